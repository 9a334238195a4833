"""Local staging folders for checkpoints, and the sweep of those a dead process left behind.

A checkpoint is written to a local folder before Ray copies it to the run's storage, and a restored one
is copied to a local folder before it is loaded; each is removed once used. A process that dies in
between leaves its folder, and that is the normal end of some trials: Tune stops an ASHA-pruned trial by
ending its actor while the trial is inside ``report``, so no ``finally`` runs. On a node that runs an
ASHA study for days those folders (a model, its optimiser state and the best weights: GBs for BERT-large)
would fill the disk. Each folder's name therefore carries its host, process id and pid namespace, and
making a new one first removes this host's folders of processes that no longer run. Python's
``tempfile`` has no such sweep, hence this module.

The folders live in the user's private scratch folder (``clsr.runtime_dir``, rule 1), and the sweep
removes only real folders of this user named with a pid of this pid namespace: containers sharing a
``/tmp`` and a host name count their pids apart, and a live trial of another one is never touched.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path

from clsr import runtime_dir

_KINDS = ("ckpt", "restore")


def staging_folder(kind: str) -> Path:
    """A new empty folder ``<kind>-<host>-<pid>-<pid namespace>-…`` in ``<private scratch>/staging``,
    after removing this host's ``<kind>-`` folders whose process has ended."""
    if kind not in _KINDS:
        raise ValueError(f"staging folder kind {kind!r}: allowed {', '.join(_KINDS)}")
    root = runtime_dir.subfolder(runtime_dir.scratch(), "staging")
    prefix = f"{kind}-{_host()}-"
    sweep_dead(root, prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{runtime_dir.pid_namespace()}-", dir=root))


def sweep_dead(root: Path, prefix: str) -> list[Path]:
    """Remove the folders ``<prefix><pid>-<namespace>-…`` under ``root`` whose process is gone
    (``runtime_dir.sweep_dead``); the removed ones."""
    return runtime_dir.sweep_dead(root, re.compile(re.escape(prefix) + r"(\d+)-(\d+)-"))


def _host() -> str:
    # folder-name safe; several containers may share one /tmp, each with a host name of its own
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40]
