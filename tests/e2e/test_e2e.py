"""The whole stack: CLI → YAML → Ray Tune → Ray Train → trainer → STS evaluation → MLflow.

Each test runs the real ``platform`` command in a subprocess (its own Ray) and reads MLflow back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.stores import sqlite_uri
from tests.support.studies import SMOKE_STS_PAIRS

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(2.4)]


def platform_cmd(*args: str, cwd: Path, uri: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "clsr.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def run_smoke_study(study: Path, tmp_path: Path) -> tuple[str, str]:
    """``platform study run <study> --smoke`` in tmp_path; returns (MLflow URI, output), asserting success."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    args = ("study", "run", str(study), "--smoke", "--set", f"storage_path={tmp_path / 'runs'}")
    # system metrics (tested in test_resilience.py) would cost each of the many small trials a monitor
    args += ("--set", "system_metrics_interval_s=null")
    proc = platform_cmd(*args, cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-3000:]
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)  # one model checkpoint per trial: free the disk now
    return uri, output


def runs_of(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id]) if exp else []
    parents = [r for r in runs if "clsr.study" in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


@pytest.mark.xdist_group("smoke_study")
def test_a_finished_smoke_studys_trials_keep_their_weights_once_each_kind(smoke_study):
    """Once the study finished, each trial's kept checkpoint is its last weights only (before: weights,
    AdamW's two moments and the best weights, about 4x; issue 35), its best weights being its MLflow run's
    model (issue 53: kept once, the manifest names it); the whole study about 4x the model on disk."""
    import json

    client, _, children = runs_of(smoke_study.uri, "smoke")
    by_folder = {Path(run.data.tags["clsr.checkpoint"]).resolve(): run for run in children}
    folders = {p.parent.resolve() for p in (smoke_study.folder / "runs").rglob("checkpoint_*/state.pt")}
    assert folders == set(by_folder)  # one per trial
    for folder, run in by_folder.items():
        weights = (folder / "state.pt").stat().st_size
        assert weights > 80e6  # MiniLM's 22.6 M fp32 parameters
        assert sorted(f.name for f in folder.iterdir() if f.is_file()) == ["manifest.json", "state.pt"]
        assert (
            json.loads((folder / "manifest.json").read_text())["best_model"]
            == f"runs:/{run.info.run_id}/model"
        )
        model = [
            a for a in client.list_artifacts(run.info.run_id, "model") if a.path.endswith(".safetensors")
        ]
        assert model and model[0].file_size > 80e6  # the best weights, there
    disk = sum(
        f.stat().st_size
        for name in ("runs", "mlruns")
        for f in (smoke_study.folder / name).rglob("*")
        if f.is_file()
    )
    assert disk <= 4 * weights + 16e6, disk  # two trials: last weights + the MLflow model each
    assert "2 with their best weights kept once" in smoke_study.output  # the line that says so


@pytest.mark.xdist_group("smoke_study")
def test_the_smoke_study_told_its_webhook_and_kept_the_url_out_of_the_record(smoke_study, tmp_path):
    """Issue 56 item 5: the study's notify server (a real one on 127.0.0.1) received the finished and
    verdicts messages (no trial failed), and the URL's secret path is nowhere in the MLflow record (the
    parent's params, tags and every artifact; the trials' params and tags) or the command's output."""
    secret = smoke_study.notify_secret
    client, (parent,), children = runs_of(smoke_study.uri, "smoke")
    received = smoke_study.webhook.received
    assert [r["path"] for r in received] == [f"/services/{secret}"] * 2
    finished, verdicts = (r["body"] for r in received)
    assert finished == {
        "text": "clsr study smoke finished: 2 trial(s) (2 finished)",
        "event": "finished", "study": "smoke", "run_id": parent.info.run_id,
    }  # fmt: skip
    head, *lines = verdicts["text"].splitlines()
    assert verdicts["event"] == "verdicts" and head == "clsr study smoke: verdicts against the papers"
    assert sorted(lines) == [  # one seed: no CI, so no verdict either way
        "• temperature[method.temperature=0.05] best_dev_stsb: inconclusive (1 seed)",
        "• temperature[method.temperature=0.1] best_dev_stsb: inconclusive (1 seed)",
    ]
    shown = f"http://127.0.0.1:{smoke_study.webhook.port}/***"
    for run in [parent, *children]:
        assert secret not in str(run.data.params) and secret not in str(run.data.tags)
    folder = Path(client.download_artifacts(parent.info.run_id, "", str(tmp_path)))
    texts = {p.name: p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()}
    assert {"study.yaml", "resolved.yaml", "fingerprint.json"} <= set(texts)
    assert [name for name, text in texts.items() if secret in text] == []
    assert f"url: '{shown}'" in texts["study.yaml"] and f"url: {shown}" in texts["resolved.yaml"]
    assert secret not in smoke_study.output and "warning: notify" not in smoke_study.output


@pytest.mark.xdist_group("smoke_study")
def test_smoke_study_end_to_end(smoke_study):
    """One Ray Train worker per trial (the GCLSR and SupMPN smoke studies run trials in-process)."""
    uri, output = smoke_study.uri, smoke_study.output
    assert "temperature | method.temperature=0.05" in output  # the summary table

    client, parents, children = runs_of(uri, "smoke")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # report/: the live report's, where the study outlasted report.live_every (a slow machine)
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} - {"report"} == {
        "study.yaml",
        "resolved.yaml",
        "fingerprint.json",
        "environment",  # the driver's (issue 55)
    }
    assert len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["method.temperature"] for c in children) == ["0.05", "0.1"]
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["clsr.status"] == "finished"
        assert child.data.tags["clsr.method"] == "simcse_unsup" and child.data.tags["clsr.seed"] == "1"
        assert child.data.params["model.name"] == "minilm" and child.data.params["trainer.batch_size"] == "16"
        assert child.data.params["data.source"] == "data_dir"  # CLSR_DATA_DIR (conftest)
        metrics = child.data.metrics
        for key in ("test_sts16", "test_stsb", "test_sts_avg", "best_dev_stsb", "align", "uniform"):
            assert key in metrics, key
        assert 60 < metrics["test_stsb"] < 95 and 60 < metrics["best_dev_stsb"] < 95
        assert metrics["test_sts_avg"] == pytest.approx((metrics["test_sts16"] + metrics["test_stsb"]) / 2)
        losses = client.get_metric_history(child.info.run_id, "loss")
        assert sorted(m.step for m in losses) == list(range(1, 9))  # one training loss per step
    paper = {c.data.params["method.temperature"]: c.data.tags.get("clsr.paper.dev_stsb") for c in children}
    assert paper == {"0.05": "82.5", "0.1": "80.9"}
    assert_data_identities(children)
    assert_environment(client, parents[0], children)


