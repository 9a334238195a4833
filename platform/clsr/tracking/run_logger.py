"""Metrics from inside a trial, sent to an MLflow run that the study driver opened, through a journal
(``clsr.tracking.spool``) so that a tracking-server outage never costs a trial or its numbers.

MLflow is imported only when there is a run to log to: the trainer (and ``platform bench train``)
also runs where MLflow is not installed, e.g. on a GPU machine that gets only the code and its data.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

DRAIN_S = 30.0  # how long a finished trial waits for MLflow before leaving its writes to the driver


class RunLogger:
    """A trial's MLflow writes, journaled (``Spool``) and sent in the background: per-step metrics are
    buffered and sent one request per flush. Nothing here waits on MLflow or raises when it is down."""

    def __init__(self, tracking: dict[str, Any] | None):
        self.run_id = (tracking or {}).get("run_id")
        self.spool: Any = None
        self.pending_root = (tracking or {}).get("pending_root")
        self.buffer: list[tuple[str, float, int, int]] = []
        self.system: Any = None
        if not self.run_id:
            return
        from clsr.tracking.spool import Spool
        from clsr.tracking.system_metrics import SystemMetrics

        self.spool = Spool(tracking["uri"], self.run_id).start()
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
        return self.spool is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.spool is None:
            return
        now = int(time.time() * 1000)  # the point's timestamp is fixed now: a replay is a duplicate
        self.buffer += [(k, float(v), now, step) for k, v in metrics.items() if v is not None]

    def flush(self) -> None:
        if self.spool is not None and self.buffer:
            self.spool.metrics(self.buffer)
            self.buffer = []

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.spool is not None:
            self.spool.tags(tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact, e.g. ``"method/table.csv"``."""
        if self.spool is not None:
            self.spool.text(text, artifact_file)

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_path``)."""
        if self.spool is not None:
            self.spool.artifacts(local_path, artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local folder into the run's artifacts (under ``artifact_path``)."""
        if self.spool is not None:
            self.spool.artifacts(local_dir, artifact_path)

    def save_to(self, checkpoint: Path) -> None:
        """What has not reached MLflow yet goes into the checkpoint (a retried trial sends it)."""
        if self.spool is not None:
            self.flush()
            self.spool.save_to(checkpoint)

    def load_from(self, checkpoint: Path) -> None:
        if self.spool is not None:
            self.spool.load_from(checkpoint)

    def close(self, wait_s: float = DRAIN_S) -> int:
        """Send what is left, waiting up to ``wait_s``; the rest goes to the study's storage for the
        study driver. Returns the number of writes handed over (0: all reached MLflow)."""
        if self.spool is None:
            return 0
        self.flush()
        left = self.spool.close(wait_s, self.pending_root)
        self.spool = None
        return left
