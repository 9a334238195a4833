"""Reproduction verdicts: does a row's score over seeds reproduce the paper's published number?

A difference from the paper says nothing until it is set against the spread of the seeds. The verdict
is an equivalence test, Schuirmann's two one-sided tests (TOST; Schuirmann 1987, "A comparison of the
two one-sided tests procedure and the power approach for assessing the equivalence of average
bioavailability"): with a tolerance ``tol`` (points of the metric, ``report: {tolerance: 0.5}`` in the
study file), the null hypothesis "the mean over seeds lies outside paper ± tol" is tested against
"inside", as one-sample t-tests through statsmodels (``DescrStatsW.ttost_mean``). A row is

* **reproduced** when the TOST p-value is below ``ALPHA`` (0.05): the mean is within paper ± tol, at
  5 % error (equivalently, the 90 % CI lies inside paper ± tol);
* **not reproduced**, *above* or *below*, when the 95 % CI of the mean (Student t, statsmodels'
  ``tconfint_mean``, the report's cell interval) lies wholly outside paper ± tol, on that side;
* **inconclusive** otherwise: the seeds cannot tell (the CI straddles a bound), or there is a single
  seed (no spread, no test: "inconclusive (1 seed)").

The two conclusive kinds exclude each other: the 95 % CI holds the 90 % CI, so it cannot lie outside
the band while the 90 % CI lies inside it. Each row is a test of its own (a verdict is read row by row),
so no multiple-comparison adjustment is made across rows.

**Seeds that would make it conclusive.** For an inconclusive row of n >= 2 seeds with mean m and std s
(ddof 1), the estimate is the smallest n' > n at which the same m and s would give a conclusive verdict:
``reproduced`` when |m - paper| < tol and t(1 - α, n' - 1) · s / √n' < tol - |m - paper|, or ``not
reproduced`` when |m - paper| > tol and t(1 - α/2, n' - 1) · s / √n' < |m - paper| - tol; none (shown
as "more than MAX_SEEDS") when no n' up to ``MAX_SEEDS`` does, e.g. a mean exactly on a bound. This is a
plug-in estimate, not a power calculation: new seeds move the mean and the std, so with roughly even
odds more seeds are needed. statsmodels' power module solves the sample size of one- and two-sided
t-tests, not of TOST, hence these few lines over SciPy's t quantiles.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05  # TOST level: reproduced when its p-value is below this
CONFIDENCE = 0.95  # not reproduced when this CI lies wholly outside paper ± tolerance
DEFAULT_TOLERANCE = 0.5  # points of the metric (scores x 100)
MAX_SEEDS = 1000  # the seeds estimate looks no further
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
TEST_NAME = "TOST (two one-sided t-tests, statsmodels DescrStatsW.ttost_mean)"


@dataclass(frozen=True)
class Verdict:
    """A row's scores over seeds against the paper's number, within ``tolerance``."""

    kind: str  # REPRODUCED, NOT_REPRODUCED or INCONCLUSIVE
    direction: str | None  # "above" or "below" the paper for NOT_REPRODUCED, else None
    p_value: float  # TOST p-value; nan below 2 seeds
    n: int
    paper: float
    tolerance: float
    seeds_needed: int | None = None  # inconclusive rows of n >= 2: the plug-in estimate; None: none found
    provisional: bool = False  # a partial report's row whose planned seeds have not all ended

    @property
    def short(self) -> str:
        """A table cell: ``reproduced``, ``not reproduced (below)``, ``inconclusive (~8 seeds)``; a
        provisional one says so first."""
        return f"provisional: {self._judged}" if self.provisional else self._judged

    @property
    def _judged(self) -> str:
        if self.kind == NOT_REPRODUCED:
            return f"{self.kind} ({self.direction})"
        if self.kind == REPRODUCED:
            return self.kind
        if self.n < 2:
            return f"{self.kind} ({self.n} seed{'s' if self.n != 1 else ''})"
        if self.seeds_needed is None:
            return f"{self.kind} (> {MAX_SEEDS} seeds)"
        return f"{self.kind} (~{self.seeds_needed} seeds)"


def tost(values: Sequence[float], paper: float, tolerance: float) -> float:
    """The TOST p-value of "the mean lies within paper ± tolerance" (nan below 2 values)."""
    from statsmodels.stats.weightstats import DescrStatsW

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return math.nan
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # identical values: zero std, infinite t (p 0 or 1), or nan
        p = float(DescrStatsW(x).ttost_mean(paper - tolerance, paper + tolerance)[0])
    return p


def confidence_interval(values: Sequence[float]) -> tuple[float, float]:
    """The Student-t CI of the mean at ``CONFIDENCE`` (the report's cell interval)."""
    from statsmodels.stats.weightstats import DescrStatsW

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        low, high = DescrStatsW(np.asarray(values, dtype=float)).tconfint_mean(alpha=1 - CONFIDENCE)
    return float(low), float(high)


def verdict(values: Sequence[float], paper: float, tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    """The verdict of the seeds' ``values`` against ``paper`` (the module docstring states the rules)."""
    n = len(values)
    if n < 2:
        return Verdict(INCONCLUSIVE, None, math.nan, n, paper, tolerance)
    p = tost(values, paper, tolerance)
    if p < ALPHA:
        return Verdict(REPRODUCED, None, p, n, paper, tolerance)
    low, high = confidence_interval(values)
    if low > paper + tolerance:
        return Verdict(NOT_REPRODUCED, "above", p, n, paper, tolerance)
    if high < paper - tolerance:
        return Verdict(NOT_REPRODUCED, "below", p, n, paper, tolerance)
    x = np.asarray(values, dtype=float)
    needed = seeds_needed(float(x.mean()), float(x.std(ddof=1)), n, paper, tolerance)
    return Verdict(INCONCLUSIVE, None, p, n, paper, tolerance, needed)


def seeds_needed(mean: float, std: float, n: int, paper: float, tolerance: float) -> int | None:
    """The smallest n' > n (up to MAX_SEEDS) at which ``mean`` and ``std`` would be conclusive."""
    gap = abs(mean - paper)
    if not math.isfinite(std) or gap == tolerance:
        return None
    if gap < tolerance:  # could become reproduced: the 90 % CI must fit inside the band
        room, quantile = tolerance - gap, 1 - ALPHA
    else:  # could become not reproduced: the 95 % CI must clear the band
        room, quantile = gap - tolerance, 0.5 + CONFIDENCE / 2
    candidates = np.arange(n + 1, MAX_SEEDS + 1)
    half = sps.t.ppf(quantile, candidates - 1) * std / np.sqrt(candidates)
    fits = candidates[half < room]
    return int(fits[0]) if len(fits) else None


def legend(tolerance: float, source: str | None = None) -> str:
    """The line under a table that explains its verdict column; ``source``: where a table's own
    tolerance comes from (None: the study's ``report: tolerance``)."""
    whence = f"the table's tolerance, from {source}" if source else "report: tolerance in the study file"
    return (
        f"verdict: {TEST_NAME} of the seeds' mean against the paper's number ± {tolerance:g} ({whence}); "
        f"reproduced: TOST p < {ALPHA}; not reproduced (above/below): the "
        f"{CONFIDENCE:.0%} CI lies wholly outside paper ± {tolerance:g} on that side; inconclusive otherwise, "
        f"with ~N seeds: how many seeds the same mean and std would need to be conclusive (a plug-in "
        f"estimate, not a power calculation)"
    )
