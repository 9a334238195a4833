"""Study reports from a hand-made MLflow store: cells, tests and paper numbers against SciPy, the Holm
adjustment against hand numbers and Holm's own procedure, failed and missing trials shown, rows that
are one configuration and evaluation-only rows marked, the files written and logged, the command line,
and the reference check."""

from __future__ import annotations

import copy
import csv
import html
import json
import math
import re
import time
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats

from clsr.cli import main
from clsr.study.analyse.plots import histories
from clsr.study.analyse.render import render_json, render_text
from clsr.study.analyse.report import report_study, write_report
from clsr.study.analyse.rows import ablation_report, build_report
from clsr.study.analyse.runs import NoStudyRuns, study_from_run
from clsr.study.analyse.tables import ablation_notes, declared_fidelity, fidelity_lines, pareto_table
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points
from clsr.study.record.summary import resolved_summary
from clsr.study.spec.schema import StudyError
from clsr.study.stats.effects import grid_effects, sampled_effects
from clsr.study.stats.seeds import CORRECTION, TEST_NAME, holm, paired_test, seed_stats
from clsr.tracking.study_runs import close_run, open_child_run, record_skipped, start_parent_run
from tests.support.stores import sqlite_uri

NAME = "report_t"
STUDY = {
    "name": NAME,
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "seeds": [1, 2, 3],
    "ablations": {
        "temperature": {
            "table": "SimCSE Table D.1",
            "description": "temperature of the contrastive loss",
            "paper_metric": "test_sts_avg",
            "grid": {"method.temperature": [0.05, 0.1, 0.2, 0.3]},
            "paper": {"0.05": 76.0, "0.1": 75.0},
            "paper_choice": "0.05",
        },
        "pooling": {
            "table": "SimCSE Table 6",
            "paper_metric": "dev_stsb",
            "points": [
                {
                    "label": "cls",
                    "set": {"model.pooling": "cls"},
                    "paper": {"dev_stsb": 81.7, "test_stsb": 80.0},
                },
                {"label": "avg", "set": {"model.pooling": "avg"}},
            ],
            "paper_choice": "cls",
            "reference": "avg",
        },
    },
}
# (ablation, label) -> seed -> test_sts_avg (temperature) or best_dev_stsb (pooling) of finished trials
MAIN = {
    ("temperature", "method.temperature=0.05"): {1: 76.1, 2: 75.5, 3: 76.6},
    ("temperature", "method.temperature=0.1"): {1: 74.0, 2: 74.9},  # seed 3 fails
    ("temperature", "method.temperature=0.2"): {1: 73.0, 2: 73.4, 3: 72.1},
    ("temperature", "method.temperature=0.3"): {1: 70.0},  # seed 2 skipped, seed 3 never ran
    ("pooling", "cls"): {1: 81.0, 2: 81.5, 3: 80.9},
    ("pooling", "avg"): {1: 82.0, 2: 82.2, 3: 82.5},
}
T05, T01, T02, T03 = (f"method.temperature={t}" for t in ("0.05", "0.1", "0.2", "0.3"))
COST = {"trial_wall_s": 100.0, "trial_cpu_s": 50.0, "trial_gpu_s": 100.0}


def trial_metrics(ablation: str, seed: int, main_value: float) -> dict[str, float]:
    """Known values per trial: the main metric, and test metrics derived from it."""
    if ablation == "pooling":
        return {"best_dev_stsb": main_value, "test_stsb": main_value - 1.0 + 0.1 * seed, "test_sts_avg": 75.0}
    return {
        "test_sts_avg": main_value,
        "test_stsb": main_value + 2.0 + 0.3 * seed,
        "test_sts16": 78.0 - 0.2 * seed,
        "test_mr": 80.0 + seed,
        "test_transfer_avg": 85.0 + 0.5 * seed,
        "best_dev_stsb": 80.0 + seed,
        "trial_gpu_utilization_mean": 60.0 + 10 * seed,  # MLflow system metrics' mean
        **COST,
    }


