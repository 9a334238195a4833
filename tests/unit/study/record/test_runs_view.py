"""The study's shared view of its runs table (issue 53): written on the experiment when a driver takes the
record, read back from MLflow as the UI reads it."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_study
from clsr.study.record import parent as record
from clsr.study.record.runs_view import VIEW_TAG, trials_url, varied_params

REPO_ROOT = Path(__file__).resolve().parents[4]


def test_each_record_writes_the_view_of_its_own_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    study = load_study(str(REPO_ROOT / "studies" / "smoke.yaml"), [("storage_path", str(tmp_path / "runs"))])
    first, _, lease = record.start_record(client, uri, study, "name: smoke", fingerprint(study))
    lease.release()
    experiment = client.get_experiment_by_name("smoke")
    assert json.loads(experiment.tags[VIEW_TAG]) == {
        "searchFilter": f"tags.`mlflow.parentRunId` = '{first}'",
        "orderByKey": "metrics.`best_dev_stsb`",
        "orderByAsc": False,  # mode: max, the best first
        "selectedColumns": ["metrics.`best_dev_stsb`", "params.`method.temperature`"],
    }
    client.set_terminated(first, status="FINISHED")
    second, _, lease = record.start_record(client, uri, study, "name: smoke", fingerprint(study), new=True)
    lease.release()
    view = json.loads(client.get_experiment(experiment.experiment_id).tags[VIEW_TAG])
    assert view["searchFilter"] == f"tags.`mlflow.parentRunId` = '{second}'"  # the newest record's trials
    assert trials_url("http://127.0.0.1:5000/", experiment.experiment_id) == (
        f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
        "?workflowType=machine_learning&viewStateShareKey=trials"
    )


def test_the_columns_are_every_parameter_the_ablations_vary_in_study_order():
    """gclsr_ablations.yaml: its points' keys (the first ablation's three, the region sizes, ...), then its
    grids' axes, each once, in the file's order."""
    study = load_study(str(REPO_ROOT / "studies" / "gclsr_ablations.yaml"), [])
    assert varied_params(study) == [
        "method.augmentation", "method.self_attention", "method.group_size", "model.region_sizes",
        "trainer.batch_size", "trainer.weight_decay", "method.predictor_lr", "trainer.momentum",
        "trainer.momentum_after_warmup", "trainer.warmup_epochs", "model.filters",
        "method.projector_out_bn", "method.pwva.operators", "method.oov_draw", "trainer.nesterov",
    ]  # fmt: skip
