"""``trainer.checkpoint_upload: async``: the session hands each checkpoint to Ray Train's background
upload and waits, before writing the next, until Ray has copied and removed the last one.

Ray's side (ordering, the copy, the removal, a restart from the last copied checkpoint) runs for real in
tests/e2e/test_distributed.py and tests/e2e/test_resilience.py; here ``ray.train.report`` is replaced by a fake
that copies in a thread, to show what the session does with the folder and when it waits."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import ray.train

from clsr.train.session import RayTrainSession


def fake_report(calls: list, copy_s: float):
    def report(metrics, checkpoint=None, checkpoint_upload_mode=None, **kwargs):
        calls.append((metrics["step"], checkpoint_upload_mode))
        if checkpoint is not None and checkpoint_upload_mode == ray.train.CheckpointUploadMode.ASYNC:
            # Ray's background upload: copied, then the local folder removed
            threading.Timer(copy_s, shutil.rmtree, args=(checkpoint.path,)).start()

    return report


def folder(tmp_path, name: str):
    path = tmp_path / name
    path.mkdir()
    (path / "state.pt").write_bytes(b"0" * 1000)
    return path


def test_async_hands_the_folder_over_and_waits_for_it_before_the_next(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(ray.train, "report", fake_report(calls, copy_s=0.5))
    session = RayTrainSession(upload_async=True)
    first = folder(tmp_path, "one")
    session.report({"step": 1}, first)
    assert first.exists()  # Ray's to remove once copied, not ours
    started = time.perf_counter()
    session.wait_for_upload()
    assert not first.exists() and time.perf_counter() - started >= 0.3
    session.report({"step": 2}, None)  # a report without a checkpoint changes nothing to wait for
    session.wait_for_upload()
    assert calls == [(1, ray.train.CheckpointUploadMode.ASYNC), (2, ray.train.CheckpointUploadMode.ASYNC)]


def test_sync_removes_the_folder_once_ray_has_copied_it(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(ray.train, "report", fake_report(calls, copy_s=0.0))
    session = RayTrainSession(upload_async=False)
    checkpoint = folder(tmp_path, "one")
    session.report({"step": 1}, checkpoint)
    assert not checkpoint.exists() and calls == [(1, None)]


def test_a_folder_ray_never_removes_is_waited_for_up_to_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(ray.train, "report", lambda metrics, **kwargs: None)  # never removes it
    session = RayTrainSession(upload_async=True)
    session.report({"step": 1}, folder(tmp_path, "one"))
    with pytest.warns(UserWarning, match="is still there after 0 s"):
        session.wait_for_upload(limit_s=0.2)
