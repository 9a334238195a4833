"""A newcomer's first mistakes, refused before anything starts with what to do (issue 35): a data folder
one level off, and a folder of studies of which some need hub models this machine has not cached."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from clsr.cli import main
from clsr.data.sources import data_folder_problem

SMOKE = Path(__file__).resolve().parents[3] / "studies" / "smoke.yaml"


def test_a_data_folder_one_level_too_high_is_refused_with_where_it_is(tmp_path, monkeypatch, capsys):
    (tmp_path / "data" / "wiki").mkdir(parents=True)
    monkeypatch.setenv("CLSR_DATA_DIR", str(tmp_path))
    started = time.monotonic()
    assert main(["study", "validate", str(SMOKE)]) == 1
    assert time.monotonic() - started < 30  # before any trial, model or Ray
    err = capsys.readouterr().err
    assert f"$CLSR_DATA_DIR = '{tmp_path}' holds none of senteval/, nli/, wiki/" in err
    assert f"did you mean '{tmp_path / 'data'}'?" in err
    assert err.count("\n") == 2  # the count line and one problem line, not one per trial


def test_a_data_folder_one_level_too_deep_points_up(tmp_path, monkeypatch):
    (tmp_path / "wiki" / "inner").mkdir(parents=True)
    (tmp_path / "nli").mkdir()
    problem = data_folder_problem(str(tmp_path / "wiki"))
    assert problem.startswith(f"data.data_dir = '{tmp_path / 'wiki'}' holds none of")
    assert problem.endswith(f"did you mean '{tmp_path}'?")
    assert data_folder_problem(str(tmp_path)) is None
    monkeypatch.delenv("CLSR_DATA_DIR")
    assert data_folder_problem() is None  # no folder: the hub


def test_a_folder_of_studies_ends_with_one_summary_line(tmp_path, capsys):
    shutil.copy(SMOKE, tmp_path / "smoke.yaml")
    hub = yaml.safe_load(SMOKE.read_text())
    hub["name"] = "hub"
    hub["base"]["model"]["name"] = "some-org/a-model-nobody-cached"
    (tmp_path / "hub.yaml").write_text(yaml.safe_dump(hub))
    broken = dict(hub, name="broken", metric="no_such_metric")
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    assert main(["study", "validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "1 valid; 1 need hub models or sets that are not in your cache: hub.yaml — run once with the hub "
        "reachable, or add --set skip_unavailable=true; 1 invalid (above)"
    )


def test_running_a_study_again_is_refused_unless_new(tmp_path, monkeypatch):
    """A rerun would start a record the report shows instead of the earlier one: refused, saying how to
    report, resume or start another record (``--new``)."""
    from mlflow.tracking import MlflowClient

    from clsr.study.plan.fingerprint import fingerprint
    from clsr.study.plan.load import load_study
    from clsr.study.record import parent as record
    from clsr.study.record.parent import EarlierRecord

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    study = load_study(str(SMOKE), [("storage_path", str(tmp_path / "runs"))])
    first, _, lease = record.start_record(client, uri, study, "name: smoke", fingerprint(study))
    lease.release()
    client.set_tag(first, "clsr.status", "finished")
    client.set_terminated(first, status="FINISHED")
    try:
        record.start_record(client, uri, study, "name: smoke", fingerprint(study))
    except EarlierRecord as err:
        message = str(err)
    else:
        raise AssertionError("a second record was started without --new")
    assert message.startswith(f"study 'smoke' already has a record (MLflow run {first}, finished, started ")
    assert "`platform study resume`" in message and "`platform study run --new`" in message
    second, _, lease = record.start_record(client, uri, study, "name: smoke", fingerprint(study), new=True)
    lease.release()
    assert second != first


def test_a_study_whose_every_trial_failed_is_recorded_failed():
    from clsr.study.record.parent import all_failed

    assert all_failed([{"status": "failed"}, {"status": "failed"}, {"status": "skipped"}])
    assert not all_failed([{"status": "failed"}, {"status": "finished"}])
    assert not all_failed([{"status": "failed"}, {"status": "stopped"}])  # ASHA stopped it: it ran
    assert not all_failed([{"status": "skipped"}]) and not all_failed([])
