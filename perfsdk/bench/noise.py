"""How far apart two sets of repetitions must be before a difference is more than noise.

``perfsdk bench serve --repeat N`` runs the same load N times; a headline number (TTFT P99, output
tokens/s, …) then has N values per run, one per repetition. :func:`difference_interval` gives a 95 %
interval for the difference of their means (B − A)::

    from perfsdk.bench.noise import difference_interval
    ci = difference_interval([10.2, 12.9, 11.1], [11.8, 14.0, 12.2])
    ci.low, ci.high, ci.spans_zero      # (-1.7, 4.2, True): within noise
    difference_interval([10.2], [11.8]) # None: one value per side, the noise is unknown

The method is **Welch's t interval**: mean(B) − mean(A) ± t · sqrt(s_A²/n_A + s_B²/n_B), with the
sample standard deviations s and the Welch–Satterthwaite degrees of freedom (fractional; the t
quantile is computed exactly, without SciPy). Why this and not a bootstrap: with three repetitions
a bootstrap has only ten distinct resamples per side and its percentile interval is far too narrow,
and no rank test can reach 95 % with 3 + 3 values; the t interval holds (Welch's very nearly) when the
repetition-level values are normal, and a headline statistic of a whole run (a mean or a percentile over ~100
requests) is close to that. It is wide for n = 3 (t = 4.30 at two degrees of freedom) — that is the
honest price of three repetitions.

When one side has a single value and the other several, the single run is assumed to have the same
spread as the repeated one (pooled: the repeated side's variance for both, its n − 1 degrees of
freedom). With a single value on both sides there is no estimate of the noise at all and the function
returns ``None``: callers say "noise unknown" rather than invent an interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["METHOD", "Interval", "difference_interval", "mean", "sample_std", "t_quantile"]

#: How the intervals are made, in words, for table footers and JSON.
METHOD = "Welch t, 95 %, over per-repetition values"

_LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A confidence interval for B − A, in the metric's unit."""

    low: float
    high: float
    df: float  # degrees of freedom of the t quantile used

    @property
    def spans_zero(self) -> bool:
        """True when the interval contains 0: the data do not say which side is better (within noise)."""
        return self.low <= 0.0 <= self.high


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def sample_std(values: Sequence[float]) -> float:
    """Standard deviation with n − 1 in the denominator (0.0 for a single value)."""
    n = len(values)
    if n < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))


def difference_interval(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """The 95 % interval of mean(b) − mean(a) (see the module docstring); ``None`` when n_a = n_b = 1."""
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise ValueError("difference_interval: each side needs at least one value")
    if na < 2 and nb < 2:
        return None
    delta = mean(b) - mean(a)
    va, vb = sample_std(a) ** 2, sample_std(b) ** 2
    if na < 2 or nb < 2:
        # one run on one side: assume it varies as the repeated side does (the same server and load)
        var, df = (vb, float(nb - 1)) if na < 2 else (va, float(na - 1))
        se = math.sqrt(var * (1.0 / na + 1.0 / nb))
    else:
        qa, qb = va / na, vb / nb
        se = math.sqrt(qa + qb)
        # Welch-Satterthwaite, at least the smaller n - 1 (its floor, also when the squares underflow); with
        # no spread on either side the interval is the point and df does not matter
        denom = qa * qa / (na - 1) + qb * qb / (nb - 1)
        df = max((qa + qb) ** 2 / denom if denom > 0.0 else 0.0, float(min(na, nb) - 1))
    half = t_quantile(df) * se
    return Interval(delta - half, delta + half, df)


def t_quantile(df: float, level: float = _LEVEL) -> float:
    """The two-sided *level* quantile of Student's t with *df* > 0 degrees of freedom (fractional too).

    Solved by bisection on P(|T| < t) = 1 − I_x(df/2, 1/2), x = df / (df + t²), with the regularised
    incomplete beta function I from its continued fraction, so no SciPy is needed:
    t_quantile(2) = 4.303, t_quantile(4) = 2.776, t_quantile(30) = 2.042.
    """
    if isinstance(df, bool) or not isinstance(df, (int, float)) or not (math.isfinite(df) and df > 0):
        raise ValueError(f"t_quantile: df must be a finite number > 0, got {df!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"t_quantile: level must be in (0, 1), got {level!r}")
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_central(mid, df) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def _t_central(t: float, df: float) -> float:
    """P(|T| < t) for Student's t with *df* degrees of freedom."""
    return 1.0 - _betainc(0.5 * df, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Numerical Recipes' continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b  # the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) converges faster


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h
