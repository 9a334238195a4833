"""The study lease on a real MLflow store: one compare-and-set decides the holder, a holder is judged
gone only by watching its heartbeat on the observer's own clock, a driver that lost its generation is
fenced off the record, and two drivers racing (threads forced into each interleaving here; two real
processes against an ``mlflow server`` in the e2e test) never both hold a study."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import clsr.study.record.lease as lease_module
import clsr.study.record.parent as record
from clsr.study.plan.load import load_study
from clsr.study.record.lease import (
    GENERATION_PARAM,
    LEASE_TAG,
    Lease,
    LeaseAmbiguous,
    LeaseHeld,
    LeaseLost,
    leased,
    pid_namespace,
    read_state,
)
from clsr.tracking.study_runs import start_parent_run

REPO_ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(autouse=True)
def fast_heartbeat(monkeypatch):
    """Heartbeats every 50 ms, so that watching a lease takes a fraction of a second."""
    monkeypatch.setattr(lease_module, "HEARTBEAT_S", 0.05)


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def stop_beating(lease: Lease) -> None:
    lease._stop.set()
    lease._thread.join()


def lease_run_of(client: MlflowClient, run_id: str) -> str:
    """A lease run for the parent ``run_id``, as its creator's ``take_first`` makes it."""
    parent = client.get_run(run_id)
    tags = {"clsr.role": "lease", "clsr.lease_of": run_id}
    made = client.create_run(parent.info.experiment_id, tags=tags).info.run_id
    client.set_terminated(made, status="FINISHED")
    return made


def held_by_a_gone_driver(client: MlflowClient, run_id: str, in_parent: bool = False) -> str:
    """Generation 1, beaten by a process of this machine that no longer exists; on the parent's lease run
    (or, ``in_parent``, in the parent's own params, as a parent taken over before its lease run was made
    holds it). Returns the run holding it."""
    import socket

    holder = run_id if in_parent else lease_run_of(client, run_id)
    client.log_param(holder, GENERATION_PARAM.format(1), "gone")
    client.set_tag(holder, LEASE_TAG, f"gone {socket.gethostname()} {pid_namespace()} {dead_pid()} 7")
    return holder


def test_the_lease_is_held_by_one_driver_and_taken_over_when_its_holder_is_gone(store):
    uri, client, run_id = store
    first = Lease(uri, run_id, "record")
    assert first.take_first() == 1
    with pytest.raises(
        LeaseHeld,
        match=r"study 'record' is being run by pid \d+ on .* \(its process is running on this machine\)",
    ):
        first.start()
        Lease(uri, run_id, "record").acquire(watch_s=5)
    stop_beating(first)  # killed: it beats no more, and its process is gone
    beat = read_state(client, run_id).beat
    client.set_tag(first.record_id, LEASE_TAG, f"{first.token} {beat.host} {beat.namespace} {dead_pid()} 9")
    second = Lease(uri, run_id, "record")
    started = time.monotonic()
    assert second.acquire(watch_s=3600) == 2  # a gone process on this machine: no need to watch
    assert time.monotonic() - started < 5
    assert second.record_id == first.record_id  # one lease run per parent, whoever holds it
    assert client.get_run(first.record_id).data.params["clsr.lease.2"] == second.token
    second.release()
    assert read_state(client, run_id).released


def test_the_lease_is_kept_out_of_the_parents_params_and_tags(store):
    """Issue 35: the parent run shows the study, not its bookkeeping. The generations and the heartbeat
    are on a lease run of the study's experiment, closed (it is not a running study), named for it."""
    uri, client, run_id = store
    lease = Lease(uri, run_id, "record")
    lease.take_first()
    lease.release()
    parent = client.get_run(run_id)
    assert not [k for k in parent.data.params if k.startswith("clsr.lease")]
    assert "clsr.lease" not in parent.data.tags
    record_run = client.get_run(lease.record_id)
    assert record_run.info.experiment_id == parent.info.experiment_id
    assert record_run.info.status == "FINISHED" and record_run.info.run_name == "record lease"
    assert record_run.data.tags["clsr.lease_of"] == run_id and record_run.data.tags["clsr.role"] == "lease"
    assert record_run.data.params == {"clsr.lease.1": lease.token}
    assert record_run.data.tags["clsr.lease"] == f"released {lease.token}"
    assert leased(client, [parent]) == {run_id}