def assert_environment(client, parent, children) -> None:
    """Each trial's rank 0 (a Ray Train worker here) and the driver logged where they ran (issue 55):
    the values this machine's own platform, torch and packages give; the lock-style list names torch."""
    import importlib.metadata
    import platform

    import clsr

    expected = {
        "env.python": platform.python_version(),
        "env.torch": importlib.metadata.version("torch"),  # the distribution's (env.cuda names the build)
        "env.transformers": importlib.metadata.version("transformers"),
        "env.clsr": clsr.__version__,
        "env.gpu": "none",  # the smoke trials run on CPU
        "env.gpu_count": "0",
    }
    for child in children:
        assert {k: child.data.params.get(k) for k in expected} == expected
        assert child.data.params["env.git_dirty"] in ("true", "false") and child.data.params["env.cpu"]
        lock = client.download_artifacts(child.info.run_id, "environment/environment.txt")
        assert f"torch=={importlib.metadata.version('torch')}" in Path(lock).read_text().splitlines()
    driver = {k: v for k, v in parent.data.params.items() if k.startswith("env.")}
    assert driver["env.python"] == expected["env.python"] and driver["env.torch"] == expected["env.torch"]
    assert len(driver) == 13  # python, os, cpu, torch, cuda, cudnn, gpu(s), driver, packages, code


