"""Resilience under scale: a diverging trial fails in MLflow with its error while the study goes on, a
lost Ray Train worker is retried from its last checkpoint, and a study whose MLflow server is
unreachable stops before any training."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import ray
import yaml

from clsr.cli import main
from conftest import save_tiny_bert
from test_e2e import platform_cmd, runs_of

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
    return path, f"sqlite:///{tmp_path / 'mlflow.db'}"


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


def test_a_diverging_trial_fails_with_its_error_and_the_study_goes_on(tmp_path):
    # AdamW moves every weight by about lr at the first step: 1e30 overflows the next forward pass
    grid = {"lr": {"grid": {"trainer.lr": [3.0e-5, 1.0e30]}}}
    trainer = {"max_steps": 4, "eval_steps": 2, "log_every": 1}
    # a Ray Train worker per trial, which Ray Train would retry twice: a NaN is reported, not retried
    study_file, uri = tiny_study(tmp_path, "resilience", trainer, grid, concurrency=1, max_failures=2)
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=900)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    assert proc.returncode == 1, output[-3000:]  # a failed trial: non-zero exit, after the others finished

    client, parents, children = runs_of(uri, "resilience")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    by_lr = {float(c.data.params["trainer.lr"]): c for c in children}
    assert sorted(by_lr) == [3.0e-5, 1.0e30]
    good, diverged = by_lr[3.0e-5], by_lr[1.0e30]
    assert good.info.status == "FINISHED" and good.data.tags["clsr.status"] == "finished"
    assert "test_sts16" in good.data.metrics
    assert diverged.info.status == "FAILED" and diverged.data.tags["clsr.status"] == "failed"
    assert re.search(
        r"loss became (nan|-?inf) at step \d+; lower trainer.lr", diverged.data.tags["clsr.error"]
    )
    steps = [m.step for m in client.get_metric_history(diverged.info.run_id, "loss")]
    assert steps.count(1) == 1  # its first step was logged, once: no retry
    assert not client.get_metric_history(diverged.info.run_id, "resumed_from_step")


def test_a_lost_worker_is_retried_from_its_last_checkpoint(tmp_path):
    """Kill the trial's Ray Train worker after its first checkpoint: ``FailureConfig`` starts a new
    worker group, which resumes from that checkpoint, and the trial finishes."""
    trainer = {"max_steps": 60, "eval_steps": 10, "log_every": 5}
    one = {"one": {"grid": {"method.temperature": [0.05]}}}
    # no dev set (loss_avg as the metric): checkpoints come quickly
    study_file, uri = tiny_study(
        tmp_path, "lost-worker", trainer, one, (), metric="loss_avg", mode="min", system_metrics_interval_s=2
    )
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    deadline = time.time() + 600
    while not list((tmp_path / "runs").glob("**/checkpoint_*")):  # Ray Train persisted a checkpoint
        assert proc.poll() is None and time.time() < deadline, "the trial ended before its first checkpoint"
        time.sleep(0.2)
    time.sleep(3)  # Ray Train registers a reported checkpoint when it next polls the worker
    killed = subprocess.run(["pkill", "-9", "-f", "RayTrainWorker"], check=False).returncode
    output, _ = proc.communicate(timeout=900)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    assert killed == 0, "no Ray Train worker process to kill"
    assert proc.returncode == 0, output[-3000:]

    client, _, children = runs_of(uri, "lost-worker")
    (trial,) = children
    assert trial.info.status == "FINISHED" and trial.data.tags["clsr.status"] == "finished"
    assert "test_sts16" in trial.data.metrics
    resumed = client.get_metric_history(trial.info.run_id, "resumed_from_step")
    assert len(resumed) == 1 and resumed[0].value > 0  # from the checkpoint, not from step 0
    steps = [m.step for m in client.get_metric_history(trial.info.run_id, "loss")]
    assert max(steps) == 60 and steps.count(1) == 1  # the first steps ran once
    # MLflow system metrics sampled on the worker's machine every 2 s, and the trial's mean
    assert client.get_metric_history(trial.info.run_id, "system/cpu_utilization_percentage")
    assert 0 < trial.data.metrics["trial_cpu_utilization_mean"] <= 100
