"""The MLflow write journal (``clsr.tracking.spool``) and a trial's logger, on a real MLflow store: a
journal read back from a checkpoint or the study's storage is untrusted input (others write there too),
a torn journal costs nothing that follows it, the spool forgets what it sent and sweeps what killed
trials left behind, a full disk is one warning, and a resumed trial's history holds each step once."""

from __future__ import annotations

import builtins
import contextlib
import errno
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from clsr.tracking.run_logger import RunLogger, TrackingTarget
from clsr.tracking.spool import Spool, hand_over, pending_runs, replay_pending

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on port 9


def history(client: MlflowClient, run_id: str, key: str = "loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def all_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += all_artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def pending_journal(storage: Path, run_id: str, entries: list[dict], tail: str = "") -> Path:
    """A run's first pending journal, ``<storage>/spool/<run>/000001-<uuid>/journal.jsonl``, as another
    writer of the storage may have left it (``tail``: bytes after its last entry)."""
    folder = storage / "spool" / run_id / f"000001-{'e' * 12}"
    (folder / "files").mkdir(parents=True)
    (folder / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries) + tail)
    return folder


@contextlib.contextmanager
def warned(word: str) -> Iterator[None]:
    """The block warns with ``word`` in a message (checked after the block's own assertions)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert any(word in str(w.message) for w in caught), [str(w.message) for w in caught]


def stored_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


# --- 4: a journal names files inside its own folder only ------------------------------------------------


def test_a_restored_journal_cannot_write_outside_the_spool_folder(store, tmp_path):
    uri, client, run_id = store
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "x").mkdir(parents=True)
    (checkpoint / "x" / "planted.sh").write_text("echo owned\n")
    (checkpoint / "spool" / "files").mkdir(parents=True)
    entries = [
        {"op": "artifacts", "file": "../../x/planted.sh", "artifact_path": None},
        {"op": "metrics", "points": [["loss", 1.0, 1000, 1]]},
    ]
    (checkpoint / "spool" / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (tmp_path / "trial" / "x").mkdir(parents=True)  # <spool folder>/files/../../x

    spool = Spool(uri, run_id, tmp_path / "trial" / "spool")
    with warned("refused"):
        spool.load_from(checkpoint)
        assert not (tmp_path / "trial" / "x" / "planted.sh").exists()
    assert spool.start().drain(60)
    assert history(client, run_id) == [(1, 1.0)]  # the rest of the journal still counts
    assert all_artifacts(client, run_id) == []


def test_a_pending_journal_cannot_upload_a_local_folder(store, tmp_path):
    uri, client, run_id = store
    secret = tmp_path / "home" / ".aws"
    secret.mkdir(parents=True)
    (secret / "credentials").write_text("[default]\naws_secret_access_key = SECRET\n")
    storage = tmp_path / "storage"
    folder = pending_journal(
        storage,
        run_id,
        [
            {"op": "artifacts", "file": str(secret), "artifact_path": "absolute"},
            {"op": "artifacts", "file": "0123456789ab-aws", "artifact_path": "linked"},
            {"op": "metrics", "points": [["loss", 1.0, 1000, 1]]},
        ],
    )
    (folder / "files" / "0123456789ab-aws").symlink_to(secret)  # the same through a link in the storage

    with warned("refused"):
        sent, left = replay_pending(uri, str(storage))
        assert all_artifacts(client, run_id) == []
    assert history(client, run_id) == [(1, 1.0)]
    assert left == [] and pending_runs(str(storage)) == []  # refused writes are not retried forever
    assert str(secret).encode() in stored_bytes(storage)  # the journal is kept for a person to look at


def test_text_artifacts_stay_inside_their_run(store, tmp_path):
    uri, client, run_id = store
    storage = tmp_path / "storage"
    pending_journal(
        storage,
        run_id,
        [
            {"op": "text", "text": "owned", "file": "../../../outside.txt"},
            {"op": "text", "text": "owned", "file": str(tmp_path / "absolute.txt")},
            {"op": "artifacts", "file": "0123456789ab-x", "artifact_path": "../up"},
            {"op": "text", "text": "a,b\n", "file": "method/table.csv"},
            {"op": "terminate", "status": "FINISHED", "end_time": 2000},
        ],
    )
    with warned("refused"):
        assert replay_pending(uri, str(storage))[1] == []
        assert not list(tmp_path.glob("**/outside.txt")) and not (tmp_path / "absolute.txt").exists()
    assert all_artifacts(client, run_id) == ["method/table.csv"]
    assert client.get_run(run_id).info.status == "FINISHED"  # what follows a refused write is sent


# --- 5: a torn journal loses nothing after it -----------------------------------------------------------


def test_a_torn_journal_does_not_cost_the_trials_ending(store, tmp_path):
    """A trial's hand-over whose last line cannot be read (the storage is anyone's to write); the driver's
    last writes came after it. The run ends finished, and the torn bytes stay in the storage for a person."""
    uri, client, run_id = store
    storage = tmp_path / "storage"
    torn = '{"op": "metrics", "points": [["loss", 2.0, 2000'
    pending_journal(storage, run_id, [{"op": "metrics", "points": [["loss", 1.0, 1000, 1]]}], tail=torn)
    driver = Spool(UNREACHABLE, run_id, tmp_path / "driver")
    driver.tags({"clsr.status": "finished"})
    driver.terminate("FINISHED")
    hand_over(driver.unsent(), driver.folder, str(storage), run_id)

    with warned("unreadable"):
        replay_pending(uri, str(storage))
        run = client.get_run(run_id)
        assert (run.info.status, run.data.tags["clsr.status"]) == ("FINISHED", "finished")
    assert history(client, run_id) == [(1, 1.0)]
    assert torn.encode() in stored_bytes(storage)
    assert pending_runs(str(storage)) == []  # kept aside, not replayed at every driver start


def test_the_drivers_last_writes_follow_the_trials_own(store, tmp_path):
    from clsr.tracking.study_runs import finish_child

    uri, client, run_id = store
    storage = str(tmp_path / "storage")
    for n in range(11):  # more hand-overs than one digit counts
        trial = Spool(UNREACHABLE, run_id, tmp_path / f"trial-{n}").start()
        trial.metrics([("loss", float(n), 1000 + n, n)])
        trial.tags({"who": f"trial {n}", "clsr.status": "running"})
        assert trial.close(wait_s=0.2, pending_root=storage) == 2
    finish_child(UNREACHABLE, run_id, "finished", storage, tags={"who": "driver"}, wait_s=0.2)
    assert replay_pending(uri, storage) == (24, [])
    run = client.get_run(run_id)
    assert (run.info.status, run.data.tags["clsr.status"], run.data.tags["who"]) == (
        "FINISHED",
        "finished",
        "driver",
    )
    assert [s for s, _ in history(client, run_id)] == list(range(11))
    assert pending_runs(storage) == []


def test_a_hand_over_still_being_written_is_neither_replayed_nor_deleted(store, tmp_path):
    """A driver killed while it handed writes over leaves a folder with its files but no journal yet, or
    only the journal's temporary file: the replay sends the complete hand-over and leaves those alone."""
    uri, client, run_id = store
    storage = tmp_path / "storage"
    hand_over([{"op": "metrics", "points": [["loss", 1.0, 1000, 1]]}], tmp_path, str(storage), run_id)
    run_folder = storage / "spool" / run_id
    files_only = run_folder / f"000002-{'a' * 12}"
    (files_only / "files").mkdir(parents=True)
    (files_only / "files" / "model.txt").write_text("uploaded before its journal")
    temporary_only = run_folder / f"000003-{'b' * 12}"
    temporary_only.mkdir()
    torn = '{"op": "tags", "tags": {"clsr.status": "finished"}}\n{"op": "termi'
    (temporary_only / f"journal.jsonl.{'c' * 12}.tmp").write_text(torn)

    assert replay_pending(uri, str(storage)) == (1, [])
    assert history(client, run_id) == [(1, 1.0)]
    assert client.get_run(run_id).info.status == "RUNNING"  # nothing of the unfinished hand-overs sent
    assert sorted(p.name for p in run_folder.iterdir()) == [files_only.name, temporary_only.name]
    assert (files_only / "files" / "model.txt").read_text() == "uploaded before its journal"
    assert (temporary_only / f"journal.jsonl.{'c' * 12}.tmp").read_text() == torn
    assert pending_runs(str(storage)) == []  # no complete journal is waiting


