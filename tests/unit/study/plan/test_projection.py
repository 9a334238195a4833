"""``platform study plan``: per-unit phase costs from a real MLflow store of hand-made trials, each
distinct trial priced by the loop's own step, evaluation and checkpoint counts, packed onto the GPUs,
checked against numbers worked out by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.plan.load import load_study
from clsr.study.plan.probe import probe, probe_trial
from clsr.study.plan.projection import measure, pack, project
from clsr.tracking.study_runs import children, close_run, open_child_run, start_parent_run
from tests.e2e.test_e2e import REPO_ROOT
from tests.support.stores import sqlite_uri

SMOKE = REPO_ROOT / "studies" / "smoke.yaml"  # 2 trials of 8 steps, a dev evaluation every 4 steps
# per trial: set-up 10 s, 2 s a step, 3 s a dev evaluation, 0.5 s a checkpoint write, test evaluation 20 s
PHASES = {
    "trial_setup_s": 10.0, "trial_steps_s": 16.0, "trial_steps_run": 8.0, "trial_dev_eval_s": 6.0,
    "trial_dev_evaluations": 2.0, "trial_checkpoint_write_s": 1.0, "trial_checkpoints_written": 2.0,
    "trial_test_eval_s": 20.0,
}  # fmt: skip


@pytest.fixture()
def recorded(tmp_path, monkeypatch):
    """A recorded study 'probe': two measured trials, one resumed (its clock restarted: not used), one
    failed."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "probe", str(tmp_path / "runs"), None)
    trials = [("a", PHASES, "finished"), ("b", {**PHASES, "trial_setup_s": 12.0}, "finished"),
              ("c", {**PHASES, "trial_setup_s": 999.0, "resumed_from_step": 4.0}, "finished"),
              ("d", {**PHASES, "trial_setup_s": 999.0}, "failed")]  # fmt: skip
    for label, metrics, status in trials:
        tags = {"clsr.ablation": "temperature", "clsr.point": label, "clsr.seed": 1, "clsr.device": "1 x cpu"}
        run_id = open_child_run(uri, parent, f"temperature[{label}] seed=1", label, tags, {})
        client.log_batch(run_id, metrics=[Metric(k, v, 0, 8) for k, v in metrics.items()])
        close_run(uri, run_id, status)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return client, parent


def test_unit_costs_are_medians_over_finished_never_resumed_trials(recorded):
    client, parent = recorded
    costs = measure(children(client, parent), "probe").overall
    assert costs.trials == 2 and costs.device == "1 x cpu"
    assert (costs.setup_s, costs.step_s, costs.dev_eval_s, costs.checkpoint_s, costs.test_eval_s) == (
        11.0, 2.0, 3.0, 0.5, 20.0,
    )  # fmt: skip


def test_a_cpu_study_is_projected_as_measured_and_a_gpu_study_packed_on_its_gpus(recorded):
    client, parent = recorded
    measured = measure(children(client, parent), "probe")
    cpu = project(load_study(SMOKE), measured, gpus=1, gpu="h100", progress=lambda _: None)
    per_trial = 11 + 8 * 2 + 2 * 3 + 2 * 0.5 + 20  # 8 steps, evaluations at 4 and 8, a checkpoint each
    assert [p.seconds for p in cpu.plans] == [per_trial] * 2
    assert (cpu.trials, cpu.distinct, cpu.slots) == (2, 2, 2) and cpu.wall_s == per_trial  # side by side
    assert cpu.gpu_hours == 0 and cpu.usd is None

    # half a GPU per trial, a GPU 10x faster at steps and evaluations, USD 2 per GPU-hour
    gpu_study = load_study(SMOKE, [("resources.gpus_per_worker", 0.5)])
    gpu = project(
        gpu_study, measured, gpus=1, gpu="h100", speedup=10, usd_per_gpu_hour=2.0, progress=lambda _: None
    )
    per_trial = 11 + (16 + 6 + 20) / 10 + 1  # set-up and checkpoint writes as measured
    assert gpu.plans[0].seconds == pytest.approx(per_trial) and gpu.slots == 2
    assert gpu.gpu_hours == pytest.approx(2 * per_trial * 0.5 / 3600)
    assert gpu.usd == pytest.approx(gpu.gpu_hours * 2.0)
    one_slot = project(gpu_study, measured, gpus=1, gpu="h100", speedup=10, progress=lambda _: None)
    assert "USD 2.50 per GPU-hour (assumed; --price to change it)" in one_slot.assumptions
    assert project(load_study(SMOKE, [("resources.gpus_per_worker", 1.0)]), measured, gpus=1, gpu="h100",
                   speedup=10, progress=lambda _: None).wall_s == pytest.approx(2 * (11 + 4.2 + 1))  # fmt: skip


