"""Identical trials run once: which trials are identical (the validated config, defaults filled), the one
entry that stands for them, and the run that carries every label, read back from a real MLflow store
by the outputs later stages use, an edited resume and ``run_keys``."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from clsr.study.plan.distinct import also_keys, merge_identical, run_keys
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import count_trials, grid_points
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.record.attempts import supersede
from clsr.study.record.parent import attach_labels
from clsr.study.run.experiment import expand_trials
from clsr.tracking.study_runs import (
    ALSO_TAG,
    CHECKPOINT_TAG,
    close_run,
    finished_outputs,
    open_child_run,
    run_labels,
    start_parent_run,
)
from tests.e2e.test_e2e import REPO_ROOT
from tests.support.stores import sqlite_uri

SUPMPN = REPO_ROOT / "studies" / "supmpn_ablations.yaml"
# SupMPN's paper configuration, written six ways: the reference row and each ablation's paper choice
SAME_AS_REFERENCE = (
    ("positive_augmentation", "None"),
    ("batch_size", "trainer.batch_size=256"),
    ("positives_negatives", "method.positives=5, method.negatives=5"),
    ("temperature", "method.temperature=0.05"),
    ("loss_variant", "released code"),
)


def supmpn_trials(study):
    points = [p.of(n) for n, a in study.ablations.items() for p in grid_points(a)]
    return expand_trials(study, points)


def test_the_paper_configuration_written_six_ways_is_one_trial_per_seed():
    study = load_study(SUPMPN)
    trials = supmpn_trials(study)
    merged = merge_identical(study, trials)
    assert (len(trials), len(merged)) == count_trials(study) == (132, 117)
    reference = [t for t in merged if t.ablation == "reference"]
    assert [t.seed for t in reference] == [42, 43, 44]
    for entry in reference:  # written out (P = 5) or inherited (batch 256's row): the same trial
        assert entry.also == SAME_AS_REFERENCE
        assert also_keys(entry)[0] == f"positive_augmentation[None] seed={entry.seed}"
    assert sum(len(t.also) for t in merged) == 15
    # another seed is another trial
    assert len(merge_identical(study, [t for t in trials if t.label == "SupMPN-BERT-base"])) == 3


def test_staged_trials_compare_with_their_upstream_outputs_filled_in():
    rcl = load_study(REPO_ROOT / "studies" / "rcl_ablations.yaml", smoke=True)
    outputs = {("entropy_models", phi, 1): f"/ckpt/{phi}" for phi in ("0.01", "0.02")}
    points = [p.of("regulators") for p in grid_points(rcl.ablations["regulators"])]
    merged = merge_identical(rcl, expand_trials(rcl, points), outputs)
    assert [t.label for t in merged] == ["SRoBERTa-base", "2", "4"]  # all different


def child(client, uri, parent, ablation, label, tags=None, status="finished"):
    tags = {"clsr.ablation": ablation, "clsr.point": label, "clsr.seed": 1, **(tags or {})}
    run_id = open_child_run(uri, parent, f"{ablation}[{label}] seed=1", label, tags, {})
    close_run(uri, run_id, status)
    return run_id


def test_a_run_stands_for_each_of_its_points_in_outputs_resumes_and_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "dup", str(tmp_path / "runs"), None)
    also = json.dumps([["b", "y"], ["c", "z"]])
    checkpoint = str(tmp_path / "runs" / "grid" / "checkpoint_000001")
    shared = child(client, uri, parent, "a", "x", {ALSO_TAG: also, CHECKPOINT_TAG: checkpoint})
    tags = client.get_run(shared).data.tags
    assert run_labels(tags) == [("a", "x"), ("b", "y"), ("c", "z")]
    assert run_keys(tags) == ["a[x] seed=1", "b[y] seed=1", "c[z] seed=1"]
    # a later stage that needs b[y] (or c[z]) reads the one run's checkpoint
    outputs = finished_outputs(client, parent, storage_root=str(tmp_path / "runs"))
    assert outputs == {(a, p, 1): checkpoint for a, p in [("a", "x"), ("b", "y"), ("c", "z")]}

    # an edited resume changed b[y]: the run keeps its own point and c[z], and stops standing for b[y]
    supersede(client, parent, frozenset({"b[y] seed=1"}), attempt=2)
    run = client.get_run(shared)
    assert run_labels(run.data.tags) == [("a", "x"), ("c", "z")] and "clsr.superseded" not in run.data.tags
    # ... and added d[w], identical to the trial already run: that run stands for it too
    attach_labels(client, run, TrialSpec("a", "x", {}, {}, 1, also=(("c", "z"), ("d", "w"))))
    assert run_labels(client.get_run(shared).data.tags) == [("a", "x"), ("c", "z"), ("d", "w")]
    # a change to the run's own point supersedes the whole run
    supersede(client, parent, frozenset({"a[x] seed=1"}), attempt=3)
    assert client.get_run(shared).data.tags["clsr.superseded"] == "v3"


def test_a_hand_edited_also_tag_is_read_safely():
    base = {"clsr.ablation": "a", "clsr.point": "x", "clsr.seed": "1", "clsr.trial_id": "a[x] seed=1"}
    for broken in ("not json", '{"b": "y"}', '[["b"], [1, 2], "c"]'):
        assert run_labels({**base, ALSO_TAG: broken}) == [("a", "x")]
        assert run_keys({**base, ALSO_TAG: broken}) == ["a[x] seed=1"]
