"""The study's record in MLflow: one driver holds it, it knows what the study was, and it closes telling
what happened.

``start_record`` opens a new parent run (refused while another driver runs the study, or while an
earlier run was killed without closing); ``take_over`` continues the latest one (refused when its
resolved trials changed, unless told to keep the unchanged ones); ``close_study`` sends what trials
kept for MLflow, closes the runs still open and the parent; ``sync_study`` finishes a record whose
driver could not.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clsr.study.control.driver_link import LEASE_LOST_EXIT
from clsr.study.plan.fingerprint import compare, fingerprint, overall
from clsr.study.plan.resolve import point_label
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.record import reader
from clsr.study.record.attempts import (
    pending_extensions,
    record_edit,
    recorded_fingerprint,
    recorded_study_file,
    search_versions,
)
from clsr.study.record.extension import ExtendRequest, record_extension
from clsr.study.record.lease import HEARTBEAT_S, STALE_S, Lease, LeaseHeld, LeaseLost, leased, watch
from clsr.study.record.parent_summary import log_parent_summary
from clsr.study.record.runs_view import log_trials_view
from clsr.study.record.summary import resolved_summary, summary_rows
from clsr.study.spec.schema import Study
from clsr.tracking.patient import PatientClient
from clsr.tracking.retry import call_with_retry
from clsr.tracking.secrets import mask_uri
from clsr.tracking.spool import replay_pending
from clsr.tracking.study_runs import (
    ALSO_TAG,
    FINGERPRINT_TAG,
    STORAGE_TAG,
    TRIAL_TAG,
    check_reachable,
    children,
    close_run,
    open_children,
    parent_runs,
    record_skipped,
    resolve_tracking_uri,
    run_labels,
    start_parent_run,
)


class NoEarlierRun(LookupError):
    """``platform study resume`` of a study MLflow has no run of."""


class StudyChanged(RuntimeError):
    """``platform study resume`` of a file whose resolved trials differ from the recorded ones."""


class UnclosedRun(RuntimeError):
    """``platform study run`` of a study whose last driver was killed: resume it."""


class EarlierRecord(RuntimeError):
    """``platform study run`` of a study that already has a record: report it, resume it, or ``--new``."""


class StorageMismatch(RuntimeError):
    """A parent run whose storage tag is not one of the study file's own run folders."""


@dataclass
class StudyOutcome:
    """What a study run ended with: one row per trial, and why it stopped if it did not finish."""

    rows: list[dict[str, Any]]
    stopped_by: str | None = None  # SIGINT, SIGTERM, study_timeout
    exit_code: int = 0
    pending_records: int = 0  # trials whose MLflow writes wait in storage (the server stayed down)


def storage_root(study: Study) -> str:
    if "://" in study.storage_path:
        return study.storage_path
    return str(Path(study.storage_path).resolve())


def new_storage(study: Study) -> str:
    """A fresh storage folder per run: time for people, a random suffix so two runs never share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{storage_root(study).rstrip('/')}/{study.name}-{stamp}-{uuid.uuid4().hex[:6]}"


def recorded_storage(study: Study, parent) -> str:
    """The storage folder of a parent run, built from the study file's ``storage_path``: the parent's
    ``clsr.storage`` tag is anyone's to write on a shared tracking server, so it only names which of the
    study's own folders (``<name>-<time>-<suffix>``) the run used; a tag naming anything else stops here.
    Resume restores Tune's pickled state from that folder and replays its journals: it is trusted code."""
    tagged = parent.data.tags.get(STORAGE_TAG, "")
    root = storage_root(study).rstrip("/")
    folder = tagged.rsplit("/", 1)[-1]
    pattern = re.escape(study.name) + r"-\d{8}-\d{6}-[0-9a-f]{6}"
    if tagged != mask_uri(f"{root}/{folder}") or not re.fullmatch(pattern, folder):
        raise StorageMismatch(
            f"study {study.name!r}: MLflow run {parent.info.run_id} names storage {mask_uri(tagged)!r}, "
            f"which is not a run folder of the study file's storage_path {mask_uri(root)!r} "
            f"({study.name}-<time>-<suffix>); storage is taken from the study file only: set storage_path "
            f"to the folder the study ran in (a moved folder), or start a new record with `platform study run`"
        )
    return f"{root}/{folder}"


def study_parent(client, study: Study, current: dict[str, str]):
    """The parent run a resume continues: the one reader of the record decides (leased runs first)."""
    return reader.study_parent(client, study.name, overall(current))


