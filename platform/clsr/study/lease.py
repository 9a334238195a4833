"""One driver per study: a lease on the study's MLflow parent run, renewed by a heartbeat.

Why by hand: Ray and MLflow have no lock that two drivers on different machines both see. MLflow
params are write-once (logging a different value for a key that exists is refused), which makes them
a compare-and-set: the driver that logs ``clsr.lease.<n>`` first holds lease generation ``n``; the
other gets MLflow's refusal. The holder renews the tag ``clsr.lease`` (``token host pid time``) every
``HEARTBEAT_S``; a lease not renewed for ``STALE_S`` belongs to a driver that is gone (SIGKILL, a lost
node) and ``platform study resume`` takes it over with the next generation.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from clsr.study.supervise import command_pid

LEASE_TAG = "clsr.lease"
GENERATION_PARAM = "clsr.lease.{}"
HEARTBEAT_S = 5.0
STALE_S = 60.0


class LeaseHeld(RuntimeError):
    """Another driver holds the study."""


@dataclass(frozen=True)
class Holder:
    token: str
    host: str
    pid: int
    heartbeat: float

    @classmethod
    def parse(cls, text: str | None) -> Holder | None:
        try:
            token, host, pid, beat = (text or "").split(" ")
            return cls(token, host, int(pid), float(beat))
        except ValueError:
            return None

    def describe(self) -> str:
        age = time.time() - self.heartbeat
        return f"pid {self.pid} on {self.host} (last heartbeat {age:.0f} s ago)"

    @property
    def fresh(self) -> bool:
        """Renewed lately, by a process that still exists (when it ran on this machine)."""
        if time.time() - self.heartbeat >= STALE_S:
            return False
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive
            return True
        return True


def current_holder(client: MlflowClient, run_id: str) -> Holder | None:
    """The driver holding a study's parent run; None when the run is not RUNNING or has no lease."""
    run = client.get_run(run_id)
    if run.info.status != "RUNNING":
        return None
    return Holder.parse(run.data.tags.get(LEASE_TAG))


def generation(client: MlflowClient, run_id: str) -> int:
    """The highest lease generation taken on the run (0: none)."""
    params = client.get_run(run_id).data.params
    taken = [int(k.rsplit(".", 1)[1]) for k in params if k.startswith("clsr.lease.") and k[11:].isdigit()]
    return max(taken, default=0)


class Lease:
    """This driver's lease on a parent run; ``acquire`` takes it or raises ``LeaseHeld``."""

    def __init__(self, uri: str, run_id: str, study: str):
        self.uri, self.run_id, self.study = uri, run_id, study
        self.token = uuid.uuid4().hex[:12]
        self.generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> int:
        """Take the next generation, unless a live driver holds the study; returns the generation."""
        client = MlflowClient(self.uri)
        holder = current_holder(client, self.run_id)
        if holder is not None and holder.fresh and holder.token != self.token:
            raise LeaseHeld(self._held_message(holder))
        wanted = generation(client, self.run_id) + 1
        try:
            client.log_param(self.run_id, GENERATION_PARAM.format(wanted), self.token)
        except MlflowException as err:  # another driver took this generation first
            holder = current_holder(client, self.run_id)
            raise LeaseHeld(self._held_message(holder)) from err
        self.generation = wanted
        self._beat(client)
        return wanted

    def _held_message(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "another driver"
        return (
            f"study {self.study!r} is being run by {who}; wait for it to end, or stop it (Ctrl-C there); "
            f"a driver that was killed lets go after {STALE_S:.0f} s, then `platform study resume` takes over"
        )

    def _beat(self, client: MlflowClient) -> None:
        client.set_tag(
            self.run_id, LEASE_TAG, f"{self.token} {socket.gethostname()} {command_pid()} {time.time():.0f}"
        )

    def start(self) -> Lease:
        self._thread = threading.Thread(target=self._heartbeat, name="clsr-lease", daemon=True)
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        client = MlflowClient(self.uri)
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat(client)
            except Exception as err:  # an outage: the lease goes stale only if it outlasts STALE_S
                print(f"lease heartbeat failed ({type(err).__name__}); retrying", file=sys.stderr)

    def release(self) -> None:
        """Stop the heartbeat and clear the lease (best effort: a stale lease expires by itself)."""
        self._stop.set()
        with contextlib.suppress(Exception):
            MlflowClient(self.uri).set_tag(self.run_id, LEASE_TAG, "")
