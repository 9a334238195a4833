"""The driver's watch over a running study's ``budget:`` and ``platform study stop`` requests.

Every ``POLL_S`` the driver reads the record: the parent run's stop request, and its trial runs (what
they spent, how many failed). Once the budget allows no further trial, or the whole study is asked to
stop, it tags the parent with the reason (``clsr.stop_reason``): each trial reads that as it starts and
does not run (Tune records it errored, so a resume runs it), the trials already running finish, and
when none is left running the study stops the way a signal stops it (``Interrupts.stop_for``), its
record closed KILLED with the reason. An ablation asked to stop is held the same way, alone: the
other ablations go on, and the study closes stopped once they are done.
"""

from __future__ import annotations

import threading
import time

from mlflow.tracking import MlflowClient

from clsr.study.control.budget import next_trial_s, over_budget, prior_seconds, spent, trial_times
from clsr.study.control.interrupt import Interrupts
from clsr.study.control.stop_request import HOLD_TAG, STOP_TAG, read_request
from clsr.study.plan.projection import gpus_per_trial
from clsr.study.spec.schema import Study
from clsr.tracking.escape import terminal
from clsr.tracking.patient import PatientClient
from clsr.tracking.study_runs import children

POLL_S = 10.0  # between reads of the record (tests shorten it)
CLOSE_S = 30.0  # how long closing waits for a poll in progress
BUDGET, STOP_REQUEST = "budget", "stop_request"  # the reasons a study stops by, as Interrupts records them


class StudyWatch:
    """While the study runs: its budget kept and stop requests obeyed (a daemon thread)."""

    def __init__(self, study: Study, uri: str, parent_run_id: str, interrupts: Interrupts):
        self.study, self.uri, self.parent_run_id, self.interrupts = study, uri, parent_run_id, interrupts
        self.hold: tuple[str, str] | None = None  # (BUDGET or STOP_REQUEST, the line why)
        self.stopped_ablations: frozenset[str] = frozenset()
        self.started = time.monotonic()
        self.prior: tuple[float, str] | None = None  # the plan's seconds a trial, projected once
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="clsr-watch", daemon=True)

    def start(self) -> StudyWatch:
        """A new driver's requests start empty: an earlier driver's stop (a resume) is not this one's.
        The record not answering (past the driver's patience) is a warning, never the driver's end."""
        try:
            client = PatientClient(self.uri)
            tags = client.get_run(self.parent_run_id).data.tags
            for tag in (STOP_TAG, HOLD_TAG):
                if tag in tags:
                    client.delete_tag(self.parent_run_id, tag)
        except Exception as err:  # noqa: BLE001 - an earlier stop request may then stand
            print(
                f"warning: could not clear an earlier driver's stop request ({type(err).__name__}: "
                f"{terminal(str(err)[:200])})"
            )
        self._thread.start()
        return self

    def close(self) -> None:
        """No further poll; a poll in progress ends first (its hold or stop is not written after the
        study's record), unless the record does not answer within ``CLOSE_S``."""
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_S)

    def _loop(self) -> None:
        while not self._done.wait(POLL_S):
            try:
                self.poll()
            except Exception as err:  # noqa: BLE001 - an MLflow outage: the next poll tries again
                print(f"warning: budget/stop check skipped ({type(err).__name__}: {str(err)[:200]})")

    def poll(self) -> None:
        """One look at the record: hold the study, or an ablation, if it must stop; stop the study once
        it is held and no trial runs. The trial runs are read only when a budget or a hold needs them."""
        client = MlflowClient(self.uri)
        request = read_request(client.get_run(self.parent_run_id).data.tags)
        if request.ablations - self.stopped_ablations:
            self.stopped_ablations = request.ablations
            print(f"{terminal(request.describe())}: its trials not yet started will not run")
        needed = self.hold is not None or request.whole or self.study.budget.limited
        runs = children(client, self.parent_run_id) if needed else []
        if self.hold is None:
            why = request.describe() if request.whole else self._over_budget(runs)
            if why is not None:
                self.hold = (STOP_REQUEST if request.whole else BUDGET, why)
                client.set_tag(self.parent_run_id, HOLD_TAG, why)
                print(f"{terminal(why)}: no more trials are launched; the running ones finish")
        if self.hold is not None and not any(r.info.status == "RUNNING" for r in runs):
            self.interrupts.stop_for(self.hold[0])

    def _over_budget(self, runs: list) -> str | None:
        if not self.study.budget.limited:
            return None
        gpus = gpus_per_trial(self.study)
        used = spent(trial_times(runs, int(time.time() * 1000)), time.monotonic() - self.started, gpus)
        if self.prior is None and not used.finished_s and self._projected_needed():
            self.prior = prior_seconds(self.study)
            print(f"budget: the next trial's cost before any trial finished: {self.prior[1]}")
        return over_budget(self.study, used, next_trial_s(used, (self.prior or (0.0, ""))[0]), gpus)

    def _projected_needed(self) -> bool:
        return self.study.budget.gpu_hours is not None or self.study.budget.wall is not None

    def settle(self, client) -> str | None:
        """At the study's end, when nothing stopped it: the reason it still did not run all it planned
        (a trial held back by the budget; the study or an ablation asked to stop, read once more: a
        trial reads a request as it starts, the watch only at its next poll), its line tagged on the
        parent; or None."""
        try:
            request = read_request(client.get_run(self.parent_run_id).data.tags)
        except Exception:  # noqa: BLE001 - MLflow down: what the last poll saw
            request = read_request({})
        stopped = self.stopped_ablations | request.ablations
        why = self.hold or (
            (STOP_REQUEST, request.describe())
            if request.whole
            else (STOP_REQUEST, read_request({STOP_TAG: ",".join(stopped)}).describe())
            if stopped
            else None
        )
        if why is None:
            return None
        try:
            client.set_tag(self.parent_run_id, HOLD_TAG, why[1])
        except Exception as err:  # noqa: BLE001 - the parent's status still says it stopped
            print(f"warning: could not tag why the study stopped ({type(err).__name__})")
        return why[0]