def start_record(
    client,
    uri: str,
    study: Study,
    study_text: str,
    current: dict[str, str],
    new: bool = False,
    command_pid: Callable[[], int] = os.getpid,
):
    """A new parent run holding the study's lease; refused while another driver runs the study, while
    an earlier run was killed without closing (resume it), or, unless ``new``, when the study already
    has a record (a rerun would hide it from the report)."""
    for run in parent_runs(client, study.name, running=True):
        refuse_open_parent(client, uri, study, run)
    # a closed record (a RUNNING one that appeared meanwhile is a rival: handled below)
    # (one no driver leased ran nothing: closed above by close_unleased, it is no record to keep)
    recent = parent_runs(client, study.name, max_results=5)
    taken = leased(client, recent)
    closed = [r for r in recent if r.info.status != "RUNNING" and r.info.run_id in taken]
    if closed and not new:
        raise EarlierRecord(earlier_record_message(study, closed[0]))
    storage = new_storage(study)
    parent_run_id = start_parent_run(client, study.name, storage, study.description)
    client.set_tag(parent_run_id, FINGERPRINT_TAG, overall(current))
    lease = Lease(uri, parent_run_id, study.name, command_pid)
    lease.take_first()
    # A driver that started the same study at the same moment: each one that sees another RUNNING
    # parent gives way (both may, never neither: the later one always sees the earlier one's run).
    rivals = [
        r.info.run_id for r in parent_runs(client, study.name, running=True) if r.info.run_id != parent_run_id
    ]
    if rivals:
        lease.discard(client)
        client.delete_run(parent_run_id)
        raise LeaseHeld(
            f"study {study.name!r} was started by another driver at the same moment (MLflow run "
            f"{rivals[0]}); this one stopped before running anything: wait for it, or stop it and resume"
        )
    client.log_text(parent_run_id, study.masked(study_text), "study.yaml")
    log_trials_view(client, client.get_run(parent_run_id).info.experiment_id, study, parent_run_id)
    summary = yaml.safe_dump(resolved_summary(study), sort_keys=False)
    client.log_text(parent_run_id, mask_uri(summary), "resolved.yaml")
    client.log_dict(parent_run_id, current, "fingerprint.json")
    return parent_run_id, storage, lease


def earlier_record_message(study: Study, run) -> str:
    """What a rerun would do to the study's record, and the three ways on."""
    status = run.data.tags.get("clsr.status") or run.info.status.lower()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.info.start_time / 1000))
    return (
        f"study {study.name!r} already has a record (MLflow run {run.info.run_id}, {status}, started "
        f"{started}): `platform study report` shows it; `platform study resume` continues it (finished "
        f"trials are kept); `platform study run --new` starts another record, which the report then shows"
    )


def refuse_open_parent(client, uri: str, study: Study, run) -> None:
    """Raise for a RUNNING parent run of the study: LeaseHeld while its driver is alive (its heartbeat
    changes within a short watch), UnclosedRun when it is gone."""
    run_id = run.info.run_id
    try:
        state = watch(client, run_id, watch_s=2 * HEARTBEAT_S + 1)
    except LeaseHeld as err:
        raise LeaseHeld(Lease(uri, run_id, study.name).held_message(str(err))) from None
    if not state.running:  # it closed meanwhile: not in the way
        return
    if state.generation == 0 and close_unleased(client, study, run_id):
        return
    if not state.free_now():  # unchanged over two heartbeats: most likely gone, maybe paused
        raise UnclosedRun(
            f"an earlier run of study {study.name!r} (MLflow run {run_id}) is still open, and its driver "
            f"({state.describe()}) did not renew its lease over {2 * HEARTBEAT_S + 1:.0f} s: if it was "
            f"killed, `platform study resume` continues it once the lease has been unchanged for "
            f"{STALE_S:.0f} s, and closes what it left RUNNING"
        )
    raise UnclosedRun(
        f"an earlier run of study {study.name!r} (MLflow run {run_id}) stopped without "
        f"closing (its driver was killed); `platform study resume` continues it and closes what it "
        f"left RUNNING"
    )


