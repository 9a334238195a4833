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
from dataclasses import dataclass
from typing import Any

LINK_ENV = "CLSR_DRIVER_LINK"
SUPERVISOR_ENV = "CLSR_DRIVER_SUPERVISOR"
LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: another driver took the study over; it runs the study now


@dataclass(frozen=True)
class DriverLink:
    """What the supervisor gave this process: the link file (empty: no supervisor, nothing to tell) and
    the supervisor's pid. Read once where the command starts (``from_environment``) and passed down to
    whoever tells the supervisor something (the runner, the interrupt handling, the lease)."""

    path: str = ""
    supervisor: str = ""

    @classmethod
    def from_environment(cls) -> DriverLink:
        """Taken out of ``os.environ``, so that Ray's processes and any command the driver starts do not
        inherit them (a ``platform study run`` started from there would write into this link)."""
        return cls(os.environ.pop(LINK_ENV, ""), os.environ.pop(SUPERVISOR_ENV, ""))

    @property
    def is_child(self) -> bool:
        return bool(self.path)

    def command_pid(self) -> int:
        """The pid of the command the user ran (the supervisor), the one to name and to signal; this
        process's own once the supervisor is gone (the driver is then stopping on its own)."""
        supervisor = self.supervisor
        return int(supervisor) if supervisor and os.getppid() == int(supervisor) else os.getpid()

    def tell(self, **entry: Any) -> None:
        """In the child: one line for the supervisor (nothing when run without one)."""
        if not self.path:
            return
        with contextlib.suppress(OSError), open(self.path, "a") as link:
            link.write(json.dumps(entry) + "\n")


NO_LINK = DriverLink()  # run without a supervisor (tests, ``sync``): nothing told, this process's pid named
