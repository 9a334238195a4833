"""Resilience under scale: a diverging trial fails in MLflow with its error while the study goes on and a
lost Ray Train worker is retried from its last checkpoint (one study: each study started costs about a
minute of CI), and a study whose MLflow server is unreachable stops before any training."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from pathlib import Path

import pytest
import ray
import yaml

from clsr.cli import main
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.support.models import save_tiny_bert
from tests.support.stores import sqlite_uri

pytestmark = pytest.mark.e2e


def test_unreachable_mlflow_fails_before_ray_starts(monkeypatch, capfd):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    assert main(["study", "run", "studies/smoke.yaml"]) != 0
    message = capfd.readouterr().err  # the driver child's, on the command's stderr
    assert "MLflow tracking server http://127.0.0.1:9 is unreachable" in message
    assert "mlflow server" in message  # says what to do
    assert not ray.is_initialized()


TINY_STS_PAIRS = 200


def tiny_study(
    tmp_path: Path, name: str, trainer: dict, ablations: dict, dev_tasks=("stsb",), **top
) -> tuple[Path, str]:
    """A simcse_unsup study on a tiny random BERT (1 Ray Train worker per trial) written to tmp_path;
    returns the file and the MLflow URI to run it with."""
    study = {
        "name": name,
        "method": "simcse_unsup",
        "base": {
            "model": {"name": save_tiny_bert(tmp_path / "tiny-bert", dropout=0.0), "max_seq_length": 16},
            "data": {"train": "wiki1m", "max_rows": 8 * trainer["max_steps"]},
            "trainer": {"batch_size": 8, **trainer},
            # a seeded 200 pairs of each STS set: the full STS-B dev set was about half of a trial's time
            "eval": {
                "dev_tasks": list(dev_tasks),
                "tasks": ["sts16"],
                "alignment_uniformity": False,
                "sts_max_pairs": TINY_STS_PAIRS,
            },
        },
        "ablations": ablations,
        "seeds": [1],
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1},
        "max_failures": 1,
        "storage_path": str(tmp_path / "runs"),
        **top,
    }
    study["base"]["model"]["pooling"] = "avg"
    study["base"]["eval"]["log_model"] = False
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path, sqlite_uri(tmp_path / "mlflow.db")


def run_in_process(tmp_path: Path, name: str, trainer: dict, ablations: dict, **top) -> tuple[Path, str, str]:
    """A tiny study of in-process trials (two at once, no system metrics) run to its end through the
    ``platform`` command: its file, MLflow URI and output."""
    study_file, uri = tiny_study(
        tmp_path, name, trainer, ablations, resources={"workers_per_trial": 0, "cpus_per_worker": 1},
        concurrency=2, system_metrics_interval_s=None, **top,
    )  # fmt: skip
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    return study_file, uri, output


def kill_train_workers(command_pid: int) -> int:
    """SIGKILL the Ray Train workers of the study started by ``command_pid`` (its local Ray's processes
    are its descendants), never another Ray's on this machine; how many were killed."""
    import psutil

    killed = 0
    for process in psutil.Process(command_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            if any("RayTrainWorker" in part for part in process.cmdline()):
                process.kill()
                killed += 1
    return killed


def test_a_diverging_trial_fails_alone_and_a_lost_worker_is_retried_from_its_last_checkpoint(tmp_path):
    """Three trials of Ray Train workers, one at a time, which Ray Train would retry twice. One diverges:
    it fails with its error and is not retried (a NaN is reported, not retried). The worker of the first
    that learns is killed after its first checkpoint: ``FailureConfig`` starts a new worker group, which
    resumes from that checkpoint, and the trial finishes. The study goes on past the failure and exits 1.
    With ``trainer.deterministic`` (and dropout on), the resumed trial ends on the weights (their digest)
    and metrics of the third, never interrupted, of the same settings (issue 55)."""
    # AdamW moves every weight by about lr at the first step: 1e30 overflows the next forward pass
    # the diverging one logs every step, so its first step's point shows whether it ran twice
    grid = {"lr": {"points": [
        {"label": "diverges", "set": {"trainer.lr": 1.0e30, "trainer.log_every": 1}},
        {"label": "learns", "set": {"trainer.lr": 3.0e-5}},
        {"label": "learns again", "set": {"trainer.lr": 3.0e-5, "trainer.checkpoint_upload": "sync"}},
    ]}}  # fmt: skip
    trainer = {"max_steps": 60, "eval_steps": 10, "log_every": 5, "deterministic": True}
    # no dev set (loss_avg as the metric): checkpoints come quickly
    study_file, uri = tiny_study(
        tmp_path, "resilience", trainer, grid, (), metric="loss_avg", mode="min", concurrency=1,
        max_failures=2, system_metrics_interval_s=2,
    )  # fmt: skip
    study = yaml.safe_load(study_file.read_text())
    study["base"]["model"]["dropout"] = 0.1  # the tiny BERT's 0.0: the resumed trial draws masks too
    study_file.write_text(yaml.safe_dump(study, sort_keys=False))
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    deadline = time.time() + 600
    while not list((tmp_path / "runs").glob("**/checkpoint_*")):  # Ray Train persisted a checkpoint
        assert proc.poll() is None and time.time() < deadline, "the trial ended before its first checkpoint"
        time.sleep(0.2)
    time.sleep(3)  # Ray Train registers a reported checkpoint when it next polls the worker
    killed = kill_train_workers(proc.pid)
    output, _ = proc.communicate(timeout=900)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    assert killed, "no Ray Train worker process to kill"
    assert proc.returncode == 1, output[-3000:]  # a failed trial: non-zero exit, after the other finished

    client, parents, children = runs_of(uri, "resilience")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    by_point = {c.data.tags["clsr.point"]: c for c in children}
    assert sorted(by_point) == ["diverges", "learns", "learns again"]
    diverged = by_point["diverges"]
    # one of the two that learn ran first and was killed: the other ran whole
    trial, whole = sorted((by_point["learns"], by_point["learns again"]), key=lambda c: c.info.start_time)
    assert diverged.info.status == "FAILED" and diverged.data.tags["clsr.status"] == "failed"
    assert re.search(
        r"loss became (nan|-?inf) at step \d+; lower trainer.lr", diverged.data.tags["clsr.error"]
    )
    steps = [m.step for m in client.get_metric_history(diverged.info.run_id, "loss")]
    assert steps.count(1) == 1  # its first step was logged, once: no retry
    assert not client.get_metric_history(diverged.info.run_id, "resumed_from_step")

    assert trial.info.status == "FINISHED" and trial.data.tags["clsr.status"] == "finished"
    assert "test_sts16" in trial.data.metrics
    resumed = client.get_metric_history(trial.info.run_id, "resumed_from_step")
    assert len(resumed) == 1 and resumed[0].value > 0  # from the checkpoint, not from step 0
    steps = [m.step for m in client.get_metric_history(trial.info.run_id, "loss")]
    assert max(steps) == 60 and steps.count(1) == 1  # the first steps ran once
    assert whole.info.status == "FINISHED" and not client.get_metric_history(
        whole.info.run_id, "resumed_from_step"
    )
    assert same_weights_and_metrics(client, trial, whole)
    # MLflow system metrics sampled on the worker's machine every 2 s, and the trial's mean
    assert client.get_metric_history(trial.info.run_id, "system/cpu_utilization_percentage")
    assert 0 < trial.data.metrics["trial_cpu_utilization_mean"] <= 100


def same_weights_and_metrics(client, a, b) -> bool:
    """Two trial runs ended on the same weights (``clsr.weights_sha256``) with the same value at every
    logged step, the timings and the resume's own marker aside (``clsr_bench.determinism.UNSHARED``). A
    resumed run may hold a step twice (the points sent after the checkpoint it resumed from: a killed
    worker's async upload had not registered the newer one); the repeat must carry the same value."""
    from clsr_bench.determinism import UNSHARED

    def histories(run) -> dict[str, list[tuple[int, float]]]:
        found = {}
        for key in (k for k in run.data.metrics if not UNSHARED.fullmatch(k)):
            points = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)}
            assert len({step for step, _ in points}) == len(points), key  # a repeated step, another value
            found[key] = sorted(points)
        return found

    digest = a.data.tags["clsr.weights_sha256"]
    assert len(digest) == 64 and digest == b.data.tags["clsr.weights_sha256"]
    resumed, whole = histories(a), histories(b)
    assert "test_sts16" in resumed and [step for step, _ in resumed["loss"]] == list(range(1, 61))
    assert resumed == whole
    return True
