"""``platform study plan`` before any run: the cost model's projection against FLOPs worked out by hand,
``--from`` a record of another configuration refused with the fields named, every shipped study planned
with the hub off and no socket opened, and a probe that stops at its time limit."""

from __future__ import annotations

import socket

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.plan.load import load_documents, load_study
from clsr.study.plan.probe import partial_sample
from clsr.study.plan.projection import project
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from tests.e2e.test_e2e import REPO_ROOT
from tests.support.stores import sqlite_uri

SMOKE = REPO_ROOT / "studies" / "smoke.yaml"
GCLSR = REPO_ROOT / "studies" / "gclsr_ablations.yaml"
# MiniLM-L6 (config.json: 6 layers, hidden 384, feed-forward 1536, 30,522 words):
# N = 6 x (4 x 384² + 2 x 384 x 1536) non-embedding parameters, all = N + 30,522 x 384
N, ALL = 10_616_832, 22_337_280
TOKENS = 16.6  # a sentence's mean real tokens (max_seq_length 32 caps nothing)
# a smoke trial: 8 steps of 16 sentences encoded twice; STS-B dev (1,500 pairs) at steps 4 and 8, each
# followed by a checkpoint; test on STS16 (1,186 pairs) and STS-B test (1,379)
TRAIN_FLOP = 6 * N * 16 * 2 * TOKENS * 8
DEV_FLOP = 2 * (2 * 1500 * 2 * N * TOKENS)
TEST_FLOP = 2 * (1186 + 1379) * 2 * N * TOKENS
CHECKPOINTS_S = 2 * ALL * 16.1 / 4.19e8  # 16.1 bytes a parameter at 419 MB/s
SETUP_S = 8.4


def quiet(_line: str) -> None:
    pass


def test_a_cpu_study_with_no_record_is_priced_by_flops_over_the_measured_cpu_throughput():
    projection = project(load_study(SMOKE), None, gpus=1, gpu="h100", progress=quiet)
    flops = 9.96e10 * 1 / 2  # the 2-core figure, for a trial's 1 CPU
    per_trial = SETUP_S + (TRAIN_FLOP + DEV_FLOP + TEST_FLOP) / flops + CHECKPOINTS_S
    assert per_trial == pytest.approx(94.33, abs=0.01)
    assert [p.seconds for p in projection.plans] == [pytest.approx(per_trial)] * 2
    assert [p.basis for p in projection.plans] == ["model", "model"]
    assert projection.wall_s == pytest.approx(per_trial)  # concurrency 2: side by side
    assert any("6 x N x training tokens" in a for a in projection.assumptions)
    assert any(f"minilm {N:,} (config.json)" in a for a in projection.assumptions)


def test_a_gpu_share_gets_that_share_of_the_measured_gpu_throughput():
    study = load_study(SMOKE, [("resources.gpus_per_worker", 0.5)])
    projection = project(study, None, gpus=1, gpu="h200", usd_per_gpu_hour=2.0, progress=quiet)
    per_trial = SETUP_S + (TRAIN_FLOP + DEV_FLOP + TEST_FLOP) / (1.266e14 * 0.5) + CHECKPOINTS_S
    assert projection.plans[0].seconds == pytest.approx(per_trial)
    assert projection.gpu_hours == pytest.approx(2 * per_trial * 0.5 / 3600)
    assert projection.usd == pytest.approx(projection.gpu_hours * 2.0)


