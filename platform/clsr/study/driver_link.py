"""The line between the study command (the supervisor, ``clsr.study.supervise``) and its driver child.

The bottom of the study's process control: the lease, the record, the interrupt handling and the
supervisor all import this module and it imports none of them. The supervisor starts the driver with two
variables: ``LINK_ENV``, a small JSON-lines file the driver writes to (``tell``: which parent run and
lease it holds, the command that resumes it, why it is stopping, when it has settled the record, and
whether it told the user how to go on), and ``SUPERVISOR_ENV``, the
supervisor's pid (the one to name to the user and to signal).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
from typing import Any, NoReturn

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


def exit_driver(code: int) -> NoReturn:
    """End the driver child as the interpreter would, less its teardown: its other non-daemon threads
    joined and the ``atexit`` functions run (Ray's shutdown, logging's flush, MLflow's), the output
    flushed, then ``os._exit``. Python's own teardown of torch's, Ray's and MLflow's modules takes about
    1.5 s on 2 cores after the study is over, and the command waits for this process."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter runs at exit, in its order (CPython's own function)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
