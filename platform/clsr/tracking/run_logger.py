"""Metrics from inside a trial, sent to an MLflow run that the study driver opened, through a journal
(``clsr.tracking.spool``) so that a tracking-server outage never costs a trial or its numbers.

Per-step points of a training trial are committed with the checkpoint that covers their step
(``commit_at_checkpoints``): they are held here and given to the journal when a checkpoint is saved
(``save_to``) or the trial ends. Why: a trial interrupted after its step-4 checkpoint and resumed from it
logs steps 5, 6, ... again, with new values and timestamps (MLflow keeps both). Had the interrupted
attempt sent them, the run would hold those steps twice, and the curve would not be the trajectory of
the model that finished. Recognising replayed steps instead would keep the interrupted attempt's points
(a trajectory that was thrown away) and would need MLflow to answer at start-up. The cost: MLflow shows a
training trial's points at each checkpoint rather than at each log window, and what a trial logged after
its last checkpoint is dropped when it fails in a way that is retried or resumed (the next attempt logs
those steps again); a trial that ends (finished, or failed for good) sends them.

MLflow is imported only when there is a run to log to: the trainer (and ``platform bench train``)
also runs where MLflow is not installed, e.g. on a GPU machine that gets only the code and its data.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DRAIN_S = 30.0  # how long a finished trial waits for MLflow before leaving its writes to the driver
MAX_HELD_POINTS = 100_000  # ~15 MB; past it points are committed early (a resume may then repeat them)


@dataclass(frozen=True)
class TrackingTarget:
    """Where a trial's writes go: its MLflow run on ``uri``; ``pending_root``: the study's storage, where
    what MLflow has not taken is left for the driver; ``commit_at_checkpoints``: points reach the journal
    with the checkpoint that covers their step (off under an early-stopping scheduler, which may end a
    trial at an evaluation that writes no checkpoint)."""

    uri: str
    run_id: str
    system_metrics_interval_s: float | None = None
    pending_root: str | None = None
    commit_at_checkpoints: bool = True


class RunLogger:
    """A trial's MLflow writes, journaled (``Spool``) and sent in the background: per-step metrics are
    held and given to the journal in one request per ``flush``, or, with ``commit_at_checkpoints``, per
    checkpoint (``save_to``) and at the end (``close``). Nothing here waits on MLflow or raises when it is
    down, nor when the local disk is full (a warning, once: artifacts are then not logged)."""

    def __init__(self, tracking: TrackingTarget | None, commit_at_checkpoints: bool = False):
        self.run_id = tracking.run_id if tracking is not None else None
        self.spool: Any = None
        self.pending_root = tracking.pending_root if tracking is not None else None
        self.commit_at_checkpoints = commit_at_checkpoints
        self.held: list[tuple[str, float, int, int]] = []  # logged, not given to the journal yet
        self.system: Any = None
        self._disk_warned = False
        if not self.run_id:
            return
        from clsr.tracking.spool import Spool
        from clsr.tracking.system_metrics import SystemMetrics

        self.spool = Spool(tracking.uri, self.run_id).start()
        if interval := tracking.system_metrics_interval_s:
            self.system = SystemMetrics(tracking.uri, self.run_id, interval)
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
        self.held += [(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        if len(self.held) > MAX_HELD_POINTS:  # a very long stretch without a checkpoint: bounded memory
            self.commit()

    def flush(self) -> None:
        """The end of a log window: its points go to the journal (with ``commit_at_checkpoints``, they
        wait for the next checkpoint instead)."""
        if not self.commit_at_checkpoints:
            self.commit()

    def commit(self) -> None:
        """The points logged so far go to the journal, to be sent."""
        if self.spool is not None and self.held:
            self.spool.metrics(self.held)
            self.held = []

    def log_params(self, params: dict[str, str]) -> None:
        """Params the trial learns as it runs (its data's identities); a param is written once: a retry
        that logs another value for it is refused by MLflow (warned), the first value stays."""
        if self.spool is not None:
            self.spool.params(params)

    def set_tags(self, tags: dict[str, Any]) -> None:
        if self.spool is not None:
            self.spool.tags(tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact, e.g. ``"method/table.csv"``."""
        if self.spool is not None:
            self.spool.text(text, artifact_file)

    def log_artifact(self, local_path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_path``)."""
        self.log_artifacts(local_path, artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Copy a local folder into the run's artifacts (under ``artifact_path``)."""
        if self.spool is not None:
            try:
                self.spool.artifacts(local_dir, artifact_path)
            except OSError as err:
                self._disk_failed(err, f"{os.fspath(local_dir)} is not logged")

    def save_to(self, checkpoint: Path) -> None:
        """What has not reached MLflow yet, the points logged so far included, goes into the checkpoint (a
        trial retried from it sends them). The points are committed only once the checkpoint is Tune's
        (``commit``, after ``session.report``): a trial stopped before Tune registered it resumes from the
        one before, and logs those steps again."""
        if self.spool is not None:
            try:
                self.spool.save_to(checkpoint, self.held)
            except OSError as err:  # sent from memory all the same; lost only if this trial dies too
                self._disk_failed(err, f"the checkpoint {checkpoint} holds no unsent MLflow writes")

    def _disk_failed(self, err: OSError, consequence: str) -> None:
        """A full or failing local disk: said once (not at every step); the trial goes on."""
        if not self._disk_warned:
            self._disk_warned = True
            warnings.warn(
                f"MLflow writes could not be kept on the local disk ({err}): {consequence}, nor any "
                "artifact that cannot be copied later; metrics are still sent",
                stacklevel=3,
            )

    def load_from(self, checkpoint: Path) -> None:
        if self.spool is not None:
            self.spool.load_from(checkpoint)

    def close(self, wait_s: float = DRAIN_S, keep_uncommitted: bool = True) -> int:
        """Send what is left, waiting up to ``wait_s``; the rest goes to the study's storage for the
        study driver. Returns the number of writes handed over (0: all reached MLflow).

        ``keep_uncommitted=False``: the points logged since the last checkpoint are dropped, for a
        trial that will be retried or resumed from that checkpoint (it logs those steps again)."""
        if self.spool is None:
            return 0
        if keep_uncommitted:
            self.commit()
        self.held = []
        spool, self.spool = self.spool, None
        try:
            return spool.close(wait_s, self.pending_root)
        except Exception as err:  # the study's storage failed: the writes are lost, the trial is not
            unsent = len(spool.unsent())
            warnings.warn(
                f"{unsent} MLflow write(s) could not be left in {self.pending_root}: {err!r}", stacklevel=2
            )
            return unsent