def test_a_let_go_lease_run_is_out_of_the_default_view_and_comes_back_for_its_next_holder(store):
    """Issue 53: the lease run is not among the runs MLflow's runs table lists by default (active runs):
    the driver that lets go deletes it; the next driver restores it and takes the next generation on it,
    so the compare-and-set stays on one run; let go again, it is deleted again."""
    uri, client, run_id = store
    experiment = client.get_run(run_id).info.experiment_id
    first = Lease(uri, run_id, "record")
    first.take_first()
    listed = [r.info.run_id for r in client.search_runs([experiment])]
    assert listed == [first.record_id, run_id]  # held: in view
    first.release()
    assert client.get_run(first.record_id).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in client.search_runs([experiment])] == [run_id]  # what the UI lists
    assert leased(client, [client.get_run(run_id)]) == {run_id}  # the reader still sees who leased it
    second = Lease(uri, run_id, "record")
    assert second.acquire(watch_s=5) == 2 and second.record_id == first.record_id
    lease_run = client.get_run(first.record_id)
    assert lease_run.info.lifecycle_stage == "active"
    assert lease_run.data.params == {"clsr.lease.1": first.token, "clsr.lease.2": second.token}
    assert not [k for k in client.get_run(run_id).data.params if k.startswith("clsr.lease")]
    second.release()
    assert client.get_run(first.record_id).info.lifecycle_stage == "deleted"
    assert read_state(client, run_id).released


def test_a_driver_refused_the_restore_takes_the_lease_in_the_parents_params(store, monkeypatch):
    """Restoring a deleted run needs MANAGE on the experiment: a colleague with EDIT is refused, and
    takes the next generation in the parent's params (they win over the lease run), not "held"."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    uri, client, run_id = store
    first = Lease(uri, run_id, "record")
    first.take_first()
    first.release()

    def refused(self, run_id):
        raise MlflowException("Permission denied", PERMISSION_DENIED)

    from clsr.tracking.patient import PatientClient

    monkeypatch.setattr(MlflowClient, "restore_run", refused)
    monkeypatch.setattr(PatientClient, "restore_run", refused)
    second = Lease(uri, run_id, "record")
    assert second.acquire(watch_s=5) == 2 and second.record_id == run_id
    assert client.get_run(run_id).data.params["clsr.lease.2"] == second.token
    assert read_state(client, run_id).holder == second.token
    second.release()
    assert client.get_run(first.record_id).info.lifecycle_stage == "deleted"  # untouched


def test_a_heartbeat_restores_its_lease_run_deleted_under_it(store):
    """A driver letting go deletes the lease run a moment after the next driver restored and took it:
    the holder's next beat restores it and beats on (it would otherwise go stale while alive)."""
    uri, client, run_id = store
    lease = Lease(uri, run_id, "record")
    lease.take_first()
    client.delete_run(lease.record_id)  # the late delete
    deadline = time.monotonic() + 10
    while client.get_run(lease.record_id).info.lifecycle_stage == "deleted" and time.monotonic() < deadline:
        time.sleep(0.05)
    beats = read_state(client, run_id).beat.count
    time.sleep(0.3)
    assert client.get_run(lease.record_id).info.lifecycle_stage == "active"
    assert read_state(client, run_id).beat.count != beats  # beating on
    lease.check(client)  # still the holder
    lease.release()


def test_a_parent_taken_over_in_its_own_params_stays_there(store):
    """A parent whose first driver stopped before making its lease run was taken over in its own params
    (generation 1 there); the next driver takes generation 2 there, and no lease run is made."""
    uri, client, run_id = store
    held_by_a_gone_driver(client, run_id, in_parent=True)
    assert leased(client, [client.get_run(run_id)]) == {run_id}
    lease = Lease(uri, run_id, "record")
    assert lease.acquire(watch_s=3600) == 2 and lease.record_id == run_id
    assert client.get_run(run_id).data.params["clsr.lease.2"] == lease.token
    lease.release()
    assert read_state(client, run_id).released
    experiment = client.get_run(run_id).info.experiment_id
    assert client.search_runs([experiment], "tags.`clsr.role` = 'lease'") == []


def test_generations_in_the_parents_params_win_over_its_lease_run(store):
    """A driver that took a parent over in its params (its lease run was not made yet when it looked) holds
    it: the lease run's driver is fenced off at its next check."""
    uri, client, run_id = store
    creator = Lease(uri, run_id, "record")
    creator.take_first()
    client.log_param(run_id, GENERATION_PARAM.format(1), "the-other-driver")
    with pytest.raises(LeaseLost, match="was taken over"):
        creator.check()
    creator.release()
    assert read_state(client, run_id).holder == "the-other-driver"


def test_a_second_lease_run_for_one_parent_is_refused_as_ambiguous(store):
    """Only a parent's creator makes its lease run: a second one was written by someone else, and which
    holds the study cannot be told."""
    uri, client, run_id = store
    held_by_a_gone_driver(client, run_id)
    planted = lease_run_of(client, run_id)
    with pytest.raises(
        LeaseAmbiguous, match=rf"has 2 lease runs .*{planted}.*delete the ones you did not make"
    ):
        Lease(uri, run_id, "record").acquire(watch_s=1)


