"""The command's supervisor closes the record a driver left open, as the driver would have, and only then
(read back from a real MLflow store). The whole path, a driver killed after SIGTERM, runs in
test_record.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from clsr.study.run.supervise import say_how_to_continue, settle
from tests.support.stores import sqlite_uri


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return sqlite_uri(tmp_path_factory.mktemp("mlflow") / "mlflow.db")  # one store: set-up costs seconds


@pytest.fixture(params=["lease_run", "in_parent"])
def study_record(store, request):
    """A parent run held by lease token 'tok', one finished and one running trial run. The lease is on
    the parent's lease run (as its creator writes it), or in the parent's own params (a parent taken over
    before its lease run was made)."""
    uri = store
    client = MlflowClient(uri)
    experiment = client.create_experiment(request.node.name)
    parent = client.create_run(experiment).info.run_id
    holder = parent
    if request.param == "lease_run":
        tags = {"clsr.role": "lease", "clsr.lease_of": parent}
        holder = client.create_run(experiment, tags=tags).info.run_id
    client.set_tag(holder, "clsr.lease", "tok host 1 0")
    client.log_param(holder, "clsr.lease.1", "tok")  # lease generation 1 is this driver's
    done, running = (
        client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id for _ in range(2)
    )
    client.set_tag(done, "clsr.status", "finished")
    client.set_terminated(done, status="FINISHED")
    held = {"uri": uri, "parent_run_id": parent, "token": "tok", "generation": 1}
    return client, held, done, running, holder


def states(client, *run_ids):
    return [(client.get_run(r).info.status, client.get_run(r).data.tags.get("clsr.status")) for r in run_ids]


def test_a_driver_killed_after_sigterm_leaves_unfinished_trials_interrupted(study_record, capsys):
    client, held, done, running, holder = study_record
    assert settle([held], 1, "SIGTERM") == 143  # Ray's exit status 1 becomes the signal's
    parent = held["parent_run_id"]
    assert states(client, parent, done, running) == [
        ("KILLED", "interrupted"),
        ("FINISHED", "finished"),  # a finished trial stays finished
        ("KILLED", "interrupted"),
    ]
    assert client.get_run(holder).data.tags["clsr.lease"] == "released tok"  # said in words, free at once
    assert "before closing its record; closing it here" in capsys.readouterr().err


def test_the_reason_the_driver_gave_wins_over_the_signal(study_record):
    client, held, _, running, _ = study_record
    assert settle([held, {"stopping": "study_timeout"}], 1, None) == 124
    assert states(client, held["parent_run_id"], running) == [
        ("KILLED", "timed_out"),
        ("KILLED", "timed_out"),
    ]


def test_a_driver_that_died_by_itself_leaves_a_failed_study(study_record):
    client, held, _, running, _ = study_record
    assert settle([held], -signal.SIGKILL, None) == 137
    parent = client.get_run(held["parent_run_id"])
    assert (parent.info.status, parent.data.tags["clsr.status"]) == ("FAILED", "failed")
    assert "killed by SIGKILL" in parent.data.tags["clsr.error"]
    assert states(client, running) == [("FAILED", "failed")]  # never finished


def test_a_closed_or_taken_over_record_is_left_alone(study_record):
    client, held, _, running, holder = study_record
    assert settle([held, {"settled": True}], 143, "SIGTERM") == 143
    assert settle([], 2, None) == 2  # refused before a record existed
    assert settle([{**held, "token": "another driver"}], 1, "SIGTERM") == 143
    client.log_param(holder, "clsr.lease.2", "resumed")  # a resume took the study over
    assert settle([held], 1, "SIGTERM") == 143
    assert states(client, held["parent_run_id"], running) == [("RUNNING", None), ("RUNNING", None)]


def test_a_driver_that_closed_its_record_and_then_died_exits_with_the_signals_status():
    """Ray can end the driver with status 1 after its record is written: the status is still the signal's."""
    held = {"uri": "unused", "parent_run_id": "r", "token": "t", "generation": 1}
    assert settle([held, {"stopping": "SIGTERM"}, {"settled": True}], 1, "SIGTERM") == 143
    assert settle([held, {"stopping": "SIGINT"}, {"settled": True}], 130, "SIGINT") == 130
    assert settle([{"stopping": "SIGTERM"}], 1, None) == 143  # stopped before it held the study
    assert settle([held, {"settled": True}], 1, None) == 1  # a failed trial: the driver's own status


