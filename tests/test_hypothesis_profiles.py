"""The test suite's hypothesis profiles (tests/conftest.py): `ci` draws each property's own
examples, the same every run; `deep` (`--hypothesis-profile deep`) ten times as many, new ones
each run. Checked on two properties of a scratch file (one with its own max_examples, one with
the profile's), run by pytest with this conftest as a plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROPERTY = """
import json, os
from hypothesis import given, settings, strategies as st

SEEN = {"own": [], "profile": []}

@settings(max_examples=3)
@given(st.integers(0, 10**12))
def test_own_examples(x):
    SEEN["own"].append(x)

@given(st.integers(0, 10**12))
def test_the_profiles_examples(x):
    SEEN["profile"].append(x)

def test_write_what_was_drawn():
    with open(os.environ["DRAWN"], "w") as f:
        json.dump(SEEN, f)
"""


def _drawn(tmp_path: Path, run: int, *args: str) -> dict[str, list[int]]:
    (tmp_path / "test_scratch_property.py").write_text(PROPERTY)
    out = tmp_path / f"drawn{run}.json"
    env = dict(os.environ, DRAWN=str(out), PYTHONPATH=str(TESTS))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider"]
    r = subprocess.run(
        [*cmd, "--rootdir", str(tmp_path), *args, str(tmp_path / "test_scratch_property.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


@pytest.mark.slow  # a pytest run of its own each
@pytest.mark.parametrize("profile", ["ci", "deep"])
def test_ci_repeats_its_own_examples_and_deep_draws_ten_times_as_many_new_ones(tmp_path, profile):
    args = ("--hypothesis-profile", "deep") if profile == "deep" else ()
    first, second = _drawn(tmp_path, 1, *args), _drawn(tmp_path, 2, *args)
    n = {"own": 3, "profile": 25}  # a test's own max_examples, else the ci profile's
    for key in ("own", "profile"):
        if profile == "ci":
            assert len(first[key]) == n[key] and first[key] == second[key]
        else:
            assert len(first[key]) == len(second[key]) == 10 * n[key]
            assert first[key] != second[key]
