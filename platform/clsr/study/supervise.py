"""The study driver runs as a child of the command, so that whatever ends it, its record gets closed.

A SIGTERM sent to a process group (a batch scheduler, a preempted node) reaches the local Ray's own
processes too. Once the raylet is gone, Ray's core worker in the driver may end the driver process
at once, with exit status 1 ("the Raylet IPC connection failed and the local Raylet is dead"): no
Python handler runs, the graceful stop never writes the record, and the scheduler sees the wrong
status. So ``platform study run|resume`` validates the study, then runs the driver as a child
process and waits. The child writes to a small file (``LINK_ENV``) which parent run and lease it
holds, why it is stopping, and when it has settled the record. If it ends without settling it, this
process, which holds no Ray connection, closes the record as the driver would have: unfinished
trials interrupted (failed when nothing stopped the study), the parent run KILLED (FAILED), the
lease released; and it exits with the signal's status (130, 143, 124) or the child's.

Signals sent to this process alone (``kill <pid>``, a container's PID 1, ``timeout``) are passed on
to the child; the child takes a signal that reaches it both ways as one. Why by hand: neither Ray nor
MLflow watches a driver process from outside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

LINK_ENV = "CLSR_DRIVER_LINK"
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "study_timeout": 124}


def is_child() -> bool:
    return bool(os.environ.get(LINK_ENV))


def command_pid() -> int:
    """The pid of the command the user ran (the supervisor), the one to name and to signal."""
    return os.getppid() if is_child() else os.getpid()


def tell(**entry: Any) -> None:
    """In the child: one line for the supervisor (nothing when run without one)."""
    path = os.environ.get(LINK_ENV)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "a") as link:
        link.write(json.dumps(entry) + "\n")


def supervise(argv: list[str]) -> int:
    """Run ``platform <argv>`` as the driver child; close the record if it could not."""
    folder = Path(tempfile.mkdtemp(prefix="clsr-driver-"))
    link = folder / "link.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "clsr.cli", *argv],
        env={**os.environ, LINK_ENV: str(link)},
        preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None,
    )
    received: list[str] = []

    def pass_on(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        if child.returncode is None:  # not yet reaped: the pid is still the child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
        return settle(_read(link), code, received[0] if received else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(folder, ignore_errors=True)


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGTERM when this process dies (SIGKILLed alone), so the driver
    stops gracefully instead of running on unwatched."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _read(link: Path) -> list[dict[str, Any]]:
    if not link.exists():
        return []
    return [json.loads(line) for line in link.read_text().splitlines() if line.strip().endswith("}")]


def settle(entries: list[dict[str, Any]], code: int, signalled: str | None) -> int:
    """The command's exit status; closes the record first if the child left it open."""
    held = next((e for e in entries if "parent_run_id" in e), None)
    if held is None or any(e.get("settled") for e in entries):
        return code if code >= 0 else 128 - code  # nothing recorded yet, or the driver closed it
    reason = next((e["stopping"] for e in entries if "stopping" in e), signalled)
    ended = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    print(f"\nthe study driver ended ({ended}) before closing its record; closing it here", file=sys.stderr)
    try:
        close_abandoned(held, reason, ended)
    except Exception as err:  # MLflow unreachable too: the lease goes stale and resume closes the record
        print(
            f"could not close the record ({type(err).__name__}: {err}); `platform study resume` closes it",
            file=sys.stderr,
        )
    if reason:
        return EXIT_CODES[reason]
    return code if code > 0 else 128 - code if code < 0 else 1


def close_abandoned(held: dict[str, Any], reason: str | None, ended: str) -> None:
    """What the driver's own close would have written, if this driver still holds the study."""
    from mlflow.tracking import MlflowClient

    from clsr.study.lease import LEASE_TAG, current_holder
    from clsr.study.record import close_open_children

    uri, run_id = held["uri"], held["parent_run_id"]
    client = MlflowClient(uri)
    holder = current_holder(client, run_id)
    if holder is None or holder.token != held["token"]:
        return  # closed already, or another driver has taken the study over
    close_open_children(client, uri, run_id, reason)
    if reason:
        client.set_tag(run_id, "clsr.status", "timed_out" if reason == "study_timeout" else "interrupted")
        client.set_terminated(run_id, status="KILLED")
    else:
        client.set_tag(run_id, "clsr.status", "failed")
        client.set_tag(run_id, "clsr.error", f"the study driver ended ({ended}) without closing its record")
        client.set_terminated(run_id, status="FAILED")
    client.set_tag(run_id, LEASE_TAG, "")
