"""Local staging folders for checkpoints, and the sweep of those a dead process left behind.

A checkpoint is written to a local folder before Ray copies it to the run's storage, and a restored one
is copied to a local folder before it is loaded; each is removed once used. A process that dies in
between leaves its folder, and that is the normal end of some trials: Tune stops an ASHA-pruned trial by
ending its actor while the trial is inside ``report``, so no ``finally`` runs. On a node that runs an
ASHA study for days those folders (a model, its optimiser state and the best weights: GBs for BERT-large)
would fill the disk. Each folder's name therefore carries its host and process id, and making a new one
first removes this host's folders of processes that no longer run. Python's ``tempfile`` has no such
sweep, hence this module.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

_KINDS = ("ckpt", "restore")


def staging_folder(kind: str) -> Path:
    """A new empty folder ``clsr-<kind>-<host>-<pid>-…`` in the temporary directory, after removing
    this host's ``clsr-<kind>-`` folders whose process has ended."""
    if kind not in _KINDS:
        raise ValueError(f"staging folder kind {kind!r}: allowed {', '.join(_KINDS)}")
    prefix = f"clsr-{kind}-{_host()}-"
    sweep_dead(Path(tempfile.gettempdir()), prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def sweep_dead(root: Path, prefix: str) -> list[Path]:
    """Remove the folders ``<prefix><pid>-…`` under ``root`` whose process is gone; the removed ones."""
    removed = []
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    for folder in root.glob(f"{prefix}*"):
        match = pattern.match(folder.name)
        if match and folder.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _host() -> str:
    # folder-name safe; several containers may share one /tmp, each with a host name of its own
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40]
