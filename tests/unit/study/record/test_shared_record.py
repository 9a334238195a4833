"""A study's record on a tracking server shared with a lab: what a colleague with write access writes
(a parent run's storage tag, a planted parent run) never redirects a resume to storage the study file does
not name; the driver's own writes wait out a locked SQLite store; a Ray pointer file written by someone
else is not followed; and the study's process control imports one way only."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import clsr.study.record.lease as lease_module
import clsr.study.record.parent as record
from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_study
from clsr.study.record.lease import read_state
from clsr.tracking.study_runs import STORAGE_TAG, start_parent_run
from tests.support.stores import sqlite_uri

REPO_ROOT = Path(__file__).resolve().parents[4]


class Planted:
    """Unpickling this writes a file: what a crafted searcher state would run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A study recorded on a SQLite store by ``start_record`` and then left (its lease released)."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    study = load_study(REPO_ROOT / "studies" / "smoke.yaml", [("storage_path", str(tmp_path / "runs"))])
    current = fingerprint(study)
    parent_run_id, storage, lease = record.start_record(client, uri, study, "name: smoke", current)
    lease.release()
    client.set_terminated(parent_run_id, status="KILLED")
    return uri, client, study, current, parent_run_id, storage


def crafted_storage(tmp_path: Path, run_id: str) -> tuple[Path, Path]:
    """A folder holding a pickled Tune searcher state that runs code, and a journal that uploads ~/.ssh."""
    evil = tmp_path / "elsewhere" / "smoke-20260101-000000-abcdef"
    (evil / "grid").mkdir(parents=True)
    marker = tmp_path / "it-ran"
    (evil / "grid" / "searcher-state-2026.pkl").write_bytes(pickle.dumps(Planted(str(marker))))
    journal = evil / "spool" / run_id / f"000001-{'a' * 12}"
    (journal / "files").mkdir(parents=True)
    (journal / "journal.jsonl").write_text('{"op": "tags", "tags": {"planted": "yes"}}\n')
    return evil, marker


def test_a_storage_tag_pointing_elsewhere_stops_resume_and_sync(started, tmp_path):
    """Finding 1: the parent's clsr.storage tag is written by anyone with write access to the server."""
    uri, client, study, current, parent_run_id, storage = started
    evil, marker = crafted_storage(tmp_path, parent_run_id)
    client.set_tag(parent_run_id, STORAGE_TAG, str(evil))
    with pytest.raises(
        record.StorageMismatch, match=r"names storage '.*elsewhere.*', which is not a run folder"
    ):
        record.take_over(client, uri, study, "name: smoke", current, allow_changes=False)
    with pytest.raises(record.StorageMismatch, match=str(tmp_path / "runs")):
        record.sync_study(study)
    assert not marker.exists()
    assert "planted" not in client.get_run(parent_run_id).data.tags  # its journal was not replayed
    assert client.get_run(parent_run_id).info.status == "KILLED"  # nothing taken over


@pytest.mark.parametrize(
    "tag",
    [
        "{root}/../elsewhere/smoke-20260101-000000-abcdef",
        "{root}/smoke-20260101-000000-abcdef/../../elsewhere",
        "{root}/other-20260101-000000-abcdef",
        "{root}/smoke-20260101-000000-abcdef/grid",
        "{root}x/smoke-20260101-000000-abcdef",
        "s3://lab-bucket/smoke-20260101-000000-abcdef",
        "",
    ],
)
def test_only_a_run_folder_of_the_study_files_storage_is_taken(started, tag):
    uri, client, study, current, parent_run_id, storage = started
    root = record.storage_root(study)
    client.set_tag(parent_run_id, STORAGE_TAG, tag.format(root=root))
    with pytest.raises(record.StorageMismatch):
        record.recorded_storage(study, client.get_run(parent_run_id))
    client.set_tag(parent_run_id, STORAGE_TAG, storage)
    assert record.recorded_storage(study, client.get_run(parent_run_id)) == storage


def test_a_planted_newer_parent_run_is_not_the_one_resumed(started, tmp_path, monkeypatch):
    """Finding 1: a run tagged with the study's name, newer than the real one, but never leased."""
    uri, client, study, current, parent_run_id, storage = started
    # the planted run is watched for the stale limit before it is closed: 3 s here instead of 60
    for module, name, seconds in (
        (record, "STALE_S", 3.0),
        (record, "HEARTBEAT_S", 0.5),
        (lease_module, "HEARTBEAT_S", 0.5),
    ):
        monkeypatch.setattr(module, name, seconds)
    evil, marker = crafted_storage(tmp_path, parent_run_id)
    planted = start_parent_run(client, study.name, str(evil), "planted")
    client.set_tag(planted, "clsr.fingerprint", client.get_run(parent_run_id).data.tags["clsr.fingerprint"])
    assert record.study_parent(client, study, current).info.run_id == parent_run_id
    parent, resumed_storage, lease, skip, searches = record.take_over(client, uri, study, "", current, False)
    lease.release()
    assert (parent, resumed_storage, skip, searches) == (parent_run_id, storage, frozenset(), {})
    assert not marker.exists()


