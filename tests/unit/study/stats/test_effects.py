"""Effects tables: the ANOVA against sums of squares computed by hand with numpy on a balanced 2x2
with replicates, partial eta squared exactly, the bootstrap interval against scipy.stats.bootstrap run
directly, the skips, and fANOVA importance against Optuna's own function on the same trials."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.importance import FanovaImportanceEvaluator, get_param_importances
from scipy import stats

from clsr.study.spec.space import Distribution
from clsr.study.stats.effects import (
    N_RESAMPLES,
    anova_table,
    grid_effects,
    grid_frame,
    partial_eta_squared,
    sampled_effects,
)

# y[a][b] = three seeds of a balanced 2x2 grid
Y = {
    (0.05, "cls"): [76.1, 75.5, 76.6],
    (0.05, "avg"): [74.0, 74.9, 74.2],
    (0.1, "cls"): [75.0, 74.4, 75.9],
    (0.1, "avg"): [71.0, 72.3, 71.8],
}
CELLS = [({"method.temperature": a, "model.pooling": b}, ys) for (a, b), ys in Y.items()]


def hand_sums_of_squares(values: dict | None = None) -> dict[str, float]:
    """Balanced two-way ANOVA: SS_A = nb Σ(Ā_i - Ȳ)², SS_B = na Σ(B̄_j - Ȳ)², SS_AB = n Σ(cell - Ā - B̄ + Ȳ)²,
    SS_E = Σ(y - cell)²."""
    values = values or Y
    a_levels, b_levels = [0.05, 0.1], ["cls", "avg"]
    y = np.array([[values[(a, b)] for b in b_levels] for a in a_levels])  # a x b x n
    n = y.shape[2]
    grand, cell = y.mean(), y.mean(axis=2)
    a_mean, b_mean = y.mean(axis=(1, 2)), y.mean(axis=(0, 2))
    return {
        "method.temperature": n * len(b_levels) * ((a_mean - grand) ** 2).sum(),
        "model.pooling": n * len(a_levels) * ((b_mean - grand) ** 2).sum(),
        "method.temperature x model.pooling": n
        * ((cell - a_mean[:, None] - b_mean[None, :] + grand) ** 2).sum(),
        "Residual": ((y - cell[:, :, None]) ** 2).sum(),
    }


def test_anova_table_matches_hand_sums_of_squares():
    table = anova_table(grid_frame(CELLS), ["method.temperature", "model.pooling"])
    hand = hand_sums_of_squares()
    assert list(table.index) == list(hand)
    for term, ss in hand.items():
        assert table.loc[term, "sum_sq"] == pytest.approx(ss, rel=1e-9)
    assert table.loc["Residual", "df"] == 8
    f = hand["model.pooling"] / (hand["Residual"] / 8)
    assert table.loc["model.pooling", "F"] == pytest.approx(f)
    assert table.loc["model.pooling", "PR(>F)"] == pytest.approx(stats.f.sf(f, 1, 8))


def test_partial_eta_squared_is_exact():
    hand = hand_sums_of_squares()
    eta = partial_eta_squared(anova_table(grid_frame(CELLS), ["method.temperature", "model.pooling"]))
    for term in ("method.temperature", "model.pooling", "method.temperature x model.pooling"):
        assert eta[term] == pytest.approx(hand[term] / (hand[term] + hand["Residual"]), rel=1e-12)


def test_grid_effects_give_terms_with_bootstrap_intervals_from_scipy():
    effects = grid_effects(CELLS)
    assert effects.kind == "anova" and effects.residual_df == 8
    hand = hand_sums_of_squares()
    by_term = {t.term: t for t in effects.terms}
    pooling = by_term["model.pooling"]
    assert pooling.partial_eta_sq == pytest.approx(
        hand["model.pooling"] / (hand["model.pooling"] + hand["Residual"])
    )

    # the cells in the order the report groups them (the keys sorted as strings), resampled by SciPy
    # directly with the statistic computed by hand (numpy sums of squares)
    order = sorted(Y, key=lambda k: (str(k[0]), str(k[1])))

    def eta_pooling(*ys):
        resampled = dict(zip(order, ys, strict=True))
        ss = hand_sums_of_squares(resampled)
        return ss["model.pooling"] / (ss["model.pooling"] + ss["Residual"])

    res = stats.bootstrap([Y[k] for k in order], eta_pooling, n_resamples=N_RESAMPLES,
                          method="percentile", vectorized=False, rng=np.random.default_rng(0))  # fmt: skip
    assert pooling.ci_low == pytest.approx(res.confidence_interval.low)
    assert pooling.ci_high == pytest.approx(res.confidence_interval.high)
    assert pooling.ci_low <= pooling.partial_eta_sq <= pooling.ci_high


def test_grid_effects_are_skipped_with_a_reason():
    one_seed = [(keys, ys[:1]) for keys, ys in CELLS]
    assert "no replicates" in grid_effects(one_seed).reason
    one_key = [({"a": a}, ys) for (a, _), ys in Y.items()]
    assert "needs 2 or more" in grid_effects(one_key).reason
    assert "have no finished trial" in grid_effects(CELLS[:3]).reason


def test_sampled_importance_matches_optuna():
    rng = np.random.default_rng(1)
    space = {
        "trainer.lr": Distribution(loguniform=(1e-5, 1e-4)),
        "trainer.batch_size": Distribution(choice=[64, 128, 256]),
    }
    trials = []
    for _ in range(30):
        lr, bs = float(10 ** rng.uniform(-5, -4)), int(rng.choice([64, 128, 256]))
        trials.append(({"trainer.lr": lr, "trainer.batch_size": bs}, 70 + 2e4 * lr + 0.001 * bs))
    effects = sampled_effects(space, trials)
    assert effects.kind == "importance"
    study = optuna.create_study(direction="maximize")
    distributions = {
        "trainer.lr": FloatDistribution(1e-5, 1e-4, log=True),
        "trainer.batch_size": CategoricalDistribution([64, 128, 256]),
    }
    for params, value in trials:
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    expected = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))
    assert effects.importances == pytest.approx(dict(expected))
    assert list(effects.importances) == list(expected)
    assert math.isclose(sum(effects.importances.values()), 1.0)
    assert "1 finished" in sampled_effects(space, trials[:1]).reason


def test_rows_that_differ_in_another_key_are_not_pooled_as_replicates():
    cells = [*CELLS, ({"method.temperature": 0.05, "model.pooling": "cls", "trainer.lr": 1e-5}, [70.0, 71.0])]
    assert "not a grid" in grid_effects(cells).reason


def test_a_logged_value_outside_the_space_skips_the_importance():
    space = {"a": Distribution(uniform=(0.0, 1.0)), "b": Distribution(choice=[1, 2])}
    trials = [({"a": 0.5, "b": 1}, 1.0), ({"a": 2.0, "b": 2}, 2.0)]  # a = 2.0: the space was edited
    effects = sampled_effects(space, trials)
    assert effects.kind == "skipped" and effects.reason.startswith("no parameter importance:")
