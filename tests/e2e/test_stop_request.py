"""``platform study stop --ablation`` on a running study: the stopped ablation's trial never starts
(and holds no run), the other ablation's finishes, and the study closes stopped, with the reason."""

from __future__ import annotations

import shutil
import time

import pytest
from mlflow.tracking import MlflowClient

from clsr.study.control.stop_request import HOLD_TAG, request_stop
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.e2e.test_resilience import tiny_study

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.5)]


def test_an_ablation_stopped_mid_study_never_starts_and_the_other_finishes(tmp_path):
    # one trial at a time: whichever ablation Tune starts first runs; the other is asked to stop meanwhile
    ablations = {"first": {"grid": {"trainer.lr": [3.0e-5]}}, "second": {"grid": {"trainer.lr": [5.0e-5]}}}
    study_file, uri = tiny_study(
        tmp_path, "stopping", {"max_steps": 40, "eval_steps": 20, "log_every": 10}, ablations,
        resources={"workers_per_trial": 0, "cpus_per_worker": 1}, concurrency=1,
        system_metrics_interval_s=None,
    )  # fmt: skip
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    client, running = MlflowClient(uri), None
    while running is None:  # a trial's run is open: the driver's watch has started (it clears requests)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        experiment = client.get_experiment_by_name("stopping")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        running = next((r for r in runs if "clsr.ablation" in r.data.tags), None)
        time.sleep(0.2)
    started = running.data.tags["clsr.ablation"]
    stopped = next(name for name in ablations if name != started)
    request_stop(client, running.data.tags["mlflow.parentRunId"], stopped)  # as `platform study stop` does
    output, _ = proc.communicate(timeout=900)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    assert proc.returncode == 0, output[-3000:]
    assert "stopped by stop_request" in output

    _, parents, children = runs_of(uri, "stopping")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "KILLED" and parent.data.tags["clsr.status"] == "stopped"
    assert parent.data.tags[HOLD_TAG] == f"platform study stop: ablation(s) {stopped}"
    # the running ablation's trial finished; the stopped one's never opened a run
    assert [(c.data.tags["clsr.ablation"], c.info.status, c.data.tags["clsr.status"]) for c in children] == [
        (started, "FINISHED", "finished")
    ]
    assert "test_sts16" in children[0].data.metrics
