"""Per-trial utilisation: MLflow system metrics sampled into the trial's run, reduced to means."""

from __future__ import annotations

import time

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.tracking.run_logger import RunLogger, TrackingTarget
from clsr.tracking.system_metrics import summarise, visible_gpu_indices
from tests.support.stores import sqlite_uri


@pytest.fixture
def run(tmp_path) -> tuple[str, str]:
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("system-metrics", artifact_location=str(tmp_path / "artifacts"))
    return uri, client.create_run(experiment).info.run_id


def test_run_logger_samples_the_machine_into_the_run(run):
    uri, run_id = run
    logger = RunLogger(TrackingTarget(uri, run_id, system_metrics_interval_s=0.2))
    deadline = time.time() + 30
    while (
        time.time() < deadline
        and "system/cpu_utilization_percentage" not in MlflowClient(uri).get_run(run_id).data.metrics
    ):
        sum(i * i for i in range(200_000))  # keep a core busy while it samples
    summary = logger.stop_system_metrics()
    history = MlflowClient(uri).get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert history, "no system metrics were logged"
    assert 0 <= summary["trial_cpu_utilization_mean"] <= 100
    assert summary["trial_cpu_utilization_mean"] == pytest.approx(
        sum(m.value for m in history) / len(history)
    )
    assert logger.stop_system_metrics() == {}  # stopped once


def test_no_interval_no_sampling(run):
    uri, run_id = run
    logger = RunLogger(TrackingTarget(uri, run_id))
    assert logger.system is None and logger.stop_system_metrics() == {}


def test_summary_counts_only_this_process_gpus(run, monkeypatch):
    uri, run_id = run
    client = MlflowClient(uri)
    values = {"gpu_0_utilization_percentage": [10, 20], "gpu_1_utilization_percentage": [80, 100]}
    values |= {"gpu_0_memory_usage_megabytes": [500, 700], "gpu_1_memory_usage_megabytes": [9000, 12000]}
    metrics = [Metric(f"system/{k}", v, 0, step) for k, vs in values.items() for step, v in enumerate(vs)]
    client.log_batch(run_id, metrics=metrics)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert summarise(client, run_id) == {
        "trial_gpu_utilization_mean": 90.0,
        "trial_gpu_memory_peak_mb": 12000.0,
    }
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert summarise(client, run_id)["trial_gpu_utilization_mean"] == 52.5  # all GPUs: (10+20+80+100)/4


def test_visible_gpu_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpu_indices(8) == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5f1e")  # UUIDs: count every GPU logged
    assert visible_gpu_indices(2) == [0, 1]
