"""Benchmark suites run by `attnconv bench --suite NAME`: each is a module ``attnconv.bench.NAME``
with ``main(argv) -> int``, listed once in ``SUITES`` (the command's help, its error message and
the docs name them from there). Shared helpers (subprocess timing, peak memory, FLOP counting,
tables) are in ``common``."""

SUITES = {
    "layers": "global self-attention layers, fast paths against the reference",
    "local": "SASA local attention",
    "convert": "converted CNNs against the originals, Lemma 2's error",
    "models": "training throughput of the paper models",
    "compile": "the paper models eager and under torch.compile, against the plain model compiled",
    "cuda": "the layers on a CUDA GPU against what runs there instead",
}