def close_unleased(client, study: Study, run_id: str) -> bool:
    """A parent run whose driver stopped between creating it and taking its lease (Ctrl-C, a crash): it
    ran nothing. Closed once it has been watched unchanged for the stale limit; True when it was."""
    try:
        state = watch(client, run_id, watch_s=STALE_S, say=print)
    except LeaseHeld:
        return False
    if state.generation or not state.running:
        return False
    client.set_tag(run_id, "clsr.status", "interrupted")
    client.set_tag(
        run_id, "clsr.error", "its driver stopped before it took the study's lease: it ran nothing"
    )
    client.set_terminated(run_id, status="KILLED")
    print(f"closed MLflow run {run_id} of study {study.name!r}: its driver stopped before it ran anything")
    return True


def refuse_live_rivals(client, uri: str, study: Study, parent_run_id: str) -> None:
    """Raise LeaseHeld when a driver runs another record of the study (a run started from an edited
    file, or starting right now); a record whose driver is gone is not in the way of this one."""
    for run in parent_runs(client, study.name, running=True):
        if run.info.run_id != parent_run_id:
            with contextlib.suppress(UnclosedRun):
                refuse_open_parent(client, uri, study, run)


def take_over(
    client,
    uri: str,
    study: Study,
    study_text: str,
    current: dict[str, str],
    allow_changes: bool,
    command_pid: Callable[[], int] = os.getpid,
    extend: ExtendRequest | None = None,
):
    """The study's parent run, its lease taken (a killed driver's stale one too), the trial keys old
    experiments must not run (an edited resume: their new versions run in a new wave), and the sampled
    ablations searched again since the study started, each with the attempt that started its search.
    ``extend``: recorded as this attempt's extension (``study extend``); an edit of its ablation's space
    narrows its search (its finished trials kept) instead of starting it again."""
    parent = study_parent(client, study, current)
    if parent is None:
        raise NoEarlierRun(
            f"no earlier run of study {study.name!r} in MLflow at {mask_uri(uri)}; use `platform study run`"
        )
    parent_run_id, storage = parent.info.run_id, recorded_storage(study, parent)
    recorded = recorded_fingerprint(client, parent_run_id)
    if not recorded:  # its first driver stopped before recording one (start_record), so before any trial
        print(f"note: study {study.name!r} ran nothing before it stopped; recording this file's fingerprint")
        client.log_dict(parent_run_id, current, "fingerprint.json")
        recorded = current
    changes = compare(recorded, current)
    if changes and not allow_changes:
        narrowing = [extend.ablation] if extend else sorted(pending_extensions(client, parent_run_id))
        raise StudyChanged(
            f"study {study.name!r} changed since it was started; its trials would mix two versions:\n  "
            + "\n  ".join(changes.describe())
            + f"\neither revert the file to the recorded one (MLflow run {parent_run_id}, artifact "
            f"{recorded_study_file(client, parent_run_id)}), or resume with --allow-changes: finished trials that "
            f"did not change are kept, changed and added ones run as a new wave, changed and removed "
            f"ones are marked superseded (an edited sampled ablation is searched again"
            + (
                f"; {', '.join(narrowing)}, being extended, keeps its finished trials inside its space)"
                if narrowing
                else ")"
            )
        )
    refuse_live_rivals(client, uri, study, parent_run_id)
    lease = Lease(uri, parent_run_id, study.name, command_pid)
    attempt = lease.acquire()
    client.update_run(parent_run_id, status="RUNNING")
    lease.check(client)  # another driver could take a closed run's lease until it was RUNNING again
    client.set_tag(parent_run_id, "clsr.status", "running")
    log_trials_view(client, parent.info.experiment_id, study, parent_run_id)  # the parent resumed now
    # an earlier attempt's writes (a run's end among them) go first: sent later, they would overwrite
    # what this attempt records
    pending = wait_for_tracking(uri, storage, study.tracking_wait_s)
    lease.check(client)
    if pending:
        lease.release()
        raise ConnectionError(
            f"study {study.name!r}: {pending} trial run(s) still have writes the tracking server did not "
            f"take; resume once MLflow at {mask_uri(uri)} answers (`platform study sync` sends them)"
        )
    closed = [r.info.run_id for r in open_children(client, parent_run_id)]
    for run_id in closed:  # left RUNNING by a driver that was killed: they resume from checkpoints
        close_run(uri, run_id, "interrupted", "the study's driver stopped without closing this run")
    if closed:
        print(f"closed {len(closed)} run(s) a stopped driver had left RUNNING; their trials resume")
    # the extension first: a driver killed before it records the edit leaves a pending extension, which
    # the next resume records the edit for (its search narrowed, never started again beside the old one)
    if extend is not None:
        record_extension(
            client, parent_run_id, extend.ablation, extend.samples, attempt, edited=bool(changes)
        )
    extending = frozenset([extend.ablation] if extend else []) | pending_extensions(client, parent_run_id)
    skip = record_edit(
        client, study, study_text, parent_run_id, recorded, current, changes, attempt, extending
    )
    sampled = any(a.space for a in study.ablations.values())
    return (parent_run_id, storage, lease, skip, search_versions(client, parent_run_id) if sampled else {})


