"""A grid on two objectives (issue 56 item 6) through Ray Tune and MLflow: three learning rates of a tiny
study, ``metric: [best_dev_stsb, test_sts16]``, run by ``platform study run``; the report's Pareto front is
the set of points no other point beats on both objectives, computed here from the runs' metrics read back
from MLflow, and its table, JSON and plot carry it."""

from __future__ import annotations

import json

import pytest

from clsr.study.analyse.rows import build_report
from clsr.study.plan.load import load_study
from tests.e2e.test_e2e import runs_of
from tests.e2e.test_resilience import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.5)]
OBJECTIVES = ["best_dev_stsb", "test_sts16"]


def non_dominated(values: dict[str, tuple[float, float]]) -> set[str]:
    """The points no other point is at least as good as on both objectives and better on one (both max)."""

    def beats(a, b) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and a != b

    return {p for p, v in values.items() if not any(beats(w, v) for q, w in values.items() if q != p)}


def test_a_grid_on_two_objectives_reports_the_front_of_its_points(tmp_path):
    from clsr.study.analyse.render import json_pareto
    from clsr.study.analyse.tables import pareto_table

    trainer = {"max_steps": 4, "eval_steps": 4, "log_every": 2}
    grid = {"lr": {"grid": {"trainer.lr": [1.0e-5, 1.0e-4, 1.0e-3]}}}
    study_file, uri, _ = run_in_process(tmp_path, "pareto", trainer, grid, metric=OBJECTIVES, mode="max")
    client, (parent,), children = runs_of(uri, "pareto")
    assert len(children) == 3 and {r.data.tags["clsr.status"] for r in children} == {"finished"}
    values = {r.data.tags["clsr.point"]: tuple(r.data.metrics[m] for m in OBJECTIVES) for r in children}

    (ab,) = build_report(load_study(study_file), client, parent.info.run_id, uri).ablations
    assert set(ab.pareto.values) == set(values)
    for label, means in values.items():  # one seed: each point's mean is its run's metrics
        assert ab.pareto.values[label] == pytest.approx(list(means))
    assert set(ab.pareto.front) == non_dominated(values) and ab.pareto.near == []  # one seed: no CI
    assert pareto_table(ab).title.startswith(f"lr: Pareto front, {len(ab.pareto.front)} of 3 configurations")
    on_front = [
        c["label"] for c in json.loads(json.dumps(json_pareto(ab)))["configurations"] if c["on_front"]
    ]
    assert set(on_front) == non_dominated(values)
