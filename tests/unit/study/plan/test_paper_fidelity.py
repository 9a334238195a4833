"""Paper fidelity of the shipped studies (issue 37): the seeds, grids and rows the papers' captions and
appendices name are in the study files, and their ``--smoke`` variants stay as small as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clsr.methods import get_method
from clsr.study.analyse.rows import ablation_report
from clsr.study.analyse.tables import fidelity_lines
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import (
    ablation_trials,
    count_trials,
    find_point,
    grid_points,
    report_points,
    resolve_trial,
)
from clsr.study.spec.schema import StudyError

STUDIES = Path(__file__).resolve().parents[4] / "studies"
RCL, GCLSR, SUPMPN, SIMCSE, SELFCCL = (
    STUDIES / f"{n}_ablations.yaml" for n in ("rcl", "gclsr", "supmpn", "simcse", "selfccl")
)
PHI_SETS = [
    [0.01],
    [0.01, 0.02],
    [0.01, 0.02, 0.03],
    [0.01, 0.02, 0.03, 0.04],
    [0.01, 0.02, 0.03, 0.04, 0.05],
]
TABLE_4 = {"2": 81.47, "4": 81.98, "6": 82.29, "8": 82.40, "10": 82.42}  # RCL Table 4, Avg. STS, batch 64


def test_rcl_runs_every_table_with_five_seeds():
    """Every RCL caption: "average of 5 random runs"; no ablation overrides the study's seeds."""
    study = load_study(RCL)
    assert len(study.seeds) == 5
    assert all(len(study.seeds_of(name)) == 5 for name in study.ablations)


