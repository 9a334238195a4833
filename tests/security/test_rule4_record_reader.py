"""Rule 4: one trusted reader of the record. A colleague with write access to the tracking server plants
a parent run, a NaN metric, a malformed tag; every command still reads the study's own record, never
promotes the NaN, and names what it skipped. The lease's "same machine" includes the kernel's boot id."""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path

import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.study.analyse.compare import previous_record
from clsr.study.analyse.promote import promote
from clsr.study.analyse.rows import paper_from_tags
from clsr.study.analyse.runs import load_trials, open_study_runs
from clsr.study.plan.distinct import also_of
from clsr.study.plan.load import load_study
from clsr.study.record.lease import Beat, Lease, pid_namespace
from clsr.study.record.reader import study_parent, study_records
from clsr.tracking.study_runs import ALSO_TAG, close_run, open_child_run, start_parent_run
from tests.support.stores import sqlite_uri

NAME = "sec4"
STUDY = {
    "name": NAME,
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}},
    "seeds": [1, 2],
    "metric": "best_dev_stsb",
    "ablations": {"temperature": {"grid": {"method.temperature": [0.05, 0.1]}}},
}
T05, T01 = "method.temperature=0.05", "method.temperature=0.1"


def child(client, uri, parent, label, seed, value, tags=None, model=None) -> str:
    """A finished trial run as the trainer leaves it (its metric, optionally a ``model/`` artifact)."""
    trial_id = f"temperature[{label}] seed={seed}"
    all_tags = {"clsr.ablation": "temperature", "clsr.point": label, "clsr.seed": seed, **(tags or {})}
    run_id = open_child_run(uri, parent, trial_id, f"temperature/{label}/seed={seed}", all_tags, {})
    client.log_batch(run_id, metrics=[Metric("best_dev_stsb", value, int(time.time() * 1000), 1)])
    if model is not None:
        client.log_artifacts(run_id, str(model), "model")
    close_run(uri, run_id, "finished")
    return run_id


@pytest.fixture
def record(tmp_path, monkeypatch):
    """The study's record, leased by its driver: two finished trials with a model (the better one a
    NaN that ran first), then a newer parent run a colleague planted, never leased, holding a 'better'
    trial."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    study_file = tmp_path / f"{NAME}.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    client = MlflowClient(uri)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    real = start_parent_run(client, NAME, str(tmp_path / "runs"), None)
    lease = Lease(uri, real, NAME)
    lease.take_first()
    nan = child(client, uri, real, T05, 1, math.nan, model=model)
    good = child(client, uri, real, T01, 1, 80.0, model=model)
    lease.release()
    client.set_terminated(real)
    time.sleep(0.01)  # the planted run starts later: the newest by time
    planted = start_parent_run(client, NAME, str(tmp_path / "elsewhere"), "planted")
    evil = child(client, uri, planted, T01, 2, 99.0, model=model)
    client.set_terminated(planted)
    return {"uri": uri, "client": client, "file": study_file, "real": real, "planted": planted,
            "good": good, "nan": nan, "evil": evil}  # fmt: skip


def test_a_planted_unleased_parent_is_neither_reported_compared_nor_promoted(record):
    client, uri = record["client"], record["uri"]
    assert study_parent(client, NAME).info.run_id == record["real"]
    assert [r.info.run_id for r in study_records(client, NAME)] == [record["real"], record["planted"]]
    assert open_study_runs(NAME, uri)[1].info.run_id == record["real"]  # report, promote, compare, results
    assert previous_record(NAME, uri) == record["planted"]  # A is the record before B, the reader's one
    promoted = promote(load_study(record["file"], []), uri)
    assert promoted.trial.run_id == record["good"]  # not the planted 99.0, not the NaN


def test_a_nan_trial_never_wins_promote(record):
    trials = {t.run_id: t for t in load_trials(record["client"], record["real"])}
    assert math.isnan(trials[record["nan"]].metrics["best_dev_stsb"])  # it ran first: max() kept it
    promoted = promote(load_study(record["file"], []), record["uri"])
    assert promoted.trial.run_id == record["good"] and promoted.tags["metric_value"] == "80.0"


def test_malformed_tags_are_skipped_and_named(record, capsys):
    client, uri = record["client"], record["uri"]
    bad = child(client, uri, record["real"], T01, 2, 70.0, tags={"clsr.paper.x": "n/a"})
    client.set_tag(bad, "clsr.seed", "one")
    client.set_tag(bad, ALSO_TAG, '[["temperature", "other"]]')
    trials = {t.run_id: t for t in load_trials(client, record["real"])}
    assert trials[bad].seed is None
    assert paper_from_tags(trials.values()) == {}
    assert also_of(client.get_run(bad).data.tags) == []
    err = capsys.readouterr().err
    assert f"MLflow run {bad}: tag clsr.seed='one' is not an integer; skipped" in err
    assert "clsr.paper.x='n/a' is not a finite number; skipped" in err
    promote(load_study(record["file"], []), uri)  # reads the same record without a traceback


def test_the_lease_tells_two_hosts_of_one_name_apart_by_boot_id():
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert pid_namespace().endswith(f":{boot}")
    here = Beat.parse(f"tok {socket.gethostname()} {pid_namespace()} 1 3")
    assert here is not None and here.here() is True  # pid 1 of this boot: alive
    inode = pid_namespace().split(":")[0]
    twin = Beat.parse(f"tok {socket.gethostname()} {inode}:another-boot 1 3")  # same name, root ns
    assert twin is not None and twin.here() is None  # another machine: its lease is not judged here