def add_trial(client: MlflowClient, uri: str, parent: str, ablation: str, label: str, seed: int, **kw) -> str:
    """One child run as the runner makes it: tags, final metrics, per-step loss and dev histories."""
    tags = {"clsr.method": "simcse_unsup", "clsr.ablation": ablation, "clsr.point": label, "clsr.seed": seed}
    tags |= kw.get("tags", {})
    status = kw.get("status", "finished")
    trial_id = f"{ablation}:{label}:{seed}:{status}"
    params = kw.get("params", {"x": 1})
    run_id = open_child_run(uri, parent, trial_id, f"{ablation}/{label}/seed={seed}", tags, params)
    now = int(time.time() * 1000)
    steps = kw.get("steps", 4)
    metrics = [Metric("loss", 2.0 / s + 0.01 * seed, now, s) for s in range(1, steps + 1)]
    metrics += [Metric("dev_stsb", 70.0 + s + seed, now, s) for s in range(2, steps + 1, 2)]
    metrics += [Metric(k, v, now, steps) for k, v in kw.get("metrics", {}).items()]
    client.log_batch(run_id, metrics=metrics)
    close_run(uri, run_id, status, kw.get("error"))
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow sqlite store with one parent run, the trials of MAIN, a failed trial (and a failed
    first attempt that a resume fixed), a skipped and a missing seed; the study file beside it."""
    folder = tmp_path_factory.mktemp("report")
    uri = sqlite_uri(folder / "mlflow.db")
    study_file = folder / "study.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # the experiment's artifact root lands in the tmp folder
        client = MlflowClient(uri)
        parent = start_parent_run(client, NAME, str(folder / "runs"), "report test")
        study = load_study(study_file)
        client.log_text(parent, yaml.safe_dump(resolved_summary(study), sort_keys=False), "resolved.yaml")
        add_trial(client, uri, parent, "temperature", T05, 1, status="failed", steps=2, error="early crash")
        for (ablation, label), seeds in MAIN.items():
            for seed, value in seeds.items():
                device = "1 x NVIDIA H200" if ablation == "temperature" else "cpu"
                tags = {"clsr.device": device}
                if label in (T05, T02):  # the study file's 76.0 wins over the tag; 0.2 has only the tag
                    tags["clsr.paper.test_sts_avg"] = 99.0 if label == T05 else 73.5
                add_trial(client, uri, parent, ablation, label, seed, metrics=trial_metrics(ablation, seed, value), tags=tags)  # fmt: skip
        add_trial(client, uri, parent, "temperature", T01, 3, status="failed", steps=2, error="Traceback ...\nRuntimeError: CUDA out of memory")  # fmt: skip
        record_skipped(uri, parent, "temperature", T03, 2, "upstream trials without a checkpoint")
    return {"uri": uri, "folder": folder, "study_file": study_file, "parent": parent, "client": client}


@pytest.fixture(scope="module")
def report(store):
    study = load_study(store["study_file"])
    return build_report(study, store["client"], store["parent"], store["uri"])


def rows_of(report, ablation: str) -> dict:
    return {r.label: r for r in next(a for a in report.ablations if a.name == ablation).rows}


def ablation_of(report, name: str):
    return next(a for a in report.ablations if a.name == name)


def scipy_cell(values: list[float]) -> tuple[float, float, float, float]:
    mean = float(np.mean(values))
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return mean, float(np.std(values, ddof=1)), float(low), float(high)


def test_cells_are_mean_std_and_student_t_interval_over_seeds(report):
    rows = rows_of(report, "temperature")
    for label in (T05, T01, T02):
        values = list(MAIN[("temperature", label)].values())
        cell = rows[label].stats["test_sts_avg"]
        assert cell.n == len(values)
        assert (cell.mean, cell.std, cell.ci_low, cell.ci_high) == pytest.approx(scipy_cell(values))
    stsb = [MAIN[("temperature", T02)][s] + 2.0 + 0.3 * s for s in (1, 2, 3)]
    cell = rows[T02].stats["test_stsb"]
    assert (cell.mean, cell.std, cell.ci_low, cell.ci_high) == pytest.approx(scipy_cell(stsb))
    lone = rows[T03].stats["test_sts_avg"]
    assert (lone.n, lone.mean) == (1, 70.0) and math.isnan(lone.std) and math.isnan(lone.ci_low)


def test_rows_are_tested_against_the_reference_with_a_paired_t_test(report):
    temperature, pooling = ablation_of(report, "temperature"), ablation_of(report, "pooling")
    assert temperature.main_metric == "test_sts_avg" and pooling.main_metric == "best_dev_stsb"
    assert temperature.reference.label == T05 and pooling.reference.label == "avg"  # paper_choice; reference:
    rows = rows_of(report, "temperature")
    ref = MAIN[("temperature", T05)]
    for label in (T01, T02):
        mine = MAIN[("temperature", label)]
        seeds = sorted(set(mine) & set(ref))
        expected = stats.ttest_rel([mine[s] for s in seeds], [ref[s] for s in seeds]).pvalue
        assert rows[label].test.p_value == pytest.approx(expected)
        assert rows[label].test.n == len(seeds)
        assert rows[label].test.mean_diff == pytest.approx(np.mean([mine[s] - ref[s] for s in seeds]))
    assert rows[T03].test.n == 1 and math.isnan(rows[T03].test.p_value)  # < 2 paired seeds
    assert rows[T05].test is None
    cls, avg = MAIN[("pooling", "cls")], MAIN[("pooling", "avg")]
    expected = stats.ttest_rel([cls[s] for s in (1, 2, 3)], [avg[s] for s in (1, 2, 3)]).pvalue
    assert rows_of(report, "pooling")["cls"].test.p_value == pytest.approx(expected)


def test_holm_matches_hand_numbers():
    # sorted 0.005, 0.01, 0.03, 0.04 times m - j + 1 = 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6]) and holm([0.7, 0.9]) == pytest.approx([1.0, 1.0])
    adjusted = holm([0.01, math.nan, 0.04])  # a row without a test is not in the family: m = 2
    assert (
        adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)
    )
    assert holm([]) == [] and holm([0.2]) == [0.2]


def holm_rejects(p_values: list[float], alpha: float) -> set[int]:
    """Holm's procedure as the 1979 paper states it: test the k-th smallest p against alpha / (m - k + 1)
    and stop at the first that is not below."""
    rejected = set()
    for k, i in enumerate(sorted(range(len(p_values)), key=lambda i: p_values[i])):
        if p_values[i] > alpha / (len(p_values) - k):
            break
        rejected.add(i)
    return rejected


def test_holm_adjusted_p_rejects_what_the_step_down_procedure_rejects():
    rng = np.random.default_rng(0)
    # 40 families, not hundreds: statsmodels 0.15's Holm branch runs gc.collect() on every call, which
    # costs 0.1-0.3 s in a test process holding torch and MLflow (a report makes one call per ablation)
    for _ in range(40):
        p = (rng.uniform(0, 0.2, size=int(rng.integers(1, 9))) ** 2).tolist()
        adjusted = holm(p)
        for alpha in (0.01, 0.05, 0.1):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == holm_rejects(p, alpha)


def test_p_values_are_holm_adjusted_within_each_ablation(report):
    rows = rows_of(report, "temperature")
    ref = MAIN[("temperature", T05)]
    raw = {}
    for label in (T01, T02):
        mine = MAIN[("temperature", label)]
        seeds = sorted(set(mine) & set(ref))
        raw[label] = stats.ttest_rel([mine[s] for s in seeds], [ref[s] for s in seeds]).pvalue
    low, high = sorted(raw, key=raw.get)  # the family is T01 and T02: T03 has one paired seed
    assert rows[low].test.p_adjusted == pytest.approx(min(1.0, 2 * raw[low]))
    assert rows[high].test.p_adjusted == pytest.approx(max(min(1.0, 2 * raw[low]), raw[high]))
    assert math.isnan(rows[T03].test.p_adjusted)
    assert raw[T02] < 0.05 < rows[T02].test.p_adjusted  # significant alone, not after the correction
    cls = rows_of(report, "pooling")["cls"].test  # a family of one: nothing to adjust
    assert cls.p_adjusted == pytest.approx(cls.p_value)
    text = render_text(report)
    assert "p (paired t) | p (Holm) | sig." in text and f"{CORRECTION} (2 tested, family-wise error)" in text
    t02 = [c.strip() for c in next(x for x in text.splitlines() if x.startswith(T02)).split("|")]
    assert t02[-2:] == [f"{raw[T02]:.3f}", f"{rows[T02].test.p_adjusted:.3f}"]  # no '*' after them


def test_paper_numbers_come_from_the_study_file_then_the_tags(report):
    rows = rows_of(report, "temperature")
    assert rows[T05].paper_value("test_sts_avg") == 76.0  # the file, not the tag's 99
    assert rows[T01].paper_value("test_sts_avg") == 75.0
    assert rows[T02].paper_value("test_sts_avg") == 73.5  # the tag: the file has none
    assert rows[T03].paper_value("test_sts_avg") is None
    cls = rows_of(report, "pooling")["cls"]
    assert cls.paper_value("best_dev_stsb") == 81.7  # paper_metric dev_stsb = the kept checkpoint's dev
    assert cls.paper_value("test_stsb") == 80.0
    text = render_text(report)
    diff = np.mean(list(MAIN[("temperature", T05)].values())) - 76.0
    assert f"76.00 | {diff:+.2f}" in text


def test_failed_skipped_and_missing_trials_are_shown_not_averaged(report):
    rows = rows_of(report, "temperature")
    assert rows[T05].trials_text() == "3/3 ok"  # the failed first attempt of seed 1 was re-run
    assert rows[T01].trials_text() == "2/3 ok, 1 failed"
    assert rows[T03].trials_text() == "1/3 ok, 1 skipped, 1 missing"
    text = render_text(report)
    assert "2/3 ok, 1 failed" in text and "1/3 ok, 1 skipped, 1 missing" in text
    assert f"{T01} seed 3: failed: RuntimeError: CUDA out of memory" in text
    assert f"{T03} seed 3: missing (no run)" in text
    assert f"{T03} seed 2: skipped: upstream trials without a checkpoint" in text
    line = next(x for x in text.splitlines() if x.startswith(T03) and "missing" in x)
    assert line.rstrip().endswith("n/a")


def test_columns_follow_the_papers_order_and_rows_the_study(report):
    temperature, pooling = ablation_of(report, "temperature"), ablation_of(report, "pooling")
    assert temperature.metrics == ["test_sts16", "test_stsb", "test_sts_avg", "test_mr", "test_transfer_avg"]
    assert pooling.metrics == ["best_dev_stsb", "test_stsb", "test_sts_avg"]
    assert [r.label for r in temperature.rows] == [T05, T01, T02, T03]
    marks = {r.label: r.marks() for r in temperature.rows + pooling.rows}
    assert marks[T05] == "paper choice, reference" and marks["cls"] == "paper choice"
    assert marks["avg"] == "reference" and marks[T01] == ""
    text = render_text(report)
    assert TEST_NAME in text and "reference row 'avg' (the study's reference)" in text


def test_cost_is_summed_per_ablation_and_study(report):
    temperature, pooling = ablation_of(report, "temperature"), ablation_of(report, "pooling")
    finished = sum(len(v) for (a, _), v in MAIN.items() if a == "temperature")
    assert (
        temperature.cost.measured == finished and temperature.cost.runs == finished + 3
    )  # 2 failed, skipped
    assert temperature.cost.wall_s == pytest.approx(100.0 * finished)
    assert temperature.cost.gpu_s == pytest.approx(100.0 * finished)
    assert pooling.cost.measured == 0 and pooling.cost.devices == {"cpu": 6}
    assert report.cost.wall_s == pytest.approx(100.0 * finished) and report.cost.runs == finished + 3 + 6
    text = render_text(report)
    assert "1 x NVIDIA H200 (9)" in text and "not logged" in text
    # GPU utilisation weighted by GPU seconds (equal here): seeds 1, 2, 3 finished 4, 3 and 2 times
    assert temperature.cost.gpu_utilization == pytest.approx((70 * 4 + 80 * 3 + 90 * 2) / 9)
    assert pooling.cost.gpu_utilization is None
    assert "78 %" in text


def test_learning_curves_read_the_metric_histories(store, report):
    temperature = ablation_of(report, "temperature")
    trial = temperature.rows[0].trials[1]
    curves = histories(store["client"], [trial], ["loss", "dev_stsb"])[trial.run_id]
    assert curves["loss"][:, 0].tolist() == [1, 2, 3, 4]
    assert curves["dev_stsb"].tolist() == [[2, 73.0], [4, 75.0]]


def test_a_loss_spanning_decades_is_drawn_on_a_log_axis():
    from clsr.study.analyse.plots import spans_decades

    assert spans_decades([np.array([1.0, 0.1]), np.array([1e-5])])  # the smoke's 1.0 -> 1e-5
    assert not spans_decades([np.array([3.2, 1.1, 0.9])])  # an ordinary loss curve stays linear
    assert not spans_decades([np.array([1.0, -0.5, 1e-6])])  # a negative loss has no log axis
    assert not spans_decades([])


def test_report_files_and_parent_run_artifacts(store, tmp_path, monkeypatch):
    monkeypatch.chdir(store["folder"])
    study = load_study(store["study_file"])
    out = tmp_path / "out"
    report, files = report_study(study, out)
    names = {p.name for p in files}
    assert names == {
        "report.md", "report.csv", "report.html", "report.json", "temperature_main.png", "temperature_curves.png",
        "pooling_main.png", "pooling_curves.png",
    }  # fmt: skip
    assert all((out / n).is_file() for n in names)
    assert (out / "temperature_main.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "<style>" in page
    assert 'src="http' not in page and "<link" not in page
    md = re.sub(r" {2,}", " ", (out / "report.md").read_text())  # cells padded to their column's width
    assert "| point | row | trials | test_sts_avg mean ± std |" in md and "![temperature_main]" in md
    assert "| p (paired t) | p (Holm) | sig. |" in md and CORRECTION in md
    assert ">p (Holm)</th>" in page and html.escape(CORRECTION) in page
    # issue 53: each ablation opens on its table (inside a box that scrolls sideways, not the page), its
    # statistics paragraphs below under a heading of their own
    assert ".wide{max-width:100%;overflow-x:auto}" in page
    boxed = re.findall(r'<div class="wide">\s*(?:<style[^>]*>.*?</style>\s*)?<table', page, re.S)
    assert len(boxed) == page.count("<table") == 6
    section = page[page.index("<h2>temperature</h2>") : page.index("<h2>pooling</h2>")]
    statistics = section.index("main metric test_sts_avg; reference row")
    assert section.index("<table") < section.index("<h3>temperature: how to read the table</h3>") < statistics
    assert section.count('<p class="notes">', 0, section.index("<table")) == 1  # the paper table's name only
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert len(rows) == 4 * 5 + 2 * 3  # ablation x point x metric
    cell = next(r for r in rows if r["point"] == T01 and r["metric"] == "test_sts_avg")
    mean, std, low, high = scipy_cell(list(MAIN[("temperature", T01)].values()))
    assert float(cell["mean"]) == pytest.approx(mean) and float(cell["ci_high"]) == pytest.approx(high)
    assert float(cell["std"]) == pytest.approx(std) and cell["n"] == "2" and cell["paper"] == "75.0"
    assert float(cell["diff"]) == pytest.approx(mean - 75.0) and cell["test"] == TEST_NAME
    assert cell["trials"] == "2/3 ok, 1 failed" and float(cell["p_value"]) > 0
    assert float(cell["p_adjusted"]) == pytest.approx(report.ablations[0].rows[1].test.p_adjusted)
    assert float(cell["p_adjusted"]) >= float(cell["p_value"]) and cell["correction"] == CORRECTION
    assert cell["eval_only"] == "False" and cell["same_as"] == ""
    missing = next(r for r in rows if r["point"] == T03 and r["metric"] == "test_sts_avg")
    assert missing["n"] == "1" and missing["std"] == "" and missing["p_value"] == ""
    assert missing["p_adjusted"] == ""
    other = next(r for r in rows if r["point"] == T01 and r["metric"] == "test_stsb")
    assert other["p_value"] == other["p_adjusted"] == ""  # tests are on the main metric only
    logged = {a.path for a in store["client"].list_artifacts(store["parent"], "report")}
    assert {f"report/{n}" for n in names} <= logged


def test_cli_report_by_file_and_by_name(store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(store["folder"])
    out = tmp_path / "cli"
    assert main(["study", "report", str(store["study_file"]), "--out", str(out), "--no-log"]) == 0
    printed = capsys.readouterr().out
    assert "== temperature ==" in printed and "2/3 ok, 1 failed" in printed and "== cost ==" in printed
    assert (out / "report.html").is_file() and f"wrote 8 file(s) to {out}" in printed
    args = ["study", "report", "--name", NAME, "--tracking-uri", store["uri"], "--out", str(tmp_path / "n")]
    assert main([*args, "--no-log"]) == 0
    assert "1/3 ok, 1 skipped, 1 missing" in capsys.readouterr().out


def test_cli_says_where_it_looked_when_there_are_no_runs(store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**STUDY, "name": "never_ran", "tracking_uri": store["uri"]}))
    assert main(["study", "report", str(other)]) == 2
    err = capsys.readouterr().err
    assert (
        "no MLflow run of study 'never_ran'" in err and store["uri"] in err and "MLFLOW_TRACKING_URI" in err
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["study", "report", "--name", NAME]) == 2
    assert "no MLflow store at sqlite:///" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()  # a report never creates an empty store
    assert main(["study", "report", str(other), "--name", NAME]) == 2


def test_statistics_edge_cases():
    assert seed_stats([]).n == 0 and math.isnan(seed_stats([]).mean)
    assert math.isnan(paired_test({1: 1.0}, {1: 2.0, 2: 3.0}).p_value)
    assert paired_test({1: 1.0, 2: 2.0}, {3: 1.0}).n == 0
    same = paired_test({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0})
    assert same.mean_diff == 0.0 and math.isnan(same.p_value)


def test_reference_must_name_a_point(tmp_path):
    path = tmp_path / "study.yaml"
    doc = {**STUDY, "ablations": {**STUDY["ablations"]}}
    doc["ablations"]["temperature"] = {**STUDY["ablations"]["temperature"], "reference": "0.5"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(StudyError) as caught:
        load_study(path)
    (problem,) = caught.value.problems
    assert problem.startswith("ablations.temperature.reference: no such point (given: '0.5'; allowed: [")
    assert T05 in problem
    for ok in ("0.2", T02):  # a one-key grid's bare value, or the full label
        doc["ablations"]["temperature"]["reference"] = ok
        path.write_text(yaml.safe_dump(doc))
        assert load_study(path).ablations["temperature"].reference == ok
    doc["ablations"]["pooling"] = {**STUDY["ablations"]["pooling"], "reference": "mean"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(StudyError, match=r"ablations\.pooling\.reference: no such point \(given: 'mean'; allowed: \['cls', 'avg'\]\)"):  # fmt: skip
        load_study(path)


def test_a_sampled_ablation_gets_one_row_per_sampled_point(store, tmp_path):
    doc = {
        "name": "report_sampled",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}},
        "search": {"algorithm": "random", "num_samples": 2},
        "ablations": {"lr": {"space": {"trainer.lr": {"loguniform": [1e-5, 1e-4]}}}},
    }
    path = tmp_path / "sampled.yaml"
    path.write_text(yaml.safe_dump(doc))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_sampled", "x", None)
    for i, lr in enumerate([2e-5, 8e-5]):
        add_trial(client, uri, parent, "lr", f"trainer.lr={lr}", 42, metrics={"best_dev_stsb": 75.0 + i})
    (lr,) = build_report(load_study(path), client, parent, uri).ablations
    assert [r.label for r in lr.rows] == ["trainer.lr=2e-05", "trainer.lr=8e-05"]
    assert lr.main_metric == "best_dev_stsb" and [r.trials_text() for r in lr.rows] == ["1/1 ok"] * 2
    assert lr.rows[1].test.mean_diff == 1.0 and math.isnan(lr.rows[1].test.p_value)


DUPLICATES = {
    "name": "report_dup",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "seeds": [1, 2],
    "ablations": {  # one configuration written three ways: tau 0.05 = batch 16 = the reference
        "reference": {"points": [{"label": "SimCSE", "set": {"method.temperature": 0.05}}], "reference": "SimCSE"},
        "temperature": {"grid": {"method.temperature": [0.05, 0.1]}, "reference": "0.05"},
        "batch": {"grid": {"trainer.batch_size": [16, 64]}, "reference": "16"},
        "start": {
            "points": [
                {"label": "untrained", "set": {"trainer.max_steps": 0}},
                {"label": "tagged", "set": {"model.pooling": "avg"}},
            ],
            "reference": "untrained",
        },
    },
}  # fmt: skip


def test_rows_of_one_configuration_and_evaluation_only_rows_are_marked(store, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(DUPLICATES, sort_keys=False))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_dup", "x", None)
    # the study ran the three identical trials once per seed: one run standing for all three points
    also = {
        "clsr.also": json.dumps(
            [["temperature", "method.temperature=0.05"], ["batch", "trainer.batch_size=16"]]
        )
    }
    for ablation, label, tags in [
        ("reference", "SimCSE", also),
        ("temperature", "method.temperature=0.1", {}),
        ("start", "tagged", {"clsr.eval_only": "true"}),  # the trainer's tag, on a point not planned so
    ]:
        for seed in (1, 2):
            metrics = {"best_dev_stsb": 70.0 + seed, **COST}
            add_trial(client, uri, parent, ablation, label, seed, metrics=metrics, tags=tags)
    report = build_report(load_study(path), client, parent, uri)
    shared = {(a.name, r.label): r.values("best_dev_stsb") for a in report.ablations for r in a.rows}
    for row in [
        ("reference", "SimCSE"),
        ("temperature", "method.temperature=0.05"),
        ("batch", "trainer.batch_size=16"),
    ]:
        assert shared[row] == {1: 71.0, 2: 72.0}, row  # the one run, under each of its points
    assert ablation_of(report, "batch").cost.runs == 2  # each ablation counts the runs it used ...
    assert report.cost.runs == 6 and report.cost.wall_s == pytest.approx(600.0)  # ... the study each run once
    same = {(a.name, r.label): r.same_as for a in report.ablations for r in a.rows}
    assert same[("reference", "SimCSE")] == [
        "temperature[method.temperature=0.05]",
        "batch[trainer.batch_size=16]",
    ]
    assert same[("batch", "trainer.batch_size=16")] == [
        "reference[SimCSE]",
        "temperature[method.temperature=0.05]",
    ]
    assert same[("temperature", "method.temperature=0.1")] == same[("batch", "trainer.batch_size=64")] == []
    assert same[("start", "untrained")] == same[("start", "tagged")] == []
    only = {(a.name, r.label): r.eval_only for a in report.ablations for r in a.rows}
    assert only.pop(("start", "untrained")) and only.pop(("start", "tagged"))  # max_steps 0; the tag
    assert not any(only.values())
    text = render_text(report)
    assert "same as temperature[method.temperature=0.05]" in text and "same as reference[SimCSE]" in text
    assert "untrained (evaluation only)" in text and "tagged (evaluation only)" in text
    write_report(report, client, tmp_path / "out")
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    by_point = {(r["ablation"], r["point"]): r for r in rows if r["main_metric"] == "True"}
    assert by_point[("reference", "SimCSE")]["same_as"] == (
        "temperature[method.temperature=0.05]; batch[trainer.batch_size=16]"
    )
    assert by_point[("start", "tagged")]["eval_only"] == "True"
    assert by_point[("temperature", "method.temperature=0.1")]["eval_only"] == "False"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "tagged (evaluation only)" in md and "same as batch[trainer.batch_size=16]" in md


FOLDED = {
    "name": "report_folds",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "seeds": [1, 2],
    "ablations": {  # method.temperature stands for data.fold: average_over takes any grid key
        "kfold": {
            "paper_metric": "test_stsb",
            "grid": {"model.pooling": ["cls", "avg", "mean"], "method.temperature": [0.05, 0.1, 0.2]},
            "average_over": "method.temperature",
            "paper": {"cls": {"test_stsb": 70.0, "test_sts16": 60.0}},
            "reference": "avg",
        }
    },
}
# (pooling, fold temperature) -> seed -> test_stsb; avg's fold 0.2 seed 2 fails, mean has 2 folds of seed 1
FOLD_VALUES = {
    ("cls", 0.05): {1: 70.0, 2: 73.0},
    ("cls", 0.1): {1: 71.0, 2: 74.0},
    ("cls", 0.2): {1: 72.0, 2: 78.0},
    ("avg", 0.05): {1: 60.0, 2: 61.0},
    ("avg", 0.1): {1: 62.0, 2: 63.0},
    ("avg", 0.2): {1: 64.0},
    ("mean", 0.05): {1: 50.0},
    ("mean", 0.1): {1: 50.0},
}


def test_average_over_makes_one_row_per_fold_set_with_seed_means(store, tmp_path):
    path = tmp_path / "folds.yaml"
    path.write_text(yaml.safe_dump(FOLDED, sort_keys=False))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_folds", "x", None)
    for (pooling, fold), seeds in FOLD_VALUES.items():
        label = f"model.pooling={pooling}, method.temperature={fold}"
        for seed, value in seeds.items():
            metrics = {"test_stsb": value, "test_sts16": value - 10 * seed}
            metrics |= {"only_in_one_fold": 1.0} if fold == 0.05 else {}
            add_trial(client, uri, parent, "kfold", label, seed, metrics=metrics)
    add_trial(client, uri, parent, "kfold", "model.pooling=avg, method.temperature=0.2", 2, status="failed", error="boom")  # fmt: skip
    (ab,) = build_report(load_study(path), client, parent, uri).ablations
    rows = {r.label: r for r in ab.rows}  # named by the other keys; paper and reference by the bare value
    assert list(rows) == [f"model.pooling={p}" for p in ("cls", "avg", "mean")]
    assert len(ab.trials) == 14  # the fold runs behind the rows
    cls, avg, mx = rows.values()
    assert cls.values("test_stsb") == {1: 71.0, 2: 75.0}  # each seed: the mean of its 3 folds
    assert cls.values("test_sts16") == {1: 61.0, 2: 55.0}
    assert "only_in_one_fold" not in cls.trials[1].metrics  # a metric counts when every fold logged it
    mean, std, low, high = scipy_cell([71.0, 75.0])
    s = cls.stats["test_stsb"]
    assert (s.mean, s.n) == (mean, 2) and math.isclose(s.std, std) and math.isclose(s.ci_low, low)
    assert cls.paper_value("test_stsb") == 70.0 and cls.paper_value("test_sts16") == 60.0
    assert avg.reference and avg.values("test_stsb") == {1: 62.0}  # seed 2: a fold failed
    assert avg.trials_text() == "1/2 ok, 1 failed" and mx.trials_text() == "0/2 ok, 2 missing"
    assert cls.test.n == 1 and cls.test.mean_diff == 9.0 and math.isnan(cls.test.p_value)
    text = render_text(build_report(load_study(path), client, parent, uri))
    assert "each row is the mean over its method.temperature points (3) per seed" in text
    assert "model.pooling=avg, method.temperature=0.2 seed 2: failed: boom" in text
    assert "model.pooling=mean, method.temperature=0.2 seed 1: missing (no run)" in text


def test_average_over_names_a_grid_key_and_rows_are_named_without_it(tmp_path):
    path = tmp_path / "folds.yaml"
    doc = copy.deepcopy(FOLDED)
    doc["ablations"]["kfold"]["average_over"] = "data.fold"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(StudyError, match=r"average_over names a key of the ablation's grid \(given: 'data.fold'; allowed: \['model.pooling', 'method.temperature'\]\)"):  # fmt: skip
        load_study(path)
    doc["ablations"]["kfold"]["average_over"] = "method.temperature"
    doc["ablations"]["kfold"]["reference"] = "model.pooling=avg, method.temperature=0.1"  # a fold, not a row
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(StudyError, match=r"reference: no such point \(given: .*; allowed: \['model.pooling=cls', 'model.pooling=avg', 'model.pooling=mean'\]\)"):  # fmt: skip
        load_study(path)


def test_an_ablation_set_to_null_in_smoke_is_left_out_of_the_smoke_run(tmp_path):
    path = tmp_path / "smoke.yaml"
    doc = copy.deepcopy(STUDY) | {"smoke": {"seeds": [1], "ablations": {"pooling": None}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert list(load_study(path, smoke=True).ablations) == ["temperature"]
    assert list(load_study(path).ablations) == ["temperature", "pooling"]


BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


@pytest.mark.parametrize(
    ("artifact", "refusal"),
    [
        ("l0: &l0 lol\n" + BOMB + "study: {name: x}\n", "alias bomb"),  # a billion laughs
        ("study: " + "x" * (1 << 20) + "\n", "at most 1,048,576 bytes"),
        ("- study\n", "holds no study"),
        ("study: {name: x}\n", r"not a valid study \(2 problem\(s\); method: Field required\)"),
    ],
)
def test_a_hostile_resolved_yaml_artifact_is_refused(tmp_path, monkeypatch, artifact, refusal):
    """Anyone who can write to the tracking server can replace the study a ``--name`` report reads."""
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    parent = start_parent_run(client, "hostile", str(tmp_path / "runs"), None)
    client.log_text(parent, artifact, "resolved.yaml")
    with pytest.raises(NoStudyRuns, match=refusal) as refused:
        study_from_run(client, parent, tmp_path / "download")
    assert "\n" not in str(refused.value) and "resolved.yaml" in str(refused.value)


def test_a_later_record_does_not_hide_an_earlier_one(tmp_path, monkeypatch, capsys):
    """Two records of one study (a good one, then a failed one): the report shows the newest and lists
    both; ``--run`` reports the earlier; an id that is not a record of the study is refused, listing them."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    study = load_study(study_file)
    client = MlflowClient(uri)
    parents = []
    for status in ("finished", "failed"):
        parent = start_parent_run(client, NAME, str(tmp_path / "runs"), None)
        client.log_text(parent, yaml.safe_dump(resolved_summary(study), sort_keys=False), "resolved.yaml")
        metrics = trial_metrics("temperature", 1, 76.0) if status == "finished" else {}
        add_trial(client, uri, parent, "temperature", T05, 1, status=status, metrics=metrics, error="crash")
        client.set_tag(parent, "clsr.status", status)
        client.set_terminated(parent, "FINISHED" if status == "finished" else "FAILED")
        parents.append(parent)
        time.sleep(0.01)  # distinct start times: newest first
    good, bad = parents
    args = ["study", "report", str(study_file), "--no-log", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    newest = capsys.readouterr().out
    assert "0/3 ok, 1 failed, 2 missing" in newest.split("records of study")[0]
    listed = newest.split("records of study 'report_t', newest first (--run <id> reports another):\n")[1]
    assert (
        listed.splitlines()[0].startswith(f"  {bad} failed, started ")
        and "<- this report" in listed.splitlines()[0]
    )
    assert listed.splitlines()[1].startswith(f"  {good} finished, started ")
    assert main([*args, "--run", good]) == 0
    earlier = capsys.readouterr().out
    assert (
        "1/3 ok, 2 missing" in earlier
        and f"  {good} finished" in earlier
        and earlier.count("<- this report") == 1
    )
    assert main([*args, "--run", "0123456789abcdef"]) == 2
    err = capsys.readouterr().err
    assert "--run 0123456789abcdef: not a record of study 'report_t'; its records:" in err and good in err


def test_cli_report_as_json_has_the_rows_cells_verdicts_and_tests(store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(store["folder"])
    out = tmp_path / "json"
    args = ["study", "report", str(store["study_file"]), "--out", str(out), "--no-log", "--format", "json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout is the JSON alone; the file list goes to stderr
    assert (
        "wrote 8 file(s)" in captured.err and json.loads((out / "report.json").read_text())["study"] == NAME
    )
    assert doc["study"] == NAME and doc["parent_run_id"] == store["parent"] and doc["confidence"] == 0.95
    temperature = next(a for a in doc["ablations"] if a["name"] == "temperature")
    assert temperature["table"] == "SimCSE Table D.1" and temperature["main_metric"] == "test_sts_avg"
    rows = {r["label"]: r for r in temperature["rows"]}
    assert list(rows) == [T05, T01, T02, T03]
    cell = rows[T01]["metrics"]["test_sts_avg"]
    mean, std, low, high = scipy_cell(list(MAIN[("temperature", T01)].values()))
    assert cell["mean"] == pytest.approx(mean) and cell["std"] == pytest.approx(std)
    assert (cell["ci_low"], cell["ci_high"]) == pytest.approx((low, high)) and cell["n"] == 2
    assert cell["paper"] == 75.0 and cell["diff"] == pytest.approx(mean - 75.0)
    assert cell["seeds"] == {"1": 74.0, "2": 74.9} and cell["verdict"]["tolerance"] == 0.5
    assert rows[T03]["metrics"]["test_sts_avg"]["std"] is None  # nan is null: one seed has no spread
    reference = MAIN[("temperature", T05)]
    expected = stats.ttest_rel(
        [MAIN[("temperature", T01)][s] for s in (1, 2)], [reference[s] for s in (1, 2)]
    )
    assert rows[T01]["test"]["p_value"] == pytest.approx(expected.pvalue) and rows[T05]["test"] is None
    assert rows[T05]["paper_choice"] and rows[T01]["trials"] == "2/3 ok, 1 failed"
    assert {r["status"] for r in rows[T01]["runs"]} == {"finished", "failed"}
    assert any("CUDA out of memory" in line for line in temperature["not_averaged"])
    assert temperature["effects"]["kind"] == "skipped" and "1 key(s)" in temperature["effects"]["reason"]
    assert doc["cost"]["runs"] == sum(a["cost"]["runs"] for a in doc["ablations"])


GRID2 = {  # a 2 x 2 grid, two seeds per cell: an ANOVA with replicates
    ("0.05", "cls"): {1: 76.1, 2: 75.5},
    ("0.05", "avg"): {1: 74.0, 2: 74.9},
    ("0.1", "cls"): {1: 75.0, 2: 74.1},
    ("0.1", "avg"): {1: 71.0, 2: 72.3},
}


def test_a_grid_over_two_keys_gets_an_anova_with_partial_eta_squared(store, tmp_path):
    doc = {
        "name": "report_grid2",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}},
        "seeds": [1, 2],
        "ablations": {
            "tp": {
                "paper_metric": "test_sts_avg",
                "grid": {"method.temperature": [0.05, 0.1], "model.pooling": ["cls", "avg"]},
            }
        },
    }
    path = tmp_path / "grid2.yaml"
    path.write_text(yaml.safe_dump(doc))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_grid2", "x", None)
    for (t, pool), seeds in GRID2.items():
        for seed, value in seeds.items():
            label = f"method.temperature={t}, model.pooling={pool}"
            add_trial(client, uri, parent, "tp", label, seed, metrics={"test_sts_avg": value})
    report = build_report(load_study(path), client, parent, uri)
    (tp,) = report.ablations
    cells = [
        ({"method.temperature": float(t), "model.pooling": p}, list(s.values()))
        for (t, p), s in GRID2.items()
    ]
    expected = grid_effects(cells)
    assert tp.effects.kind == "anova" and tp.effects.residual_df == 4
    assert [t.term for t in tp.effects.terms] == ["method.temperature", "model.pooling",
                                                  "method.temperature x model.pooling"]  # fmt: skip
    for got, want in zip(tp.effects.terms, expected.terms, strict=True):
        assert (got.partial_eta_sq, got.ci_low, got.ci_high) == pytest.approx(
            (want.partial_eta_sq, want.ci_low, want.ci_high)
        )
        assert got.partial_eta_sq == pytest.approx(
            got.sum_sq / (got.sum_sq + got.sum_sq / got.f * 4 / got.df)
        )
    text = render_text(report)
    assert "effects: statsmodels ols + anova_lm(typ=2)" in text and "partial η²" in text
    terms = json.loads(render_json(report))["ablations"][0]["effects"]["terms"]
    assert terms[1]["term"] == "model.pooling"
    assert terms[1]["partial_eta_sq"] == pytest.approx(tp.effects.terms[1].partial_eta_sq)


def test_fidelity_lines_say_which_rows_have_no_published_number(report):
    temperature = ablation_of(report, "temperature")
    assert fidelity_lines(temperature) == [
        f"rows without a published test_sts_avg (not compared with the paper): {T03}"
    ]  # 0.2's number comes from its trials' clsr.paper tag
    assert "fidelity: rows without a published test_sts_avg" in "\n".join(ablation_notes(temperature))


def test_rcl_table_2_says_its_stackfaq_headline_has_no_published_numbers():
    study = load_study("studies/rcl_ablations.yaml")
    faq = ablation_report(study, "faq_rcl", [])
    faq.main_metric = "test_stackfaq_map"  # what the trials' metrics make it (none ran here)
    *declared, line = fidelity_lines(faq)  # the study file's fidelity: first, then what the numbers show
    assert (
        declared[0].startswith("stand-in data: data.train=faq:stackfaq, ") and "StackFAQ MAP" in declared[0]
    )
    assert line.startswith("no published number for the main metric test_stackfaq_map in any row")
    assert "test_faqir_map" in line and "test_cough_top1" in line  # where the paper's numbers are
    assert "offline stand-in with no published numbers" in line  # the study file's own words


def test_declared_fidelity_renders_one_line_per_reason():
    fidelity = SimpleNamespace(
        exact=["0.05", "0.1"],
        stand_in={"faq:stackfaq": "StackFAQ stands in for the paper's unreleased set", "faq:x": "other"},
        stand_in_setting={"0.2": "lr borrowed", "0.3": "lr borrowed"},
        not_expressible={"BERT-large row": "needs a checkpoint the study cannot load"},
    )
    assert declared_fidelity(fidelity, {"faq:stackfaq": [1200]}) == [
        "exact reproductions: 0.05; 0.1",
        "stand-in data: faq:stackfaq: StackFAQ stands in for the paper's unreleased set (rows read: 1,200)",
        "stand-in data: faq:x: other (rows read: no finished trial)",
        "stand-in setting: 0.2; 0.3: lr borrowed",
        "not expressible: BERT-large row: needs a checkpoint the study cannot load",
    ]
    assert declared_fidelity(None) == []


def test_a_sampled_ablation_gets_optunas_parameter_importance(store, tmp_path):
    space = {"trainer.lr": {"loguniform": [1e-5, 1e-4]}, "trainer.batch_size": {"choice": [64, 128]}}
    doc = {
        "name": "report_importance",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}},
        "search": {"algorithm": "random", "num_samples": 6},
        "ablations": {"lr_bs": {"space": space}},
    }
    path = tmp_path / "importance.yaml"
    path.write_text(yaml.safe_dump(doc))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_importance", "x", None)
    sampled = [(2e-5, 64, 74.0), (8e-5, 128, 76.5), (3e-5, 128, 74.9), (6e-5, 64, 75.8), (1e-5, 64, 73.1)]
    for lr, bs, value in sampled:
        params = {"trainer": {"lr": lr, "batch_size": bs}}
        add_trial(client, uri, parent, "lr_bs", f"lr={lr}, bs={bs}", 42, params=params,
                  metrics={"best_dev_stsb": value})  # fmt: skip
    (ab,) = build_report(load_study(path), client, parent, uri).ablations
    study = load_study(path)
    expected = sampled_effects(
        study.ablations["lr_bs"].space,
        [({"trainer.lr": lr, "trainer.batch_size": bs}, v) for lr, bs, v in sampled],
    )
    assert ab.effects.kind == "importance" and set(ab.effects.importances) == set(space)
    assert ab.effects.importances == pytest.approx(expected.importances)


