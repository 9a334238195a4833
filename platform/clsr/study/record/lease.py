"""One driver per study: a fenced lease on the study's MLflow parent run, renewed by a heartbeat.

Why by hand: Ray and MLflow have no lock that two drivers on different machines both see. MLflow
params are write-once (logging a different value for a key that exists is refused), which makes them
a compare-and-set: the driver that logs ``clsr.lease.<n>`` first holds lease generation ``n``; any other
gets MLflow's refusal. The highest generation's token names the holder, and nothing else does.

Where: on the parent's *lease run*, a run of its own in the study's experiment (tags ``clsr.role=lease``,
``clsr.lease_of=<parent id>``) that the parent's creator makes, so that the parent's parameters hold
the study and nothing of its bookkeeping. It lives in the study's experiment because whoever may run
the study may write there (an experiment of its own would need its own grants on a server with
logins). A RUNNING parent with no lease run yet counts as held (below). One whose first driver stopped
before making its lease run is taken over in its own params: the next driver logs its generation
there (a lease run made by whoever takes the parent over could be made twice); where a parent has
generations they win, so its creator, should it make its lease run after all, finds itself taken over.
Two lease runs for one parent are refused as ambiguous (only the parent's creator makes one: a second
was written by someone else).

Out of sight while no driver holds it: a driver that lets go deletes the lease run (MLflow's runs table
shows active runs only by default), and the next driver restores it before taking its generation.
Deleted runs keep their params and tags, and the lookups here read deleted runs too, so the
compare-and-set is unchanged. Where MLflow refuses the restore (deleting and restoring a run needs the
experiment's MANAGE permission, a colleague may hold EDIT only) the generation goes in the parent's
params, which win; a heartbeat that finds its lease run deleted under it (a releasing driver's late
delete) restores it and beats on.

The holder renews the tag ``clsr.lease`` (``token host pid count``) every ``HEARTBEAT_S``. Whether a
holder is gone is judged on the observer's own monotonic clock: the lease is stale when the observer
has watched it unchanged for ``STALE_S`` (timestamps written by two machines are never compared, so a
clock that runs ahead steals nothing). A generation whose holder has not beaten yet, and a RUNNING
parent with no generation yet, count as held until watched that long. A holder on this machine is judged
by its process instead (a pid is only ever checked on its own host): gone, the lease is free at once;
there (even stopped by Ctrl-Z), it is held.

Fencing: the heartbeat re-reads the generation before each beat; a driver whose generation was taken
over (it was paused past ``STALE_S``: Ctrl-Z, a suspended VM) calls ``on_lost`` once and stops beating,
and ``check`` raises ``LeaseLost`` before any record write, so it writes nothing more.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from clsr.tracking.patient import PatientClient
from clsr.tracking.retry import describe, is_transient
from clsr.tracking.study_runs import quoted

LEASE_TAG = "clsr.lease"
GENERATION_PARAM = "clsr.lease.{}"
ROLE_TAG = "clsr.role"  # "lease" on a lease run
LEASE_OF_TAG = "clsr.lease_of"  # the parent run a lease run belongs to
RELEASED = "released"
HEARTBEAT_S = 5.0
STALE_S = 60.0
BEAT_JOIN_S = 30.0  # a beat is one tag write; past this the store is down and the lease goes stale anyway


class LeaseHeld(RuntimeError):
    """Another driver holds the study."""


class LeaseLost(RuntimeError):
    """This driver's lease was taken over by another driver: it must not write the record."""


class LeaseAmbiguous(LeaseHeld):
    """Two lease runs name one parent run: which holds the study cannot be told, so none is trusted."""


def pid_namespace() -> str:
    """This process's pid namespace on this boot of this kernel: two containers sharing a host name
    (``--net=host``) do not share pids, and two hosts of one name share the root namespace's inode but
    not the kernel's boot id (one field of the heartbeat: no space in it)."""
    try:
        inode = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        inode = "-"
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace(" ", "")
    except OSError:
        boot = "-"
    return f"{inode}:{boot or '-'}"


@dataclass(frozen=True)
class Beat:
    """The holder's last heartbeat, as it wrote it (its count changes with every beat)."""

    token: str
    host: str
    namespace: str
    pid: int
    count: str

    @classmethod
    def parse(cls, text: str | None) -> Beat | None:
        try:
            token, host, namespace, pid, count = (text or "").split(" ")
            return cls(token, host, namespace, int(pid), count)
        except ValueError:
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def here(self) -> bool | None:
        """Whether the holder's process exists, when it ran on this machine (None: another machine)."""
        if self.host != socket.gethostname() or self.namespace != pid_namespace():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive
            return True
        return True