@pytest.fixture()
def smoke_record(tmp_path, monkeypatch):
    """A recorded 'gclsr_ablations-smoke': two finished trials of the smoke configuration, with their
    params as a study run logs them and phase timings."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "gclsr_ablations-smoke", str(tmp_path / "runs"), None)
    documents = load_documents(GCLSR, smoke=True)
    phases = {"trial_setup_s": 5.0, "trial_steps_s": 0.2, "trial_steps_run": 2.0, "trial_dev_eval_s": 0.5,
              "trial_dev_evaluations": 1.0, "trial_test_eval_s": 3.0}  # fmt: skip
    for n, point in enumerate(documents.grids["components"][:2]):
        trial = documents.config("components", point.overrides, 1)
        tags = {"clsr.ablation": "components", "clsr.point": point.label, "clsr.seed": 1}
        run_id = open_child_run(uri, parent, f"t{n}", point.label, tags, trial.model_dump())
        client.log_batch(run_id, metrics=[Metric(k, v, 0, 2) for k, v in phases.items()])
        close_run(uri, run_id, "finished")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)


def test_a_smoke_record_does_not_price_the_full_study(smoke_record, capsys):
    assert main(["study", "plan", str(GCLSR), "--from", "gclsr_ablations-smoke"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "ran another configuration than study 'gclsr_ablations'" in err
    assert "model.vectors (recorded glove-6b-50d-local; planned word2vec-google-news-300)" in err
    assert "model.filters (recorded 8; planned 300, 640)" in err
    # counts are the planned study's own: a short record of the same configuration prices it
    assert not any(f in err for f in ("data.max_rows", "trainer.max_steps", "trainer.eval_steps"))
    assert "trainer.batch_size (recorded 512; planned 1024, 128, 256, ...)" in err  # Table 4's sizes
    assert "eval.sts_max_pairs (recorded 500; planned None)" in err
    # asked for anyway: priced, and the warning heads the assumptions
    assert main(["study", "plan", str(GCLSR), "--from", "gclsr_ablations-smoke", "--allow-other-config"]) == 0
    out = capsys.readouterr().out
    assert "  - WARNING: study 'gclsr_ablations-smoke' ran another configuration" in out
    # the smoke study's own configuration: the vectors and STS pairs match; what differs now is only
    # what the two recorded components trials never ran (other ablations' filters, sizes, batches)
    assert main(["study", "plan", str(GCLSR), "--smoke", "--from", "gclsr_ablations-smoke"]) == 2
    err = capsys.readouterr().err
    assert "trainer.batch_size (recorded 512; planned 1024, 128, 256, ...)" in err
    assert not any(f in err for f in ("model.vectors", "eval.transfer_mode", "sts_max_pairs"))


@pytest.mark.parametrize("study", sorted(p.name for p in (REPO_ROOT / "studies").glob("*.yaml")))
def test_every_shipped_study_plans_with_the_hub_off_and_no_socket_opened(
    study, tmp_path, monkeypatch, capsys
):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    connections: list[object] = []

    def refuse(sock, address):
        connections.append(address)
        raise OSError(f"test: no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    uri = sqlite_uri(tmp_path / "none.db")
    path = REPO_ROOT / "studies" / study
    assert main(["study", "plan", str(path), "--set", "skip_unavailable=true", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert connections == []
    assert "no recorded trial: every trial priced by the cost model" in out
    rows = [line for line in out.splitlines() if line.rstrip().endswith(("model", "?"))]
    assert rows and any(line.endswith("model") for line in rows)
    minutes = float(out.split("about ")[1].split(" min wall")[0].replace(",", ""))
    assert minutes > 0


def test_a_cut_copy_is_priced_by_the_steps_it_logged():
    # set-up, then steps 1-4 a second apart, a 23 s dev evaluation (step 4 logged again), step 5
    logged = [(1, 20.0, "1 x cpu"), (2, 21.0, "1 x cpu"), (3, 22.0, "1 x cpu"), (4, 23.0, "1 x cpu"),
              (4, 46.0, "1 x cpu"), (5, 47.0, "1 x cpu")]  # fmt: skip
    sample = partial_sample(logged)
    assert sample is not None and sample.device == "1 x cpu"
    m = sample.metrics
    assert (m["trial_dev_evaluations"], m["trial_dev_eval_s"]) == (1.0, 23.0)
    assert m["trial_steps_s"] / m["trial_steps_run"] == pytest.approx((47 - 20 - 23) / 4)  # 1 s a step
    assert m["trial_setup_s"] == pytest.approx(19.0) and m["trial_test_eval_s"] == 0.0
    assert partial_sample(logged[:1]) is None


def test_a_probe_that_measures_nothing_in_its_limit_falls_back_to_the_cost_model(tmp_path, capsys):
    uri = sqlite_uri(tmp_path / "none.db")
    assert main(["study", "plan", str(SMOKE), "--probe", "--probe-limit", "1", "--tracking-uri", uri]) == 0
    captured = capsys.readouterr()
    assert "probe: no copy logged two steps before the time limit" in captured.err
    assert "projected by the cost model instead" in captured.err
    assert "no recorded trial: every trial priced by the cost model" in captured.out
    assert "probe: 1 copy of temperature/method.temperature=0.05 at once, 8 steps each" in captured.out
