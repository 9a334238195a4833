"""`platform study run studies/gclsr_ablations.yaml --smoke` through Ray Tune, Ray Train and MLflow.

Every runnable point of every GCLSR ablation table must leave a finished child run with STS scores
and the paper's numbers beside them; the back-translation points are skipped offline with a note.
"""

from __future__ import annotations

import pytest

from clsr.study.analyse.rows import build_report
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points
from clsr.tracking.study_runs import run_labels
from tests.e2e.test_e2e import REPO_ROOT, run_smoke_study, runs_of  # noqa: E402
from tests.e2e.test_supmpn_study import distinct_trials  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(3.5)]
STUDY = REPO_ROOT / "studies" / "gclsr_ablations.yaml"


def test_full_study_validates_with_every_table():
    study = load_study(STUDY)
    assert study.seeds == [2, 3, 4] and study.resources.gpus_per_worker == 0.125  # 8 trials per GPU
    assert study.resources.workers_per_trial == 0 and study.resources.cpus_per_worker == 2
    tables = {a.table for a in study.ablations.values()}
    assert {"GCLSR Tables 2-3", *(f"GCLSR Table {n}" for n in (4, 5, 6, 7, 8, 9, 10, 11))} <= tables
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    assert sum(len(p) for p in points.values()) == 50
    ours = next(p for p in points["region_sizes"] if p.label == "(1,1,1,6,15,20)")
    assert ours.paper["test_sts12_15_avg"] == 67.66


def test_gclsr_smoke_study_end_to_end(tmp_path):
    uri, output = run_smoke_study(STUDY, tmp_path)
    assert "skipped (not available here): ablations.components[+ TransL]" in output

    study = load_study(STUDY, smoke=True)
    client, parents, children = runs_of(uri, study.name)
    assert len(parents) == 1
    expected = {
        (name, p.label)
        for name, a in study.ablations.items()
        for p in grid_points(a)
        if "TransL" not in p.label
    }
    seen = [label for r in children for label in run_labels(r.data.tags)]
    assert set(seen) == expected and len(seen) == len(expected) == 47
    # each table's paper-choice row is one configuration: identical trials ran once (47 points, 39 runs)
    assert len(children) == distinct_trials(study, expected) == 39
    for run in children:
        assert run.data.tags["clsr.status"] == "finished", run.data.tags
        assert run.data.tags["clsr.seed"] == "1"
        metrics = run.data.metrics
        for task in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"):
            assert 0 < metrics[f"test_{task}"] < 100
        assert "test_sts12_15_avg" in metrics and "best_dev_stsb" in metrics
    # the paper's region sizes are every table's choice: the run of that configuration stands for them all
    ours = next(r for r in children if ("region_sizes", "(1,1,1,6,15,20)") in run_labels(r.data.tags))
    assert len(run_labels(ours.data.tags)) == 9
    # the report shows that one run in each of the nine ablations' rows, and counts it once for the study
    report = build_report(study, client, parents[0].info.run_id, uri)
    shown_in = {
        a.name
        for a in report.ablations
        for r in a.rows
        for t in r.trials.values()
        if t.run_id == ours.info.run_id
    }
    assert shown_in == {ablation for ablation, _ in run_labels(ours.data.tags)}
    assert report.cost.runs == 39
    assert ours.data.params["model.vectors"] == "glove-6b-50d-local"
