"""Reproduction verdicts: the TOST p-value against SciPy's one-sided one-sample t-tests on shifted data,
each verdict kind on hand-made seeds, the CI rule against SciPy's t interval, the seeds estimate against
the verdict of samples of that size with the same mean and std, one seed, the study file's tolerance,
and the verdict column of the report's table and CSV."""

from __future__ import annotations

import copy
import csv
import math

import numpy as np
import pytest
import yaml
from scipy import stats

from clsr.study.analyse.render import render_text
from clsr.study.analyse.report import write_report
from clsr.study.analyse.rows import build_report
from clsr.study.analyse.tables import detail_tables, summary_table
from clsr.study.plan.load import load_study
from clsr.study.spec.schema import StudyError
from clsr.study.stats.verdict import (
    INCONCLUSIVE,
    MAX_SEEDS,
    NOT_REPRODUCED,
    REPRODUCED,
    seeds_needed,
    tost,
    verdict,
)
from tests.unit.study.analyse.test_report import MAIN, STUDY, T01, T05, store  # noqa: F401 (store: the report's MLflow store fixture)

PAPER, TOL = 76.0, 0.5


def scipy_tost(values, paper, tol) -> float:
    """TOST by hand from SciPy: H0 mean <= paper - tol tested on values shifted by the lower bound
    (one-sided, greater), H0 mean >= paper + tol on values shifted by the upper one (less); the larger
    p-value is the test's."""
    x = np.asarray(values, dtype=float)
    lower = stats.ttest_1samp(x - (paper - tol), 0.0, alternative="greater").pvalue
    upper = stats.ttest_1samp(x - (paper + tol), 0.0, alternative="less").pvalue
    return float(max(lower, upper))


def scipy_ci(values) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return float(low), float(high)


def with_mean_std(mean: float, std: float, n: int) -> np.ndarray:
    """n values whose mean and sample std (ddof 1) are exactly ``mean`` and ``std``."""
    z = np.arange(n, dtype=float)
    z = (z - z.mean()) / z.std(ddof=1)
    return mean + std * z


@pytest.mark.parametrize(
    "values",
    [
        [76.0, 76.1, 75.9, 76.05, 75.95],
        [75.6, 76.4, 76.9],
        [74.0, 74.2, 73.9],
        [75.4, 75.7, 75.3, 75.6],
    ],
)
def test_tost_p_value_is_scipys_two_one_sided_tests(values):
    assert tost(values, PAPER, TOL) == pytest.approx(scipy_tost(values, PAPER, TOL), rel=1e-9)


def test_reproduced_when_both_one_sided_tests_reject():
    values = [76.0, 76.1, 75.9, 76.05, 75.95]
    assert scipy_tost(values, PAPER, TOL) < 0.05  # the hand-made data is equivalent
    v = verdict(values, PAPER, TOL)
    assert (v.kind, v.direction, v.n, v.seeds_needed) == (REPRODUCED, None, 5, None)
    assert v.p_value == pytest.approx(scipy_tost(values, PAPER, TOL)) and v.short == "reproduced"
    # the same seeds against a stricter margin no longer fit
    strict = verdict(values, PAPER, 0.05)
    assert strict.kind == INCONCLUSIVE and scipy_tost(values, PAPER, 0.05) >= 0.05


@pytest.mark.parametrize(
    ("values", "direction"), [([74.0, 74.2, 73.9], "below"), ([77.5, 77.7, 77.6, 77.4], "above")]
)
def test_not_reproduced_when_the_ci_lies_outside_the_band(values, direction):
    low, high = scipy_ci(values)
    assert high < PAPER - TOL if direction == "below" else low > PAPER + TOL
    v = verdict(values, PAPER, TOL)
    assert (v.kind, v.direction) == (NOT_REPRODUCED, direction)
    assert v.short == f"not reproduced ({direction})" and v.p_value == pytest.approx(
        scipy_tost(values, PAPER, TOL)
    )


def test_inconclusive_when_the_ci_straddles_a_bound():
    values = [75.6, 76.4, 76.9]  # mean 76.3, inside the band, but the seeds spread
    low, high = scipy_ci(values)
    assert low < PAPER - TOL < high and scipy_tost(values, PAPER, TOL) >= 0.05
    v = verdict(values, PAPER, TOL)
    assert v.kind == INCONCLUSIVE and v.direction is None and v.seeds_needed is not None
    assert v.short == f"inconclusive (~{v.seeds_needed} seeds)"
    below = [75.0, 75.5, 74.2]  # mean 74.9, below the band, CI reaching into it
    assert scipy_ci(below)[1] > PAPER - TOL and verdict(below, PAPER, TOL).kind == INCONCLUSIVE


