"""Data layer: local STS/NLI/wiki files (exact counts from the data README), triplet builders, catalog."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from clsr.data.catalog import DATASETS, dataset_columns, load_rows
from clsr.data.corpora import (
    NLIPair,
    build_sbert_v2_triplets,
    build_simcse_triplets,
    load_nli_for_simcse,
    load_nli_pairs,
    load_wiki_sentences,
)
from clsr.data.hub.manifest import STS_REVISIONS
from clsr.data.sources import DataUnavailableError, resolve_data_dir
from clsr.data.sts import STS_TASKS, load_sts

STS_COUNTS = {
    ("sts12", "test"): 3108,
    ("sts13", "test"): 1500,
    ("sts14", "test"): 3750,
    ("sts15", "test"): 3000,
    ("sts16", "test"): 1186,
    ("stsb", "train"): 5749,
    ("stsb", "dev"): 1500,
    ("stsb", "test"): 1379,
    ("sickr", "train"): 4500,
    ("sickr", "dev"): 500,
    ("sickr", "test"): 4927,
}
# Gold-labelled pairs over every local NLI file (data README §5, §9): SNLI dev+test 19,666,
# MNLI dev 19,647, MNLI train sample 20,000, counterfactual SNLI 11,330, New Protocols 39,901, XNLI 7,500.
NLI_PAIRS = 118_044
NLI_LABELS = {"entailment": 41_373, "neutral": 35_983, "contradiction": 40_688}
SIMCSE_TRIPLETS = 32_489  # (premise, entailment) pairs whose premise has a contradiction
SBERT_V2_TRIPLETS = 67_420  # 2 × 33,710 key sentences with an entailment and a contradiction


# --- STS ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("task", "split"), list(STS_COUNTS))
def test_sts_counts_and_scores(data_dir: Path, task: str, split: str) -> None:
    data = load_sts(task, split, data_dir)
    n = STS_COUNTS[task, split]
    assert (data.task, data.split) == (task, split)
    assert len(data.sentences1) == len(data.sentences2) == len(data.subsets) == len(data.scores) == n
    assert data.scores.dtype == np.float64
    low = 1.0 if task == "sickr" else 0.0  # SICK relatedness runs 1–5
    assert data.scores.min() >= low and data.scores.max() <= 5.0
    for sentence in data.sentences1 + data.sentences2:
        assert sentence and sentence == " ".join(sentence.split())


def test_sts_tasks_cover_counts() -> None:
    assert {task for task, _ in STS_COUNTS} == set(STS_TASKS)


def test_sts_subsets(data_dir: Path) -> None:
    assert list(dict.fromkeys(load_sts("sts13", data_dir=data_dir).subsets)) == ["FNWN", "headlines", "OnWN"]
    assert Counter(load_sts("sts12", data_dir=data_dir).subsets)["SMTeuroparl"] == 459
    assert set(load_sts("stsb", "dev", data_dir).subsets) == {"stsb"}


@pytest.mark.parametrize(
    ("task", "scored", "lines"),
    [
        (
            "sts15",
            {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
            8500,
        ),
        (
            "sts16",
            {
                "answer-answer": 254,
                "headlines": 249,
                "plagiarism": 230,
                "postediting": 244,
                "question-question": 209,
            },
            9183,
        ),
    ],
)
def test_sts_drops_unscored_pairs(data_dir: Path, task: str, scored: dict[str, int], lines: int) -> None:
    folder = data_dir / "senteval/downstream/STS" / f"STS{task[-2:]}-en-test"
    raw = sum(len((folder / f"STS.input.{s}.txt").read_text(encoding="utf-8").splitlines()) for s in scored)
    assert raw == lines
    assert Counter(load_sts(task, data_dir=data_dir).subsets) == scored


def test_sts_first_pair_is_tokenised_text(data_dir: Path) -> None:
    data = load_sts("stsb", "dev", data_dir)
    assert data.sentences1[0] == "a man with a hard hat is dancing ."
    assert data.sentences2[0] == "a man wearing a hard hat is dancing ."
    assert data.scores[0] == 5.0


@pytest.mark.parametrize(
    ("task", "split", "allowed"), [("sts12", "dev", "test"), ("stsb", "val", "train, dev, test")]
)
def test_sts_unknown_split(task: str, split: str, allowed: str) -> None:
    with pytest.raises(ValueError, match=allowed):
        load_sts(task, split)


def test_sts_unknown_task() -> None:
    with pytest.raises(ValueError, match="sts12, sts13, sts14, sts15, sts16, stsb, sickr"):
        load_sts("sts17")


@pytest.mark.parametrize(
    ("task", "split", "missing"),
    [
        ("sts12", "test", "STS.input.MSRpar.txt"),
        ("stsb", "test", "sts-test.csv"),
        ("sickr", "dev", "SICK_trial.txt"),
    ],
)
def test_sts_missing_local_file(tmp_path: Path, task: str, split: str, missing: str) -> None:
    with pytest.raises(DataUnavailableError, match=missing):
        load_sts(task, split, tmp_path)


def test_sts_hub_offline_raises() -> None:
    # HF_HUB_OFFLINE=1 (conftest): load_dataset fails at once when the data set is not cached (STS12: the
    # package's embedded sample has STS-B and STS16 only, clsr.data.embedded)
    with pytest.raises(DataUnavailableError, match=r"mteb/sts12-sts[\s\S]*STS\.input\.<subset>\.txt"):
        load_sts("sts12", data_dir=None)


# --- Hub path (datasets.load_dataset replaced by in-memory tables) --------------------------------


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, dict[str, list]]], list]:
    datasets = pytest.importorskip("datasets")

    def install(tables: dict[str, dict[str, list]]) -> list[tuple[str, dict]]:
        calls: list[tuple[str, dict]] = []

        def load_dataset(hub_id: str, **kwargs: object) -> object:
            calls.append((hub_id, kwargs))
            return datasets.Dataset.from_dict(tables[hub_id])

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        monkeypatch.setattr("clsr.data.embedded.hub_serves", lambda hub_id: True)  # not the embedded set
        return calls

    return install


def test_sts_from_hub(fake_hub: Callable) -> None:
    calls = fake_hub(
        {"mteb/stsbenchmark-sts": {"sentence1": ["A  man ."], "sentence2": ["A dog"], "score": [2.5]}}
    )
    data = load_sts("stsb", "dev")
    # read at the revision the manifest pins, never the hub's moving default branch
    pin = STS_REVISIONS["mteb/stsbenchmark-sts"]
    assert calls == [("mteb/stsbenchmark-sts", {"split": "validation", "revision": pin})]
    assert (data.sentences1, data.sentences2, data.subsets) == (["A man ."], ["A dog"], ["stsb"])
    assert data.scores.tolist() == [2.5]


def test_corpora_from_hub(fake_hub: Callable) -> None:
    nli = {"premise": ["p", "p", "q"], "hypothesis": ["e", "c", "x"], "label": [0, 2, -1]}
    fake_hub(
        {
            "stanfordnlp/snli": nli,
            "nyu-mll/multi_nli": {"premise": ["r"], "hypothesis": ["n"], "label": [1]},
            "princeton-nlp/datasets-for-simcse": {"text": ["one", "", "two "]},
        }
    )
    assert load_nli_pairs() == [
        NLIPair("p", "e", "entailment"),
        NLIPair("p", "c", "contradiction"),
        NLIPair("r", "n", "neutral"),
    ]
    assert load_wiki_sentences() == ["one", "two"]


def test_nli_for_simcse_from_hub(fake_hub: Callable, tmp_path: Path) -> None:
    calls = fake_hub(
        {"princeton-nlp/datasets-for-simcse": {"sent0": ["a"], "sent1": ["b"], "hard_neg": ["c"]}}
    )
    assert load_nli_for_simcse(tmp_path) == [{"anchor": "a", "positive": "b", "negative": "c"}]
    assert calls[0][1]["data_files"] == "nli_for_simcse.csv"


# --- Sources --------------------------------------------------------------------------------------


def test_resolve_data_dir(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_data_dir(tmp_path) == tmp_path
    assert resolve_data_dir(data_dir / "senteval") == data_dir  # SentEval's PATH_TO_DATA
    monkeypatch.setenv("CLSR_DATA_DIR", str(data_dir))
    assert resolve_data_dir() == data_dir
    monkeypatch.delenv("CLSR_DATA_DIR")
    assert resolve_data_dir() is None
    with pytest.raises(DataUnavailableError, match="not a folder"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv("CLSR_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(DataUnavailableError, match=r"\$CLSR_DATA_DIR"):
        resolve_data_dir()


# --- Corpora --------------------------------------------------------------------------------------


def test_wiki_sentences(data_dir: Path) -> None:
    sentences = load_wiki_sentences(data_dir)
    assert len(sentences) == 11_914  # every line of the head file is non-empty
    assert sentences[0] == "YMCA in South Australia"
    assert all(s == s.strip() and s for s in sentences)


def test_wiki_missing(tmp_path: Path) -> None:
    with pytest.raises(
        DataUnavailableError, match=r"wiki1m_for_simcse\.txt.*wiki1m_for_simcse\.head11914\.txt"
    ):
        load_wiki_sentences(tmp_path)


def test_nli_pairs_local(data_dir: Path) -> None:
    pairs = load_nli_pairs(data_dir)
    assert len(pairs) == NLI_PAIRS
    assert Counter(p.label for p in pairs) == NLI_LABELS
    assert all(p.premise == p.premise.strip() and p.hypothesis for p in pairs)
    # SentEval SNLI comes first; its trailing space is stripped.
    assert pairs[0] == NLIPair(
        "Two women are embracing while holding to go packages .",
        "The sisters are hugging goodbye while holding to go packages after just eating lunch .",
        "neutral",
    )
    # SimCSE Table 4's pair sources by label: that first (neutral) pair leads the neutral pairs only
    first = {"anchor": pairs[0].premise, "positive": pairs[0].hypothesis}
    assert load_rows("nli_neutral_pairs", data_dir)[0] == first
    assert (
        first not in load_rows("nli_pairs", data_dir)[:1] + load_rows("nli_contradiction_pairs", data_dir)[:1]
    )
    assert load_rows("nli_all_pairs", data_dir)[0] == first


def test_nli_pairs_missing(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match=r"s1\.dev"):
        load_nli_pairs(tmp_path)


def test_nli_for_simcse_offline_suggests_local_triplets(data_dir: Path) -> None:
    with pytest.raises(DataUnavailableError, match="nli_triplets"):
        load_nli_for_simcse(data_dir)


def test_nli_for_simcse_local_file(tmp_path: Path) -> None:
    (tmp_path / "nli").mkdir()
    (tmp_path / "nli/nli_for_simcse.csv").write_text('sent0,sent1,hard_neg\na,"b, c",d\n', encoding="utf-8")
    assert load_nli_for_simcse(tmp_path) == [{"anchor": "a", "positive": "b, c", "negative": "d"}]


# --- Triplet builders -----------------------------------------------------------------------------

PAIRS = [
    NLIPair("p1", "e1", "entailment"),
    NLIPair("p1", "c1", "contradiction"),
    NLIPair("p1", "n1", "neutral"),
    NLIPair("p2", "e2", "entailment"),  # no contradiction: no triplet
    NLIPair("p3", "c3", "contradiction"),  # no entailment: no triplet
    NLIPair("p4", "e4", "entailment"),
    NLIPair("p4", "e5", "entailment"),
    NLIPair("p4", "c4", "contradiction"),
    NLIPair("q1", "h", "entailment"),  # h is a key only in the reverse direction (SBERT-v2)
    NLIPair("q2", "h", "contradiction"),
]
MANY_NEGATIVES = [
    NLIPair("p", "e", "entailment"),
    *(NLIPair("p", f"c{i}", "contradiction") for i in range(5)),
]


def test_simcse_triplets_exact() -> None:
    assert build_simcse_triplets(PAIRS) == [
        {"anchor": "p1", "positive": "e1", "negative": "c1"},
        {"anchor": "p4", "positive": "e4", "negative": "c4"},
        {"anchor": "p4", "positive": "e5", "negative": "c4"},
    ]


def test_simcse_triplets_seeded() -> None:
    negatives = {seed: build_simcse_triplets(MANY_NEGATIVES, seed)[0]["negative"] for seed in range(20)}
    assert all(build_simcse_triplets(MANY_NEGATIVES, s)[0]["negative"] == n for s, n in negatives.items())
    assert len(set(negatives.values())) > 1  # the seed matters


def test_sbert_v2_triplets_exact() -> None:
    single_choice = [p for p in PAIRS if p.hypothesis != "e5"]  # every draw has one candidate
    assert build_sbert_v2_triplets(single_choice) == [
        {"anchor": "p1", "positive": "e1", "negative": "c1"},
        {"anchor": "e1", "positive": "p1", "negative": "c1"},
        {"anchor": "p4", "positive": "e4", "negative": "c4"},
        {"anchor": "e4", "positive": "p4", "negative": "c4"},
        {"anchor": "h", "positive": "q1", "negative": "q2"},  # hypothesis → premise direction
        {"anchor": "q1", "positive": "h", "negative": "q2"},
    ]


def test_sbert_v2_triplets_seeded() -> None:
    rows = {seed: build_sbert_v2_triplets(PAIRS + MANY_NEGATIVES, seed) for seed in range(10)}
    assert all(build_sbert_v2_triplets(PAIRS + MANY_NEGATIVES, s) == r for s, r in rows.items())
    assert len({str(r) for r in rows.values()}) > 1


# --- Catalog --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("wiki1m", 11_914),
        ("nli_triplets", SIMCSE_TRIPLETS),
        ("nli_sbert_v2", SBERT_V2_TRIPLETS),
        ("nli_pairs", 41_373),
        ("nli_neutral_pairs", 35_983),
        ("nli_contradiction_pairs", 40_688),
        ("nli_all_pairs", 118_044),
    ],
)
def test_catalog_local_counts(data_dir: Path, name: str, count: int) -> None:
    rows = load_rows(name, data_dir)
    assert len(rows) == count
    assert set(rows[0]) == set(dataset_columns(name))


def test_load_rows_subset(data_dir: Path) -> None:
    full = load_rows("wiki1m", data_dir)
    subset = load_rows("wiki1m", data_dir, max_rows=100, seed=3)
    assert len(subset) == 100
    assert subset == load_rows("wiki1m", data_dir, max_rows=100, seed=3)
    assert subset != load_rows("wiki1m", data_dir, max_rows=100, seed=4)
    assert subset != full[:100]  # random, not the head of the file
    assert all(row in full for row in subset)
    assert len(load_rows("wiki1m", data_dir, max_rows=10**9)) == len(full)


def test_load_rows_returns_copies(data_dir: Path) -> None:
    load_rows("wiki1m", data_dir)[0]["text"] = "changed"
    assert load_rows("wiki1m", data_dir)[0]["text"] == "YMCA in South Australia"


def test_load_rows_uses_env(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLSR_DATA_DIR", str(data_dir))
    assert len(load_rows("wiki1m", max_rows=5)) == 5


def test_load_rows_unknown_name() -> None:
    with pytest.raises(ValueError, match=", ".join(DATASETS)):
        load_rows("wiki2m")
    with pytest.raises(ValueError, match="nli_sbert_v2"):
        dataset_columns("nope")


def test_load_rows_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match="wiki1m_for_simcse"):
        load_rows("wiki1m", tmp_path)


def test_catalog_columns() -> None:
    assert dataset_columns("wiki1m") == ("text",)
    assert dataset_columns("nli_pairs") == ("anchor", "positive")
    for name in ("nli_for_simcse", "nli_triplets", "nli_sbert_v2"):
        assert dataset_columns(name) == ("anchor", "positive", "negative")
