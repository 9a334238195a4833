"""`platform study run studies/selfccl_ablations.yaml --smoke` through Ray Tune, Ray Train and MLflow.

Every ablation's trials finish with the scoring counts, Figure 4 and STS-B test in MLflow; the
baselines run on the same triplets; the curriculum scored by the trained SimCSE-sup baseline (a second
stage) gets that trial's checkpoint.
"""

from __future__ import annotations

import pytest

from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points, stages
from clsr.tracking.study_runs import run_labels
from tests.e2e.test_e2e import REPO_ROOT, run_smoke_study, runs_of  # noqa: E402
from tests.e2e.test_supmpn_study import distinct_trials  # noqa: E402

STUDY = REPO_ROOT / "studies" / "selfccl_ablations.yaml"


def test_full_study_validates_with_every_ablation():
    study = load_study(STUDY)
    assert study.seeds == [42, 43, 44] and study.method == "selfccl"
    assert stages(study)[-1] == ["scored_by_simcse"]
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    assert [p.overrides["method.order"] for p in points["order"]] == [
        "none",
        "curriculum",
        "anti",
        "random",
    ]
    assert [p.overrides["method.pacing"] for p in points["pacing"]] == ["root", "linear", "quadratic"]
    assert points["order"][1].paper == {"test_sts_avg": 81.8}
    assert points["reference"][0].paper["test_transfer_avg"] == 86.9
    assert points["simcse_sup"][0].paper["test_sts_avg"] == 81.57
    assert points["mnrl"][0].paper["test_sts_avg"] == 81.6
    assert study.ablations["simcse_sup"].method == "simcse_sup" and study.ablations["mnrl"].method == "mnrl"
    # per-epoch pacing is the default reading and the pacing_unit table's reference row
    assert [p.overrides["method.pacing_unit"] for p in points["pacing_unit"]] == ["epoch", "step"]
    references = {name: a.reference for name, a in study.ablations.items()}
    assert references == {
        "reference": "SelfCCL-BERT-base",
        "order": "curriculum",
        "pacing": "linear",
        "margin": "0.2",
        "pacing_unit": "epoch",
        "simcse_sup": "SimCSE-sup-BERT-base",
        "mnrl": "SBERT-base-nli-v2 (reproduced)",
        "scored_by_simcse": "scored by SimCSE-sup",
    }
    smoke = load_study(STUDY, smoke=True)  # every smoke reference is a point of its cut grid
    assert {n: a.reference for n, a in smoke.ablations.items() if a.reference != references[n]} == {
        "pacing": "root",
        "margin": "0.1",
        "pacing_unit": "step",
    }


@pytest.mark.e2e
@pytest.mark.minutes(4.6)
@pytest.mark.parallel
def test_selfccl_smoke_study_end_to_end(tmp_path):
    uri, output = run_smoke_study(STUDY, tmp_path)

    study = load_study(STUDY, smoke=True)
    client, parents, children = runs_of(uri, study.name)
    assert len(parents) == 1
    planned = {(name, p.label) for name, a in study.ablations.items() for p in grid_points(a)}
    seen = [label for r in children for label in run_labels(r.data.tags)]
    assert set(seen) == planned and len(seen) == len(planned)
    assert len(children) == distinct_trials(study, planned) < len(planned)  # identical trials ran once
    assert {r.data.tags["clsr.method"] for r in children} == {"selfccl", "simcse_sup", "mnrl"}
    for run in children:
        assert run.data.tags["clsr.status"] == "finished", run.data.tags
        assert 20 < run.data.metrics["test_stsb"] < 95 and "best_dev_sickr" in run.data.metrics
        assert run.data.params["data.train"] == "nli_triplets" and run.data.params["data.max_rows"] == "96"

    curricula = [r for r in children if r.data.tags["clsr.method"] == "selfccl"]
    for run in curricula:
        counts = [run.data.metrics[f"selfccl_{c}"] for c in ("easy", "semi_hard", "hard")]
        assert sum(counts) == 96
        files = {a.path for a in client.list_artifacts(run.info.run_id, "selfccl")}
        assert {"selfccl/fig4_sickr_start.png", "selfccl/fig4_sickr_final.png"} <= files
    pretrained = [r for r in curricula if r.data.tags["clsr.ablation"] != "scored_by_simcse"]
    counts_by_margin = {
        (
            r.data.params["method.margin"],
            tuple(r.data.metrics[f"selfccl_{c}"] for c in ("easy", "semi_hard", "hard")),
        )
        for r in pretrained
    }
    # one scoring of the rows, shared by every curriculum trial: one count per margin, equal hard counts
    assert len(counts_by_margin) == len({m for m, _ in counts_by_margin}) == 2
    assert len({counts[2] for _, counts in counts_by_margin}) == 1

    simcse = next(r for r in children if r.data.tags["clsr.ablation"] == "simcse_sup")
    staged = next(r for r in children if r.data.tags["clsr.ablation"] == "scored_by_simcse")
    assert staged.data.params["method.scoring_model"] == simcse.data.tags["clsr.checkpoint"]
