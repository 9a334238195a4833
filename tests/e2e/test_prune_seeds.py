"""Seed pruning through the real ``platform`` command, Ray Tune, Optuna and MLflow: a random search whose
second configuration sits in a planted bad region (a learning rate that cannot move the weights) stops
it after two of its three seeds; its runs are tagged pruned, the good configuration ran every seed and
is not; the report counts the pruned one's third seed as not run, not missing. An extension round
prunes on its own and says so."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clsr.study.analyse.rows import build_report, skipped_by_pruning
from clsr.study.analyse.tables import problems
from clsr.study.plan.load import load_study
from clsr.tracking.tags import PRUNED_TAG
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.e2e.test_resilience import tiny_study

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.5)]

GOOD, BAD = 5.0e-3, 1.0e-12


def test_a_planted_bad_region_is_pruned_after_two_seeds(tmp_path):
    # one trial at a time: the good configuration runs its three seeds first, then the bad one is
    # tested after its second seed (ttest: Wilcoxon cannot reach p < 0.2 with fewer than 3 seeds)
    search = {
        "algorithm": "random",
        "num_samples": 2,
        "points_to_evaluate": [{"trainer.lr": GOOD}, {"trainer.lr": BAD}],
        "prune_seeds": {"test": "ttest", "p": 0.2, "min_seeds": 2},
    }
    ablations = {"lr": {"space": {"trainer.lr": {"choice": [GOOD, BAD]}}}}
    trainer = {"max_steps": 6, "eval_steps": 6, "log_every": 3}
    study_file, uri = tiny_study(
        tmp_path, "prune", trainer, ablations, seeds=[1, 2, 3], search=search, metric="loss_avg",
        mode="min", concurrency=1, resources={"workers_per_trial": 0, "cpus_per_worker": 1},
        system_metrics_interval_s=None,
    )  # fmt: skip
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    assert "lr: seed pruning stopped 1 of 2 configurations" in output, output[-3000:]
    assert "1 of 6 trials saved" in output
    _, _, children = runs_of(uri, "prune")
    seeds, pruned = defaultdict(set), defaultdict(set)
    for run in children:
        assert run.data.tags["clsr.status"] == "finished"
        lr = float(run.data.params["trainer.lr"])
        seeds[lr].add(run.data.tags["clsr.seed"])
        if PRUNED_TAG in run.data.tags:
            pruned[lr].add(run.data.tags[PRUNED_TAG])
    assert len(children) == 5  # 3 + 2 of the 6 without pruning
    assert seeds[GOOD] == {"1", "2", "3"} and GOOD not in pruned
    assert seeds[BAD] == {"1", "2"}
    (reason,) = pruned[BAD]  # the same on both of its runs
    assert reason.startswith("ttest p=") and "after 2 of 3 seeds" in reason
    client, (parent,), _ = runs_of(uri, "prune")
    report = build_report(load_study(study_file), client, parent.info.run_id, uri)
    assert problems(report.ablations[0]) == []  # the pruned configuration's third seed is not missing
    assert skipped_by_pruning(report) == 1  # what the live report's planned count holds but never runs
    extend = ("study", "extend", str(study_file), "--ablation", "lr", "--samples", "1")
    proc = platform_cmd(*extend, cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    assert "lr-x1: seed pruning stopped 0 of 1 configurations" in output, output[-3000:]
