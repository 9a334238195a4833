"""The line between the study command (the supervisor, ``clsr.study.run.supervise``) and its driver child.

The bottom of the study's process control: the lease, the record, the interrupt handling and the
supervisor all import this module and it imports none of them. The supervisor starts the driver with two
variables: ``LINK_ENV``, a small JSON-lines file the driver writes to (``tell``: which parent run and
lease it holds, the command that resumes it, why it is stopping, when it has settled the record, and
whether it told the user how to go on), and ``SUPERVISOR_ENV``, the
supervisor's pid (the one to name to the user and to signal).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

LINK_ENV = "CLSR_DRIVER_LINK"
SUPERVISOR_ENV = "CLSR_DRIVER_SUPERVISOR"
LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: another driver took the study over; it runs the study now
_inherited: dict[str, str] = {}  # the child's link and supervisor pid, taken out of the environment


def _from_supervisor(name: str) -> str:
    """Taken out of ``os.environ`` on first use, so that Ray's processes and any command the driver starts
    do not inherit them (a ``platform study run`` started from there would write into this link)."""
    if name not in _inherited:
        _inherited[name] = os.environ.pop(name, "")
    return _inherited[name]


def is_child() -> bool:
    _from_supervisor(SUPERVISOR_ENV)
    return bool(_from_supervisor(LINK_ENV))


def command_pid() -> int:
    """The pid of the command the user ran (the supervisor), the one to name and to signal; this
    process's own once the supervisor is gone (the driver is then stopping on its own)."""
    supervisor = _from_supervisor(SUPERVISOR_ENV)
    return int(supervisor) if supervisor and os.getppid() == int(supervisor) else os.getpid()


def tell(**entry: Any) -> None:
    """In the child: one line for the supervisor (nothing when run without one)."""
    path = _from_supervisor(LINK_ENV)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "a") as link:
        link.write(json.dumps(entry) + "\n")
