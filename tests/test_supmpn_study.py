"""`platform study run studies/supmpn_ablations.yaml --smoke` through Ray Tune, Ray Train and MLflow.

Every runnable point of every SupMPN ablation (and the SimCSE-sup and MNRL baselines) must leave a
finished child run with STS and transfer scores and the paper's numbers beside them; the points whose
resources are not here (WordNet, the T5 paraphraser) are skipped with a note.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clsr.study.schema import grid_points, load_study

sys.path.insert(0, str(Path(__file__).parent))
from test_e2e import REPO_ROOT, run_smoke_study, runs_of  # noqa: E402

pytestmark = pytest.mark.e2e
STUDY = REPO_ROOT / "studies" / "supmpn_ablations.yaml"
TRANSFER = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")


def test_full_study_validates_with_every_ablation():
    study = load_study(STUDY)
    assert study.seeds == [42, 43, 44] and study.method == "supmpn"
    assert study.base["eval"]["tasks"] == ["sts", "transfer"]
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    assert len(points["positives_negatives"]) == 25
    assert [p["label"] for p in points["positive_augmentation"]] == ["None", "RD", "SR", "PP"]
    assert [p["overrides"]["trainer.batch_size"] for p in points["batch_size"]] == [64, 128, 256, 512]
    assert study.ablations["simcse_sup"].method == "simcse_sup" and study.ablations["mnrl"].method == "mnrl"
    assert points["reference"][0]["paper"]["test_transfer_avg"] == 86.96
    assert points["reference"][0]["overrides"]["method.loss_variant"] == "code"  # said, not defaulted
    variants = study.ablations["loss_variant"]
    assert variants.reference == variants.paper_choice == "released code"
    assert all(a.reference for a in study.ablations.values())  # every table names its baseline row
    assert sum(len(p) for p in points.values()) == 43


def test_supmpn_smoke_study_end_to_end(tmp_path):
    uri, output = run_smoke_study(STUDY, tmp_path)

    study = load_study(STUDY, smoke=True)
    _, parents, children = runs_of(uri, study.name)
    assert len(parents) == 1
    planned = {(name, p["label"]) for name, a in study.ablations.items() for p in grid_points(a)}
    seen = {(r.data.tags["clsr.ablation"], r.data.tags["clsr.point"]) for r in children}
    skipped = planned - seen
    assert skipped <= {("positive_augmentation", "SR"), ("positive_augmentation", "PP")}
    for _, label in skipped:
        assert f"skipped (not available here): ablations.positive_augmentation[{label}]" in output
    assert len(children) == len(seen) >= 15
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
        if r.data.tags["clsr.ablation"] == "positives_negatives"
    }
    assert grid == {("1", "1"), ("1", "5"), ("5", "1"), ("5", "5")}
