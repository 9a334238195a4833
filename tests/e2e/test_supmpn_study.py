"""`platform study run studies/supmpn_ablations.yaml --smoke` through Ray Tune, Ray Train and MLflow.

Every runnable point of every SupMPN ablation (and the SimCSE-sup and MNRL baselines) must leave a
finished child run with STS and transfer scores and the paper's numbers beside them; the points whose
resources are not here (WordNet, the T5 paraphraser) are skipped with a note.
"""

from __future__ import annotations

import pytest

from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points, trial_identity
from clsr.tracking.study_runs import run_labels
from tests.e2e.test_e2e import REPO_ROOT, run_smoke_study, runs_of  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(3.7)]
STUDY = REPO_ROOT / "studies" / "supmpn_ablations.yaml"
TRANSFER = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")


def test_full_study_validates_with_every_ablation():
    study = load_study(STUDY)
    assert study.seeds == [42, 43, 44] and study.method == "supmpn"
    assert study.base["eval"]["tasks"] == ["sts", "transfer"]
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    assert len(points["positives_negatives"]) == 25
    assert [p.label for p in points["positive_augmentation"]] == ["None", "RD", "SR", "PP"]
    assert [p.overrides["trainer.batch_size"] for p in points["batch_size"]] == [64, 128, 256, 512]
    assert study.ablations["simcse_sup"].method == "simcse_sup" and study.ablations["mnrl"].method == "mnrl"
    assert points["reference"][0].paper["test_transfer_avg"] == 86.96
    assert points["reference"][0].overrides["method.loss_variant"] == "code"  # said, not defaulted
    variants = study.ablations["loss_variant"]
    assert variants.reference == variants.paper_choice == "released code"
    assert all(a.reference for a in study.ablations.values())  # every table names its baseline row
    assert sum(len(p) for p in points.values()) == 44


def distinct_trials(study, labels) -> int:
    """How many different trials these (ablation, point) labels of a one-seed study resolve to."""
    points = {(name, p.label): p for name, a in study.ablations.items() for p in grid_points(a)}
    seed = study.seeds[0]
    return len({trial_identity(study, name, points[name, label].overrides, seed) for name, label in labels})


def test_supmpn_smoke_study_end_to_end(tmp_path):
    uri, output = run_smoke_study(STUDY, tmp_path)

    study = load_study(STUDY, smoke=True)
    _, parents, children = runs_of(uri, study.name)
    assert len(parents) == 1
    planned = {(name, p.label) for name, a in study.ablations.items() for p in grid_points(a)}
    seen = [label for r in children for label in run_labels(r.data.tags)]
    skipped = planned - set(seen)
    assert skipped <= {("positive_augmentation", "SR"), ("positive_augmentation", "PP")}
    for _, label in skipped:
        assert f"skipped (not available here): ablations.positive_augmentation[{label}]" in output
    assert len(seen) == len(set(seen)) >= 15  # every runnable point has one run, that stands for it
    # identical trials ran once: the reference = anchor copies = batch 4 (the smoke base) = P5 x Q5 =
    # tau 0.05 = the released loss, one run standing for all six
    assert len(children) == distinct_trials(study, set(seen))
    shared = next(r for r in children if r.data.tags["clsr.ablation"] == "reference")
    also = run_labels(shared.data.tags)[1:]
    assert ("positive_augmentation", "None") in also and ("loss_variant", "released code") in also
    assert sorted(a for a, _ in also) == [
        "batch_size", "loss_variant", "positive_augmentation", "positives_negatives", "temperature"
    ]  # fmt: skip
    assert "identical trials run once" in output
    methods = {r.data.tags["clsr.method"] for r in children}
    assert methods == {"supmpn", "simcse_sup", "mnrl"}
    for run in children:
        assert run.data.tags["clsr.status"] == "finished", run.data.tags
        metrics = run.data.metrics
        assert 20 < metrics["test_stsb"] < 95 and "best_dev_sickr" in metrics
        for task in TRANSFER:
            assert 0 < metrics[f"test_{task}"] <= 100, task
        assert "test_transfer_avg" in metrics
    reference = next(r for r in children if r.data.tags["clsr.ablation"] == "reference")
    assert reference.data.tags["clsr.paper.test_transfer_avg"] == "86.96"
    assert (
        reference.data.params["method.positives"] == "5" and reference.data.params["model.name"] == "minilm"
    )
    grid = {
        (r.data.params["method.positives"], r.data.params["method.negatives"])
        for r in children
        if "positives_negatives" in {a for a, _ in run_labels(r.data.tags)}
    }
    assert grid == {("1", "1"), ("1", "5"), ("5", "1"), ("5", "5")}