@dataclass(frozen=True)
class LeaseState:
    """What MLflow holds of a parent run's lease at one moment."""

    running: bool
    generation: int  # the highest generation taken (0: none)
    holder: str | None  # that generation's token
    beat_text: str  # the heartbeat tag as written
    record_id: str | None = None  # the run holding them: the lease run, or the parent (None: not made yet)

    @property
    def beat(self) -> Beat | None:
        beat = Beat.parse(self.beat_text)
        return beat if beat is not None and beat.token == self.holder else None

    @property
    def released(self) -> bool:
        return self.holder is not None and self.beat_text == f"{RELEASED} {self.holder}"

    def free_now(self) -> bool:
        """Free without watching: the run is closed, its holder let go, or the holder's process is gone."""
        if not self.running or self.released:
            return True
        return self.beat is not None and self.beat.here() is False

    def describe(self) -> str:
        if self.beat is not None:
            return self.beat.describe()
        if self.generation:
            return "a driver that is starting (its lease is taken, its first heartbeat not yet written)"
        return "a driver that is starting (its parent run is open, its lease not yet taken)"


def generations(params: dict[str, str]) -> dict[int, str]:
    """The lease generations taken in a run's params, by number."""
    prefix = GENERATION_PARAM.format("")
    return {
        int(key[len(prefix) :]): token
        for key, token in params.items()
        if key.startswith(prefix) and key[len(prefix) :].isdigit()
    }


def lease_runs(client: MlflowClient, parent) -> list:
    """The lease runs that name ``parent`` (a Run): one, or none while its creator has not made it."""
    query = f"tags.`{ROLE_TAG}` = 'lease' and tags.`{LEASE_OF_TAG}` = {quoted(parent.info.run_id)}"
    return client.search_runs([parent.info.experiment_id], query, ViewType.ALL, max_results=3)  # deleted too


def lease_record(client: MlflowClient, parent, known_id: str | None = None):
    """The run that holds the parent's lease (the parent itself once a driver took it over in its params:
    see the module doc), or None. ``known_id``: the lease run this driver made or found before (a heartbeat need not search)."""
    if generations(parent.data.params):
        return parent
    if known_id is not None and known_id != parent.info.run_id:
        return client.get_run(known_id)
    found = lease_runs(client, parent)
    if len(found) > 1:
        raise LeaseAmbiguous(
            f"MLflow run {parent.info.run_id} has {len(found)} lease runs "
            f"({', '.join(r.info.run_id for r in found)}) where its driver made one: someone else wrote "
            f"the others; delete the ones you did not make (tag {LEASE_OF_TAG}), then resume"
        )
    return found[0] if found else None


def read_state(client: MlflowClient, run_id: str, known_id: str | None = None) -> LeaseState:
    parent = client.get_run(run_id)
    record = lease_record(client, parent, known_id)
    taken = generations(record.data.params) if record is not None else {}
    top = max(taken, default=0)
    return LeaseState(
        running=parent.info.status == "RUNNING",
        generation=top,
        holder=taken.get(top),
        beat_text=record.data.tags.get(LEASE_TAG, "") if record is not None else "",
        record_id=record.info.run_id if record is not None else None,
    )


def leased(client: MlflowClient, parents: list) -> set[str]:
    """The ids of the parent runs (of one experiment) whose lease a driver took: generation 1 in their
    lease run, or in their own params (taken over before their lease run was made)."""
    ids = {p.info.run_id for p in parents if GENERATION_PARAM.format(1) in p.data.params}
    by_experiment: dict[str, list] = {}
    for parent in parents:
        by_experiment.setdefault(parent.info.experiment_id, []).append(parent.info.run_id)
    for experiment, wanted in by_experiment.items():
        query = f"tags.`{ROLE_TAG}` = 'lease'"
        for run in client.search_runs([experiment], query, ViewType.ALL, max_results=50_000):
            if run.data.tags.get(LEASE_OF_TAG) in wanted and GENERATION_PARAM.format(1) in run.data.params:
                ids.add(run.data.tags[LEASE_OF_TAG])
    return ids


