"""`studies/rcl_ablations.yaml`: its stages and paper numbers. The `--smoke` run end to end (stage 1 trains
the entropy models, stage 2's regulator trials get their checkpoints, each entropy model embeds the training
texts once) runs on the loopback cluster: tests/test_cluster.py."""

from __future__ import annotations

import sys
from pathlib import Path

from clsr.study.schema import grid_points, load_study, stages

sys.path.insert(0, str(Path(__file__).parent))
from test_e2e import REPO_ROOT  # noqa: E402

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

