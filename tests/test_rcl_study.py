"""`platform study run studies/rcl_ablations.yaml --smoke`: a staged study through Ray Tune and MLflow.

Stage 1 trains the entropy models (and the baselines that need nothing); stage 2's regulator trials
get the entropy models' checkpoints from MLflow, and each entropy model embeds the training texts once
for all of them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from clsr.study.schema import grid_points, load_study, stages

sys.path.insert(0, str(Path(__file__).parent))
from test_e2e import REPO_ROOT, run_smoke_study, runs_of  # noqa: E402

STUDY = REPO_ROOT / "studies" / "rcl_ablations.yaml"


def test_full_study_validates_with_stages_and_paper_numbers():
    study = load_study(STUDY)
    assert study.seeds == [42, 43, 44] and study.method == "rcl"
    assert stages(study) == [["entropy_models", "attention_dropout", "drophead"], ["regulators"]]
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    assert [p["label"] for p in points["regulators"]] == ["0", "2", "4", "6", "8", "10"]
    assert [len(p["overrides"]["method.phis"]) for p in points["regulators"]] == [0, 1, 2, 3, 4, 5]
    assert [p["paper"]["test_sts_avg"] for p in points["regulators"]] == [
        81.29,
        81.47,
        81.98,
        82.29,
        82.4,
        82.42,
    ]
    assert points["regulators"][4]["paper"]["test_faqir_map"] == 31.65
    assert len(points["entropy_models"]) == 5 and len(points["attention_dropout"]) == 3
    assert study.base["eval"]["tasks"] == ["sts", "faq"]


@pytest.mark.e2e
def test_rcl_smoke_study_runs_in_stages_end_to_end(tmp_path):
    uri, output = run_smoke_study(STUDY, tmp_path)

    study = load_study(STUDY, smoke=True)
    _, parents, children = runs_of(uri, study.name)
    assert len(parents) == 1
    by_point = {(r.data.tags["clsr.ablation"], r.data.tags["clsr.point"]): r for r in children}
    assert sorted(by_point) == [
        ("attention_dropout", "0.1"),
        ("drophead", "0.1"),
        ("entropy_models", "0.01"),
        ("entropy_models", "0.02"),
        ("regulators", "0"),
        ("regulators", "2"),
        ("regulators", "4"),
    ]
    for run in children:
        tags, metrics = run.data.tags, run.data.metrics
        assert tags["clsr.status"] == "finished", tags
        assert 20 < metrics["test_stsb"] < 95 and "best_dev_sickr" in metrics
        for key in ("top1", "top3", "top5", "map"):
            assert 0 < metrics[f"test_stackfaq_{key}"] <= 100
        assert metrics["test_stackfaq_top1"] <= metrics["test_stackfaq_top3"] <= metrics["test_stackfaq_top5"]

    # stage 2 got stage 1's checkpoints, by φ
    entropy = {
        r.data.params["method.phi"]: r.data.tags["clsr.checkpoint"]
        for r in children
        if r.data.tags["clsr.ablation"] == "entropy_models"
    }
    four = by_point[("regulators", "4")]
    assert four.data.params["method.entropy_models.0.01"] == entropy["0.01"]
    assert four.data.params["method.entropy_models.0.02"] == entropy["0.02"]
    assert output.index("Trial run_trial") < output.index("rcl: embedded")  # stage 2 starts after stage 1

    # each entropy model embedded the training texts once, for all regulator trials
    embedded = re.findall(r"rcl: embedded [\d,]+ training texts with the entropy model φ=([\d.]+)", output)
    assert sorted(embedded) == ["0.01", "0.02"]
    assert output.count("preparing 1 shared input set(s)") == 1