def generation(client: MlflowClient, run_id: str) -> int:
    """The highest lease generation taken on the run (0: none)."""
    return read_state(client, run_id).generation


def watch(
    client: MlflowClient,
    run_id: str,
    watch_s: float = STALE_S,
    say: Callable[[str], None] | None = None,
) -> LeaseState:
    """The lease's state once it is free: at once when ``free_now``, else after watching it unchanged
    for ``watch_s`` on this machine's monotonic clock. Raises ``LeaseHeld`` when it changes meanwhile
    (its holder beats: it is alive; or another driver took it)."""
    first = read_state(client, run_id)
    if first.free_now():
        return first
    if first.beat is not None and first.beat.here():  # even stopped (Ctrl-Z) it is alive: not stale
        raise LeaseHeld(f"{first.describe()} (its process is running on this machine)")
    if say is not None:
        say(f"the lease is held by {first.describe()}; watching its heartbeat for up to {watch_s:.0f} s")
    started = time.monotonic()
    while (left := watch_s - (time.monotonic() - started)) > 0:
        time.sleep(min(HEARTBEAT_S, left))
        now = read_state(client, run_id)
        if now.free_now():
            return now
        if now != first:
            raise LeaseHeld(f"{now.describe()} (its heartbeat changed while watched)")
    return first