# --- 10: the spool forgets what it sent and sweeps what killed trials left --------------------------------


def test_sent_writes_leave_the_spools_memory(store, tmp_path):
    uri, client, run_id = store
    probe = float("0.123456789")  # one object: each point that still holds it counts in its references
    before = sys.getrefcount(probe)
    spool = Spool(uri, run_id, tmp_path / "journal").start()
    for step in range(200):
        spool.metrics([("loss", probe, 1000 + step, step)])
    assert spool.drain(60) and spool.sent == 200 and spool.unsent() == []
    gc.collect()
    assert sys.getrefcount(probe) - before < 5
    assert len(history(client, run_id)) == 200


def test_a_killed_trials_spool_folder_is_swept_by_the_next_spool(store, tmp_path, monkeypatch):
    uri, client, run_id = store
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = (
        "import os, sys\nfrom clsr.tracking.spool import Spool\n"
        "print(Spool(sys.argv[1], sys.argv[2]).folder, flush=True)\nos.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.run(
        [sys.executable, "-c", code, uri, run_id], capture_output=True, text=True, env=env
    )
    left = Path(killed.stdout.strip())
    assert killed.returncode == -9 and left.parent == tmp_path and left.is_dir(), killed.stderr
    alive = Spool(uri, run_id)  # this process's own folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    link = tmp_path / f"{left.name}link"  # a dead owner's name, but a link: never followed
    link.symlink_to(elsewhere)
    others = tmp_path / f"{left.name}other"
    others.mkdir()
    if os.getuid() == 0:  # another user's folder (only root can make one here)
        os.chown(others, 65534, 65534)

    Spool(uri, run_id)
    assert not left.exists()
    assert alive.folder.is_dir() and link.is_symlink() and (elsewhere / "keep").exists()
    assert others.exists() == (os.getuid() == 0)


