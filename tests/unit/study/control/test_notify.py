"""A study's notify webhook (issue 56 item 5): the study file's section validated with the rest (bad
values in one line naming the field, the URL never in it), the URL masked in every dump and kept from
argv and from the study Ray's workers get, the messages' bodies, the driver's hook against a real HTTP
server on 127.0.0.1 and a real MLflow store, and a failing webhook that never fails the study."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.study.control.notify import (
    FailedTrial,
    Notifier,
    ended_message,
    failed_message,
    slack_text,
    verdicts_message,
)
from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_study
from clsr.study.record.parent import StudyOutcome
from clsr.study.record.summary import resolved_summary
from clsr.study.run.waves import tell_end, without_notify
from clsr.study.spec.schema import StudyError
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from tests.support.stores import sqlite_uri
from tests.support.webhook_server import WebhookServer

SECRET = "T0B0-n0tify-s3cret"
URL = f"https://hooks.slack.com/services/{SECRET}"
SHOWN = "https://hooks.slack.com/***"
GOOD = {
    "name": "notified",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "ablations": {"temp": {"grid": {"method.temperature": [0.05, 0.1]}, "paper": {"0.05": 82.5}}},
}


def study_file(tmp_path: Path, notify, name: str = "study.yaml") -> Path:
    doc = copy.deepcopy(GOOD) | ({"notify": notify} if notify is not None else {})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# --- the study file's section ------------------------------------------------------------------------


def test_notify_is_read_with_yamls_on_key_and_every_event_by_default(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(GOOD) + f"notify: {{url: '{URL}', on: [finished, verdicts]}}\n")
    assert yaml.safe_load(path.read_text())["notify"] == {"url": URL, True: ["finished", "verdicts"]}
    notify = load_study(path).notify
    assert notify.on == ["finished", "verdicts"] and notify.url.get_secret_value() == URL
    assert notify.timeout_s == 5.0
    assert load_study(study_file(tmp_path, {"url": URL}, "b.yaml")).notify.on == [
        "failed",
        "finished",
        "verdicts",
    ]
    assert load_study(study_file(tmp_path, None, "c.yaml")).notify is None


@pytest.mark.parametrize(
    ("notify", "field", "fragment"),
    [
        (
            {"url": "http://hooks.example.com/" + SECRET},
            "notify.url",
            "http:// is allowed only to a loopback",
        ),
        ({"url": "ftp://example.com/" + SECRET}, "notify.url", "allowed: an https:// URL, or http://"),
        ({"url": URL, "on": ["started"]}, "notify.on.0", "'failed', 'finished' or 'verdicts'"),
        ({"url": URL, "on": ["failed", "failed"]}, "notify.on", "each event once (allowed: failed, finished"),
        ({"url": URL, "on": []}, "notify.on", "at least 1"),
        ({"url": URL, "timeout_s": 0}, "notify.timeout_s", "greater than 0"),
        ({"url": URL, "tiemout_s": 1}, "notify.tiemout_s", "did you mean 'timeout_s'?"),
        ({"on": ["failed"]}, "notify.url", "Field required"),
    ],
)
def test_a_bad_notify_is_one_line_naming_file_and_field_without_the_secret(tmp_path, notify, field, fragment):
    path = study_file(tmp_path, notify)
    with pytest.raises(StudyError) as err:
        load_study(path)
    (line,) = err.value.problems
    assert line.startswith(f"{field}: ") and fragment in line, line
    assert SECRET not in str(err.value) and str(path) in str(err.value)


def test_the_url_is_refused_on_the_command_line(tmp_path):
    path = study_file(tmp_path, None)
    for key, value in (("notify.url", URL), ("notify", {"url": URL}), ("notify", URL), ("notify", [URL])):
        with pytest.raises(
            StudyError, match="the webhook URL is a credential; give notify in the study file"
        ):
            load_study(path, [(key, value)])
    assert load_study(study_file(tmp_path, {"url": URL}, "b.yaml"), [("notify", None)]).notify is None
    on = load_study(
        study_file(tmp_path, {"url": URL}, "c.yaml"), [("notify.on", ["failed"]), ("notify.timeout_s", 2)]
    )
    assert on.notify.on == ["failed"] and on.notify.timeout_s == 2 and on.notify.url.get_secret_value() == URL


@pytest.mark.parametrize("notify", [{"url": URL}, URL])
def test_the_url_is_masked_in_the_study_file_text_when_turned_off_on_the_command_line(tmp_path, notify):
    """``--set notify=null``: the study has no notify, and the file's text (MLflow's study.yaml) is
    masked all the same, the URL given as a section or as a bare string."""
    path = study_file(tmp_path, notify)
    text = path.read_text()
    study = load_study(path, [("notify", None)])
    assert study.notify is None and SECRET in text
    assert SECRET not in study.masked(text) and study.masked(text).count(SHOWN) == 1


@pytest.mark.parametrize(
    ("notify", "field"), [(URL, "notify"), ({"url": URL, "on": URL}, "notify.on"), ([URL], "notify")]
)
def test_a_notify_not_a_section_is_refused_without_echoing_the_url(tmp_path, notify, field):
    path = study_file(tmp_path, notify)  # e.g. `notify: https://hooks.slack.com/services/...`
    with pytest.raises(StudyError) as err:
        load_study(path)
    (line,) = err.value.problems
    assert line.startswith(f"{field}: ") and SECRET not in str(err.value), line


def test_the_url_is_masked_in_every_dump_and_out_of_the_fingerprint(tmp_path):
    study = load_study(study_file(tmp_path, {"url": URL}))
    dumped = yaml.safe_dump(resolved_summary(study))  # resolved.yaml
    assert f"url: {SHOWN}" in dumped and SECRET not in dumped
    assert SECRET not in repr(study) and SECRET not in study.model_dump_json()
    text = study_file(tmp_path, {"url": URL}, "b.yaml").read_text()
    assert study.masked(text).count(SHOWN) == 1 and SECRET not in study.masked(text)  # study.yaml
    other = load_study(study_file(tmp_path, {"url": URL + "-rotated"}, "c.yaml"))
    assert (
        fingerprint(study)
        == fingerprint(other)
        == fingerprint(load_study(study_file(tmp_path, None, "d.yaml")))
    )


def test_the_study_ray_gets_has_no_notify(tmp_path):
    study = load_study(study_file(tmp_path, {"url": URL}))
    shipped = without_notify(study)
    assert shipped.notify is None and study.notify is not None  # the driver keeps it
    assert shipped.objectives == study.objectives and shipped.ablations is study.ablations
    assert SECRET.encode() not in pickle.dumps(shipped)
    assert SECRET.encode() in pickle.dumps(study)  # what stripping it is for


# --- the messages ------------------------------------------------------------------------------------


def test_the_messages_bodies():
    failed = failed_message("smoke", "run1", [FailedTrial("temp/0.05/seed=1 (r1)", "RuntimeError: NaN loss")])
    assert failed.body() == {
        "text": "clsr study smoke: 1 trial(s) failed\n• temp/0.05/seed=1 (r1): RuntimeError: NaN loss",
        "event": "failed", "study": "smoke", "run_id": "run1",
    }  # fmt: skip
    ended = ended_message("smoke", "run1", "timed_out", {"finished": 2, "interrupted": 1})
    assert ended.body()["text"] == "clsr study smoke timed out: 3 trial(s) (2 finished, 1 interrupted)"
    assert ended.event == "finished"
    verdicts = verdicts_message("smoke", "run1", [f"t[{i}] dev_stsb: reproduced" for i in range(22)])
    lines = verdicts.body()["text"].splitlines()
    assert (
        lines[0] == "clsr study smoke: verdicts against the papers"
        and lines[1] == "• t[0] dev_stsb: reproduced"
    )
    assert len(lines) == 22 and lines[-1] == "… and 2 more"
    assert "none to give" in verdicts_message("smoke", "run1", []).text


def test_record_text_is_escaped_for_slack_and_masked():
    text = slack_text("a <b> & c\x1b]52;c;x\x07 http://u:pw@host/x")
    assert text == "a &lt;b&gt; &amp; c\\x1b]52;c;x\\x07 http://u:***@host/x"


# --- the driver's hook -------------------------------------------------------------------------------


def notifier(server: WebhookServer, events=("failed", "finished", "verdicts"), run_id: str = "r") -> Notifier:
    from pydantic import SecretStr

    return Notifier(SecretStr(server.url()), frozenset(events), 2.0, "notified", run_id)


@pytest.mark.parametrize("failing", [{"status": 500}, {"hang": True}, "refused"])
def test_a_failing_webhook_is_a_warning_line_never_an_exception(failing, capsys):
    if failing == "refused":
        server = WebhookServer()
        server.close()  # its port now refuses
    else:
        server = WebhookServer(**failing)
    try:
        hook = notifier(server)
        hook.timeout_s = 0.5
        assert hook.post(ended_message("notified", "r", "finished", {"finished": 1})) is False
    finally:
        if failing != "refused":
            server.close()
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"warning: notify (finished) not sent: http://127.0.0.1:{server.port}/***")
    assert "s3cr3tPATH" not in line and hook.sent == []


def test_only_the_events_asked_for_are_posted():
    with WebhookServer() as server:
        hook = notifier(server, events=("verdicts",))
        assert hook.post(ended_message("notified", "r", "finished", {})) is False
        assert hook.post(verdicts_message("notified", "r", [])) is True
        assert [b["event"] for b in server.bodies()] == ["verdicts"]


def test_failed_trials_are_told_once_and_a_resume_does_not_tell_earlier_ones(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "notified", str(tmp_path / "runs"), None)

    def child(label: str, status: str, error: str | None = None) -> str:
        run_id = open_child_run(uri, parent, f"temp:{label}:1", f"temp/{label}/seed=1", {}, {"x": 1})
        close_run(uri, run_id, status, error)
        return run_id

    early = child("0.2", "failed", "an earlier attempt's failure")
    with WebhookServer() as server:
        hook = notifier(server, run_id=parent)
        hook.note_failed_before(client)
        child("0.05", "finished")
        crashed = child(
            "0.1",
            "failed",
            "Traceback (most recent call last):\n  ...\nRuntimeError: store http://u:pw@db/x down",
        )
        hook.tell_failed(client)
        hook.tell_failed(client)  # nothing new: nothing sent
        (body,) = server.bodies()
    assert body["event"] == "failed" and body["run_id"] == parent
    assert body["text"] == (
        f"clsr study notified: 1 trial(s) failed\n• temp/0.1/seed=1 ({crashed}): RuntimeError: store http://u:***@db/x down"
    )
    assert early not in body["text"]


def test_a_trial_that_fails_again_on_a_resume_is_told(tmp_path):
    """A resume reopens the failed trial's run (same run id, same name): failing again is a new failure."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "notified", str(tmp_path / "runs"), None)
    trial = ("temp:0.1:1", "temp/0.1/seed=1", {}, {"x": 1})
    run_id = open_child_run(uri, parent, *trial)
    close_run(uri, run_id, "failed", "RuntimeError: the earlier attempt")
    earlier = client.get_run(run_id).info.end_time - 60_000  # an earlier attempt's end: a minute before
    client.set_terminated(run_id, "FAILED", end_time=earlier)
    with WebhookServer() as server:
        hook = notifier(server, run_id=parent)
        hook.note_failed_before(client)  # the resume starts: the earlier failure is not told
        hook.tell_failed(client)
        assert open_child_run(uri, parent, *trial) == run_id  # reopened
        hook.tell_failed(client)  # running again: nothing to tell
        close_run(uri, run_id, "failed", "RuntimeError: NaN loss again")
        hook.tell_failed(client)
        hook.tell_failed(client)  # told once
        (body,) = server.bodies()
    assert client.get_run(run_id).info.end_time > earlier
    assert body["text"] == (
        f"clsr study notified: 1 trial(s) failed\n• temp/0.1/seed=1 ({run_id}): RuntimeError: NaN loss again"
    )


