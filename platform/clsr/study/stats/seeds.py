"""Statistics over a row's seeds, with no I/O: a cell's mean, std and Student-t CI, a row's paired t-test
against the reference row, and Holm's adjustment of the p-values of one ablation's rows.

One ablation tests many rows against one reference, so its p-values are adjusted for multiple
comparisons with Holm's step-down method (Holm 1979, "A simple sequentially rejective multiple test
procedure"): the family is the rows of one ablation that have a p-value on the main metric. Holm, not
Benjamini-Hochberg, because each row's verdict ("differs from the paper's configuration") is read on
its own, which asks for the family-wise error to be controlled, not the share of false discoveries;
Holm holds under any dependence between the tests (they share the reference's seeds), and it is
uniformly more powerful than Bonferroni. The adjustment is statsmodels' (``multipletests``,
``method="holm"``); ``holm`` only keeps the rows without a test out of the family.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

CONFIDENCE = 0.95
ALPHA = 0.05  # rows whose Holm-adjusted p against the reference is below this are flagged
TEST_NAME = "paired t-test (scipy.stats.ttest_rel, two-sided)"
CORRECTION = "Holm (1979) step-down over the ablation's rows tested against its reference"


@dataclass(frozen=True)
class Stats:
    """A cell: mean over seeds, sample std (ddof 1) and the Student-t CI; std and CI are nan below n = 2."""

    mean: float
    std: float
    ci_low: float
    ci_high: float
    n: int


def seed_stats(values: Sequence[float]) -> Stats:
    """Seeds are few (3-5), so the interval uses Student's t with n - 1 degrees of freedom, not z."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n == 0:
        return Stats(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if n < 2:
        return Stats(mean, math.nan, math.nan, math.nan, 1)
    std = float(v.std(ddof=1))
    half = float(sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return Stats(mean, std, mean - half, mean + half, n)


@dataclass(frozen=True)
class Paired:
    """A row against the reference row on the main metric, over the seeds both finished."""

    p_value: float  # nan: fewer than 2 paired seeds (or no spread at all in the differences)
    n: int
    mean_diff: float  # row - reference, mean over the paired seeds
    p_adjusted: float = math.nan  # Holm-adjusted over the ablation's tested rows; nan when p_value is

    @property
    def significant(self) -> bool:
        return self.p_adjusted < ALPHA


def paired_test(row: dict[int | None, float], reference: dict[int | None, float]) -> Paired:
    """Same seed = same data order and initialisation, so the paired test removes the seed's share of
    the variance that an unpaired test would count against the difference."""
    seeds = sorted((s for s in set(row) & set(reference) if s is not None), key=int)
    diffs = [row[s] - reference[s] for s in seeds]
    mean_diff = float(np.mean(diffs)) if diffs else math.nan
    if len(seeds) < 2:
        return Paired(math.nan, len(seeds), mean_diff)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # constant differences: SciPy warns and returns nan or 0
        p = float(sps.ttest_rel([row[s] for s in seeds], [reference[s] for s in seeds]).pvalue)
    return Paired(p, len(seeds), mean_diff)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979) through statsmodels, in the input order: the k-th smallest
    of the m finite p-values becomes max over j <= k of min(1, (m - j + 1) p_(j)). A nan (too few paired
    seeds) stays nan and is not counted in m: a row without a test is not a comparison made."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(len(p), math.nan)
    tested = ~np.isnan(p)
    if tested.any():
        adjusted[tested] = multipletests(p[tested], method="holm")[1]
    return adjusted.tolist()
