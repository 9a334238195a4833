"""Rule 1: everything the platform writes on a node lives in one private per-user folder, created
exclusively, mode 0700, never followed through a link (``clsr.runtime_dir``). The co-tenant's attacks of
issue 52: a pre-made SLURM head folder, a link planted as the s3 driver log, a staging sweep across
owners and pid namespaces, and the local Ray in the shared /tmp/ray."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clsr import runtime_dir
from tests.security.rule123_cotenant import (
    as_cotenant,
    have_cotenant,
    private_name,
    shared_tmp,
    start_local_ray,
)


@pytest.fixture()
def shared(monkeypatch):
    with shared_tmp(monkeypatch) as folder:
        yield folder


def test_the_private_folder_is_made_0700_and_exclusive(shared):
    folder = runtime_dir.root()
    assert folder == shared / private_name()
    info = os.lstat(folder)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    runtime_dir.subfolder(folder, "ray", fresh=True)
    with pytest.raises(FileExistsError):
        runtime_dir.subfolder(folder, "ray", fresh=True)


def test_a_link_or_a_folder_others_can_write_is_refused(shared, tmp_path):
    (shared / private_name()).symlink_to(tmp_path)
    with pytest.raises(runtime_dir.UnsafeFolder, match="a link"):
        runtime_dir.root()
    (shared / private_name()).unlink()
    (shared / private_name()).mkdir()
    (shared / private_name()).chmod(0o777)
    with pytest.raises(runtime_dir.UnsafeFolder, match="writable by others"):
        runtime_dir.root()


def test_a_cotenants_premade_private_folder_is_refused(shared):
    as_cotenant(f"mkdir -m 777 {shared}/{private_name()}")
    with pytest.raises(runtime_dir.UnsafeFolder, match="not this user"):
        runtime_dir.scratch()


def test_a_premade_slurm_head_folder_is_refused_by_the_node(shared, monkeypatch):
    """The co-tenant makes the job's predictable head folder first, with its own Ray's address in it."""
    from clsr.cluster import slurm_node

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    as_cotenant(
        f"mkdir -m 777 {shared}/{private_name()} {shared}/{private_name()}/4242-0 "
        f"&& echo 10.6.6.6:6379 > {shared}/{private_name()}/4242-0/address"
    )
    with pytest.raises(runtime_dir.UnsafeFolder):
        slurm_node.run_node("head", 1, 0, str(shared), ip="127.0.0.1")


def test_the_batch_script_does_not_join_the_ray_a_cotenants_folder_names(tmp_path, monkeypatch):
    """Even when the head's own start fails, the script reads no address from a folder another user made."""
    from tests.unit.cluster import test_sbatch
    from tests.unit.cluster.test_sbatch import run_fake, write

    # the head's step fails at once, as slurm-node does in a folder another user made
    monkeypatch.setitem(test_sbatch.FAKES, "srun", 'echo "srun $*" >> "$FAKE_LOG"\nexit 1\n')

    if not have_cotenant():
        pytest.skip("a co-tenant is another Unix user: runuser needs root")
    import shutil
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="clsr-sb-", dir="/tmp"))
    try:
        short.chmod(0o1777)
        as_cotenant(f"mkdir -m 777 {short}/{private_name()} && mkdir -m 777 {short}/{private_name()}/4242-0")
        as_cotenant(f"echo 10.6.6.6:6379 > {short}/{private_name()}/4242-0/address")
        code, output, calls = run_fake(tmp_path, write(tmp_path, "--tmp", str(short)))
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert code == 1 and "not this user's private folder" in output
    assert not [call for call in calls if call.startswith("platform study")]


def test_the_s3_driver_log_is_private_and_never_follows_a_link(shared, tmp_path):
    from clsr.study.run.progress import DriverLog, log_path

    victim = tmp_path / "bashrc"
    victim.write_text("# mine\n")
    # the old place, named in the clsr.storage tag: a co-tenant's link there is no longer looked at
    (shared / "clsr-study-1").mkdir()
    (shared / "clsr-study-1" / "driver.log").symlink_to(victim)
    path = log_path("s3://bucket/runs/study-1")
    assert path.is_relative_to(runtime_dir.root()) and path.parent.stat().st_mode & 0o077 == 0
    # and a link at the new place (only this user could make one) is refused, not followed
    path.symlink_to(victim)
    log = DriverLog(echo=lambda line: None)
    with pytest.raises(OSError):
        log.open(path)
    assert victim.read_text() == "# mine\n"
    path.unlink()
    log.open(path)
    log.write("a line")
    assert "a line" in path.read_text() and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_s3_driver_log_is_refused_in_a_cotenants_folder(shared):
    from clsr.study.run.progress import log_path

    as_cotenant(f"mkdir -m 777 {shared}/{private_name()}")
    with pytest.raises(runtime_dir.UnsafeFolder):
        log_path("s3://bucket/runs/study-1")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_staging_sweep_spares_another_pid_namespace(shared):
    from clsr.train import staging

    root = runtime_dir.subfolder(runtime_dir.scratch(), "staging")
    prefix, pid, namespace = f"ckpt-{staging._host()}-", _dead_pid(), runtime_dir.pid_namespace()
    other_container = root / f"{prefix}{pid}-{namespace + 1}-abc"  # the same pid in another container
    own_dead = root / f"{prefix}{pid}-{namespace}-abc"
    other_container.mkdir()
    own_dead.mkdir()
    staging.staging_folder("ckpt")
    assert other_container.is_dir() and not own_dead.exists()


