"""One call trains a config: build the Trainer, fit, and leave the process group cleanly on every
rank (``attnconv train`` and ``attnconv demo`` call it)."""

from __future__ import annotations

from . import distributed as D
from .config import Config
from .loop import Trainer
from .stopping import Interrupted


def train(
    cfg: Config,
    *,
    resume: bool = False,
    stop_at_step: int | None = None,
    overwrite: bool = False,
    device: str | None = None,
) -> dict:
    """Build everything from ``cfg`` and train; see :class:`Trainer`.

    Args:
        cfg: the run's configuration (``attnconv.train.config``).
        resume: continue from the run folder's newest checkpoint.
        stop_at_step: stop (resumably) once this step is reached.
        overwrite: replace a run already in the folder (refused otherwise, unless ``resume``).
        device: cpu, cuda, cuda:N, mps (default: CUDA if available).

    Returns:
        The last evaluation's metrics (``eval_loss``, ``eval_acc``, ``step``, ``epoch``,
        ``seconds``).
    """
    tr = Trainer(cfg, resume=resume, stop_at_step=stop_at_step, overwrite=overwrite, device=device)
    # every rank past its last collective before the group is unregistered (the group object
    # itself lives on: D.wrap says why freeing it hung or aborted a rank); on the success and
    # stop paths only, so that a failing rank never waits on a peer stuck elsewhere
    try:
        last = tr.fit()
    except Interrupted:  # a stop every rank agreed on (any_rank, stop_at_step): all are here
        D.barrier(tr.info)
        raise
    else:
        D.barrier(tr.info)
        return last
    finally:
        D.shutdown(tr.info)