def attach_labels(client, run, trial: TrialSpec) -> None:
    """Let a run stand for every point of ``trial`` (one of identical trials) it does not yet."""
    tags = run.data.tags
    have = {tuple(label) for label in run_labels(tags)}
    wanted = [[trial.ablation, trial.label], *trial.also]
    added = [list(label) for label in wanted if tuple(label) not in have]
    if added:
        also = [list(label) for label in run_labels(tags)[1:]] + added
        client.set_tag(run.info.run_id, ALSO_TAG, json.dumps(also, ensure_ascii=False))
        print(f"{tags.get(TRIAL_TAG)} also stands for " + ", ".join(f"{a}[{p}]" for a, p in added))


def replay(uri: str, storage: str) -> int:
    """Send what trials could not send to MLflow (their journals in the study's storage)."""
    sent, left = replay_pending(uri, storage)
    if sent:
        print(f"sent {sent} MLflow write(s) that trials had kept while the tracking server was unreachable")
    return len(left)


def give_up(client, uri: str, parent_run_id: str, reason: str | None, lease: Lease) -> None:
    """The record of a study whose driver hangs after a signal: what did not finish is interrupted
    (nothing, when another driver has taken the study over)."""
    lease.check(client)
    close_unfinished(client, uri, parent_run_id, reason)
    lease.release()


def close_unfinished(client, uri: str, parent_run_id: str, reason: str | None, error: str = "") -> None:
    """A study no driver will close: open trial runs and the parent interrupted (timed out) by
    ``reason``, or, with none, failed with ``error``."""
    close_open_children(client, uri, parent_run_id, reason)
    if reason:
        client.set_tag(
            parent_run_id, "clsr.status", "timed_out" if reason == "study_timeout" else "interrupted"
        )
        client.set_terminated(parent_run_id, status="KILLED")
    else:
        client.set_tag(parent_run_id, "clsr.status", "failed")
        client.set_tag(parent_run_id, "clsr.error", error)
        client.set_terminated(parent_run_id, status="FAILED")


def close_study(
    client,
    uri: str,
    parent_run_id: str,
    storage: str,
    study: Study,
    stop: tuple[str | None, int],
    status: str,
    lease: Lease,
) -> StudyOutcome:
    """Send what trials left, close the runs still open (interrupted, or stopped early by the
    scheduler), close the parent, and sum up; ``stop``: why the study stopped (None: it did not) and
    the exit status that goes with it. Runs under a second Ctrl-C without stopping halfway. Writes
    nothing once another driver has taken the study over (this one was paused past the stale limit)."""
    reason, exit_code = stop
    try:
        lease.check(client)
    except LeaseLost:
        return StudyOutcome([], "lease_lost", LEASE_LOST_EXIT)
    pending = wait_for_tracking(uri, storage, study.tracking_wait_s)
    if pending:  # the lease goes stale; `platform study sync` (or resume) finishes the record
        return StudyOutcome([], reason, exit_code or 1, pending)
    try:  # again: that wait may have been long (a partition), and another driver may have taken over
        lease.check(client)
    except LeaseLost:
        return StudyOutcome([], "lease_lost", LEASE_LOST_EXIT)
    close_open_children(client, uri, parent_run_id, reason, study.scheduler.type != "fifo")
    rows = summary_rows(children(client, parent_run_id), study)
    if status == "FINISHED" and reason is None and all_failed(rows):  # nothing to report: say so
        status = "FAILED"
    ended = {None: "finished", "study_timeout": "timed_out", "budget": "stopped", "stop_request": "stopped"}
    state = "failed" if status == "FAILED" else ended.get(reason)
    log_parent_summary(client, parent_run_id, study, rows)
    client.set_tag(parent_run_id, "clsr.trials", str(len(rows)))
    client.set_tag(parent_run_id, "clsr.status", state or "interrupted")
    client.set_terminated(parent_run_id, status=status)
    return StudyOutcome(rows, reason, exit_code, 0)


