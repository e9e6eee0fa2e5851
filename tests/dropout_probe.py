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


def _recorded() -> int:
    drawn.append(_draw())
    return drawn[-1]


if __name__ == "__main__":
    dropout.dropout_seed = _recorded
    argv = sys.argv[1:]
    rc = main(argv)
    out = Path(argv[argv.index("--out") + 1])
    (out / f"seeds-rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(drawn))
    sys.exit(rc)