def test_a_generation_taken_but_not_yet_beaten_counts_as_held(store, monkeypatch):
    """Finding 2a: driver A took generation 2 of a stale lease and has not beaten yet when driver B reads
    the lease. B must not take generation 3: it watches, and A's first heartbeat tells it A is alive."""
    uri, client, run_id = store
    holder = held_by_a_gone_driver(client, run_id)
    a = Lease(uri, run_id, "record")
    a.record_id = holder
    client.log_param(holder, GENERATION_PARAM.format(2), a.token)  # A's compare-and-set, and no beat yet

    real_sleep = time.sleep
    monkeypatch.setattr(lease_module.time, "sleep", lambda s: (a._beat(client), real_sleep(s)))  # A beats
    with pytest.raises(LeaseHeld, match="heartbeat changed while watched"):
        Lease(uri, run_id, "record").acquire(watch_s=30)
    assert read_state(client, run_id).generation == 2 and read_state(client, run_id).holder == a.token


def test_a_generation_whose_holder_never_beats_is_taken_after_the_watch(store):
    """The driver that took generation 2 died before its first heartbeat: watched unchanged, it goes."""
    uri, client, run_id = store
    holder = held_by_a_gone_driver(client, run_id)
    client.log_param(holder, GENERATION_PARAM.format(2), "died-before-beating")
    assert Lease(uri, run_id, "record").acquire(watch_s=0.3) == 3


def test_a_checker_whose_clock_runs_ahead_steals_no_live_lease(store, monkeypatch):
    """Finding 2d: staleness is never judged by comparing the holder's clock with the checker's."""
    uri, client, run_id = store
    holder = Lease(uri, run_id, "record")
    holder.take_first()
    holder.start()
    monkeypatch.setattr(lease_module.Beat, "here", lambda beat: None)  # the holder runs on another machine
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 61)  # this checker is 61 s ahead
    try:
        with pytest.raises(LeaseHeld, match="heartbeat changed while watched"):
            Lease(uri, run_id, "record").acquire(watch_s=2)
    finally:
        holder.release()


def test_a_paused_driver_that_lost_its_generation_is_fenced_off_the_record(store, tmp_path):
    """Findings 2c and 2d: a driver paused past the stale limit (Ctrl-Z, a suspended VM) is taken over;
    when it wakes, its heartbeat finds the newer generation, tells the driver to stop, and its record
    writes are refused: the new holder's record stands."""
    uri, client, run_id = store
    paused = Lease(uri, run_id, "record")
    paused.take_first()
    stop_beating(paused)  # and then paused
    client.set_tag(
        paused.record_id, LEASE_TAG, f"{paused.token} another-machine 1 4242 1"
    )  # its pid is not ours to check
    successor = Lease(uri, run_id, "record")
    assert successor.acquire(watch_s=0.3) == 2  # watched unchanged: taken over

    lost: list[str] = []
    paused.on_lost = lost.append
    paused.start()  # it wakes up
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost and "was taken over by" in lost[0] and "writes nothing more" in lost[0]
    with pytest.raises(LeaseLost):
        paused.check()
    assert read_state(client, run_id).beat.token == successor.token  # it stopped beating

    study = load_study(REPO_ROOT / "studies" / "smoke.yaml")
    outcome = record.close_study(client, uri, run_id, str(tmp_path), study, (None, 0), "FINISHED", paused)
    assert outcome.stopped_by == "lease_lost" and outcome.exit_code == 75
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and "clsr.status" not in run.data.tags  # nothing written
    paused.release()
    assert read_state(client, run_id).beat.token == successor.token  # its release did not let go of B's


def test_two_runs_that_start_at_once_never_both_proceed(store, tmp_path, monkeypatch):
    """Finding 2b: driver B listed the study's parents before driver A created its own; A's parent has
    no lease yet when B checks for rivals. B must give way (today's rule: only rivals with a fresh lease)."""
    uri, client, _ = store
    study = load_study(REPO_ROOT / "studies" / "smoke.yaml", [("storage_path", str(tmp_path / "runs"))])
    start_parent_run(client, study.name, f"{tmp_path}/runs/a", None)  # A: created, no lease yet
    listed = []
    real = record.parent_runs

    def listed_before_a(client, name, running=False, max_results=1000):
        listed.append(running)
        return [] if len(listed) == 1 else real(client, name, running, max_results)

    monkeypatch.setattr(record, "parent_runs", listed_before_a)
    with pytest.raises(LeaseHeld, match="started by another driver at the same moment"):
        record.start_record(client, uri, study, "name: smoke", {"t": "x"})
    experiment = client.get_experiment_by_name(study.name).experiment_id
    alive = client.search_runs([experiment], "attributes.status = 'RUNNING'")
    assert len(alive) == 1 and read_state(client, alive[0].info.run_id).generation == 0  # A's alone
    assert client.search_runs([experiment], "tags.`clsr.role` = 'lease'") == []  # B deleted its lease run too


