"""The parts of a truthful record, each on a real MLflow store: the write journal (replays are harmless,
what a trial leaves is sent later, unsent writes ride in a checkpoint), the study lease (a
compare-and-set two drivers both see), the resolved-study fingerprint, and the study's time limit."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from clsr.study.control.interrupt import Interrupted, Interrupts
from clsr.study.plan.fingerprint import compare, fingerprint
from clsr.study.plan.load import load_study
from clsr.tracking.spool import Spool, hand_over, pending_runs, replay_pending

REPO_ROOT = Path(__file__).resolve().parents[4]


def points(client: MlflowClient, run_id: str, key: str) -> Counter:
    return Counter((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_a_journal_replayed_twice_leaves_each_write_once(store, tmp_path):
    uri, client, run_id = store
    (tmp_path / "table.csv").write_text("a,b\n1,2\n")
    spool = Spool(uri, run_id, tmp_path / "journal")
    spool.metrics([("loss", 0.5, 1000, 1), ("loss", 0.25, 2000, 2)])
    spool.params({"trainer.lr": "3e-05"})
    spool.tags({"clsr.status": "finished"})
    spool.artifacts(tmp_path / "table.csv", "method")
    spool.terminate("FINISHED")
    (tmp_path / "table.csv").unlink()  # the journal kept its own copy
    everything = spool.unsent()  # what a checkpoint written now would hold
    assert spool.start().drain(60) and spool.sent == 5 and spool.unsent() == []

    hand_over(everything, spool.folder, str(tmp_path / "storage"), run_id)  # all of it again
    assert pending_runs(str(tmp_path / "storage")) == [run_id]
    assert replay_pending(uri, str(tmp_path / "storage")) == (5, [])
    assert pending_runs(str(tmp_path / "storage")) == []  # sent journals are removed

    run = client.get_run(run_id)
    assert points(client, run_id, "loss") == Counter({(1, 0.5): 1, (2, 0.25): 1})
    assert run.data.params == {"trainer.lr": "3e-05"} and run.data.tags["clsr.status"] == "finished"
    assert run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run_id, "method")] == ["method/table.csv"]


def test_unsent_writes_ride_in_a_checkpoint_and_the_next_attempt_sends_them(store, tmp_path):
    uri, client, run_id = store
    unreachable = Spool("http://127.0.0.1:9", run_id, tmp_path / "first")  # nothing listens on port 9
    unreachable.metrics([("loss", 1.0, 1000, 1)])
    unreachable.tags({"clsr.device": "1 x cpu"})
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    unreachable.save_to(checkpoint)
    assert (checkpoint / "spool" / "journal.jsonl").exists()

    retried = Spool(uri, run_id, tmp_path / "second")
    retried.load_from(checkpoint)
    retried.metrics([("loss", 0.5, 2000, 2)])
    assert retried.start().drain(60)
    assert points(client, run_id, "loss") == Counter({(1, 1.0): 1, (2, 0.5): 1})
    assert client.get_run(run_id).data.tags["clsr.device"] == "1 x cpu"


def test_a_trial_that_cannot_reach_mlflow_hands_its_writes_to_the_study_storage(store, tmp_path):
    uri, client, run_id = store
    spool = Spool("http://127.0.0.1:9", run_id, tmp_path / "journal").start()
    spool.metrics([("loss", 1.0, 1000, 1)])
    assert spool.close(wait_s=0.5, pending_root=str(tmp_path / "storage")) == 1
    assert not (tmp_path / "journal").exists()
    assert replay_pending(uri, str(tmp_path / "storage")) == (1, [])
    assert points(client, run_id, "loss") == Counter({(1, 1.0): 1})


def test_the_fingerprint_names_added_removed_and_changed_trials():
    import yaml

    from clsr.study.plan.load import study_from_dict

    smoke = load_study(REPO_ROOT / "studies" / "smoke.yaml")
    raw = yaml.safe_load((REPO_ROOT / "studies" / "smoke.yaml").read_text())
    raw["ablations"]["temperature"]["grid"]["method.temperature"] = [0.05, 0.2]
    edited = study_from_dict(raw, "edited.yaml", REPO_ROOT / "studies", [("trainer.lr", 1.0e-4)])
    moved = load_study(
        REPO_ROOT / "studies" / "smoke.yaml", [("concurrency", 1), ("storage_path", "elsewhere")]
    )
    assert not compare(fingerprint(smoke), fingerprint(moved))  # where and how fast is not what
    changes = compare(fingerprint(smoke), fingerprint(edited))
    assert changes.added == ["temperature[method.temperature=0.2] seed=1"]
    assert changes.removed == ["temperature[method.temperature=0.1] seed=1"]
    assert changes.changed == ["temperature[method.temperature=0.05] seed=1"]  # the base lr changed


def test_the_study_time_limit_stops_the_study_like_a_signal():
    interrupts = Interrupts(study_timeout_s=0.2)
    interrupts.GRACE_S = 3600  # the watchdog that ends a hung driver must not end this test
    with interrupts:
        time.sleep(0.6)
        assert interrupts.reason == "study_timeout" and interrupts.exit_code == 124
        with pytest.raises(Interrupted):
            interrupts.check()


def test_local_storage_refused_on_a_cluster_of_several_hosts(monkeypatch):
    import clsr.study.run.storage_checks as checks
    from clsr.study.run.storage_checks import StorageError, check_local_storage_on_cluster

    monkeypatch.setattr(checks, "cluster_hosts", lambda: {"10.0.0.1", "10.0.0.2"})
    with pytest.raises(StorageError, match=r"local folder, but the Ray cluster spans 2 hosts .*s3://"):
        check_local_storage_on_cluster("smoke", "runs")
    check_local_storage_on_cluster("smoke", "s3://bucket/runs")  # cloud: fine
    check_local_storage_on_cluster("smoke", "file:///shared/runs")  # a mount every node has: the user's call
    monkeypatch.setattr(checks, "cluster_hosts", lambda: {"127.0.0.1"})
    check_local_storage_on_cluster("smoke", "runs")  # several nodes on one host share its disk