def test_a_full_disk_is_one_warning_and_the_points_still_reach_mlflow(store, tmp_path, monkeypatch):
    uri, client, run_id = store
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    real_open, real_copy2 = builtins.open, shutil.copy2

    def full(path: Path) -> None:
        if "clsr-spool-" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def open_on_full_disk(file, mode="r", *args, **kwargs):
        if set(mode) & set("wax+"):
            full(file)
        return real_open(file, mode, *args, **kwargs)

    def copy_on_full_disk(source, target, *args, **kwargs):
        full(target)
        return real_copy2(source, target, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_on_full_disk)
    monkeypatch.setattr(shutil, "copy2", copy_on_full_disk)
    (tmp_path / "table.csv").write_text("a,b\n")
    logger = RunLogger(TrackingTarget(uri, run_id, pending_root=str(tmp_path / "storage")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 51):
            logger.log({"loss": 1.0 / step}, step)
            logger.flush()
        logger.log_artifact(tmp_path / "table.csv", "method")
        logger.log_artifact(tmp_path / "table.csv", "method")
        assert logger.close(wait_s=60) == 0
    messages = [str(w.message) for w in caught]
    assert len([m for m in messages if "No space left" in m]) == 1, messages
    assert [step for step, _ in history(client, run_id)] == list(range(1, 51))


# --- 11: a resumed trial's history holds each step once ---------------------------------------------------


def test_a_trial_resumed_from_its_checkpoint_logs_each_step_once(store, tmp_path, monkeypatch):
    """Steps 1-8 logged, the checkpoint at 4, the trial killed after 8 (no close): the resumed attempt logs
    5-8 again, and the record holds each step once, with the resumed attempt's values."""
    uri, client, run_id = store
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tracking = TrackingTarget(uri, run_id, pending_root=str(tmp_path / "storage"))
    first = RunLogger(tracking, commit_at_checkpoints=True)
    checkpoint = tmp_path / "step_4"
    checkpoint.mkdir()
    for step in range(1, 9):
        first.log({"loss": 1.0 / step}, step)
        if step % 2 == 0:
            first.flush()
        if step == 4:
            first.save_to(checkpoint)
    assert first.spool.drain(60)  # whatever it gave its journal has reached MLflow; then it is killed

    resumed = RunLogger(tracking, commit_at_checkpoints=True)
    resumed.load_from(checkpoint)
    for step in range(5, 9):
        resumed.log({"loss": 0.5 / step}, step)
        if step % 2 == 0:
            resumed.flush()
    assert resumed.close(wait_s=60) == 0
    first_attempt, resumed_attempt = range(1, 5), range(5, 9)
    assert history(client, run_id) == [(s, 1.0 / s) for s in first_attempt] + [
        (s, 0.5 / s) for s in resumed_attempt
    ]


def test_a_trial_that_ends_for_good_keeps_its_last_points_and_one_that_is_retried_does_not(store, tmp_path):
    uri, client, run_id = store
    ends = RunLogger(TrackingTarget(uri, run_id), commit_at_checkpoints=True)
    ends.log({"loss": 1.0}, 1)
    assert ends.close(wait_s=60, keep_uncommitted=True) == 0
    retried = RunLogger(TrackingTarget(uri, run_id), commit_at_checkpoints=True)
    retried.log({"loss": 2.0}, 2)  # after its last checkpoint: the retry logs step 2 again
    assert retried.close(wait_s=60, keep_uncommitted=False) == 0
    assert history(client, run_id) == [(1, 1.0)]


def test_the_loop_and_the_worker_agree_on_which_failures_are_final():
    from clsr.train.outcome import FINAL_FAILURES
    from clsr.train.worker import NON_RETRYABLE

    assert set(FINAL_FAILURES) == set(NON_RETRYABLE)


def tiny_trial(**trainer):
    from clsr.config.trial import TrialConfig

    return TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 64},
            "trainer": {"batch_size": 8, "lr": 1e-4, **trainer},
            "method": {"name": "simcse_sup"},
            "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False, "log_model": False},
        }
    )


def test_an_interrupted_trial_resumed_by_the_loop_logs_each_step_once(data_dir, store, tmp_path):
    """The trainer loop itself: interrupted (Ctrl-C) at the step-6 evaluation, two steps after its step-4
    checkpoint, then resumed from that checkpoint; ``loss`` holds steps 1-8 once each."""
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    class InterruptedAtStep6(LocalSession):
        def report(self, metrics, checkpoint_dir=None):
            if metrics.get("step") == 6:
                raise KeyboardInterrupt
            super().report(metrics, checkpoint_dir)

    uri, client, run_id = store
    trial = tiny_trial(max_steps=8, eval_steps=2, checkpoint_every=2, log_every=1)
    tracking = TrackingTarget(uri, run_id, pending_root=str(tmp_path / "storage"))
    first = InterruptedAtStep6(tmp_path / "first")
    with pytest.raises(KeyboardInterrupt):
        fit(trial, first, tracking)
    assert first.latest == tmp_path / "first" / "step_4"
    resumed = LocalSession(tmp_path / "resumed")
    resumed.latest = first.latest
    fit(trial, resumed, tracking)
    assert [step for step, _ in history(client, run_id)] == list(range(1, 9))