def test_the_end_tells_the_state_and_the_verdicts_only_once_finished(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    study = load_study(study_file(tmp_path, {"url": URL}))
    for state, events in (("finished", ["finished", "verdicts"]), ("failed", ["finished"])):
        parent = start_parent_run(client, "notified", str(tmp_path / "runs"), None)
        client.set_tag(parent, "clsr.status", state)
        with WebhookServer() as server:
            outcome = StudyOutcome([{"status": "finished"}, {"status": state}])
            tell_end(notifier(server, run_id=parent), study, client, uri, outcome)
            bodies = server.bodies()
        assert [b["event"] for b in bodies] == events
        total = "2 finished" if state == "finished" else "1 failed, 1 finished"
        assert bodies[0]["text"] == f"clsr study notified {state}: 2 trial(s) ({total})"
    # a webhook that is down and a record that cannot be read: warning lines, nothing raised
    broken = SimpleNamespace(get_run=lambda run_id: 1 / 0, search_runs=lambda *a, **k: 1 / 0)
    with WebhookServer(status=500) as server:
        tell_end(notifier(server), study, broken, uri, StudyOutcome([]))


def test_the_parent_runs_record_holds_the_url_masked_only(tmp_path, monkeypatch):
    """What ``start_record`` writes to a real MLflow store (study.yaml, resolved.yaml, the parent's params
    and tags) shows the notify URL as scheme://host/*** and holds its secret nowhere."""
    from clsr.study.record.parent import start_record

    monkeypatch.chdir(tmp_path)  # the Default experiment's artifacts land here
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    path = study_file(tmp_path, {"url": URL, "on": ["finished"]})
    study = load_study(path, [("storage_path", str(tmp_path / "runs"))])
    parent, _, lease = start_record(client, uri, study, path.read_text(), fingerprint(study))
    lease.release()
    run = client.get_run(parent)
    assert SECRET not in str(run.data.params) and SECRET not in str(run.data.tags)
    folder = Path(client.download_artifacts(parent, "", str(tmp_path / "artifacts-read")))
    texts = {p.name: p.read_text() for p in folder.rglob("*") if p.is_file()}
    assert {"study.yaml", "resolved.yaml", "fingerprint.json"} <= set(texts)
    assert [name for name, text in texts.items() if SECRET in text] == []
    assert f"url: {SHOWN}" in texts["study.yaml"] and f"url: {SHOWN}" in texts["resolved.yaml"]
