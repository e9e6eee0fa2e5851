"""Regenerate the embedded CIFAR-10 sample from the full JPEG zip.

    python -m attnconv.data.make_sample PATH/cifar10-jpeg.zip

Copies the JPEG files unchanged (the first ``--train`` / ``--test`` files of every class, in name
order) into ``attnconv/data/sample/cifar10_sample.zip`` with the same ``split/class/file``
layout; the output is byte-for-byte reproducible (fixed timestamps, sorted entries).
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

from .datasets import SAMPLE_PATH


def make_sample(src: str | Path, dst: str | Path = SAMPLE_PATH, train: int = 400, test: int = 100):
    with zipfile.ZipFile(src) as zin:
        names = sorted(n for n in zin.namelist() if not n.endswith("/"))
        per: dict[tuple[str, str], list[str]] = {}
        for n in names:
            parts = n.split("/")
            if len(parts) == 3 and parts[0] in ("train", "test"):
                per.setdefault((parts[0], parts[1]), []).append(n)
        if not per:
            raise ValueError(f"{src}: no train/<class>/<file> or test/<class>/<file> entries")
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as zout:
            for (split, _cls), files in sorted(per.items()):
                for n in files[: train if split == "train" else test]:
                    info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                    zout.writestr(info, zin.read(n))
    return Path(dst)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("zip", help="the full CIFAR-10 JPEG zip (split/class/file)")
    p.add_argument("--out", default=str(SAMPLE_PATH))
    p.add_argument("--train", type=int, default=400, help="train images per class")
    p.add_argument("--test", type=int, default=100, help="test images per class")
    a = p.parse_args(argv)
    out = make_sample(a.zip, a.out, a.train, a.test)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