def test_resume_waits_for_an_earlier_attempts_writes_before_recording_its_own(started, monkeypatch):
    """Finding 12: a journal still pending when a resume starts (its run's KILLED end among it) would,
    sent later, overwrite what the resumed trial records: the resume refuses instead."""
    uri, client, study, current, parent_run_id, storage = started
    monkeypatch.setattr(record, "replay", lambda uri, storage: 1)  # the server refuses the journal
    study = study.model_copy(update={"tracking_wait_s": 0.0})
    with pytest.raises(ConnectionError, match=r"1 trial run\(s\) still have writes"):
        record.take_over(client, uri, study, "", current, False)
    assert read_state(client, parent_run_id).released  # let go for the next try


def test_a_ray_pointer_file_written_by_another_user_is_not_followed(tmp_path, monkeypatch):
    """Finding 6: /tmp/ray is world-writable on a shared server; a co-tenant's pointer names their Ray."""
    import socket

    from clsr.study.control import ray_session

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    os.chmod(ray_dir, 0o700)
    (ray_dir / "ray_current_cluster").write_text(address)
    try:
        assert ray_session.cluster_address() == address  # this user's own pointer, in a private folder
        os.chmod(ray_dir, 0o1777)  # like /tmp/ray when someone else made it: anyone may replace the file
        assert ray_session.cluster_address() is None
        os.chmod(ray_dir, 0o700)
        real_stat = os.stat
        monkeypatch.setattr(
            ray_session.os, "stat", lambda p, **kw: _owned_by(real_stat(p, **kw), os.getuid() + 1)
        )
        assert ray_session.cluster_address() is None  # written by another user
    finally:
        listener.close()


def _owned_by(stat: os.stat_result, uid: int) -> os.stat_result:
    fields = list(stat)
    fields[4] = uid
    return os.stat_result(fields)


def test_the_drivers_record_writes_wait_out_a_locked_sqlite_store(started):
    """Finding 12: SQLite answers 'database is locked' after its 20 s busy timeout while another process
    holds a write lock (a colleague's study on the same file); the driver's writes wait it out."""
    import sqlite3
    import threading
    import time

    from clsr.tracking.patient import PatientClient

    uri, client, study, current, parent_run_id, storage = started
    lock = sqlite3.connect(uri.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False)
    lock.execute("BEGIN EXCLUSIVE")
    threading.Timer(21, lambda: lock.execute("ROLLBACK")).start()
    started_at = time.monotonic()
    PatientClient(uri).set_tag(parent_run_id, "clsr.status", "interrupted")
    assert time.monotonic() - started_at > 20  # it did meet the lock
    assert client.get_run(parent_run_id).data.tags["clsr.status"] == "interrupted"
    lock.close()


def test_sync_sends_what_a_stopped_driver_left_and_closes_its_record(tmp_path, monkeypatch):
    """``platform study sync`` of a record left RUNNING by a driver that stopped with writes pending (its
    lease released): the writes are sent and the record closed; with a live driver it is refused."""
    from clsr.study.record.lease import LeaseHeld
    from clsr.tracking.spool import Spool, hand_over
    from clsr.tracking.study_runs import open_child_run

    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    study = load_study(REPO_ROOT / "studies" / "smoke.yaml", [("storage_path", str(tmp_path / "runs"))])
    parent, storage, lease = record.start_record(client, uri, study, "name: smoke", fingerprint(study))
    child = open_child_run(uri, parent, "temperature[x] seed=1", "t", {}, {})
    spool = Spool(uri, child, tmp_path / "journal")
    spool.tags({"clsr.status": "finished"})
    spool.terminate("FINISHED")
    hand_over(spool.unsent(), spool.folder, storage, child)

    with pytest.raises(LeaseHeld, match="is being run by pid"):  # its driver (this process) is alive
        record.sync_study(study)
    lease.release()  # the driver ended with its writes pending
    assert record.sync_study(study) == 0
    assert client.get_run(child).info.status == "FINISHED"
    assert client.get_run(child).data.tags["clsr.status"] == "finished"
    closed = client.get_run(parent)
    assert (closed.info.status, closed.data.tags["clsr.status"]) == ("KILLED", "interrupted")