def test_several_objectives_get_their_pareto_front_in_every_format(store, tmp_path):
    """A study searched on two objectives: each configuration's means over its seeds, the front (checked
    by hand: b beats a on transfer, c is beaten by a on both), its table, plot and JSON."""
    doc = {
        "name": "report_pareto",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}, "eval": {"tasks": ["sts", "transfer"]}},
        "seeds": [1, 2],
        "metric": ["best_dev_stsb", "test_transfer_avg"],
        "search": {"algorithm": "optuna", "num_samples": 3},
        "ablations": {"lr": {"space": {"trainer.lr": {"loguniform": [1e-5, 1e-4]}}}},
    }
    path = tmp_path / "pareto.yaml"
    path.write_text(yaml.safe_dump(doc))
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_pareto", "x", None)
    scores = {
        "a": [(82.0, 84.0), (84.0, 85.0)],
        "b": [(80.0, 86.0), (81.0, 87.0)],
        "c": [(81.0, 83.0), (82.0, 84.0)],
    }
    for label, seeds in scores.items():
        for seed, (sts, transfer) in zip((1, 2), seeds, strict=True):
            add_trial(client, uri, parent, "lr", label, seed,
                      metrics={"best_dev_stsb": sts, "test_transfer_avg": transfer})  # fmt: skip
    report = build_report(load_study(path), client, parent, uri)
    (ab,) = report.ablations
    assert ab.pareto.values == {"a": [83.0, 84.5], "b": [80.5, 86.5], "c": [81.5, 83.5]}
    assert ab.pareto.front == ["a", "b"] and ab.pareto.seeds == {"a": 2, "b": 2, "c": 2}
    table = pareto_table(ab)
    assert table.title.startswith("lr: Pareto front, 2 of 3 configurations")
    # best first on the first objective; then c, near the front (two seeds: CIs wide enough to reach a's)
    assert [(row[0][0], row[-1][0]) for row in table.rows] == [("a", "on"), ("b", "on"), ("c", "near")]
    assert "Pareto front, 2 of 3" in render_text(report)
    files = write_report(report, client, tmp_path / "out")
    assert (tmp_path / "out" / "lr_pareto.png") in files
    pareto = json.loads((tmp_path / "out" / "report.json").read_text())["ablations"][0]["pareto"]
    assert [c["label"] for c in pareto["configurations"] if c["on_front"]] == ["a", "b"]
    assert pareto["objectives"][1] == {"metric": "test_transfer_avg", "mode": "max"}


