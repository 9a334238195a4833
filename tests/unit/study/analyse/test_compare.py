"""``platform study compare``: two records in two real MLflow sqlite stores, paired by resolved
configuration and seed; the differences, CIs and Holm-adjusted p checked against SciPy and statsmodels
on the same hand-made numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from clsr.cli import main
from clsr.study.analyse.compare import compare_records
from clsr.tracking.study_runs import start_parent_run
from tests.support.stores import sqlite_uri
from tests.unit.study.analyse.test_results import child

NAME = "cmp"
BASE = {
    "model": {"name": "minilm", "pooling": "cls"},
    "data": {"data_dir": "/data/cpu"},
    "trainer": {"lr": 3e-05, "seed": 0},
    "method": {"name": "simcse_unsup", "temperature": 0.05},
}
# (ablation, label) -> method.temperature / model.pooling; seed -> test_sts_avg
A = {
    ("temperature", "0.05"): {1: 76.1, 2: 75.4, 3: 76.8},
    ("temperature", "0.1"): {1: 74.0, 2: 74.9, 3: 73.2},
    ("pooling", "avg"): {1: 70.0, 2: 71.0},
}
B = {
    ("temperature", "0.05"): {1: 76.3, 2: 75.9, 3: 77.5},
    ("temperature", "0.1"): {1: 74.1, 2: 74.0},  # seed 3 did not finish on B
    ("pooling", "cls_before_pooler"): {1: 69.0},
}


def params(ablation: str, label: str, seed: int, data_dir: str) -> dict:
    p = {k: dict(v) for k, v in BASE.items()}
    p["data"]["data_dir"] = data_dir
    p["trainer"]["seed"] = seed
    if ablation == "temperature":
        p["method"]["temperature"] = float(label)
    else:
        p["model"]["pooling"] = label
    return p | {"study": {"ablation": ablation, "point": label, "seed": seed}}


def record(uri: str, points: dict, data_dir: str, storage: str, extra: dict | None = None) -> str:
    extra = extra or {}
    client = MlflowClient(uri)
    parent = start_parent_run(client, NAME, storage, None)
    for (ablation, label), seeds in points.items():
        for seed, value in seeds.items():
            p = params(ablation, label, seed, data_dir) | extra
            child(client, uri, parent, ablation, label, seed, p, {"test_sts_avg": value})
    return parent


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri_a = sqlite_uri(tmp_path / "a.db")
    uri_b = sqlite_uri(tmp_path / "b.db")  # another machine's store
    run_a = record(uri_a, A, "/data/cpu", str(tmp_path / "runs"))
    # B ran a newer clsr, with a field A's runs never logged
    run_b = record(uri_b, B, "/scratch/h100", str(tmp_path / "runs"), {"eval": {"new_field": True}})
    client = MlflowClient(uri_b)  # a failed trial on B: not compared
    failed = child(
        client, uri_b, run_b, "temperature", "0.1", 3, params("temperature", "0.1", 3, "/scratch/h100"), {}
    )
    client.set_tag(failed, "clsr.status", "failed")
    return {"a": uri_a, "b": uri_b, "run_a": run_a, "run_b": run_b}


def expected(a: list[float], b: list[float]) -> tuple[float, float, float, float]:
    d = np.asarray(b) - np.asarray(a)
    low, high = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    return d.mean(), low, high, sps.ttest_1samp(d, 0.0).pvalue


def test_pairs_by_configuration_and_seed_with_holm_across_points(stores):
    comparison, a, b = compare_records(NAME, NAME, stores["a"], stores["b"], ignore=("data.data_dir",))
    assert stores["run_a"] in a.name and stores["run_b"] in b.name
    table = comparison.table.set_index("point")
    assert list(table.index) == ["temperature[0.05]", "temperature[0.1]"]
    ps = []
    for label, seeds in (("0.05", [1, 2, 3]), ("0.1", [1, 2])):
        va = [A[("temperature", label)][s] for s in seeds]
        vb = [B[("temperature", label)][s] for s in seeds]
        mean, low, high, p = expected(va, vb)
        row = table.loc[f"temperature[{label}]"]
        assert row["n"] == len(seeds) and row["seeds"] == ",".join(map(str, seeds))
        assert row["diff"] == pytest.approx(mean)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
        assert row["p"] == pytest.approx(p)
        assert row["mean_a"] == pytest.approx(np.mean(va)) and row["mean_b"] == pytest.approx(np.mean(vb))
        ps.append(p)
    holm = multipletests(ps, method="holm")[1]
    assert table["p_holm"].tolist() == pytest.approx(list(holm))
    assert comparison.only_a == ["pooling[avg]"] and comparison.only_b == ["pooling[cls_before_pooler]"]
    assert comparison.params_only_a == [] and comparison.params_only_b == ["eval.new_field"]


def test_a_parameter_that_differs_pairs_nothing_unless_ignored_and_is_named(stores):
    """Issue 53: a label both records hold is not listed as "only in A" and "only in B" with no reason:
    it is listed once, with the parameter that differs and both values."""
    from clsr.study.analyse.compare import render

    comparison, a, b = compare_records(NAME, NAME, stores["a"], stores["b"])
    assert comparison.table.empty
    assert comparison.only_a == ["pooling[avg]"] and comparison.only_b == ["pooling[cls_before_pooler]"]
    why = [("data.data_dir", "/data/cpu", "/scratch/h100")]
    assert comparison.differs == {"temperature[0.05]": why, "temperature[0.1]": why}
    text = render(comparison, a, b)
    assert "\nonly in A (1): pooling[avg]\n" in text
    assert "in both, not paired (2): another configuration (--ignore <prefix> pairs them" in text
    assert "  temperature[0.1]: data.data_dir /data/cpu (A) / /scratch/h100 (B)" in text


def test_one_study_compares_its_two_newest_records(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    first = record(uri, A, "/data", str(tmp_path / "runs"))
    same = {k: dict(v) for k, v in A.items()}
    same[("pooling", "avg")] = {1: 70.0, 2: 71.5}  # one run changed, one result identical
    second = record(uri, same, "/data", str(tmp_path / "runs"))
    comparison, a, b = compare_records(NAME, NAME, uri)
    assert first in a.name and second in b.name
    table = comparison.table.set_index("point")
    assert table.loc["temperature[0.05]", "diff"] == 0.0 and math.isnan(table.loc["temperature[0.05]", "p"])
    assert table.loc["pooling[avg]", "diff"] == pytest.approx(0.25)
    # identical points have no spread to test: the family is the one point that changed
    p = sps.ttest_1samp([0.0, 0.5], 0.0).pvalue
    assert table.loc["pooling[avg]", "p_holm"] == pytest.approx(p)
    assert math.isnan(table.loc["temperature[0.1]", "p_holm"])
    assert main(["study", "compare", NAME, NAME, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert f"A: {NAME} (run {first})" in out and "pooling[avg]" in out
    assert main(["study", "compare", NAME, NAME, "--tracking-uri", uri, "--metric", "test_nope"]) == 2
    assert "test_sts_avg" in capsys.readouterr().err


ENV_A = {"python": "3.11.7", "torch": "2.8.0", "gpu": "NVIDIA H100 80GB HBM3", "git_commit": "abc"}
DATA = {"stsb": {"sha256": "9f" * 32}}


def test_compare_names_an_environment_difference_planted_in_one_record(tmp_path, monkeypatch):
    """Issue 55: B's runs ran another torch on another GPU (planted); the trials still pair (env.* and
    data hashes are drift, not configuration), and compare names each difference with both values; the
    data hashes agree. One of B's trials ran elsewhere than its others: B's side says so."""
    from clsr.study.analyse.compare import render

    monkeypatch.chdir(tmp_path)
    uri_a, uri_b = sqlite_uri(tmp_path / "a.db"), sqlite_uri(tmp_path / "b.db")
    points = {("temperature", "0.05"): {1: 76.1, 2: 75.4}}
    env_b = ENV_A | {"torch": "2.9.0", "gpu": "NVIDIA H200"}
    record(uri_a, points, "/d", str(tmp_path / "runs"), {"env": ENV_A, "data": {**DATA, "data_dir": "/d"}})
    run_b = record(
        uri_b, points, "/d", str(tmp_path / "runs"), {"env": env_b, "data": {**DATA, "data_dir": "/d"}}
    )
    p = params("temperature", "0.05", 3, "/d")  # a third seed of B, on A's GPU
    p |= {"env": env_b | {"gpu": ENV_A["gpu"]}, "data": {**DATA, "data_dir": "/d"}}
    child(MlflowClient(uri_b), uri_b, run_b, "temperature", "0.05", 3, p, {"test_sts_avg": 75.0})
    comparison, a, b = compare_records(NAME, NAME, uri_a, uri_b)
    assert comparison.table["n"].tolist() == [2]  # paired despite the environments
    assert comparison.drift == [
        "environment differs: gpu NVIDIA H100 80GB HBM3 (A) / NVIDIA H100 80GB HBM3, NVIDIA H200 (B); "
        "torch 2.8.0 (A) / 2.9.0 (B)",
        "code: the same",
        "data hashes agree (1 logged by both)",
        "B's trials ran in 2 environments: gpu NVIDIA H100 80GB HBM3, NVIDIA H200",
    ]
    text = render(comparison, a, b)
    assert "\nenvironment differs: gpu NVIDIA H100 80GB HBM3 (A) / " in text


def test_compare_names_differing_data_hashes_and_a_record_without_an_environment(tmp_path, monkeypatch):
    """A record of an older clsr says it recorded no environment; a changed data file is named by the
    first characters of both hashes."""
    monkeypatch.chdir(tmp_path)
    uri_a, uri_b = sqlite_uri(tmp_path / "a.db"), sqlite_uri(tmp_path / "b.db")
    points = {("temperature", "0.05"): {1: 76.1}}
    record(uri_a, points, "/d", str(tmp_path / "runs"))  # an older clsr: no env.*, no data hashes
    record(uri_b, points, "/d", str(tmp_path / "runs"), {"env": ENV_A})
    comparison, _, _ = compare_records(NAME, NAME, uri_a, uri_b)
    assert comparison.drift == [
        "environment: not recorded by A's runs (a clsr before issue 55)",
        "data hashes: none logged by both records",
    ]
    from clsr.study.analyse.drift import drift, drift_lines
    from clsr.study.analyse.runs import Trial

    def trial(sha: str) -> Trial:
        return Trial("r", "x", "p", 1, "finished", {}, {}, 0, {"env.torch": "2.8.0", "data.stsb.sha256": sha})

    lines = drift_lines(drift([trial("a" * 64)], [trial("b" * 64)]))
    assert lines == [
        "environment: the same",
        "code: the same",
        f"data hashes differ: data.stsb.sha256 {'a' * 12} (A) / {'b' * 12} (B)",
    ]