@pytest.mark.parametrize("values", [[75.6, 76.4, 76.9], [75.0, 75.5, 74.2], [76.3, 75.7]])
def test_seeds_needed_is_the_first_sample_size_that_would_be_conclusive(values):
    """At the estimate, n values with the observed mean and std get a conclusive verdict by SciPy's
    tests; one value fewer (if more than observed) does not."""
    x = np.asarray(values, dtype=float)
    mean, std = float(x.mean()), float(x.std(ddof=1))
    needed = verdict(values, PAPER, TOL).seeds_needed
    assert needed is not None and len(values) < needed <= MAX_SEEDS

    def conclusive(n: int) -> bool:
        sample = with_mean_std(mean, std, n)
        low, high = scipy_ci(sample)
        return scipy_tost(sample, PAPER, TOL) < 0.05 or high < PAPER - TOL or low > PAPER + TOL

    assert conclusive(needed)
    assert verdict(with_mean_std(mean, std, needed), PAPER, TOL).kind != INCONCLUSIVE
    if needed - 1 > len(values):
        assert not conclusive(needed - 1)
    # the kind it would reach: reproduced from inside the band, not reproduced from outside
    expected = REPRODUCED if abs(mean - PAPER) < TOL else NOT_REPRODUCED
    assert verdict(with_mean_std(mean, std, needed), PAPER, TOL).kind == expected


def test_seeds_needed_edge_cases():
    assert seeds_needed(PAPER + TOL, 1.0, 3, PAPER, TOL) is None  # a mean on the bound never decides
    assert seeds_needed(PAPER + 0.49, 5.0, 3, PAPER, TOL) is None  # more than MAX_SEEDS
    assert seeds_needed(PAPER, math.nan, 1, PAPER, TOL) is None
    v = verdict([PAPER + 0.45, PAPER + 0.55, PAPER - 3.0, PAPER + 4.0], PAPER, TOL)
    assert (
        v.kind == INCONCLUSIVE and v.seeds_needed is None and v.short == f"inconclusive (> {MAX_SEEDS} seeds)"
    )


def test_one_seed_is_inconclusive_and_identical_seeds_decide():
    v = verdict([76.1], PAPER, TOL)
    assert (v.kind, v.n, v.seeds_needed) == (INCONCLUSIVE, 1, None) and math.isnan(v.p_value)
    assert v.short == "inconclusive (1 seed)"
    assert verdict([76.2, 76.2, 76.2], PAPER, TOL).kind == REPRODUCED  # no spread: the mean decides
    assert verdict([78.0, 78.0], PAPER, TOL).short == "not reproduced (above)"


def test_the_tolerance_is_set_in_the_study_file(tmp_path):
    def study_with(report):
        raw = copy.deepcopy(STUDY) | {"report": report}
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return load_study(path)

    assert study_with({}).report.tolerance == 0.5
    assert study_with({"tolerance": 1.5}).report.tolerance == 1.5
    for bad in ({"tolerance": 0}, {"tolerance": -1}, {"tolerance": "wide"}, {"margin": 1.0}):
        with pytest.raises(StudyError) as err:
            study_with(bad)
        assert "report" in str(err.value)


def test_the_report_shows_a_verdict_per_row_with_a_paper_number(store, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(store["folder"])
    study = load_study(store["study_file"])
    report = build_report(study, store["client"], store["parent"], store["uri"])
    temperature = next(a for a in report.ablations if a.name == "temperature")
    rows = {r.label: r for r in temperature.rows}
    for label, paper in ((T05, 76.0), (T01, 75.0)):
        values = list(MAIN[("temperature", label)].values())
        v = rows[label].verdicts["test_sts_avg"]
        assert v.p_value == pytest.approx(scipy_tost(values, paper, 0.5)) and v.paper == paper
        assert v == verdict(values, paper, 0.5)
    assert "test_sts_avg" not in rows["method.temperature=0.3"].verdicts  # no paper number
    table = summary_table(temperature)
    column = table.header.index("verdict")
    assert table.rows[0][column] == [rows[T05].verdicts["test_sts_avg"].short]
    assert "verdict: TOST (two one-sided t-tests" in render_text(report)
    sts = next(t for t in detail_tables(temperature) if "test_sts_avg" in t.header)
    cell = sts.rows[0][sts.header.index("test_sts_avg")]
    assert cell[-1] == rows[T05].verdicts["test_sts_avg"].short and cell[-3] == "paper 76.00"
    # a wider margin in the study file: the same seeds reproduce the paper
    wide = study.model_copy(update={"report": study.report.model_copy(update={"tolerance": 2.0})})
    again = build_report(wide, store["client"], store["parent"], store["uri"])
    row = next(r for r in again.ablations[0].rows if r.label == T05)
    assert row.verdicts["test_sts_avg"].kind == REPRODUCED
    assert scipy_tost(list(MAIN[("temperature", T05)].values()), 76.0, 2.0) < 0.05
    write_report(report, store["client"], tmp_path / "out")
    lines = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    cell = next(r for r in lines if r["point"] == T05 and r["metric"] == "test_sts_avg")
    assert cell["verdict"] == rows[T05].verdicts["test_sts_avg"].short and cell["tolerance"] == "0.5"
    assert float(cell["tost_p"]) == pytest.approx(
        scipy_tost(list(MAIN[("temperature", T05)].values()), 76.0, 0.5)
    )
    assert cell["seeds_needed"] == str(rows[T05].verdicts["test_sts_avg"].seeds_needed)
    pooling = next(
        r for r in lines if r["ablation"] == "pooling" and r["point"] == "cls" and r["metric"] == "test_stsb"
    )
    assert pooling["verdict"] and pooling["paper"] == "80.0"  # every metric with a paper number is judged
    assert next(r for r in lines if r["point"] == "avg" and r["metric"] == "test_stsb")["verdict"] == ""
