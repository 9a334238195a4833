"""Metrics from inside a trial, sent to an MLflow run that the study driver opened.

MLflow is imported only when there is a run to log to: the trainer (and ``platform bench train``)
also runs where MLflow is not installed, e.g. on a GPU machine that gets only the code and its data.
"""

from __future__ import annotations

import os
import time
from typing import Any


class RunLogger:
    """Buffers per-step metrics and sends them in batches (one request per flush, not per step)."""

    def __init__(self, tracking: dict[str, Any] | None):
        self.run_id = (tracking or {}).get("run_id")
        self.client: Any = None
        self.buffer: list[Any] = []  # mlflow.entities.Metric
        self.system: Any = None
        if not self.run_id:
            return
        from mlflow.tracking import MlflowClient

        from clsr.tracking.system_metrics import SystemMetrics

        self.client = MlflowClient(tracking["uri"])
        if interval := tracking.get("system_metrics_interval_s"):
            self.system = SystemMetrics(tracking["uri"], self.run_id, interval)
            self.system.start()

    def stop_system_metrics(self) -> dict[str, float]:
        """Stop sampling the machine; the trial's utilisation means (empty without system metrics)."""
        summary = self.system.stop() if self.system is not None else {}
        self.system = None
        return summary

    @property
    def active(self) -> bool:
        """Whether anything logged here reaches an MLflow run."""
        return self.client is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.buffer += [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]

    def flush(self) -> None:
        if self.client is None or not self.buffer:
            return
        for start in range(0, len(self.buffer), 1000):  # MLflow's per-request metric limit
            self.client.log_batch(self.run_id, metrics=self.buffer[start : start + 1000])
        self.buffer = []

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.client is not None:
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, str(value))

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact, e.g. ``"method/table.csv"``."""
        if self.client is not None:
            self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_path``)."""
        if self.client is not None:
            self.client.log_artifact(self.run_id, str(local_path), artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local folder into the run's artifacts (under ``artifact_path``)."""
        if self.client is not None:
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
