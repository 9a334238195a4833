"""``platform study stop`` and the budget, through a real MLflow store: the request written by the
command, read by the driver's watch, obeyed by a starting trial; the reason tagged on the parent."""

from __future__ import annotations

import signal
import threading

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.control import watch as watch_module
from clsr.study.control.interrupt import Interrupts
from clsr.study.control.stop_request import HOLD_TAG, STOP_TAG, held_by, read_request
from clsr.study.control.watch import BUDGET, STOP_REQUEST, StudyWatch
from clsr.study.plan.load import load_study
from clsr.study.run.trial import StudyContext, TrialHeld, _refuse_held
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from tests.support.stores import sqlite_uri
from tests.unit.study.spec.test_study_validation import GOOD

TWO = {**GOOD, "ablations": {"temp": GOOD["ablations"]["temp"], "lr": {"grid": {"trainer.lr": [1e-5, 3e-5]}}}}


class Stops:
    """What the watch asks of the driver's Interrupts (the real one signals the running Tune fit)."""

    def __init__(self):
        self.reasons: list[str] = []

    def stop_for(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.fixture
def record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**TWO, "tracking_uri": uri, "budget": {"max_failed_trials": 1}}))
    study = load_study(path)
    client = MlflowClient(uri)
    parent = start_parent_run(client, study.name, str(tmp_path / "runs"), None)
    return study, uri, client, parent, path


def trial_run(uri, parent, ablation, n):
    return open_child_run(uri, parent, f"{ablation}-{n}", f"{ablation}-{n}", {"clsr.ablation": ablation}, {})


def test_an_ablation_stop_goes_from_the_command_to_the_driver_and_the_trials(record, capsys):
    study, uri, client, parent, path = record
    stops = Stops()
    watch = StudyWatch(study, uri, parent, stops).start()
    watch.close()  # polled by hand here
    assert main(["study", "stop", str(path), "--ablation", "lr"]) == 0
    assert f"run {parent}" in capsys.readouterr().out
    assert client.get_run(parent).data.tags[STOP_TAG] == "lr"
    running = trial_run(uri, parent, "temp", 0)
    watch.poll()
    assert watch.stopped_ablations == {"lr"} and watch.hold is None and stops.reasons == []
    ctx = StudyContext(study, uri, parent, "runs")
    with pytest.raises(TrialHeld, match="ablation.s. lr"):
        _refuse_held(ctx, "lr")  # a trial of lr starting now does not run
    _refuse_held(ctx, "temp")  # the other ablation's do
    close_run(uri, running, "finished")
    # the study ends with everything else done: stopped, with the reason on the parent
    assert watch.settle(client) == STOP_REQUEST
    assert client.get_run(parent).data.tags[HOLD_TAG] == "platform study stop: ablation(s) lr"


def test_a_whole_study_stop_waits_for_the_running_trials(record):
    study, uri, client, parent, path = record
    stops = Stops()
    watch = StudyWatch(study, uri, parent, stops).start()
    watch.close()
    running = trial_run(uri, parent, "temp", 0)
    assert main(["study", "stop", str(path)]) == 0
    assert main(["study", "stop", str(path), "--ablation", "lr"]) == 0
    assert read_request(client.get_run(parent).data.tags).whole
    watch.poll()
    assert watch.hold == (STOP_REQUEST, "platform study stop: the whole study")
    tags = client.get_run(parent).data.tags
    assert held_by(tags, "temp") == "platform study stop: the whole study"  # no trial starts now
    assert stops.reasons == []  # a trial still runs: it finishes
    close_run(uri, running, "finished")
    watch.poll()
    assert stops.reasons == [STOP_REQUEST]
    # a resume's driver starts with no request: the earlier driver's are cleared
    StudyWatch(study, uri, parent, Stops()).start().close()
    assert not {STOP_TAG, HOLD_TAG} & set(client.get_run(parent).data.tags)


def test_max_failed_trials_holds_the_study_from_the_record(record):
    study, uri, client, parent, _ = record
    stops = Stops()
    watch = StudyWatch(study, uri, parent, stops).start()
    watch.close()
    close_run(uri, trial_run(uri, parent, "temp", 0), "finished")
    watch.poll()
    assert watch.hold is None and stops.reasons == []
    close_run(uri, trial_run(uri, parent, "lr", 1), "failed", "boom")
    watch.poll()
    why = "budget.max_failed_trials 1 reached: 1 trial(s) failed"
    assert watch.hold == (BUDGET, why) and stops.reasons == [BUDGET]
    assert client.get_run(parent).data.tags[HOLD_TAG] == why
    with pytest.raises(TrialHeld, match="max_failed_trials"):
        _refuse_held(StudyContext(study, uri, parent, "runs"), "temp")


