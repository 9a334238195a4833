"""The live report: while a study runs, its driver rebuilds the study's report from the trials ended so
far and logs it on the parent run under ``report/`` (what ``platform study report`` writes there), marked
"partial: n of m trials" with its unsettled verdicts provisional (``rows.mark_partial``); at most every
``report.live_every`` and at each wave's end, then once more as the study ends (when a partial one was
logged: a study shorter than the interval adds no report to its end): without the mark when the study
ran all it planned, marked "stopped: n of m trials" when a signal, its budget, its time limit, `study
stop` or an error ended it first (a resume runs the rest).

It is the report's own code (``build_report``, ``write_report``), run in one daemon thread, so a
partial report is never logged after the final one. Each refresh reads the record once (the child runs,
the parent) plus the metric histories of the trials not finished: a finished trial's are read once and
kept (under its run's last opening); the final report reads them all again. The thread never fails or holds up the study: an error is a warning line and the next refresh
tries again, a refresh in progress when the study ends is waited for at most ``FINISH_S``, and nothing is
written once another driver holds the record (``still_ours``).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mlflow.tracking import MlflowClient

from clsr.study.analyse.plots import KeptHistories
from clsr.study.analyse.report import log_report, write_report
from clsr.study.analyse.rows import build_report, mark_partial
from clsr.study.plan.study_plan import StudyPlan
from clsr.study.record.extension import ExtensionRound, current_rounds
from clsr.study.spec.schema import Study
from clsr.tracking.escape import terminal
from clsr.tracking.secrets import mask_uri

FINISH_S = 60.0  # how long the study's end waits for the final report


def planned_trials(
    plan: StudyPlan,
    extensions: list[ExtensionRound] | tuple[ExtensionRound, ...] = (),
    searches: dict[str, int] | None = None,
) -> int:
    """The trials a plan runs (the report's m): its runnable grid trials, and each sampled ablation's
    ``num_samples`` and each confirmation's ``top_k`` configurations × their seeds (an adaptive
    ablation's first seeds: a report counts the trials it finds when they are more), and the ``samples``
    × seeds of each ``study extend`` round of an ablation's current search (``extensions``, ``searches``
    as ``run_waves`` has them: a round before the edited resume that searched it again is not run)."""
    study, sampled = plan.study, 0
    for name, ablation in study.ablations.items():
        if ablation.space:
            sampled += study.search.num_samples * len(study.seeds_of(name))
            rounds = current_rounds(extensions, name, searches or {})
            sampled += sum(r.samples for r in rounds) * len(study.seeds_of(name))
        elif ablation.confirm is not None:
            sampled += ablation.confirm.top_k * len(study.seeds_of(name))
    return len(plan.trials) + sampled


class LiveReport:
    """The report on the parent run, refreshed while the study runs (a daemon thread)."""

    def __init__(
        self, study: Study, uri: str, parent_run_id: str, planned: int, still_ours: Callable[[], bool]
    ):
        self.study, self.uri, self.parent_run_id, self.planned = study, uri, parent_run_id, planned
        self.still_ours = still_ours  # False once another driver took the study over: write nothing
        self.every_s = study.report.live_every_s or 0.0
        self.refreshes = 0  # partial reports logged (tests read it)
        self._kept: KeptHistories = {}
        self._wake = threading.Event()
        self._ending: bool | None = None  # set as the study ends: whether to write the final report
        self._stopped_by: str | None = None  # set as the study ends: why it did not run all it planned
        self._thread = threading.Thread(target=self._loop, name="clsr-live-report", daemon=True)

    @classmethod
    def of(
        cls, study: Study, uri: str, parent_run_id: str, planned: int, still_ours: Callable[[], bool]
    ) -> LiveReport:
        """Started, unless the study turned it off (``report.live_every: null``: then it does nothing)."""
        live = cls(study, uri, parent_run_id, planned, still_ours)
        if study.report.live_every_s is not None:
            live._thread.start()
        return live

    def wave_ended(self) -> None:
        """A refresh now (the thread's next one, without waiting out the interval)."""
        self._wake.set()

    def finish(self, final: bool = True, stopped_by: str | None = None, wait_s: float = FINISH_S) -> None:
        """The study ended: no further partial report; the final one written (unless ``final`` is False),
        marked stopped when ``stopped_by`` says why the study did not run all it planned, and waited for
        at most ``wait_s``. Never raises."""
        self._stopped_by = stopped_by
        self._ending = final
        if not self._thread.is_alive():  # turned off
            return
        self._wake.set()
        self._thread.join(wait_s)
        if final and self._thread.is_alive():
            print(
                f"warning: the report on the parent run may still be the partial one (its final one was "
                f"not logged within {wait_s:.0f} s); `platform study report` writes it"
            )

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            if self._ending is not None:
                if self._ending and (self.refreshes or self._report_logged()):
                    self.refresh(partial=False)
                return
            self.refresh(partial=True)

    def _report_logged(self) -> bool:
        """Whether the parent run holds a report (an earlier driver's partial one, before a resume)."""
        try:
            listed = MlflowClient(self.uri).list_artifacts(self.parent_run_id, "report")
        except Exception:  # noqa: BLE001 - unknown: written, to leave no partial report behind
            return True
        return any(f.path.endswith("report.json") for f in listed)

    def refresh(self, partial: bool) -> bool:
        """The report rebuilt and logged on the parent run; False (a warning line) when it could not be."""
        try:
            if not self.still_ours():
                return False
            client = MlflowClient(self.uri)
            report = build_report(self.study, client, self.parent_run_id, self.uri)
            if partial or self._stopped_by is not None:  # running, or stopped before it ran them all
                mark_partial(report, self.planned, self.study.report.live_every or "")
                report.partial = replace(report.partial, stopped_by=None if partial else self._stopped_by)
            with tempfile.TemporaryDirectory(prefix="clsr-live-report-") as folder:  # the final: all read
                files = write_report(report, client, Path(folder), self._kept if partial else None)
                if partial and self._ending is not None:  # the study ended meanwhile: the final one next
                    return False
                if not self.still_ours():
                    return False
                log_report(client, self.parent_run_id, files)
            self.refreshes += partial
            return True
        except Exception as err:  # noqa: BLE001 - the study goes on; the next refresh tries again
            what = "live report not refreshed" if partial else "the study's report not logged"
            print(f"warning: {what} ({type(err).__name__}: {terminal(mask_uri(str(err))[:200])})")
            return False