def test_the_staging_sweep_spares_another_users_folder(tmp_path):
    """A root the sweep is pointed at that holds another user's folder named like a dead trial's."""
    from clsr.train import staging

    if not have_cotenant():
        pytest.skip("another user's folder needs root to make")
    import pwd

    prefix, pid = "ckpt-host-", _dead_pid()
    theirs = tmp_path / f"{prefix}{pid}-{runtime_dir.pid_namespace()}-abc"
    theirs.mkdir()
    os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
    link = tmp_path / f"{prefix}{pid}-{runtime_dir.pid_namespace()}-link"
    link.symlink_to(theirs)
    assert staging.sweep_dead(tmp_path, prefix) == []
    assert theirs.is_dir() and link.is_symlink()


def _spool_sweep(root: Path, pid: int, namespace: int, tail: str = "x") -> tuple[Path, object]:
    from clsr.tracking import spool

    return root / f"clsr-spool-{pid}-{namespace}-abcd1234-{tail}", lambda: spool.sweep_leftovers(str(root))


def _staging_sweep(root: Path, pid: int, namespace: int, tail: str = "x") -> tuple[Path, object]:
    from clsr.train import staging

    return root / f"ckpt-host-{pid}-{namespace}-{tail}", lambda: staging.sweep_dead(root, "ckpt-host-")


@pytest.mark.parametrize("sweeper", [_spool_sweep, _staging_sweep])
def test_both_sweeps_are_one_rule(sweeper, tmp_path, monkeypatch):
    """The spool's and the staging's leftovers go through ``runtime_dir.sweep_dead``: a dead process's own
    folder goes; another namespace's, a link, and a process whose state cannot be read stay."""
    pid, namespace = _dead_pid(), runtime_dir.pid_namespace()
    own, sweep = sweeper(tmp_path, pid, namespace)
    other, _ = sweeper(tmp_path, pid, namespace + 1)
    link, _ = sweeper(tmp_path, pid, namespace, tail="link")
    for folder in (own, other):
        folder.mkdir()
    link.symlink_to(other)
    calls = []
    real = runtime_dir.sweep_dead
    monkeypatch.setattr(runtime_dir, "sweep_dead", lambda *a: calls.append(a) or real(*a))
    with monkeypatch.context() as unreadable:
        unreadable.setattr(os, "kill", lambda *a: (_ for _ in ()).throw(OSError(22, "unknown")))
        sweep()  # any OSError but "no such process" means alive: nothing goes
    assert own.is_dir()
    sweep()
    assert not own.exists() and other.is_dir() and link.is_symlink() and len(calls) == 2


def test_the_local_ray_runs_in_the_private_folder(shared, monkeypatch):
    temp = Path(start_local_ray(monkeypatch)["_temp_dir"])
    assert temp == shared / private_name() / "ray" and stat.S_IMODE(temp.stat().st_mode) == 0o700
    assert len(str(temp)) + runtime_dir.RAY_SOCKET_SUFFIX <= runtime_dir.SOCKET_PATH_MAX


def test_a_temporary_folder_too_long_for_rays_sockets_falls_back_to_tmp(monkeypatch, tmp_path):
    import tempfile

    long = tmp_path / ("x" * 60)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    folder = runtime_dir.ray_folder()
    assert folder == Path("/tmp") / private_name() / "ray"
    with pytest.raises(runtime_dir.UnsafeFolder, match="too long a folder for Ray's sockets"):
        runtime_dir.ray_folder(runtime_dir.scratch())


def test_rays_own_0777_folder_inside_the_private_one_is_taken_again(shared):
    """Ray makes its temporary folder 0777; inside the 0700 private folder no one else could reach it."""
    folder = runtime_dir.ray_folder()
    folder.chmod(0o777)
    assert runtime_dir.ray_folder() == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
