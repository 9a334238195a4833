"""Adaptive seeds through the real ``platform`` command, Ray Tune and MLflow: a grid whose rows start
with two seeds gets a third, as its own Tune experiment, for every row whose CI is wider than asked;
the report plans the seeds found."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clsr.study.analyse.rows import build_report
from clsr.study.plan.load import load_study
from tests.e2e.test_e2e import runs_of
from tests.e2e.test_resilience import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.8)]


def test_rows_wider_than_asked_get_another_seed_up_to_max(tmp_path):
    # until_ci 1e-6 points: no two seeds of a row agree that closely, so every row takes its third seed
    seeds = {"min": 2, "max": 3, "until_ci": 1.0e-6, "first": 1}
    grid = {"temp": {"grid": {"method.temperature": [0.05, 0.1]}, "seeds": seeds}}
    trainer = {"max_steps": 2, "eval_steps": 2, "log_every": 1}
    study_file, uri, output = run_in_process(tmp_path, "adaptive", trainer, grid)
    assert "ablations.temp: round 2 adds a seed to 2 row(s)" in output, output[-3000:]
    assert "round 3" not in output  # max reached: no further round
    client, (parent,), children = runs_of(uri, "adaptive")
    seeds_of = defaultdict(set)
    for child in children:
        assert child.data.tags["clsr.status"] == "finished"
        seeds_of[child.data.tags["clsr.point"]].add(int(child.data.tags["clsr.seed"]))
    assert dict(seeds_of) == {"method.temperature=0.05": {1, 2, 3}, "method.temperature=0.1": {1, 2, 3}}
    assert any((tmp_path / "runs").glob("adaptive-*/temp-seeds2"))  # the round's own Tune experiment
    (temp,) = build_report(load_study(study_file), client, parent.info.run_id, uri).ablations
    assert [r.trials_text() for r in temp.rows] == ["3/3 ok", "3/3 ok"]
