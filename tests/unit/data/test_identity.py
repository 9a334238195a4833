"""A trial's data identities (issue 55, item 2): what each source was and a SHA-256 of the rows it read,
checked against hashes computed here from the expected rows (hashlib over their JSON lines)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import random
from pathlib import Path

import pytest

from clsr.config.trial import TrialConfig
from clsr.data import embedded
from clsr.data.hub.manifest import HUB_DATASETS, STS_HUB_IDS, pinned_revision
from clsr.data.identity.digest import resolved_revision
from clsr.data.identity.sources import train_identity
from clsr.data.sts import pair_file
from clsr.data.training import training_rows
from clsr.train.data_record import data_params

ROWS = [(f"sentence {i} .", f"a paraphrase of {i} .") for i in range(10)]


def golden(rows: list) -> str:
    """The hash the docs promise: one JSON line per row (sorted keys, no spaces, UTF-8)."""
    lines = "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows
    )
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def kept(n: int, max_rows: int, seed: int) -> list[int]:
    """``data.max_rows``' rule (docs/studies.md): a seeded sample of row numbers, in file order."""
    return sorted(random.Random(seed).sample(range(n), max_rows))


def trial(sts_max_pairs: int | None = None, **data) -> TrialConfig:
    evaluation = {"tasks": ["stsb"], "dev_tasks": ["stsb"], "alignment_uniformity": False}
    return TrialConfig.model_validate(
        {
            "method": {"name": "simcse_unsup"},
            "model": {"name": "minilm"},
            "data": data,
            "trainer": {"seed": 3},
            "eval": evaluation | {"sts_max_pairs": sts_max_pairs},
        }
    )


@pytest.fixture
def csv_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerows([("anchor", "positive"), *ROWS])
    return path


@pytest.fixture
def sts_folder(tmp_path) -> Path:
    """A data folder holding STS-B dev and test files: twelve pairs each."""
    for split in ("dev", "test"):
        path = tmp_path / "data" / pair_file("stsb", split)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"main-news\tfile\t2012\t{i:04d}\t{i + 1.5}\t{split}  A {i} .\tB {i}  ." for i in range(12)]
        path.write_text("\n".join(lines) + "\n")
    return tmp_path / "data"


def test_a_local_csv_with_max_rows_is_the_hash_of_the_rows_kept(csv_file):
    config = trial(train=str(csv_file), max_rows=4)
    found = train_identity(config.data, training_rows(config))
    expected = [{"anchor": ROWS[i][0], "positive": ROWS[i][1]} for i in kept(len(ROWS), 4, seed=3)]
    assert (found.kind, found.where, found.revision) == ("local", str(csv_file.resolve()), None)
    assert (found.sha256, found.rows) == (golden(expected), 4)
    assert found.params()["data.train.source"] == f"local:{csv_file.resolve()}"


def test_changing_one_row_of_the_file_changes_the_logged_hash(csv_file, sts_folder):
    config = trial(train=str(csv_file), data_dir=str(sts_folder))
    before = data_params(config, training_rows(config))
    text = csv_file.read_text().replace("a paraphrase of 7 .", "a paraphrase of seven .")
    csv_file.write_text(text)
    after = data_params(config, training_rows(config))
    assert before["data.train.sha256"] != after["data.train.sha256"]
    expected = [{"anchor": a, "positive": b.replace("of 7", "of seven")} for a, b in ROWS]
    assert after["data.train.sha256"] == golden(expected)
    assert {k: v for k, v in before.items() if k != "data.train.sha256"} == {
        k: v for k, v in after.items() if k != "data.train.sha256"
    }  # the evaluation sets' identities did not move


def test_the_embedded_set_is_the_hash_of_its_sentences(tmp_path, monkeypatch):
    monkeypatch.delenv("CLSR_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    with gzip.open(embedded.EMBEDDED_DIR / embedded.WIKI_FILE, "rt", encoding="utf-8") as handle:
        sentences = handle.read().splitlines()
    config = trial(train="wiki1m", max_rows=50)
    found = train_identity(config.data, training_rows(config))
    expected = [{"text": sentences[i]} for i in kept(len(sentences), 50, seed=3)]
    assert (found.kind, found.where, found.sha256, found.rows) == (
        "embedded",
        "clsr/data/embedded/wiki1m_sample.txt.gz",
        golden(expected),
        50,
    )


def test_an_evaluation_set_is_the_hash_of_its_pairs_as_scored(sts_folder):
    params = data_params(trial(train="wiki1m", data_dir=str(sts_folder)), None)  # evaluation only
    for name, split in (("stsb_dev", "dev"), ("stsb", "test")):
        # SentEval's reading: fields 5 and 6, whitespace collapsed; the score as a float
        expected = [["stsb", i + 1.5, f"{split} A {i} .", f"B {i} ."] for i in range(12)]
        assert params[f"data.{name}.sha256"] == golden(expected)
        assert params[f"data.{name}.rows"] == "12"
        assert params[f"data.{name}.source"] == f"local:{sts_folder / pair_file('stsb', split)}"
        assert params[f"data.{name}.revision"] == "none"
    assert "data.train.sha256" not in params
    capped = data_params(trial(10, train="wiki1m", data_dir=str(sts_folder)), None)
    assert capped["data.stsb.rows"] == "10"  # the cap's pairs are what was read
    assert capped["data.stsb.sha256"] != params["data.stsb.sha256"]


def test_the_sts_hub_sets_are_pinned_and_the_others_say_unpinned():
    for hub_id in STS_HUB_IDS.values():
        assert len(pinned_revision(hub_id) or "") == 40
    assert pinned_revision("SetFit/sst2") is None and HUB_DATASETS["SetFit/sst2"].revision is None
    assert pinned_revision("someone/else") is None


def test_a_hub_sets_resolved_commit_is_read_from_the_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    assert resolved_revision("me/pairs") is None  # nothing cached: unknown, not made up
    commit = "ab" * 20
    prepared = tmp_path / "datasets" / "me___pairs" / "default" / "0.0.0" / commit
    prepared.mkdir(parents=True)
    assert resolved_revision("me/pairs") == commit  # datasets' Arrow cache names the commit
    refs = tmp_path / "hub" / "datasets--me--pairs" / "refs"
    refs.mkdir(parents=True)
    (refs / "v1").write_text("cd" * 20)
    assert resolved_revision("me/pairs", "v1") == "cd" * 20  # huggingface_hub's ref of that branch
    assert resolved_revision("me/pairs", "ef" * 20) == "ef" * 20


def test_a_custom_evaluation_set_is_the_hash_of_its_rows_as_scored(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    pairs = [{"sentence1": f"one {i} .", "sentence2": f"two {i} .", "score": i + 0.5} for i in range(5)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    config = TrialConfig.model_validate(
        {
            "method": {"name": "simcse_unsup"},
            "model": {"name": "minilm"},
            "eval": {
                "tasks": ["mine"],
                "dev_tasks": [],
                "alignment_uniformity": False,
                "custom": {"mine": {"type": "sts", "path": str(path)}},
            },
        }
    )
    params = data_params(config, None)
    assert params == {
        "data.custom.mine.source": f"local:{path.resolve()}",
        "data.custom.mine.revision": "none",
        "data.custom.mine.sha256": golden(pairs),
        "data.custom.mine.rows": "5",
    }