class Lease:
    """This driver's lease on a parent run: ``acquire`` (or ``take_first`` on a run it just created)
    takes it or raises ``LeaseHeld``; ``start`` beats; ``check`` fences record writes."""

    def __init__(self, uri: str, run_id: str, study: str, command_pid: Callable[[], int] = os.getpid):
        self.uri, self.run_id, self.study = uri, run_id, study
        self.command_pid = command_pid  # the pid its beats name (DriverLink.command_pid in a driver)
        self.token = uuid.uuid4().hex[:12]
        self.generation = 0
        self.record_id: str | None = None  # the run its generation is logged on (see lease_record)
        self.lost: str | None = None  # why the lease was lost, once it was
        self.on_lost: Callable[[str], None] | None = None
        self._beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, watch_s: float = STALE_S) -> int:
        """Take the next generation once no live driver holds the study (watching a holder that may be
        gone for up to ``watch_s``); returns the generation."""
        client = PatientClient(self.uri)
        try:
            state = watch(client, self.run_id, watch_s, say=lambda line: print(line, file=sys.stderr))
        except LeaseAmbiguous:
            raise
        except LeaseHeld as err:
            raise LeaseHeld(self.held_message(str(err))) from None
        # no lease run (its first driver stopped before making it): the generation goes in the parent's params
        return self._take(client, state.generation + 1, state.record_id or self.run_id)

    def take_first(self) -> int:
        """Generation 1 of a parent run this driver has just created (no one else has watched it), on the
        lease run it makes for it."""
        client = PatientClient(self.uri)
        parent = client.get_run(self.run_id)
        made = client.create_run(
            parent.info.experiment_id,
            run_name=f"{self.study} lease",
            tags={
                ROLE_TAG: "lease",
                LEASE_OF_TAG: self.run_id,
                "mlflow.note.content": f"which driver holds the record {self.run_id} of study "
                f"{self.study!r}: written by clsr; delete it only with that run",
            },
        )
        client.set_terminated(made.info.run_id, status="FINISHED")  # bookkeeping, not a running study
        taken = self._take(client, 1, made.info.run_id)
        try:
            self.check(client)  # a driver that took the parent over in its own params meanwhile holds it
        except LeaseLost:
            raise LeaseHeld(self.held_message(read_state(client, self.run_id).describe())) from None
        return taken

    def _take(self, client: MlflowClient, wanted: int, record_id: str) -> int:
        record_id = self._writable(client, record_id)
        try:
            client.log_param(record_id, GENERATION_PARAM.format(wanted), self.token)
        except MlflowException as err:  # refused: another driver took this generation first
            if is_transient(err):  # MLflow stayed away past the client's patience: not a refusal
                raise
            raise LeaseHeld(self.held_message(read_state(client, self.run_id).describe())) from err
        self.generation, self.record_id = wanted, record_id
        self._beat(client)
        self.start()  # beating from the moment it holds the lease: taking over a study may take minutes
        return wanted

    def _writable(self, client: MlflowClient, record_id: str) -> str:
        """The run to log a generation on: a lease run its last holder deleted when it let go, restored;
        the parent itself where MLflow refuses the restore (no MANAGE permission: see the module doc)."""
        if record_id == self.run_id or client.get_run(record_id).info.lifecycle_stage != "deleted":
            return record_id
        try:
            client.restore_run(record_id)
        except MlflowException as err:
            if is_transient(err):
                raise
            return self.run_id
        return record_id

    def discard(self, client: MlflowClient) -> None:
        """Beat no more and delete the lease run this driver made (its parent run is being deleted)."""
        self.stop_beating()
        if self.record_id is not None and self.record_id != self.run_id:
            client.delete_run(self.record_id)

    def held_message(self, who: str) -> str:
        return (
            f"study {self.study!r} is being run by {who}; wait for it to end, or stop it (Ctrl-C there); a driver "
            f"that was killed lets go once its lease has been watched unchanged for {STALE_S:.0f} s: "
            f"then `platform study resume` takes over"
        )

    def _beat(self, client: MlflowClient) -> None:
        self._beats += 1
        text = f"{self.token} {socket.gethostname()} {pid_namespace()} {self.command_pid()} {self._beats}"
        try:
            client.set_tag(self.record_id, LEASE_TAG, text)
        except MlflowException as err:  # a driver that let go deleted the lease run after this one took it
            # (this one's own release and discard stop the beats before they delete it: not restored then)
            if is_transient(err) or self._stop.is_set():
                raise
            if client.get_run(self.record_id).info.lifecycle_stage != "deleted":
                raise
            client.restore_run(self.record_id)
            client.set_tag(self.record_id, LEASE_TAG, text)

    def start(self) -> Lease:
        """Beat every ``HEARTBEAT_S`` (once: a lease that beats already goes on)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="clsr-lease", daemon=True)
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        client = MlflowClient(self.uri)
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self._taken_over(client):
                    return
                self._beat(client)
            except Exception as err:
                if is_transient(err):  # an outage: the lease goes stale only if it outlasts STALE_S
                    print(f"lease heartbeat failed ({type(err).__name__}); retrying", file=sys.stderr)
                    continue
                print(  # refused (a login revoked, the lease run deleted): beating again changes nothing
                    f"the study's lease heartbeat was refused ({describe(err)}); it is renewed no more: "
                    f"another driver may take the study over once it has watched it {STALE_S:.0f} s",
                    file=sys.stderr,
                )
                return

    def _taken_over(self, client: MlflowClient) -> bool:
        state = read_state(client, self.run_id, self.record_id)
        if (state.generation, state.holder, state.record_id) == (self.generation, self.token, self.record_id):
            return False
        self.lost = (
            f"study {self.study!r} was taken over by {state.describe()} (lease generation "
            f"{state.generation}, this driver held {self.generation}): this driver was paused or cut off "
            f"for longer than {STALE_S:.0f} s; it stops and writes nothing more to the record"
        )
        print(f"\n{self.lost}", file=sys.stderr)
        if self.on_lost is not None:
            self.on_lost(self.lost)
        return True

    def check(self, client: MlflowClient | None = None) -> None:
        """Raise ``LeaseLost`` unless this driver still holds the study (call before writing the record)."""
        if self.lost is None:
            self._taken_over(client or PatientClient(self.uri))
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def stop_beating(self) -> None:
        """Beat no more (the run is being deleted: nothing to let go of), a beat under way finished first:
        written after the release's, it would take the released lease back."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=BEAT_JOIN_S)

    def release(self) -> None:
        """Stop the heartbeat, let go and delete the lease run (best effort: a lease not renewed goes
        stale by itself; a lease run not deleted only stays in view)."""
        self.stop_beating()
        if self.lost is not None or not self.generation:
            return
        try:
            client = MlflowClient(self.uri)
            if self._taken_over(client):
                return
            client.set_tag(self.record_id, LEASE_TAG, f"{RELEASED} {self.token}")
        except Exception as err:  # unreachable: the lease goes stale by itself
            print(f"could not release the study's lease ({type(err).__name__})", file=sys.stderr)
            return
        if self.record_id != self.run_id:  # out of the runs table's default view until a driver takes it
            try:
                client.delete_run(self.record_id)
            except Exception as err:  # no MANAGE permission, or unreachable: it stays in view, released
                print(f"note: the study's lease run stays in view ({type(err).__name__})", file=sys.stderr)
