"""Whether a sampled configuration, part-way through its seeds, is worse than the best configuration run
on every seed: the one-sided paired test of ``search.prune_seeds``, with no I/O.

``wilcoxon`` asks Optuna's own ``WilcoxonPruner`` (an in-memory study holding the best configuration as
its one complete trial, each seed's score an intermediate value at step = the seed's index), so the
decision is exactly Optuna's, its safety rule included (never prune a configuration whose mean so far is
at least the best's); the p it is recorded with is SciPy's, computed as the pruner does. ``ttest`` is a
paired one-sided t-test (``scipy.stats.ttest_rel``) under the same safety rule: Wilcoxon's smallest p
with n seeds is 2^-n, so with few seeds only a t-test can prune at all.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from clsr.study.spec.tuning import PruneSeeds


@dataclass(frozen=True)
class PruneCall:
    """One test's outcome: ``prune``, its one-sided ``p`` (None: not tested) over ``pairs`` seeds."""

    prune: bool
    p: float | None
    pairs: int


def paired_prune(rule: PruneSeeds, candidate: Sequence[float], best: Sequence[float], mode: str) -> PruneCall:
    """Test ``candidate``'s scores (seeds 0..k-1, in order) against ``best``'s on the same seeds.
    ``best``: every seed's score of the best configuration run to the end; ``mode``: max or min."""
    k = len(candidate)
    values = np.asarray(candidate, dtype=float)
    reference = np.asarray(best[:k], dtype=float)
    if k < rule.fewest_seeds() or len(reference) < k:
        return PruneCall(False, None, k)
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(best))):  # as WilcoxonPruner: no test
        return PruneCall(False, None, k)
    alternative = "less" if mode == "max" else "greater"
    if rule.test == "wilcoxon":
        p = float(sps.wilcoxon(values - reference, alternative=alternative, zero_method="zsplit").pvalue)
        return PruneCall(_wilcoxon_pruner_says(rule, list(values), list(best), mode), p, k)
    with warnings.catch_warnings():  # identical differences: SciPy warns, p is 0 or nan
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(sps.ttest_rel(values, reference, alternative=alternative).pvalue)
    better_on_average = values.mean() >= np.mean(best) if mode == "max" else values.mean() <= np.mean(best)
    prune = not math.isnan(p) and p < rule.p and not better_on_average
    return PruneCall(prune, None if math.isnan(p) else p, k)


def _wilcoxon_pruner_says(rule: PruneSeeds, candidate: list[float], best: list[float], mode: str) -> bool:
    import optuna
    from optuna.trial import TrialState, create_trial

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "a new study created" line per test
    try:
        study = optuna.create_study(direction="maximize" if mode == "max" else "minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=float(np.mean(best)),
            intermediate_values=dict(enumerate(best)),
        )
    )
    trial = create_trial(state=TrialState.RUNNING, intermediate_values=dict(enumerate(candidate)))
    with warnings.catch_warnings():  # experimental since Optuna 3.6: said once in the docs, not per seed
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        pruner = optuna.pruners.WilcoxonPruner(p_threshold=rule.p, n_startup_steps=rule.fewest_seeds())
    return pruner.prune(study, trial)