def assert_data_identities(children) -> None:
    """Each trial's process logged the identity of every data set it read (issue 55): the same as the
    rows read here, from the same folder, give (the unit tests check the hashes against golden values)."""
    from clsr.data.training import training_rows
    from clsr.study.plan.load import load_study
    from clsr.study.plan.resolve import resolve_trial
    from clsr.train.data_record import data_params

    study = load_study(REPO_ROOT / "studies" / "smoke.yaml", [("eval.sts_max_pairs", SMOKE_STS_PAIRS)])
    trial = resolve_trial(study, "temperature", {"method.temperature": 0.05}, 1)
    expected = data_params(trial, training_rows(trial))
    names = {key.split(".")[1] for key in expected}
    assert names == {"train", "stsb_dev", "sts16", "stsb"}  # the rows, the dev pairs, the test sets
    assert expected["data.train.rows"] == "512" and expected["data.stsb_dev.rows"] == str(SMOKE_STS_PAIRS)
    assert expected["data.train.source"] == f"local:{os.environ['CLSR_DATA_DIR']} (wiki1m)"
    for child in children:  # both temperatures read the same data
        assert {k: child.data.params.get(k) for k in expected} == expected


def test_the_smoke_study_runs_with_neither_a_data_folder_nor_the_hub(tmp_path, monkeypatch):
    """A fresh clone (``make smoke``): no CLSR_DATA_DIR, the hub off and datasets' cache empty; the package's
    embedded sample serves, and each trial's ``data.source`` says so (issue 53)."""
    monkeypatch.delenv("CLSR_DATA_DIR", raising=False)
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(flag, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    uri = sqlite_uri(tmp_path / "mlflow.db")
    args = (
        "study",
        "run",
        str(REPO_ROOT / "studies" / "smoke.yaml"),
        "--set",
        f"storage_path={tmp_path / 'runs'}",
    )
    proc = platform_cmd(*args, "--set", "system_metrics_interval_s=null", cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    _, parents, children = runs_of(uri, "smoke")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2
    for child in children:
        assert child.data.tags["clsr.status"] == "finished"
        assert child.data.params["data.source"] == "embedded"
        assert child.data.params["data.train.source"] == "embedded:clsr/data/embedded/wiki1m_sample.txt.gz"
        assert child.data.params["data.stsb.source"] == "embedded:clsr/data/embedded/sts_sample.tsv.gz"
        assert child.data.params["data.stsb.rows"] == "300"  # the sample's STS-B test pairs
        assert {"test_sts16", "test_stsb", "best_dev_stsb"} <= set(child.data.metrics)


@pytest.mark.xdist_group("smoke_study")
def test_report_of_the_smoke_study(smoke_study, tmp_path, capsys):
    """`platform study report` on a study that ran: tables, files and the parent run's artifacts."""
    from clsr.cli import main

    out = tmp_path / "report"
    study = str(REPO_ROOT / "studies" / "smoke.yaml")
    assert main(["study", "report", study, "--out", str(out), "--tracking-uri", smoke_study.uri]) == 0
    printed = capsys.readouterr().out
    assert "method.temperature=0.05" in printed and "paper choice" in printed
    assert {"report.md", "report.csv", "report.html", "temperature_main.png"} <= {
        p.name for p in out.iterdir()
    }
    client, parents, children = runs_of(smoke_study.uri, "smoke")
    logged = {a.path for a in client.list_artifacts(parents[0].info.run_id, "report")}
    assert "report/report.html" in logged
    # every trial's cost reached MLflow and the report sums it
    assert all(c.data.metrics["trial_wall_s"] > 0 for c in children)
    assert "not logged" not in (out / "report.md").read_text()  # the cost table has the trials' seconds


@pytest.mark.xdist_group("smoke_study")
def test_a_trials_logged_model_loads_in_sentence_transformers_with_the_same_score(smoke_study, tmp_path):
    """Round trip: the smoke study's logged model, loaded by sentence-transformers, scores STS16 as the
    platform's own evaluation of that trial did."""
    import mlflow
    from sentence_transformers import SentenceTransformer

    from clsr.eval.sts import evaluate_sts

    client, _, children = runs_of(smoke_study.uri, "smoke")
    run = children[0]
    mlflow.set_tracking_uri(smoke_study.uri)
    folder = mlflow.artifacts.download_artifacts(f"runs:/{run.info.run_id}/model", dst_path=str(tmp_path))
    model = SentenceTransformer(folder, device="cpu")
    encode = lambda texts: model.encode(list(texts), batch_size=128)  # noqa: E731
    scores = evaluate_sts(encode, ["sts16"], "test", max_pairs=SMOKE_STS_PAIRS)  # the study's sample
    assert scores["sts16"].all == pytest.approx(run.data.metrics["test_sts16"], abs=1e-3)


OWN_STUDY = """\
name: own-data
method: simcse_sup
base:
  model: {name: minilm, pooling: auto, max_seq_length: 32}    # its own Pooling(mean): avg
  data:
    train: "o'brien/triplets.csv"                            # relative: read from the folder run in
    columns: {anchor: premise, positive: entailed, negative: contradicted}
  trainer: {batch_size: 16, max_steps: 4, eval_steps: 4, log_every: 2, lr: 3.0e-5}
  eval:
    tasks: [sts16, my_pairs]
    sts_max_pairs: 300                                        # the built-in STS sets: a sample
    alignment_uniformity: false
    log_model: false
    custom:
      my_pairs: {type: sts, path: pairs.jsonl, columns: {sentence1: left, sentence2: right, score: gold}}
ablations:
  temperature:                                                # a quote in the labels and trial ids
    grid: {method.temperature: [0.05, 0.1], data.train: ["o'brien/triplets.csv"]}
seeds: [1]
metric: best_dev_stsb
resources: {workers_per_trial: 1, cpus_per_worker: 1}
concurrency: 2
smoke: {seeds: [1]}
"""


def test_a_study_on_own_csv_with_a_custom_evaluation_set(tmp_path, data_dir, capsys):
    """A user's CSV (mapped columns) trains, a JSON Lines STS set of their own is scored: both through Ray
    Train and into MLflow, and the report shows the custom task as a column beside the built-in one. The
    CSV's folder has a quote in its name, so the points' labels and trial ids do too (MLflow finds the
    runs again by them)."""
    import csv
    import json

    from clsr.cli import main
    from clsr.data.sts import load_sts
    from clsr.data.training import load_rows

    (tmp_path / "o'brien").mkdir()
    with (tmp_path / "o'brien" / "triplets.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["premise", "entailed", "contradicted"])
        for row in load_rows("nli_triplets", data_dir, max_rows=96, seed=0):
            writer.writerow([row["anchor"], row["positive"], row["negative"]])
    dev = load_sts("stsb", "dev", data_dir)
    (tmp_path / "pairs.jsonl").write_text(
        "".join(
            json.dumps({"left": a, "right": b, "gold": float(s)})
            for a, b, s in zip(dev.sentences1[:150], dev.sentences2[:150], dev.scores[:150], strict=True)
        ).replace("}{", "}\n{")
        + "\n"
    )
    (tmp_path / "own.yaml").write_text(OWN_STUDY)
    uri, output = run_smoke_study(tmp_path / "own.yaml", tmp_path)
    client, parents, children = runs_of(uri, "own-data-smoke")
    assert len(children) == 2 and parents[0].info.status == "FINISHED"
    for child in children:
        assert child.data.tags["clsr.status"] == "finished"
        assert child.data.params["model.pooling"] == "avg"  # auto, resolved and recorded
        assert child.data.params["data.train"] == str(tmp_path / "o'brien" / "triplets.csv")
        assert "data.train=o'brien/triplets.csv" in child.data.tags["clsr.trial_id"]
        assert 0 < child.data.metrics["test_my_pairs"] < 100 and "test_sts16" in child.data.metrics

    assert (
        main(
            [
                "study",
                "report",
                str(tmp_path / "own.yaml"),
                "--smoke",
                "--tracking-uri",
                uri,
                "--no-log",
                "--out",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    report = capsys.readouterr().out
    assert "test_my_pairs" in report and "test_sts16" in report
