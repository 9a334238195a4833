"""A sampled study with two seeds and two objectives through the real ``platform`` command, Ray Tune
(Optuna's multi-objective study behind Tune's Repeater) and MLflow: each sampled configuration runs once
per seed, Optuna is told each objective's mean over the seeds, and the report groups the seeds of a
configuration into one row and draws the configurations' Pareto front."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clsr.study.load import load_study
from clsr.study.report import build_report
from test_e2e import runs_of
from test_resilience import run_in_process

pytestmark = pytest.mark.e2e


def test_two_configurations_times_two_seeds_read_back_from_mlflow(tmp_path):
    space = {"lr": {"space": {"trainer.lr": {"loguniform": [1.0e-5, 1.0e-4]}}}}
    trainer = {"max_steps": 2, "eval_steps": 2, "log_every": 1}
    study_file, uri, _ = run_in_process(
        tmp_path, "sampled-seeds", trainer, space,
        seeds=[1, 2], search={"algorithm": "optuna", "sampler": "random", "num_samples": 2},
        metric=["best_dev_stsb", "test_sts16"], mode="max",
    )  # fmt: skip
    client, (parent,), children = runs_of(uri, "sampled-seeds")
    seeds_of = defaultdict(list)
    for child in children:
        assert child.data.tags["clsr.status"] == "finished"
        seeds_of[child.data.tags["clsr.point"]].append(int(child.data.tags["clsr.seed"]))
        assert child.data.params["trainer.seed"] == child.data.tags["clsr.seed"]
    assert len(children) == 4 and sorted(map(sorted, seeds_of.values())) == [[1, 2], [1, 2]]
    (lr,) = build_report(load_study(study_file), client, parent.info.run_id, uri).ablations
    assert sorted(r.label for r in lr.rows) == sorted(seeds_of)  # a row per configuration
    assert [r.trials_text() for r in lr.rows] == ["2/2 ok", "2/2 ok"]
    means = {  # each objective's mean over a configuration's seeds, from the runs themselves
        point: [
            sum(c.data.metrics[m] for c in children if c.data.tags["clsr.point"] == point) / 2
            for m in ("best_dev_stsb", "test_sts16")
        ]
        for point in seeds_of
    }
    assert lr.pareto.seeds == dict.fromkeys(means, 2)
    assert {k: pytest.approx(v) for k, v in means.items()} == lr.pareto.values
    a, b = means.values()
    one_beats_other = a != b and (
        all(x <= y for x, y in zip(a, b, strict=True)) or all(x >= y for x, y in zip(a, b, strict=True))
    )
    assert len(lr.pareto.front) == (1 if one_beats_other else 2)
