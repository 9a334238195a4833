"""``clsr.results.load``: a study's trials as a DataFrame, read back from real MLflow sqlite stores (the
report's store, and a small one with realistic parameters, a run of identical points, a superseded run
and two records of one study)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.results import load
from clsr.study.analyse.runs import NoStudyRuns
from clsr.tracking.study_runs import (
    ALSO_TAG,
    SUPERSEDED_TAG,
    close_run,
    open_child_run,
    start_parent_run,
)
from tests.support.stores import sqlite_uri
from tests.unit.study.analyse.test_report import COST, MAIN, NAME, T01, T03, T05, store, trial_metrics  # noqa: F401 (store: fixture)


def test_one_row_per_trial_with_its_final_metrics(store):  # noqa: F811
    df = load(NAME, tracking_uri=store["uri"])
    assert df.attrs["parent_run_id"] == store["parent"] and df.attrs["study"] == NAME
    # 4 temperature points over 3 seeds less one never run, 2 pooling points over 3 seeds
    assert len(df) == 11 + 6
    assert list(df.columns[:9]) == [
        "ablation", "point", "seed", "status", "run_id", "start_time", "eval_only", "device", "error",
    ]  # fmt: skip
    assert not df.duplicated(["ablation", "point", "seed"]).any()
    finished = df[df["status"] == "finished"]
    for (ablation, label), seeds in MAIN.items():
        for seed, value in seeds.items():
            row = finished[
                (finished["ablation"] == ablation) & (finished["point"] == label) & (finished["seed"] == seed)
            ]
            assert len(row) == 1
            expected = trial_metrics(ablation, seed, value)
            for metric, number in expected.items():
                assert row[metric].iloc[0] == pytest.approx(number)
            assert row["loss"].iloc[0] == pytest.approx(2.0 / 4 + 0.01 * seed)  # the last step's value
    # a resume's finished run replaces the failed first attempt of the same trial
    first = df[(df["point"] == T05) & (df["seed"] == 1)]
    assert first["status"].tolist() == ["finished"]
    failed = df[(df["point"] == T01) & (df["seed"] == 3)].iloc[0]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: CUDA out of memory"
    assert math.isnan(failed["test_sts_avg"])
    skipped = df[(df["point"] == T03) & (df["seed"] == 2)].iloc[0]
    assert skipped["status"] == "skipped" and skipped["error"] == "upstream trials without a checkpoint"
    # cost where logged, a device tag, the flattened parameters parsed back
    temperature = finished[finished["ablation"] == "temperature"]
    assert (temperature["trial_wall_s"] == COST["trial_wall_s"]).all()
    assert finished[finished["ablation"] == "pooling"]["trial_wall_s"].isna().all()
    assert set(temperature["device"]) == {"1 x NVIDIA H200"} and (finished["params.x"] == 1).all()
    assert df["seed"].dtype == "Int64" and isinstance(df["start_time"].dtype, pd.DatetimeTZDtype)


def test_groupby_gives_the_reports_cells(store):  # noqa: F811
    df = load(NAME, tracking_uri=store["uri"])
    done = df[df["status"] == "finished"]
    cells = done.groupby(["ablation", "point"])["test_sts_avg"].agg(["mean", "std", "count"])
    values = list(MAIN[("temperature", T01)].values())
    cell = cells.loc[("temperature", T01)]
    assert cell["mean"] == pytest.approx(np.mean(values)) and cell["std"] == pytest.approx(
        np.std(values, ddof=1)
    )
    assert cell["count"] == 2


def test_the_study_file_names_the_study_and_its_store(store, monkeypatch):  # noqa: F811
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    by_file = load(store["study_file"])  # tracking_uri: from the study file
    by_name = load(NAME, tracking_uri=store["uri"])
    pd.testing.assert_frame_equal(by_file, by_name)
    with pytest.raises(NoStudyRuns, match="never_ran"):
        load("never_ran", tracking_uri=store["uri"])


def child(client, uri, parent, ablation, label, seed, params, metrics, tags=None) -> str:
    trial_id = f"{ablation}[{label}] seed={seed}"
    all_tags = {"clsr.ablation": ablation, "clsr.point": label, "clsr.seed": seed, **(tags or {})}
    run_id = open_child_run(uri, parent, trial_id, f"{ablation}/{label}/seed={seed}", all_tags, params)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, 1) for k, v in metrics.items()])
    close_run(uri, run_id, "finished")
    return run_id


def test_parameters_identical_points_superseded_runs_and_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    params = {
        "seed": 7,
        "model": {"name": "minilm", "pooling": "cls", "max_length": 32},
        "trainer": {"lr": 3e-05, "bf16": True, "max_steps": None},
        "method": {"name": "simcse_unsup", "temperature": 0.05},
        "eval": {"sts_tasks": ["stsb", "sickr"]},
        "study": {"ablation": "temperature", "point": "0.05", "seed": 7},
    }
    older = start_parent_run(client, "res_t", str(tmp_path / "runs"), None)
    child(client, uri, older, "temperature", "0.05", 7, params, {"test_sts_avg": 70.0})
    parent = start_parent_run(client, "res_t", str(tmp_path / "runs"), None)
    also = {ALSO_TAG: json.dumps([["pooling", "cls"]])}
    shared = child(client, uri, parent, "temperature", "0.05", 7, params, {"test_sts_avg": 76.5}, also)
    old = child(client, uri, parent, "temperature", "0.1", 7, params, {"test_sts_avg": 1.0})
    client.set_tag(old, SUPERSEDED_TAG, "true")
    df = load("res_t", tracking_uri=uri)
    assert df.attrs["parent_run_id"] == parent
    assert df[["ablation", "point", "seed"]].values.tolist() == [
        ["pooling", "cls", 7],
        ["temperature", "0.05", 7],
    ]
    assert (df["run_id"] == shared).all() and (df["test_sts_avg"] == 76.5).all()
    row = df.iloc[0]
    assert (
        row["params.trainer.lr"] == 3e-05
        and df["params.trainer.bf16"].dtype == bool
        and row["params.trainer.bf16"]
    )
    assert row["params.trainer.max_steps"] is None and row["params.model.name"] == "minilm"
    assert row["params.model.max_length"] == 32 and row["params.eval.sts_tasks"] == ["stsb", "sickr"]
    assert row["params.seed"] == 7 and row["params.study.point"] == 0.05  # a label that reads as a number
    earlier = load("res_t", tracking_uri=uri, run_id=older)
    assert earlier["test_sts_avg"].tolist() == [70.0] and earlier.attrs["parent_run_id"] == older
