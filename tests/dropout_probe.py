"""Run by tests/test_distributed_dropout.py, under torchrun or alone: ``attnconv train`` with
its arguments, recording every hidden-dropout seed this process draws (the seed of
``attnconv.layers.dropout.hash_dropout``'s mask) to ``<out>/seeds-rank<RANK>.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attnconv.layers.dropout as dropout
from attnconv.cli import main

drawn: list[int] = []
_draw = dropout.dropout_seed
argv = sys.argv[1:]
record = Path(argv[argv.index("--out") + 1]) / f"seeds-rank{os.environ.get('RANK', '0')}.json"


def _recorded() -> int:
    """Draw as the trainer does and record at once: a torchrun worker ends inside ``main``
    (``attnconv.train.distributed.exit_worker``), so nothing after it runs."""
    drawn.append(_draw())
    record.write_text(json.dumps(drawn))
    return drawn[-1]


if __name__ == "__main__":
    dropout.dropout_seed = _recorded
    rc = main(argv)
    record.write_text(json.dumps(drawn))  # a lone process returns here (no draw: an empty list)
    sys.exit(rc)
