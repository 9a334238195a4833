"""`studies/rcl_ablations.yaml`: its stages and paper numbers, and its `--smoke` run end to end in-process
(e2e: the evaluation-only SRoBERTa-base row, the staged regulators, Eq. 1 on an FAQ fold). The loopback
cluster runs it too: tests/cluster/test_cluster.py."""

from __future__ import annotations

from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points, report_points, resolve_trial, stages
from tests.e2e.test_e2e import REPO_ROOT  # noqa: E402

STUDY = REPO_ROOT / "studies" / "rcl_ablations.yaml"


def test_full_study_validates_with_stages_and_paper_numbers():
    study = load_study(STUDY)
    assert study.seeds == [42, 43, 44, 45, 46] and study.method == "rcl"
    faq_stage1 = ["faq_eq1", "faq_attention_dropout", "faq_drophead", "faq_untouched"]
    assert stages(study) == [
        ["entropy_models", "attention_dropout", "drophead", *faq_stage1],
        ["regulators", "faq_entropy_models"],
        ["faq_rcl"],
    ]
    points = {name: grid_points(a) for name, a in study.ablations.items()}
    regulators = {p.label: p for p in points["regulators"]}
    assert list(regulators) == [
        "SRoBERTa-base",
        "0",
        "2",
        "4",
        "6",
        "8",
        "10",
        "2, batch 32",
        "4, batch 32",
        "6, batch 32",
        "8, batch 32",
        "10, batch 32",
        "8, φ < 0",
        "16, ±φ",
    ]
    # the paper's first row is the untouched checkpoint: an evaluation-only point carries its numbers
    assert regulators["SRoBERTa-base"].overrides["trainer.max_steps"] == 0
    assert regulators["SRoBERTa-base"].paper["test_sts_avg"] == 81.29
    assert "trainer.max_steps" not in regulators["0"].overrides and not regulators["0"].paper
    assert [len(regulators[k].overrides["method.phis"]) for k in ("0", "2", "4", "6", "8", "10")] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    assert [regulators[k].paper["test_sts_avg"] for k in ("2", "4", "6", "8", "10")] == [
        81.47,
        81.98,
        82.29,
        82.4,
        82.42,
    ]
    # the appendix grid: batch 32 for the best φ set, Algorithm 1's negative φ entropy models
    assert regulators["8, batch 32"].overrides["trainer.batch_size"] == 32
    phis = {p.overrides["method.phi"] for p in points["entropy_models"]}
    assert phis == {0.01, 0.02, 0.03, 0.04, 0.05, -0.01, -0.02, -0.03, -0.04}
    assert set(regulators["16, ±φ"].overrides["method.phis"]) <= phis
    # Table 2's FAQ numbers come from models trained on the FAQ sets: only the faq_* rows carry them
    faq = {n for n, ps in points.items() for p in ps if any("faq" in k for k in p.paper)}
    assert faq == {"faq_eq1", "faq_attention_dropout", "faq_drophead", "faq_rcl"}
    assert len(points["attention_dropout"]) == 3
    assert study.base["eval"]["tasks"] == ["sts", "faq"]
    # every ablation names its reference row, in the full study and in --smoke
    assert {n: a.reference for n, a in study.ablations.items()} == {
        "entropy_models": "0.01",
        "regulators": "SRoBERTa-base",
        "attention_dropout": "0.1",
        "drophead": "0.1",
        "faq_eq1": "faq:stackfaq",
        "faq_attention_dropout": "faq:stackfaq",
        "faq_drophead": "faq:stackfaq",
        "faq_untouched": "faq:stackfaq",
        "faq_entropy_models": "data.train=faq:stackfaq, method.phi=0.01",
        "faq_rcl": "data.train=faq:stackfaq, trainer.batch_size=64, method.phis=[0.01, 0.02, 0.03, 0.04]",
    }
    # Table 2's protocol: every FAQ set's 5 folds, Eq. 1 alone, selected on the fold's dev MAP; a report
    # row per set (the mean of its folds) with the paper's FAQIR and COUGH numbers
    faq = points["faq_eq1"]
    assert sorted((p.overrides["data.train"], p.overrides["data.fold"]) for p in faq) == [
        (f"faq:{name}", fold) for name in ("cough", "faqir", "stackfaq") for fold in range(5)
    ]
    trial = resolve_trial(study, "faq_eq1", faq[0].overrides, 42)
    assert trial.eval.select_on == "faq" and trial.method["phis"] == [] and not trial.method["hard_negatives"]
    rows = {p.label: p for p in report_points(study.ablations["faq_eq1"])}
    assert list(rows) == [f"data.train=faq:{name}" for name in ("stackfaq", "faqir", "cough")]
    assert [len(r.members) for r in rows.values()] == [5, 5, 5] and rows[
        "data.train=faq:stackfaq"
    ].paper == {}
    assert rows["data.train=faq:faqir"].paper["test_faqir_map"] == 29.90
    rcl_rows = {p.label: p.paper for p in report_points(study.ablations["faq_rcl"])}
    assert rcl_rows["data.train=faq:cough, trainer.batch_size=64, method.phis=[0.01, 0.02, 0.03, 0.04]"] == {
        "test_cough_top1": 6.35, "test_cough_top3": 13.31, "test_cough_top5": 18.49, "test_cough_map": 13.41
    }  # fmt: skip
    # the RCL row's chain stays in its set and fold: the Eq. 1 model -> entropy models -> regulators
    fold = {"data.train": "faq:cough", "data.fold": 3}
    entropy = resolve_trial(study, "faq_entropy_models", fold | {"method.phi": 0.02}, 43)
    assert (
        entropy.model.init_checkpoint == "<checkpoint of faq_eq1[data.train=faq:cough, data.fold=3] seed 43>"
    )
    rcl = resolve_trial(study, "faq_rcl", fold | {"method.phis": [0.01, 0.02, 0.03, 0.04]}, 43)
    assert rcl.method["phis"] == [0.01, 0.02, 0.03, 0.04] and rcl.method["entropy_models"] == {
        phi: f"<checkpoint of faq_entropy_models[data.train=faq:cough, data.fold=3, method.phi={phi}] seed 43>"
        for phi in (0.01, 0.02, 0.03, 0.04, 0.05)  # every entropy model of the fold; the trial uses its phis
    }
    smoke = load_study(STUDY, smoke=True)
    assert all(a.reference for a in smoke.ablations.values())
    assert stages(smoke) == [
        ["entropy_models", "faq_eq1"],
        ["regulators", "faq_entropy_models"],
        ["faq_rcl"],
    ]