def all_failed(rows: list[dict[str, Any]]) -> bool:
    """No trial finished or was stopped early, and some failed (skipped ones never ran)."""
    statuses = {row["status"] for row in rows}
    return "failed" in statuses and not statuses & {"finished", "stopped"}


def close_lost_trials(client, uri: str, parent_run_id: str, lost: dict[str, str]) -> None:
    """Trials Tune ended in error (trial key -> its error) whose runs are still RUNNING: their driver died
    without recording (a lost node, a killed process). Closed failed now, before anything else can take
    them for early-stopped ones. With MLflow unreachable they stay open: the study's end closes them."""
    if not lost:
        return
    try:
        for run in open_children(client, parent_run_id):
            error = lost.get(run.data.tags.get(TRIAL_TAG, ""))
            if error is not None:
                close_run(uri, run.info.run_id, "failed", error)
    except Exception as err:  # an MLflow outage must not stop the study; the end of the study closes them
        print(f"warning: could not close {len(lost)} lost trial run(s) yet: {mask_uri(str(err))[:300]}")


def close_open_children(
    client, uri: str, parent_run_id: str, reason: str | None, early_stopping: bool = False
) -> None:
    """Runs still RUNNING once no trial runs: interrupted (or timed out with the study); when nothing
    interrupted the study, stopped early by the scheduler (ASHA, HyperBand, median), or else failed: a
    trial whose driver ended without recording how (its process or node lost past every retry) never
    counts as finished."""
    if reason:
        leftover = "timed_out" if reason == "study_timeout" else "interrupted"
        why = f"stopped by {reason}"
    elif early_stopping:
        leftover, why = "stopped", None
    else:
        leftover = "failed"
        why = "the trial ended without recording an outcome (its driver or node was lost); see Ray's logs"
    for run in open_children(client, parent_run_id):
        close_run(uri, run.info.run_id, leftover, why)


def sync_study(study: Study) -> int:
    """``platform study sync``: send what trials kept while MLflow was unreachable; close a study whose
    driver could not (its lease is stale). Returns the number of trial runs still pending."""
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    client = PatientClient(uri)
    parent = study_parent(client, study, fingerprint(study))
    if parent is None:
        raise NoEarlierRun(f"no run of study {study.name!r} in MLflow at {mask_uri(uri)}")
    storage = recorded_storage(study, parent)
    if parent.info.status != "RUNNING":
        return replay(uri, storage)
    lease = Lease(uri, parent.info.run_id, study.name)
    lease.acquire()  # a live driver sends and closes its own record (LeaseHeld says who it is)
    try:  # with the lease: a driver that comes back finds it taken and writes nothing
        left = replay(uri, storage)
        if not left:
            lease.check(client)
            close_open_children(client, uri, parent.info.run_id, "SIGKILL")
            client.set_tag(parent.info.run_id, "clsr.status", "interrupted")
            client.set_terminated(parent.info.run_id, status="KILLED")
            print(
                f"closed study {study.name!r}: its driver had stopped; `platform study resume` continues it"
            )
    finally:
        lease.release()
    return left


class PendingWrites(ConnectionError):
    """Trial runs whose kept writes MLflow did not take (it did not answer): transient, so retried."""

    def __init__(self, runs: int):
        super().__init__(f"{runs} trial run(s) have writes to send")
        self.runs = runs


def wait_for_tracking(uri: str, storage: str, wait_s: float) -> int:
    """Replay the trials' kept writes until MLflow takes them all, retried by the platform's policy
    (``clsr.tracking.retry``) for up to ``wait_s``; returns the number of runs still pending."""

    def replayed() -> int:
        if left := replay(uri, storage):
            raise PendingWrites(left)
        return 0

    try:
        return call_with_retry(
            replayed, patience_s=wait_s, what=f"sending trials' kept writes to {mask_uri(uri)}"
        )
    except PendingWrites as err:
        return err.runs


def skip_blocked(uri: str, parent_run_id: str, blocked: list[tuple[TrialSpec, str]]) -> None:
    """Trials whose upstream trials failed: a child run that says why (status skipped)."""
    for trial, reason in blocked:
        label = trial.label or point_label(trial.overrides)
        print(f"skipped: ablations.{trial.ablation}[{label}] seed {trial.seed}: {reason}")
        record_skipped(uri, parent_run_id, trial.ablation, label, trial.seed, reason)
