"""The one test every ordering claim of the experiments page states (Welch's t-test).

Two models, each trained with n seeds: the difference of their mean final accuracies, its 95%
interval and the two-sided p of Welch's t-test (unequal variances, Welch-Satterthwaite degrees
of freedom). The rule, written once: an ordering is claimed when p < 0.05 (its interval then
excludes 0); otherwise the two are "not told apart at n = ..." (never "equal"). With one seed
on a side there is no variance: no test, the result is marked single-run.

The Student t distribution is computed here (its CDF through the regularized incomplete beta
function, Numerical Recipes' continued fraction; the quantile by bisection) so the report needs
no SciPy; tests/test_experiments_stats.py checks it against tabulated values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05  # the one threshold of the page: p < ALPHA claims an order


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d, c = 1.0 + aa * d, 1.0 + aa / c
        d, c = 1.0 / (d if abs(d) > tiny else tiny), c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d, c = 1.0 + aa * d, 1.0 + aa / c
        d, c = 1.0 / (d if abs(d) > tiny else tiny), c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    front = math.exp(ln + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail P(|T| > |t|) of Student's t with ``df`` degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (q > 0.5) of Student's t, by bisection on the two-sided tail."""
    lo, hi, tail = 0.0, 1e4, 2.0 * (1.0 - q)
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_sf2(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Welch:
    """Mean of ``a`` minus mean of ``b`` (points), its 95% interval, t, df and two-sided p."""

    diff: float
    low: float
    high: float
    t: float
    df: float
    p: float
    n_a: int
    n_b: int

    @property
    def ordered(self) -> bool:
        return self.p < ALPHA

    def text(self, unit: str = " points") -> str:
        return (
            f"{self.diff:+.2f}{unit}, 95% interval [{self.low:+.2f}, {self.high:+.2f}], "
            f"Welch t = {self.t:.2f}, df = {self.df:.1f}, p = {p_text(self.p)} "
            f"(n = {self.n_a} and {self.n_b})"
        )


def p_text(p: float) -> str:
    """p to three decimals, or to two significant figures under 0.001 (never '0.000')."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _mean_var(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def welch(a: list[float], b: list[float]) -> Welch | None:
    """Welch's test of mean(a) - mean(b); None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se = math.sqrt(sa + sb)
    diff = ma - mb
    if se == 0.0:  # identical seeds on both sides: no spread to test against
        return Welch(diff, diff, diff, math.inf, math.inf, 0.0 if diff else 1.0, len(a), len(b))
    df = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    t = diff / se
    half = t_quantile(0.975, df) * se
    return Welch(diff, diff - half, diff + half, t, df, t_sf2(t, df), len(a), len(b))


def verdict(a_name: str, b_name: str, a: list[float], b: list[float]) -> str:
    """One sentence: the ordering the test supports, or that it does not tell them apart."""
    w = welch(a, b)
    if w is None:
        return (
            f"{a_name} {sum(a) / len(a):.2f}% against {b_name} {sum(b) / len(b):.2f}%: "
            f"single run on a side (n = {len(a)} and {len(b)}), no test"
        )
    order = (
        f"{a_name} {'>' if w.diff > 0 else '<'} {b_name}"
        if w.ordered
        else f"{a_name} and {b_name} not told apart"
    )
    return f"{order}: {w.text()}"
