"""A co-tenant for the tests of rules 1-3: another Unix user (``nobody``) on the same node, acting
through ``runuser`` (root only; the tests that need one skip elsewhere), and a shared /tmp-like folder
(mode 1777) both users can write, as /tmp is."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

COTENANT = "nobody"
NEEDS_ROOT = "a co-tenant is another Unix user: runuser needs root, and this run is not root"


def have_cotenant() -> bool:
    return os.geteuid() == 0 and shutil.which("runuser") is not None


def as_cotenant(script: str) -> None:
    """Run a bash ``script`` as the co-tenant (skips the test where that cannot be done)."""
    if not have_cotenant():
        pytest.skip(NEEDS_ROOT)
    subprocess.run(["runuser", "-u", COTENANT, "--", "bash", "-c", script], check=True, cwd="/")


def cotenant_reads(path: Path) -> bool:
    """Whether the co-tenant can read ``path``."""
    if not have_cotenant():
        pytest.skip(NEEDS_ROOT)
    run = ["runuser", "-u", COTENANT, "--", "cat", str(path)]
    return subprocess.run(run, capture_output=True, cwd="/").returncode == 0


@contextmanager
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A world-writable sticky folder under /tmp, made this process's temporary folder (TMPDIR), with
    ``XDG_RUNTIME_DIR`` unset so the private folder is made there."""
    folder = Path(tempfile.mkdtemp(prefix="clsr-sec-", dir="/tmp"))
    folder.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def private_name() -> str:
    return f"clsr-{os.getuid()}"


def start_local_ray(monkeypatch: pytest.MonkeyPatch) -> dict:
    """``init_ray`` as a study starts its local Ray, with ``ray.init`` a stand-in: the arguments it got."""
    import ray

    from clsr.study.control import ray_session

    seen: dict = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(
        ray, "init", lambda **kwargs: seen.update(kwargs) or type("C", (), {"dashboard_url": ""})
    )
    monkeypatch.setattr(ray_session, "cluster_address", lambda console=None: None)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray_session.init_ray()
    return seen
