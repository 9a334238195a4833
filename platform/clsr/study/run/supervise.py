"""The study driver runs as a child of the command, so that whatever ends it, its record gets closed.

A SIGTERM sent to a process group (a batch scheduler, a preempted node) reaches the local Ray's own
processes too. Once the raylet is gone, Ray's core worker in the driver may end the driver process
at once, with exit status 1 ("the Raylet IPC connection failed and the local Raylet is dead"): no
Python handler runs, the graceful stop never writes the record, and the scheduler sees the wrong
status. So ``platform study run|resume`` runs the driver as a child process at once and waits;
the child validates the study (this process imports neither torch nor Ray nor MLflow until it has
to close a record, so it adds well under a second). The child writes to a small file
(``LINK_ENV``) which parent run and lease it holds, the command that resumes it, why it is stopping,
when it has settled the record, and whether it told the user how to go on (else this process does). If
it ends without settling it, this
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

from clsr.study.control.driver_link import LEASE_LOST_EXIT, LINK_ENV, SUPERVISOR_ENV

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "study_timeout": 124, "lease_lost": LEASE_LOST_EXIT}
EXIT_CODES |= {"budget": 0, "stop_request": 0}  # the study stopped as its file or `study stop` asked
RESUMABLE = ("SIGINT", "SIGTERM", "study_timeout", "budget", "stop_request")  # stops a resume goes on from


def supervise(argv: list[str]) -> int:
    """Run ``platform <argv>`` as the driver child; close the record if it could not."""
    folder = Path(tempfile.mkdtemp(prefix="clsr-driver-"))
    link = folder / "link.jsonl"
    received: list[str] = []
    child: subprocess.Popen | None = None

    def pass_on(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        if child is not None and child.returncode is None:  # not yet reaped: the pid is still the child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)
        elif child is not None:
            print("\nthe study's record is being closed; a moment", file=sys.stderr)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "clsr.cli", *argv],
            env={**os.environ, LINK_ENV: str(link), SUPERVISOR_ENV: str(os.getpid())},
            preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None,
        )
        code = child.wait()
        entries = _read(link)
        status = settle(entries, code, received[0] if received else None)
        say_how_to_continue(entries, received[0] if received else None)
        return status
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
    entries = []
    for line in link.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut short by the child's end
            entries.append(json.loads(line))
    return [e for e in entries if isinstance(e, dict)]


def how_to_continue(reason: str, again: str) -> str:
    """What a stopped study's command says last: what the record holds and the command that goes on."""
    if reason in ("budget", "stop_request"):  # no trial was cut short: the running ones finished
        return (
            f"\nstopped by {reason} (the parent run's clsr.stop_reason says why): finished trials are "
            f"recorded; the trials not started run on a resume (raise budget: to go further).\n"
            f"Continue with: {again}"
        )
    marked = "timed_out" if reason == "study_timeout" else "interrupted"
    return (
        f"\nstopped by {reason}: finished trials are recorded, unfinished ones were marked {marked} and "
        f"keep their last checkpoint.\nContinue with: {again}"
    )


def settle(entries: list[dict[str, Any]], code: int, signalled: str | None) -> int:
    """The command's exit status; closes the record first if the child left it open."""
    held = next((e for e in entries if "parent_run_id" in e), None)
    reason = next((e["stopping"] for e in entries if "stopping" in e), signalled)
    ended_badly = code == 1 or code < 0  # Ray's exit after its raylet went, or a signal
    if held is None or any(e.get("settled") for e in entries):  # nothing recorded yet, or closed
        return EXIT_CODES[reason] if reason and ended_badly else _status(code)
    ended = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    print(f"\nthe study driver ended ({ended}) before closing its record; closing it here", file=sys.stderr)
    try:
        closed = close_abandoned(held, reason, ended)
    except Exception as err:  # MLflow unreachable too: the lease goes stale and resume closes the record
        print(
            f"could not close the record ({type(err).__name__}: {err}); `platform study resume` closes it",
            file=sys.stderr,
        )
        closed = False
    if reason:
        return EXIT_CODES[reason]
    return _status(code) if code != 0 or not closed else 1


def say_how_to_continue(entries: list[dict[str, Any]], signalled: str | None) -> None:
    """The driver's last lines, when it ended before printing them (its watchdog wrote the record after
    a graceful stop hung, or it was killed): a preempted job's log still names the command that goes on.
    What the record holds is said only when the driver settled it; otherwise ``settle`` said what it did."""
    reason = next((e["stopping"] for e in entries if "stopping" in e), signalled)
    again = next((e["resume_with"] for e in entries if "resume_with" in e), None)
    held = any("parent_run_id" in e for e in entries)  # stopped before it held a record: nothing to resume
    if reason not in RESUMABLE or not again or not held:
        return
    if any(e.get("told") for e in entries):
        return
    settled = any(e.get("settled") for e in entries)
    print(how_to_continue(reason, again) if settled else f"\nContinue with: {again}", file=sys.stderr)


def _status(code: int) -> int:
    return code if code >= 0 else 128 - code


def close_abandoned(held: dict[str, Any], reason: str | None, ended: str) -> bool:
    """What the driver's own close would have written, if the record is still this driver's: its writes
    kept in the study's storage sent first (a record with writes still pending stays open for
    ``platform study sync``). Returns whether it closed the record."""
    from mlflow.tracking import MlflowClient

    from clsr.study.record.lease import LEASE_TAG, RELEASED, generation, read_state
    from clsr.study.record.parent import close_unfinished, replay

    uri, run_id = held["uri"], held["parent_run_id"]
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a server that is down: fail in seconds
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    client = MlflowClient(uri)
    state = read_state(client, run_id)
    ours = (state.generation, state.holder) == (held["generation"], held["token"])
    if not state.running or not ours:
        return False  # closed already, or another driver has taken the study over
    if held.get("storage") and replay(uri, held["storage"]):
        print("trial writes are still pending: `platform study sync` sends them and closes the record")
        return False
    if generation(client, run_id) != held["generation"]:
        return False  # taken over while the writes were sent
    close_unfinished(
        client, uri, run_id, reason, f"the study driver ended ({ended}) without closing its record"
    )
    client.set_tag(state.record_id, LEASE_TAG, f"{RELEASED} {held['token']}")  # free: a resume need not wait
    return True
