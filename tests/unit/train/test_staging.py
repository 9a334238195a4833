"""Checkpoint staging folders left by a killed process are removed by the next one on that host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from clsr.train.staging import staging_folder

# a trial process: stage a checkpoint folder, fill it, then hang inside "report" until it is killed
TRIAL = """
import sys, time
from clsr.train.staging import staging_folder
folder = staging_folder(sys.argv[1])
(folder / "state.pt").write_bytes(b"0" * 1_000_000)
print(folder, flush=True)
time.sleep(600)
"""


def _killed_trial_folder(kind: str, tmp_path) -> str:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    trial = subprocess.Popen([sys.executable, "-c", TRIAL, kind], env=env, stdout=subprocess.PIPE, text=True)
    folder = trial.stdout.readline().strip()
    trial.send_signal(signal.SIGKILL)  # as Tune ends a pruned trial's actor: no finally, no atexit
    trial.wait(timeout=30)
    trial.stdout.close()
    return folder


@pytest.mark.parametrize("kind", ["ckpt", "restore"])
def test_a_killed_trials_folder_is_swept_and_a_live_ones_kept(tmp_path, monkeypatch, kind):
    dead = _killed_trial_folder(kind, tmp_path)
    assert os.path.isfile(os.path.join(dead, "state.pt"))  # left behind by the kill
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = staging_folder(kind)  # this process's own folder: kept by the next sweep
    assert not os.path.exists(dead)
    other = staging_folder(kind)
    assert live.is_dir() and other.is_dir() and live != other
    staged = tmp_path / f"clsr-{os.getuid()}" / "staging"
    assert sorted(p.name for p in staged.iterdir()) == sorted([live.name, other.name])


def test_another_kind_and_foreign_folders_are_left_alone(tmp_path, monkeypatch):
    dead_restore = _killed_trial_folder("restore", tmp_path)
    foreign = tmp_path / f"clsr-{os.getuid()}" / "staging" / "ckpt-notapid"
    foreign.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    staging_folder("ckpt")
    assert os.path.isdir(dead_restore) and foreign.is_dir()


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="allowed ckpt, restore"):
        staging_folder("spool")