def test_the_command_names_how_to_continue_when_its_driver_could_not(capsys):
    """A driver whose graceful stop hung past its grace writes the record from its watchdog and ends
    without its last lines (seen on a loaded SLURM node): the command prints them, once, and only where
    there is a record to resume."""
    held = {"uri": "unused", "parent_run_id": "r", "token": "t", "generation": 1}
    again = {"resume_with": "platform study resume s.yaml --set seeds=3"}
    say_how_to_continue([held, again, {"stopping": "SIGTERM"}, {"settled": True}], "SIGTERM")
    err = capsys.readouterr().err
    assert "stopped by SIGTERM: finished trials are recorded, unfinished ones were marked interrupted" in err
    assert err.rstrip().endswith("Continue with: platform study resume s.yaml --set seeds=3")
    say_how_to_continue([held, again, {"stopping": "study_timeout"}, {"settled": True}], None)
    assert "marked timed_out" in capsys.readouterr().err
    say_how_to_continue([held, again, {"stopping": "budget"}, {"settled": True}], None)  # its trials finished
    assert (
        "stopped by budget (the parent run's clsr.stop_reason says why): finished trials are recorded; "
        "the trials not started run on a resume" in capsys.readouterr().err
    )
    # not settled by the driver: the supervisor's own close said what the record holds; only the way on
    say_how_to_continue([held, again, {"stopping": "SIGTERM"}], "SIGTERM")
    assert capsys.readouterr().err == "\nContinue with: platform study resume s.yaml --set seeds=3\n"
    for entries, signalled in (
        ([held, again, {"stopping": "SIGINT"}, {"settled": True}, {"told": True}], "SIGINT"),  # said it
        ([held, again, {"stopping": "lease_lost"}], None),  # another driver holds the study
        ([again, {"stopping": "SIGTERM"}], "SIGTERM"),  # stopped before it held a record
        ([held, again, {"settled": True}], None),  # not stopped: it finished or failed
    ):
        say_how_to_continue(entries, signalled)
        assert capsys.readouterr().err == "", entries


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_command_killed_alone_sends_its_driver_sigterm(tmp_path):
    """SIGKILL of the command alone: its driver gets SIGTERM (and stops gracefully) instead of running on."""
    got = tmp_path / "got"
    driver = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(got)!r}, 'w').write('SIGTERM'), sys.exit(0)))\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    command = (
        "import subprocess, sys, time\n"
        "from clsr.study.run.supervise import _stop_with_parent\n"
        f"subprocess.Popen([sys.executable, '-c', {driver!r}], preexec_fn=_stop_with_parent)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", command])
    deadline = time.time() + 30
    while not (tmp_path / "ready").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    while not (got.exists() and got.read_text()):  # the handler creates the file, then writes it
        assert time.time() < deadline, "the driver did not get SIGTERM"
        time.sleep(0.05)
    assert got.read_text() == "SIGTERM"


def test_the_command_starts_its_driver_without_importing_torch_ray_or_mlflow(tmp_path):
    """The command's own start-up comes before the driver's, on every study run: it hands the study to
    its child before importing what the child imports again (torch alone is seconds)."""
    probe = (
        "import sys\n"
        "import clsr.study.run.supervise as supervise\n"
        "from clsr.cli import main\n"
        "def spawned(argv):\n"
        "    heavy = sorted(m for m in ('torch', 'ray', 'mlflow', 'transformers') if m in sys.modules)\n"
        "    print('heavy:', heavy)\n"
        "    return 0\n"
        "supervise.supervise = spawned\n"
        f"sys.exit(main(['study', 'run', {str(tmp_path / 'any.yaml')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "heavy: []" in done.stdout, done.stdout


def test_the_command_exits_with_its_threads_joined_its_exit_functions_run_and_its_output_flushed(tmp_path):
    """``exit_now`` skips only the interpreter's teardown: a non-daemon thread still running is
    waited for, ``atexit`` functions run, buffered output reaches the pipe, and the status is kept."""
    done = tmp_path / "thread-done"
    probe = (
        "import atexit, sys, threading, time\n"
        "from clsr.cli import exit_now\n"
        f"threading.Thread(target=lambda: (time.sleep(0.3), open({str(done)!r}, 'w').close())).start()\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(1)\n"
        "pool.submit(int)\n"  # an idle pool worker (held): threading's exit hook tells it to stop
        "atexit.register(lambda: print('atexit ran', end=' '))\n"
        "sys.stdout.write('buffered ')\n"
        "exit_now(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered atexit ran "
    assert done.exists()


def test_the_driver_link_is_read_once_and_taken_out_of_the_environment(monkeypatch, tmp_path):
    """Ray's processes and commands the driver starts must not inherit the link: it leaves os.environ
    where the driver reads it, and is passed down as a DriverLink from there."""
    import json
    import os

    from clsr.study.control.driver_link import LINK_ENV, SUPERVISOR_ENV, DriverLink

    path = tmp_path / "link"
    monkeypatch.setenv(LINK_ENV, str(path))
    monkeypatch.setenv(SUPERVISOR_ENV, str(os.getppid()))
    link = DriverLink.from_environment()
    assert LINK_ENV not in os.environ and SUPERVISOR_ENV not in os.environ
    assert link.is_child and link.command_pid() == os.getppid()
    link.tell(settled=True)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"settled": True}]
    other = DriverLink.from_environment()  # another read finds nothing: not a child, its own pid
    assert not other.is_child and other.command_pid() == os.getpid()
    other.tell(settled=False)  # nowhere to write: nothing happens
    assert path.read_text().count("\n") == 1


def test_two_consoles_keep_their_own_notes(capsys):
    from clsr.study.control.console import Console

    first, second = Console(), Console()
    first.note_once("note: a")
    first.note_once("note: a")
    second.note_once("note: a")
    assert capsys.readouterr().out == "note: a\nnote: a\n" and first.quiet is None is second.quiet
