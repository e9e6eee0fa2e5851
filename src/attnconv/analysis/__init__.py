"""What the attention heads learned: the figures of Cordonnier et al. (2020) and ViT (2021).

- ``maps``: attention of every head for one query, for one image or averaged over many.
- ``centers``: quadratic heads' centres, 50% / 90% mass contours, the per-epoch centre log.
- ``distance``: mean attention distance per head, in pixels.
- ``posemb``: position-embedding similarity, principal components of patch filters.
- ``convlike``: conv-likeness per head (Lemma 1: hard heads on a K x K grid score 1).
- ``figures``: matplotlib (Agg) plots; ``report.analyze_model``: all of them + an index.
- ``explorer``: the self-contained interactive HTML page (template ``explorer.html``).
"""
