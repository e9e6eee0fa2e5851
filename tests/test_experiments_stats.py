"""The experiments page's one test (benchmarks/experiments_stats.py): Student's t against
tabulated values, and Welch's test against a hand computation."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import experiments_stats as st  # noqa: E402


@pytest.mark.parametrize(
    "df, q975",  # two-sided 95% critical values of Student's t (standard tables)
    [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042), (1e6, 1.960)],
)
def test_t_quantile_matches_the_tables(df, q975):
    assert st.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)


@pytest.mark.parametrize("df", [1, 2.6, 7, 40])
def test_the_tail_is_the_quantiles_inverse(df):
    for q in (0.9, 0.975, 0.995):
        assert st.t_sf2(st.t_quantile(q, df), df) == pytest.approx(2 * (1 - q), rel=1e-6)


def test_the_tail_at_df_1_is_the_cauchys():
    for t in (0.3, 1.0, 4.0):
        assert st.t_sf2(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-9)


def test_welch_by_hand():
    a, b = [88.86, 89.24], [87.92, 87.74]
    w = st.welch(a, b)
    va, vb = (89.24 - 88.86) ** 2 / 2, (87.92 - 87.74) ** 2 / 2
    se = math.sqrt(va / 2 + vb / 2)
    df = (va / 2 + vb / 2) ** 2 / ((va / 2) ** 2 + (vb / 2) ** 2)
    assert w.diff == pytest.approx(88.86 / 2 + 89.24 / 2 - 87.83)
    assert w.t == pytest.approx(w.diff / se) and w.df == pytest.approx(df)
    assert w.p == pytest.approx(st.t_sf2(w.t, df))
    assert w.low == pytest.approx(w.diff - st.t_quantile(0.975, df) * se)
    assert w.ordered == (w.p < 0.05)


def test_one_seed_is_no_test():
    assert st.welch([1.0], [2.0, 3.0]) is None
    assert "single run" in st.verdict("A", "B", [1.0], [2.0, 3.0])
    assert "not told apart" in st.verdict("A", "B", [1.0, 3.0], [1.5, 2.5])