def test_a_grid_on_two_objectives_gets_its_front_and_the_points_near_it(store, tmp_path):
    """A grid (issue 56 item 6): each point's means over its seeds, the front (b and a), c near it (its
    CIs overlap a's on both objectives: t(0.975, 2) x 1 / sqrt(3) = 2.48 around each mean), d far off, e
    with one seed (no CI, so never near); in the table, the plot and the JSON."""
    doc = {
        "name": "report_grid_pareto",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}, "eval": {"tasks": ["sts", "transfer"]}},
        "seeds": [1, 2, 3],
        "metric": ["best_dev_stsb", "test_transfer_avg"],
        "mode": "max",
        "ablations": {"lr": {"grid": {"trainer.lr": [1e-5, 2e-5, 3e-5, 4e-5, 5e-5]}}},
    }
    path = tmp_path / "grid_pareto.yaml"
    path.write_text(yaml.safe_dump(doc))
    study = load_study(path)
    assert study.search.algorithm == "grid" and study.objectives[1] == ("test_transfer_avg", "max")
    labels = [p.label for p in grid_points(study.ablations["lr"])]
    client, uri = store["client"], store["uri"]
    parent = start_parent_run(client, "report_grid_pareto", "x", None)
    scores = {  # label -> (sts, transfer) per seed
        "a": [(80.0, 85.0), (81.0, 86.0), (82.0, 87.0)],
        "b": [(83.0, 82.0), (84.0, 83.0), (85.0, 84.0)],
        "c": [(79.0, 84.0), (80.0, 85.0), (81.0, 86.0)],
        "d": [(70.0, 70.0), (70.5, 70.5), (71.0, 71.0)],
        "e": [(79.0, 84.0)],
    }
    named = dict(zip("abcde", labels, strict=True))
    for key, seeds in scores.items():
        for seed, (sts, transfer) in zip((1, 2, 3), seeds, strict=False):
            add_trial(client, uri, parent, "lr", named[key], seed,
                      metrics={"best_dev_stsb": sts, "test_transfer_avg": transfer})  # fmt: skip
    report = build_report(study, client, parent, uri)
    (ab,) = report.ablations
    front = ab.pareto
    assert front.values[named["a"]] == [81.0, 86.0] and front.values[named["e"]] == [79.0, 84.0]
    assert front.front == [named["a"], named["b"]] and front.near == [named["c"]]
    assert front.seeds == {named["a"]: 3, named["b"]: 3, named["c"]: 3, named["d"]: 3, named["e"]: 1}
    table = pareto_table(ab)
    assert table.title.startswith("lr: Pareto front, 2 of 5 configurations")
    assert "1 near it" in table.title
    assert [(row[0][0], row[-1][0]) for row in table.rows] == [
        (named["b"], "on"),
        (named["a"], "on"),
        (named["c"], "near"),
    ]
    assert "Pareto front, 2 of 5" in render_text(report)
    files = write_report(report, client, tmp_path / "out")
    assert (tmp_path / "out" / "lr_pareto.png") in files
    pareto = json.loads((tmp_path / "out" / "report.json").read_text())["ablations"][0]["pareto"]
    marks = {c["label"]: (c["on_front"], c["near_front"]) for c in pareto["configurations"]}
    assert marks == {
        named["a"]: (True, False), named["b"]: (True, False), named["c"]: (False, True),
        named["d"]: (False, False), named["e"]: (False, False),
    }  # fmt: skip