def test_rcl_table_4_is_the_appendix_grid_batch_32_and_64_by_five_phi_sets():
    study = load_study(RCL)
    points = {p.label: p for p in grid_points(study.ablations["regulators"])}
    grid = {
        (p.overrides.get("trainer.batch_size"), tuple(p.overrides["method.phis"])): label
        for label, p in points.items()
        if p.overrides.get("trainer.batch_size") in (32, 64)
    }
    assert set(grid) == {(batch, tuple(phis)) for batch in (32, 64) for phis in PHI_SETS}  # 10 cells
    assert len(grid) * len(study.seeds_of("regulators")) == 10 * 5
    # the published numbers sit on batch 64 (Table 4's columns); the paper prints none for batch 32
    for regulators, value in TABLE_4.items():
        label = grid[64, tuple(PHI_SETS[int(regulators) // 2 - 1])]
        assert label == regulators and points[label].paper["test_sts_avg"] == value
    assert not any(points[grid[32, tuple(phis)]].paper for phis in PHI_SETS)
    # every cell resolves to its batch and φ set, with an entropy model per φ of its seed
    for (batch, phis), label in grid.items():
        trial = resolve_trial(study, "regulators", points[label].overrides, study.seeds[0])
        assert trial.trainer.batch_size == batch and trial.method["phis"] == list(phis)
        assert set(phis) <= set(trial.method["entropy_models"])
    # the rows beside the grid stay: the evaluation-only first row, Eq. 1 alone, negative φ
    assert {"SRoBERTa-base", "0", "8, φ < 0", "16, ±φ"} <= set(points)
    assert study.ablations["regulators"].paper_choice == "8"


def test_rcl_table_2_is_the_batch_by_phi_grid_per_faq_set_and_fold():
    """Appendix A.1 / methods.md §6.4: the FAQ grid is the STS one, batch {32, 64} x Table 4's φ sets;
    Table 2's numbers sit on batch 64 with 8 regulators, FAQIR's row labelled "RCL(ours) (p=0.3)"."""
    study = load_study(RCL)
    faq_rcl = study.ablations["faq_rcl"]
    cells = {
        (p.overrides["data.train"], p.overrides["data.fold"], p.overrides["trainer.batch_size"],
         tuple(p.overrides["method.phis"]))
        for p in grid_points(faq_rcl)
    }  # fmt: skip
    sets = ("faq:stackfaq", "faq:faqir", "faq:cough")
    assert cells == {
        (s, f, b, tuple(phis)) for s in sets for f in range(5) for b in (32, 64) for phis in PHI_SETS
    }
    rows = {r.label: r for r in report_points(faq_rcl)}
    assert len(rows) == 3 * 2 * 5 and all(len(r.members) == 5 for r in rows.values())  # 5 folds each
    best = "trainer.batch_size=64, method.phis=[0.01, 0.02, 0.03, 0.04]"
    assert rows[f"data.train=faq:faqir, {best}"].paper == {
        "test_faqir_top1": 22.01, "test_faqir_top3": 35.05, "test_faqir_top5": 41.42, "test_faqir_map": 31.65
    }  # fmt: skip  # Table 2a
    assert rows[f"data.train=faq:cough, {best}"].paper == {
        "test_cough_top1": 6.35, "test_cough_top3": 13.31, "test_cough_top5": 18.49, "test_cough_map": 13.41
    }  # fmt: skip  # Table 2b
    assert sum(bool(r.paper) for r in rows.values()) == 2  # no other cell, and no StackFAQ row, has numbers
    assert "(p=0.3)" in faq_rcl.table and find_point(list(rows.values()), faq_rcl.reference).label.endswith(
        best
    )
    # every φ of the grid has an entropy model per set and fold, chained to the cell's own fold and seed
    phis = {p.overrides["method.phi"] for p in grid_points(study.ablations["faq_entropy_models"])}
    assert phis == {0.01, 0.02, 0.03, 0.04, 0.05}
    cell = {"data.train": "faq:faqir", "data.fold": 2, "trainer.batch_size": 32, "method.phis": PHI_SETS[4]}
    trial = resolve_trial(study, "faq_rcl", cell, 44)
    assert trial.trainer.batch_size == 32 and set(trial.method["entropy_models"]) >= set(PHI_SETS[4])
    assert all(
        "data.train=faq:faqir, data.fold=2" in v and v.endswith("seed 44>")
        for v in trial.method["entropy_models"].values()
    )
    # the headline metric, StackFAQ MAP, is said to be a stand-in where the report prints it
    for name, ablation in study.ablations.items():
        if name.startswith("faq_"):
            assert ablation.paper_metric == "test_stackfaq_map" and "stand-in" in ablation.description


def _simcse_rows(study, name):
    """label -> (data.train, data.max_rows, method config, paper dev_stsb) of each point."""
    rows = {}
    for point in grid_points(study.ablations[name]):
        trial = resolve_trial(study, name, point.overrides, study.seeds[0])
        rows[point.label] = (
            trial.data.train,
            trial.data.max_rows,
            trial.method,
            point.paper.get("dev_stsb"),
        )
    return rows


def test_simcse_table_7_rows_train_on_the_papers_data():
    """§6.3 / Table 7: "N/A" on the 314k entailment pairs, the α rows on the 275k released triplets."""
    rows = _simcse_rows(load_study(SIMCSE), "hard_negatives")
    data = {label: (train, method.get("hard_negatives"), method.get("hard_negative_alpha"), paper)
            for label, (train, _, method, paper) in rows.items()}  # fmt: skip
    assert data == {
        "N/A": ("nli_pairs", False, 1.0, 84.9),
        "Contradiction α=0.5": ("nli_for_simcse", True, 0.5, 86.1),
        "Contradiction α=1": ("nli_for_simcse", True, 1.0, 86.2),
        "Contradiction α=2": ("nli_for_simcse", True, 2.0, 86.2),
        "Contra.+Neutral α=1": ("nli_triplets_neutral", True, 1.0, 85.3),  # stand-in: no file has neutrals
    }
    assert rows["Contra.+Neutral α=1"][2]["hard_negative"] == "contradiction+neutral"


TEN = " ".join(f"w{i}" for i in range(10))


@pytest.mark.parametrize(
    ("positive", "ratio", "seed", "expected"),
    [  # by hand: random.Random(3).randrange(4) == 1; Random(5).sample(range(10), 2) == [9, 4] (sorted [4, 9]);
        # Random(7).sample(range(10), 1) == [5]
        ("crop", 0.3, 3, "w1 w2 w3 w4 w5 w6 w7"),  # keep 7 of 10 words from start 1
        ("word_deletion", 0.2, 5, "w0 w1 w2 w3 w5 w6 w7 w8"),  # delete int(0.2 * 10) = 2 words
        ("delete_one_word", 0.1, 7, "w0 w1 w2 w3 w4 w6 w7 w8 w9"),
    ],
)
def test_simcse_table_1_positive_views(monkeypatch, positive, ratio, seed, expected):
    """SimCSE Table 1: the second view is an augmented copy of the text, one per row, drawn with the seed."""
    from types import SimpleNamespace

    method = get_method("simcse_unsup")(
        get_method("simcse_unsup").Config(positive=positive, positive_ratio=ratio)
    )
    seen = {}
    monkeypatch.setattr(
        type(method), "text_view_batcher", lambda self, rows, *_: seen.setdefault("rows", rows)
    )
    trial = SimpleNamespace(trainer=SimpleNamespace(seed=seed))
    rows = method.prepare_rows([{"text": TEN}], None, trial)
    assert method.views() == ("text", "positive") and method.required_columns() == ("text",)
    assert rows == [{"text": TEN, "positive": expected}]


def test_simcse_table_1_rows():
    study = load_study(SIMCSE)
    rows = {}
    for point in grid_points(study.ablations["positives"]):
        trial = resolve_trial(study, "positives", point.overrides, study.seeds[0])
        rows[point.label] = (trial.method["positive"], trial.method["positive_ratio"], trial.model.dropout)
        rows[point.label] += (point.paper["dev_stsb"],) + (
            ("two encoders",) if trial.method["two_encoders"] else ()
        )
        assert trial.data.train == ("wiki_ordered" if "next" in trial.method["positive"] else "wiki1m")
    assert rows == {  # Table 1 (STS-B dev); dropout None: BERT's own p = 0.1; ratio 0.1: unused default
        "None (unsup. SimCSE)": ("dropout", 0.1, None, 82.5),
        "Crop 10%": ("crop", 0.1, None, 77.8),
        "Crop 20%": ("crop", 0.2, None, 71.4),
        "Crop 30%": ("crop", 0.3, None, 63.6),
        "Word deletion 10%": ("word_deletion", 0.1, None, 75.9),
        "Word deletion 20%": ("word_deletion", 0.2, None, 72.2),
        "Word deletion 30%": ("word_deletion", 0.3, None, 68.2),
        "Delete one word": ("delete_one_word", 0.1, None, 75.9),
        "Delete one word, w/o dropout": ("delete_one_word", 0.1, 0.0, 74.2),
        "Synonym replacement": ("synonym_replacement", 0.1, None, 77.4),
        "Table 2: unsup. SimCSE, two encoders": ("dropout", 0.1, None, 80.7, "two encoders"),  # Table 2
        "Table 2: delete one word, two encoders": ("delete_one_word", 0.1, None, 73.1, "two encoders"),
        "Table 2: next sentence": ("next_sentence", 0.1, None, 67.1),  # on wiki_ordered, text in order
        "Table 2: next 3 sentences": ("next_3_sentences", 0.1, None, 67.4),
        "Table 2: next sentence, two encoders": ("next_sentence", 0.1, None, 68.9, "two encoders"),
        "Table 2: next 3 sentences, two encoders": ("next_3_sentences", 0.1, None, 68.8, "two encoders"),
    }
    with pytest.raises(ValueError, match="same_dropout_mask"):
        get_method("simcse_unsup").Config(positive="crop", same_dropout_mask=True)


def test_simcse_table_4_expresses_its_snli_mnli_rows():
    rows = _simcse_rows(load_study(SIMCSE), "pair_sources")
    assert {label: (train, max_rows, method["hard_negatives"], paper)
            for label, (train, max_rows, method, paper) in rows.items()} == {
        "SNLI+MNLI entailment, sample (134k)": ("nli_pairs", 134_000, False, 84.1),
        "SNLI+MNLI entailment, full (314k)": ("nli_pairs", None, False, 84.9),
        "SNLI+MNLI neutral, sample (134k)": ("nli_neutral_pairs", 134_000, False, 82.6),
        "SNLI+MNLI neutral, full (314k)": ("nli_neutral_pairs", None, False, 82.9),
        "SNLI+MNLI contradiction, sample (134k)": ("nli_contradiction_pairs", 134_000, False, 77.5),
        "SNLI+MNLI contradiction, full (314k)": ("nli_contradiction_pairs", None, False, 77.6),
        "SNLI+MNLI all, sample (134k)": ("nli_all_pairs", 134_000, False, 81.7),
        "SNLI+MNLI all, full (942k)": ("nli_all_pairs", None, False, 81.9),
        "SNLI+MNLI entailment + hard neg.": ("nli_for_simcse", None, True, 86.2),
        "QQP, sample (134k)": ("qqp_pairs", 134_000, False, 81.8),
        "QQP, full (134k)": ("qqp_pairs", None, False, 81.8),
        "Flickr30k, sample (134k)": ("flickr30k_pairs", 134_000, False, 81.5),
        "Flickr30k, full (318k)": ("flickr30k_pairs", None, False, 81.4),
        "ParaNMT, sample (134k)": ("paranmt_pairs", 134_000, False, 79.7),
        "ParaNMT, full (5m)": ("paranmt_pairs", None, False, 78.7),
        "+ ANLI (52k)": ("nli_anli_for_simcse", None, True, 85.0),
    }  # fmt: skip
    header = SIMCSE.read_text()  # the rows it cannot express are listed with their reason
    for excluded in ("MLM 15 %", "Table D.2"):
        assert excluded in header


def test_simcse_appendix_a_grid_is_exact():
    """Appendix A: batch {64, 128, 256, 512} x lr {1e-5, 3e-5, 5e-5} on STS-B dev; Table A.1 picks 64, 3e-5."""
    study = load_study(SIMCSE)
    lr_batch = study.ablations["lr_batch"]
    points = grid_points(lr_batch)
    cells = set()
    for point in points:
        trial = resolve_trial(study, "lr_batch", point.overrides, study.seeds[0])
        assert trial.method["name"] == "simcse_unsup" and trial.data.train == "wiki1m" and not point.paper
        cells.add((trial.trainer.batch_size, trial.trainer.lr))
    assert cells == {(b, lr) for b in (64, 128, 256, 512) for lr in (1e-5, 3e-5, 5e-5)}
    choice = find_point(points, lr_batch.paper_choice).overrides
    assert choice == {"trainer.batch_size": 64, "trainer.lr": 3e-5} and study.search.algorithm == "grid"
    assert ablation_trials(study, "lr_batch") == 12 * len(study.seeds)


def test_gclsr_table_2_runs_the_full_model_with_both_region_sizes():
    study = load_study(GCLSR)
    components = study.ablations["components"]
    points = {p.label: p for p in grid_points(components)}
    printed = points["+ PWVA + self-att. + GP (full, region sizes 1,1,1,1,1,1)"]
    stated = points["+ PWVA + self-att. + GP (full, region sizes 1,1,1,6,15,20)"]
    for point, sizes in ((printed, [1, 1, 1, 1, 1, 1]), (stated, [1, 1, 1, 6, 15, 20])):
        trial = resolve_trial(study, "components", point.overrides, study.seeds[0])
        assert trial.model.region_sizes == sizes
        assert (trial.method["augmentation"], trial.method["self_attention"], trial.method["group_size"]) == (
            "pwva",
            True,
            16,
        )
    # Table 2's printed full row (66.75) is the (1,1,1,1,1,1) model: Table 9's row of those sizes
    table_9 = {p.label: p.paper for p in grid_points(study.ablations["region_sizes"])}
    assert printed.paper["test_sts_avg"] == 66.75
    for task in ("test_sts12", "test_sts13", "test_sts14", "test_sts15"):
        assert printed.paper[task] == table_9["(1,1,1,1,1,1)"][task]
        assert stated.paper[task] == table_9["(1,1,1,6,15,20)"][task]  # the '(ours)' row of Tables 4-11
    assert "test_sts_avg" not in stated.paper  # Table 2 prints no row for the stated sizes
    assert find_point(list(points.values()), components.paper_choice) is stated
    assert components.reference == "GCLSR_base" and len(points) == 9


def test_supmpn_bert_large_row_is_a_point_with_the_borrowed_lr():
    study = load_study(SUPMPN)
    (point,) = grid_points(study.ablations["bert_large"])
    trial = resolve_trial(study, "bert_large", point.overrides, study.seeds[0])
    assert trial.model.name == "bert-large-uncased" and trial.trainer.batch_size == 200
    assert trial.trainer.lr == 1e-5  # SimCSE-sup's BERT-large LR: SupMPN gives none
    assert point.paper["test_sts_avg"] == 83.15 and point.paper["test_transfer_avg"] == 87.75
    assert "bert_large" not in load_study(SUPMPN, smoke=True).ablations


@pytest.mark.parametrize(
    ("path", "trials"),
    [(RCL, 8), (GCLSR, 49), (SUPMPN, 19), (SIMCSE, 7)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_smoke_variants_keep_their_size(path, trials):
    """CI runs the smoke variants end to end: the fuller grids must not make them bigger."""
    smoke = load_study(path, smoke=True)
    assert smoke.seeds == [1]
    assert sum(ablation_trials(smoke, name) for name in smoke.ablations) == count_trials(smoke)[0] == trials


@pytest.mark.parametrize("path", [SELFCCL, SUPMPN], ids=lambda p: p.name)
def test_retrained_baselines_say_they_train_on_stand_in_data(path):
    """SelfCCL Tables 4-5 / SupMPN Tables 2-3 quote SimCSE-sup (nli_for_simcse) and SBERT-nli-v2 (their own
    data); here both retrain on nli_triplets, and the report's line for them says so."""
    study = load_study(path)
    for name in ("simcse_sup", "mnrl"):
        (point,) = grid_points(study.ablations[name])
        assert resolve_trial(study, name, point.overrides, study.seeds[0]).data.train == "nli_triplets"
        assert "stand-in" in study.ablations[name].description and point.paper["test_sts_avg"]
    assert "stand-in" in path.read_text().split("\nname:")[0]  # the study file's header says it too


def report_fidelity(path: Path, name: str) -> list[str]:
    """The report's fidelity lines of one ablation, from the study file alone (no runs, no MLflow)."""
    return fidelity_lines(ablation_report(load_study(path), name, []))


def test_simcse_table_7_report_names_exact_and_stand_in_rows():
    lines = report_fidelity(SIMCSE, "hard_negatives")
    assert lines[0] == ("exact reproductions: N/A; Contradiction α=0.5; Contradiction α=1; Contradiction α=2")
    (stand_in,) = [line for line in lines if line.startswith("stand-in data: ")]
    assert stand_in.startswith("stand-in data: Contra.+Neutral α=1: nli_triplets_neutral")


def test_simcse_excluded_tables_are_listed_as_not_expressible():
    """Table 1's MLM row and Table D.2 (no ablation of their own); Table 2's next-sentence rows on stand-in
    ordered text; Table 4's ParaNMT rows exact (the release file)."""
    positives = report_fidelity(SIMCSE, "positives")
    sources = report_fidelity(SIMCSE, "pair_sources")
    for row in ("MLM 15%", "Table D.2: MLM auxiliary loss"):
        assert any(line.startswith(f"not expressible: {row}") for line in positives), row
    (stand_in,) = [line for line in positives if line.startswith("stand-in data: ")]  # one line per reason
    assert stand_in.startswith(
        "stand-in data: Table 2: next sentence; Table 2: next 3 sentences; Table 2: next sentence, two "
        "encoders; Table 2: next 3 sentences, two encoders: wiki_ordered (10^6 consecutive"
    )
    assert "ParaNMT, full (5m)" in sources[0] and not any("not expressible: ParaNMT" in s for s in sources)
    assert any(line.startswith("stand-in data: + ANLI (52k): ANLI rounds 1-3") for line in sources)


def test_rcl_faq_report_says_stackfaq_map_is_a_stand_in():
    for name in ("faq_eq1", "faq_attention_dropout", "faq_drophead", "faq_untouched", "faq_rcl"):
        lines = report_fidelity(RCL, name)
        assert any(
            line.startswith("stand-in data: ") and "StackFAQ MAP" in line and "FAQIR and COUGH" in line
            for line in lines
        ), name


@pytest.mark.parametrize("path", [RCL, GCLSR, SUPMPN, SIMCSE, SELFCCL], ids=lambda p: p.name)
def test_every_table_of_the_shipped_studies_declares_its_fidelity(path):
    """Each paper table's ablation says which rows are exact, stand-ins or missing (beyond-the-paper
    ablations and stages may say nothing)."""
    study = load_study(path)
    declared = {n for n, ab in study.ablations.items() if ab.fidelity is not None}
    beyond = {n for n, ab in study.ablations.items() if "beyond the paper" in (ab.table or "").lower()}
    stages = {"faq_entropy_models", "scored_by_simcse"}
    assert set(study.ablations) - declared - beyond - stages == set()


def test_baselines_on_nli_triplets_are_stand_ins_in_the_report():
    for path in (SUPMPN, SELFCCL):
        for name in ("simcse_sup", "mnrl"):
            assert any("nli_triplets" in line for line in report_fidelity(path, name) if "stand-in" in line)


def test_smoke_rows_drop_the_full_tables_fidelity():
    """A smoke section that replaces an ablation's rows leaves its fidelity (the full rows') out."""
    smoke = load_study(SIMCSE, smoke=True)
    assert smoke.ablations["dropout"].fidelity is None  # smoke points: 0.1 and Fixed 0.1 only
    assert load_study(SIMCSE).ablations["dropout"].fidelity is not None


def fidelity_problems(tmp_path: Path, **changes) -> list[str]:
    """The fidelity lines of the refusal of SimCSE's study file with ``changes`` at its top level."""
    doc = {k: v for k, v in yaml.safe_load(SIMCSE.read_text()).items() if k != "smoke"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**doc, **changes}, allow_unicode=True))
    with pytest.raises(StudyError) as err:
        load_study(path)
    return [p for p in err.value.problems if "fidelity" in p]


def test_a_fidelity_label_that_is_no_row_is_refused_in_one_line(tmp_path):
    dropout = {
        "points": [
            {"label": "0.1", "set": {"model.dropout": 0.1}},
            {"label": "Fixed 0.1", "set": {"method.same_dropout_mask": True}},
        ],
        "fidelity": {"exact": ["0.1", "0.7", "0.9"], "stand_in": {"Fixed 0.1": "fine"}},
    }
    assert fidelity_problems(tmp_path, ablations={"dropout": dropout}) == [
        "ablations.dropout.fidelity.exact: no such point (given: ['0.7', '0.9']; allowed: ['0.1', 'Fixed 0.1'])"
    ]
    sampled = {"space": {"trainer.lr": {"loguniform": [1e-5, 1e-4]}}, "fidelity": {"stand_in": {"x": "y"}}}
    assert fidelity_problems(
        tmp_path, ablations={"lr": sampled}, search={"algorithm": "random", "num_samples": 2}
    ) == ["ablations.lr.fidelity.stand_in: a sampled ablation (space) has no points to name (given: ['x'])"]


def test_gclsr_rows_are_stand_ins_for_the_unreleased_wikipedia_sample():
    """docs/methods/gclsr.md: every row trains on a seeded 10⁴-sentence wiki1m sample, so no row is exact."""
    study = load_study(GCLSR)
    for name, ablation in study.ablations.items():
        rows = [p.label for p in report_points(ablation)]
        assert not ablation.fidelity.exact and set(ablation.fidelity.stand_in) == set(rows), name
        assert all("wiki1m sample" in why for why in ablation.fidelity.stand_in.values()), name
        # what else is ours (region sizes, the base LR, the selection) is a setting, said on its own line
        assert not any("wiki1m" in why for why in ablation.fidelity.stand_in_setting.values()), name