def test_identical_trials_are_priced_once():
    study = load_study(REPO_ROOT / "studies" / "gclsr_ablations.yaml", smoke=True)
    from clsr.study.plan.projection import Measured, UnitCosts

    costs = UnitCosts(1.0, 0.0, 0.1, 1.0, 0.1, 1.0, 1, "1 x cpu")
    projection = project(study, Measured("x", costs), gpus=1, gpu="h100", progress=lambda _: None)
    assert (projection.trials, projection.distinct) == (49, 41)


def test_longest_trials_first_onto_the_slot_that_frees_first():
    # 5 | 4, then each 3 onto the slot that frees first: 4+3 = 7, 5+3 = 8, 7+3 = 10 (as Tune hands out slots,
    # not the best packing, 9)
    assert pack([5, 4, 3, 3, 3], 2) == 10
    assert pack([], 4) == 0 and pack([7], 3) == 7


def test_the_command_prints_the_projection_and_falls_back_to_the_cost_model(recorded, capsys):
    assert main(["study", "plan", str(SMOKE), "--from", "probe", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 trials, 2 distinct" in out and "min wall" in out and "hold no GPU" in out
    row = next(line for line in out.splitlines() if line.startswith("temperature"))
    assert row.endswith("  measured")  # the basis column
    # no recorded 'smoke' study in this store: the cost model prices it, and says so
    assert main(["study", "plan", str(SMOKE)]) == 0
    captured = capsys.readouterr()
    assert "no finished trial of study 'smoke'" in captured.err
    row = next(line for line in captured.out.splitlines() if line.startswith("temperature"))
    assert row.endswith("  model") and "no recorded trial" in captured.out
    assert main(["study", "plan", str(SMOKE), "--from", "nope"]) == 2  # named: its absence is an error
    assert "no MLflow run of study 'nope'" in capsys.readouterr().err


GCLSR = REPO_ROOT / "studies" / "gclsr_ablations.yaml"


def test_a_probe_runs_copies_of_one_trial_at_once_here_and_prices_the_study_with_them():
    """The smoke GCLSR study packs no GPU: two copies (``--probe-copies``) of its first point run at once,
    each in its own process, cut to two evaluation intervals; their clocks price every distinct trial."""
    study = load_study(GCLSR, smoke=True)
    label, trial = probe_trial(study, steps=None)
    assert label == "components/GCLSR_base" and trial.trainer.max_steps == 2  # the smoke's own 2 steps
    assert probe_trial(study, "batch_size", steps=1)[1].trainer.max_steps == 1
    lines: list[str] = []
    measured = probe(
        study, copies=2, ablations=["components", "batch_size"], progress=lines.append, limit_s=900
    )  # a limit it cannot reach on a loaded machine: both ablations measured in full
    costs = measured.overall
    assert measured.by_ablation["components"] == costs and "batch_size" in measured.by_ablation
    assert costs.trials == 2 and costs.device == "1 x cpu"
    assert costs.step_s > 0 and costs.dev_eval_s > 0 and costs.test_eval_s > 0 and costs.setup_s > 0
    assert "2 at once of components/GCLSR_base: 2 steps" in measured.source
    assert sum(line.startswith("  copy") and "set-up" in line for line in lines) == 4
    assert "  copy 0: step 1/2 after" in "\n".join(lines)  # progress while the copies train
    projection = project(study, measured, gpus=1, gpu="h100", progress=lambda _: None)
    assert projection.distinct == len(projection.plans) < projection.trials
    for plan in projection.plans:  # every smoke trial runs its 2 steps at its ablation's probed cost per step
        own = measured.for_ablation(plan.ablation)
        assert plan.seconds >= 2 * own.step_s + own.setup_s, plan


def test_probe_options_are_checked(capsys):
    assert main(["study", "plan", str(SMOKE), "--probe", "--from", "x"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert main(["study", "plan", str(GCLSR), "--smoke", "--probe", "--probe-ablation", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--probe-ablation 'nope'" in err and "components, batch_size" in err


def test_a_probe_needs_neither_mlflow_nor_ray(tmp_path):
    """A lone GPU box with PyTorch and this package can probe: planning imports neither."""
    script = tmp_path / "no_mlflow.py"
    script.write_text(
        "import importlib.abc, sys\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('mlflow', 'ray'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import clsr.cli, clsr.study.plan.probe, clsr.study.plan.projection, clsr.study.plan.distinct\n"
        "print('imported')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]
