"""The paired test of seed pruning against values computed here with SciPy and Optuna directly."""

from __future__ import annotations

import optuna
import pytest
from scipy import stats as sps

from clsr.study.spec.tuning import PruneSeeds, wilcoxon_min_seeds
from clsr.study.stats.seed_pruning import paired_prune

BEST = [70.0, 72.0, 71.0, 73.0, 72.5]


def test_ttest_prunes_a_clearly_worse_configuration_after_two_seeds_with_scipys_p():
    rule = PruneSeeds(test="ttest", p=0.1)
    call = paired_prune(rule, [60.0, 61.5], BEST, "max")
    expected = sps.ttest_rel([60.0, 61.5], BEST[:2], alternative="less").pvalue
    assert call.prune and call.pairs == 2 and call.p == pytest.approx(expected)
    assert expected < 0.1


def test_ttest_keeps_a_configuration_as_good_on_average_or_not_yet_tested():
    rule = PruneSeeds(test="ttest", p=0.1, min_seeds=3)
    assert not paired_prune(rule, [60.0, 61.0], BEST, "max").prune  # min_seeds 3: no test yet
    assert paired_prune(rule, [60.0, 61.0], BEST, "max").p is None
    assert not paired_prune(rule, [75.0, 76.0, 74.0], BEST, "max").prune  # better
    # minimising: lower is better, so the same scores are the better ones
    assert not paired_prune(PruneSeeds(test="ttest"), [60.0, 61.5], BEST, "min").prune
    assert paired_prune(PruneSeeds(test="ttest"), [80.0, 85.5], BEST, "min").prune
    assert not paired_prune(PruneSeeds(test="ttest"), [60.0, float("nan")], BEST, "max").prune


def test_wilcoxon_is_optunas_pruner_and_needs_its_seeds():
    assert [wilcoxon_min_seeds(p) for p in (0.3, 0.1, 0.05)] == [2, 4, 5]
    rule = PruneSeeds(test="wilcoxon", p=0.1)
    worse = [60.0, 61.0, 62.0, 63.0]
    assert not paired_prune(rule, worse[:3], BEST, "max").prune  # 2^-3 = 0.125: cannot reach 0.1
    call = paired_prune(rule, worse, BEST, "max")
    diffs = [a - b for a, b in zip(worse, BEST, strict=False)]
    assert call.prune and call.p == pytest.approx(sps.wilcoxon(diffs, alternative="less").pvalue)
    assert call.p == pytest.approx(0.0625)
    # Optuna's own study with the same trials says the same
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=sum(BEST) / 5, intermediate_values=dict(enumerate(BEST))))
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, intermediate_values=dict(enumerate(worse))
    )
    assert optuna.pruners.WilcoxonPruner(p_threshold=0.1).prune(study, trial)
    mixed = [60.0, 80.0, 62.0, 63.0]  # one seed better: not every pair below
    assert not paired_prune(rule, mixed, BEST, "max").prune