def test_a_running_parent_is_refused_while_its_driver_beats_and_called_unclosed_when_gone(store, tmp_path):
    uri, client, _ = store
    study = load_study(REPO_ROOT / "studies" / "smoke.yaml", [("storage_path", str(tmp_path / "runs"))])
    parent = start_parent_run(client, study.name, f"{tmp_path}/runs/a", None)
    holder = Lease(uri, parent, study.name)
    holder.take_first()
    holder.start()
    with pytest.raises(LeaseHeld, match=r"is being run by pid \d+ on .*running on this machine"):
        record.start_record(client, uri, study, "", {})
    stop_beating(holder)
    beat = read_state(client, parent).beat
    client.set_tag(holder.record_id, LEASE_TAG, f"{holder.token} {beat.host} {beat.namespace} {dead_pid()} 3")
    with pytest.raises(record.UnclosedRun, match="stopped without closing"):
        record.start_record(client, uri, study, "", {})


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import clsr.study.record.lease
    from clsr.study.record.lease import Lease, LeaseHeld
    clsr.study.record.lease.HEARTBEAT_S = 0.5
    uri, run_id, go = sys.argv[1:4]
    lease = Lease(uri, run_id, "race")
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        print("won", lease.acquire(watch_s=20), lease.token, flush=True)
        lease.start()
        time.sleep(2)  # hold it, beating, while the other may be watching
        lease.release()
    except LeaseHeld:
        print("lost", flush=True)
    """
)


@pytest.mark.e2e
def test_two_driver_processes_racing_for_a_stale_lease_on_an_mlflow_server(tmp_path):
    """Two processes started together take over the same stale lease, five times over, through a real
    ``mlflow server``: each time exactly one wins and the other is told the study is held."""
    from tests.e2e.test_record import MlflowServer

    server = MlflowServer(tmp_path)
    server.start()
    try:
        client = MlflowClient(server.url)
        experiment = client.create_experiment("race")
        for attempt in range(5):
            run_id = client.create_run(experiment).info.run_id
            held_by_a_gone_driver(client, run_id)
            go = tmp_path / f"go-{attempt}"
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", SCRIPT, server.url, run_id, str(go)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]  # both imported
            go.touch()
            outputs = [p.communicate(timeout=120)[0].split() for p in procs]
            assert sorted(o[0] for o in outputs) == ["lost", "won"], outputs
            (winner,) = [o for o in outputs if o[0] == "won"]
            state = read_state(client, run_id)
            assert (state.generation, state.holder) == (2, winner[2]) and winner[1] == "2"
    finally:
        server.stop()


def test_heartbeats_do_not_race_the_fence(store):
    """The heartbeat thread and a record write that checks the lease run together without a false loss."""
    uri, client, run_id = store
    lease = Lease(uri, run_id, "record")
    lease.take_first()
    lease.start()
    errors = []

    def check_often():
        for _ in range(20):
            try:
                lease.check()
            except LeaseLost as err:
                errors.append(err)

    threads = [threading.Thread(target=check_often) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lease.release()
    assert not errors and read_state(client, run_id).released


def test_a_lost_lease_stops_the_running_experiment_and_the_driver_exits_75():
    """The live half of fencing: ``lease.on_lost`` is ``Interrupts.lease_lost`` in the driver (runner). From
    the heartbeat's thread it asks Tune to stop the way Tune stops gracefully (SIGUSR1), says so in one
    line, and the process ends with exit 75 once its grace is over, having written no record itself."""
    script = textwrap.dedent(
        """
        import os, signal, sys, threading, time
        from clsr.study.control.interrupt import Interrupts
        Interrupts.GRACE_S = 0.5
        with Interrupts() as interrupts:
            with interrupts.experiment():
                # Tune's fit registers its SIGUSR1 handler as it starts (tune.py), inside the experiment
                signal.signal(signal.SIGUSR1, lambda *_: print("tune asked to stop", flush=True))
                threading.Thread(target=interrupts.lease_lost, args=("taken over",)).start()
                time.sleep(5)  # Tune's fit, until the grace ends the process
        print("not reached")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "platform")},
    )  # fmt: skip
    assert done.returncode == 75, done.stderr
    assert done.stdout == "tune asked to stop\n"
    assert done.stderr.strip().splitlines()[0].startswith("lease_lost: stopping the study;")
