"""What the MLflow UI shows of a study without `platform study report`: the experiment opens as model
training, trials have readable names, and the parent run carries each point's mean (read back from a
real SQLite store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from clsr.study.plan.load import load_study
from clsr.study.record.parent_summary import log_parent_summary, metric_key, point_means
from clsr.tracking.study_runs import EXPERIMENT_KIND_TAG, TRAINING_KIND, experiment_id, trial_run_name
from tests.support.stores import sqlite_uri

REPO_ROOT = Path(__file__).resolve().parents[4]

METRIC = "best_dev_stsb"  # smoke.yaml's metric
ROWS = [  # as parent.summary_rows writes them
    {
        "ablation": "temperature",
        "point": "method.temperature=0.05",
        "seed": "1",
        "status": "finished",
        METRIC: 70.0,
    },
    {
        "ablation": "temperature",
        "point": "method.temperature=0.05",
        "seed": "2",
        "status": "finished",
        METRIC: 74.0,
    },
    {
        "ablation": "temperature",
        "point": "method.temperature=0.05",
        "seed": "3",
        "status": "failed",
        METRIC: None,
    },
    {
        "ablation": "temperature",
        "point": "a/../b|<x>",
        "seed": "1",
        "status": "finished",
        METRIC: float("nan"),
    },
    {"ablation": "pooling", "point": "cls (+1 identical)", "seed": "1", "status": "finished", METRIC: 60.5},
]


def test_a_new_study_experiment_is_model_training_and_an_old_one_is_marked(tmp_path):
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    made = experiment_id(client, "fresh")
    assert (
        client.get_experiment(made).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND == "custom_model_development"
    )
    old = client.create_experiment("older")
    assert experiment_id(client, "older") == old
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND


def test_trial_names_read_as_the_report_labels_them():
    assert (
        trial_run_name("temperature", "method.temperature=0.05", 1)
        == "temperature method.temperature=0.05 · seed 1"
    )


def test_metric_keys_hold_only_what_mlflow_accepts():
    assert metric_key("summary", "temperature", "method.temperature=0.05", "test_sts_avg") == (
        "summary - temperature - method.temperature_0.05 - test_sts_avg"
    )
    assert metric_key("summary", "t", "a/../b|<x>", "m") == "summary - t - a___b_x_ - m"
    assert metric_key("summary", "t", "", "m") == "summary - t - _ - m"


def test_a_points_mean_counts_its_finished_seeds_only():
    means = point_means(ROWS, METRIC)
    assert means == {
        ("temperature", "method.temperature=0.05"): [70.0, 74.0],
        ("pooling", "cls"): [60.5],
    }


def test_the_parent_run_carries_the_studys_shape_and_each_points_mean(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    study = load_study(REPO_ROOT / "studies" / "smoke.yaml")
    run_id = client.create_run(experiment_id(client, study.name)).info.run_id
    log_parent_summary(client, run_id, study, ROWS)
    log_parent_summary(client, run_id, study, ROWS)  # a resume closes the study again: params kept
    run = client.get_run(run_id)
    assert run.data.params["study.metric"] == study.objectives[0][0]
    assert run.data.params["study.ablations"] == ",".join(study.ablations)
    assert run.data.params["study.seeds"] == ",".join(str(s) for s in study.seeds)
    metric = study.objectives[0][0]
    assert metric == METRIC
    assert run.data.metrics[f"{metric} mean - temperature - method.temperature_0.05"] == pytest.approx(72.0)
    assert run.data.metrics["n_seeds - temperature - method.temperature_0.05"] == 2
    assert run.data.metrics[f"{metric} mean - pooling - cls"] == pytest.approx(60.5)
    assert not any("a___b" in key for key in run.data.metrics)  # its only seed's value is NaN