def test_the_command_refuses_what_it_cannot_stop(record, tmp_path, capsys):
    study, uri, client, parent, path = record
    assert main(["study", "stop", str(path), "--ablation", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"{path}: --ablation: no ablation 'nope' (allowed: lr, temp)"
    client.set_terminated(parent, status="KILLED")
    assert main(["study", "stop", str(path)]) == 2
    assert "is not running (its record is KILLED); nothing to stop" in capsys.readouterr().err
    assert STOP_TAG not in client.get_run(parent).data.tags


def test_a_poll_that_cannot_read_the_record_is_only_a_warning(record, monkeypatch, capsys):
    study, uri, client, parent, _ = record
    watch = StudyWatch(study, uri, parent, Stops())
    monkeypatch.setattr(watch_module, "POLL_S", 0.01)

    def outage() -> None:
        watch.close()  # one pass
        raise ConnectionError("the tracking server is down")

    monkeypatch.setattr(watch, "poll", outage)
    watch._loop()
    assert "warning: budget/stop check skipped (ConnectionError: the tracking server is down)" in (
        capsys.readouterr().out
    )


def test_a_wall_budget_goes_by_the_plans_projection_before_any_trial_finished(record, tmp_path, capsys):
    _, uri, client, parent, path = record
    doc = yaml.safe_load(path.read_text())
    doc["budget"] = {"wall": "1s"}  # shorter than any projected trial
    path.write_text(yaml.safe_dump(doc))
    stops = Stops()
    watch = StudyWatch(load_study(path), uri, parent, stops).start()
    watch.close()
    watch.poll()
    assert "budget: the next trial's cost before any trial finished: " in capsys.readouterr().out
    assert watch.hold[0] == BUDGET and watch.hold[1].startswith("budget.wall 1s: 0.0 min run + ")
    assert stops.reasons == [BUDGET]  # nothing runs: the study stops at once
    assert client.get_run(parent).data.tags[HOLD_TAG] == watch.hold[1]


def test_a_self_requested_stop_arms_no_watchdog_and_waits_for_tunes_handler():
    asked = threading.Event()
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # as before any fit: the default kills the process
        with Interrupts() as interrupts, interrupts.experiment():
            interrupts.stop_for(BUDGET)  # no fit listens yet: no signal (this process lives on)
            assert interrupts.reason == BUDGET and interrupts.exit_code == 0
            signal.signal(signal.SIGUSR1, lambda *_: asked.set())  # the fit's handler, as tune.py's
            assert asked.wait(60)  # then Tune is asked
            interrupts.stop_for(STOP_REQUEST)  # a second stop changes nothing
            assert interrupts.reason == BUDGET
        assert "clsr-grace" not in {t.name for t in threading.enumerate()}  # no os._exit to come
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_stop_asked_while_the_record_is_written_is_nothing():
    with Interrupts() as interrupts:
        interrupts.recording = True
        interrupts.stop_for(BUDGET)
        assert not interrupts.stopped


def test_close_waits_for_the_poll_in_progress(record, monkeypatch):
    study, uri, _, parent, _ = record
    watch = StudyWatch(study, uri, parent, Stops())
    monkeypatch.setattr(watch_module, "POLL_S", 0.01)
    polling, release, polled = threading.Event(), threading.Event(), []

    def slow_poll() -> None:
        polling.set()
        release.wait(60)
        polled.append(True)

    monkeypatch.setattr(watch, "poll", slow_poll)
    watch.start()
    assert polling.wait(60)
    threading.Timer(0.2, release.set).start()
    watch.close()
    assert polled == [True] and not watch._thread.is_alive()


def test_a_record_that_does_not_answer_at_start_is_a_warning(record, monkeypatch, capsys):
    study, uri, _, parent, _ = record

    class Down:
        def __init__(self, uri):
            pass

        def get_run(self, run_id):
            raise ConnectionError("the tracking server is down")

    monkeypatch.setattr(watch_module, "PatientClient", Down)
    watch = StudyWatch(study, uri, parent, Stops()).start()
    watch.close()
    assert "warning: could not clear an earlier driver's stop request (ConnectionError: the tracking" in (
        capsys.readouterr().out
    )


def test_the_command_stops_the_smoke_run(record, capsys):
    study, uri, client, parent, path = record
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "smoke": {"seeds": [1]}}))
    smoke = load_study(path, smoke=True)
    smoke_parent = start_parent_run(client, smoke.name, "runs-smoke", None)
    assert main(["study", "stop", str(path), "--smoke", "--ablation", "lr"]) == 0
    assert f"asked study '{smoke.name}' (run {smoke_parent})" in capsys.readouterr().out
    assert client.get_run(smoke_parent).data.tags[STOP_TAG] == "lr"
    assert STOP_TAG not in client.get_run(parent).data.tags
