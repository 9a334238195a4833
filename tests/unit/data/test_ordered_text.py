"""SimCSE Table 2's ordered text (``wiki_ordered``, clsr.data.ordered_text) and ParaNMT's local pairs:
rows compared with sentences split by hand, next-sentence positives on them, and the check that says
before a study starts which catalogue sets cannot be loaded here."""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from clsr.data import catalog
from clsr.data.catalog import dataset_columns, load_rows, unavailable
from clsr.data.ordered_text import built_copy, ordered_rows, prose_paragraphs, write_ordered_file
from clsr.data.sources import DataUnavailableError
from clsr.methods.simcse_unsup import next_sentence_rows

ARTICLE = (
    "Early life\n"
    "Alice Smith was born in 1901 in Paris. She moved to Lyon in 1910.\n"
    "\n"
    "Career\n"
    "* A list item\n"
    'In 1930 she became a teacher. "It was fun," she said.\n'
    "| a | table |\n"
)
SECOND = "Bob is a cat. He sleeps a lot.\nSee also\n"


def test_articles_become_their_prose_sentences_in_order():
    assert prose_paragraphs(ARTICLE) == [
        "Alice Smith was born in 1901 in Paris. She moved to Lyon in 1910.",
        'In 1930 she became a teacher. "It was fun," she said.',
    ]  # headings, list items and table rows are not prose
    rows = ordered_rows([("12", ARTICLE), ("40", SECOND)], train_on=1)
    assert [(r["document"], r["text"]) for r in rows] == [
        ("12", "Alice Smith was born in 1901 in Paris."),
        ("12", "She moved to Lyon in 1910."),
        ("12", "In 1930 she became a teacher."),
        ("12", '"It was fun," she said.'),
        ("40", "Bob is a cat."),
        ("40", "He sleeps a lot."),
    ]
    assert [r["text"] for r in ordered_rows([("12", ARTICLE), ("40", SECOND)], limit=3)] == [
        r["text"] for r in rows[:3]
    ]
    # Table 2's "next sentence": the sentence after, within the article
    assert [(r["text"][:9], r["positive"][:9]) for r in next_sentence_rows(rows, 1, Random(0))] == [
        ("Alice Smi", "She moved"), ("She moved", "In 1930 s"), ("In 1930 s", '"It was f'), ("Bob is a ", "He sleeps"),
    ]  # fmt: skip


def test_the_local_ordered_file_is_one_sentence_a_line_and_documents_between_empty_lines(tmp_path: Path):
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "wiki_ordered.txt").write_text("A one .\nA two .\n\n\nB one .\n\nC one .\nC two .\n")
    rows = load_rows("wiki_ordered", tmp_path)
    assert rows == [
        {"text": "A one .", "document": "0"},
        {"text": "A two .", "document": "0"},
        {"text": "B one .", "document": "1"},
        {"text": "C one .", "document": "2"},
        {"text": "C two .", "document": "2"},
    ]
    assert dataset_columns("wiki_ordered") == ("text", "document") and catalog.is_ordered("wiki_ordered")
    assert [r["positive"] for r in next_sentence_rows(rows, 3, Random(0))] == ["A two .", "C two ."]


def test_paranmt_pairs_are_read_from_the_release_file_only(tmp_path: Path):
    with pytest.raises(DataUnavailableError, match="no hub copy: download .*para-nmt-5m-processed"):
        load_rows("paranmt_pairs", tmp_path)
    (tmp_path / "paranmt").mkdir()
    release = tmp_path / "paranmt" / "para-nmt-5m-processed.txt"
    release.write_text("i 'm fine .\ti am well .\n\nwhere is it ?\twhere 's it ?\t0.9\n")
    assert load_rows("paranmt_pairs", tmp_path) == [
        {"anchor": "i 'm fine .", "positive": "i am well ."},
        {"anchor": "where is it ?", "positive": "where 's it ?"},
    ]
    release.write_text("i 'm fine .\ti am well .\nno tab here\n")
    catalog._cached_rows.cache_clear()  # the file changed under the same folder
    with pytest.raises(
        ValueError, match=r"para-nmt-5m-processed.txt:2: expected a sentence and its paraphrase"
    ):
        load_rows("paranmt_pairs", tmp_path)


def test_a_catalogue_set_that_cannot_load_here_is_said_before_a_study_starts(tmp_path: Path, monkeypatch):
    arrow = tmp_path / "arrow"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # datasets' own flag, the one it reads
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", "~/elsewhere")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(arrow))
    data = tmp_path / "data"
    (data / "wiki").mkdir(parents=True)
    assert unavailable("wiki_ordered", data) == (
        "data.train wiki_ordered: it streams wikimedia/wikipedia from the hub, which is off (HF_DATASETS_OFFLINE); "
        f"provide <data_dir>/wiki/wiki_ordered.txt (data folder: {data}) or run where the hub answers"
    )
    assert unavailable("qqp_pairs", data) == (
        "data.train qqp_pairs: it reads nyu-mll/glue from the hub, which is off (HF_DATASETS_OFFLINE), and "
        f"datasets' cache ({arrow}) has no copy; provide <data_dir>/qqp/train.tsv (data folder: {data}) or run "
        "where the hub answers"
    )
    paranmt = unavailable("paranmt_pairs", data)
    assert paranmt.startswith("data.train paranmt_pairs: it has no hub copy; provide <data_dir>/paranmt/")
    assert paranmt.endswith("(ParaNMT-50M, the para-nmt-5m-processed.zip release)")  # where to get it
    (arrow / "nyu-mll___glue" / "mrpc" / "0.0.0" / "abc").mkdir(parents=True)  # another configuration
    assert unavailable("qqp_pairs", data) is not None
    (arrow / "nyu-mll___glue" / "qqp" / "0.0.0" / "abc").mkdir(parents=True)  # prepared: read offline
    assert unavailable("qqp_pairs", data) is None
    # + ANLI: each part from its own source, SimCSE's file locally and ANLI from datasets' cache
    (data / "nli").mkdir()
    (data / "nli" / "nli_for_simcse.csv").write_text("sent0,sent1,hard_neg\n")
    assert "reads facebook/anli" in unavailable("nli_anli_for_simcse", data)
    (arrow / "facebook___anli" / "plain_text" / "0.0.0" / "abc").mkdir(parents=True)
    assert unavailable("nli_anli_for_simcse", data) is None
    # a stream caches nothing: wiki_ordered is here once its rows were built (or the data folder has them)
    write_ordered_file([{"text": "A .", "document": "1"}], built_copy())
    assert unavailable("wiki_ordered", data) is None and load_rows("wiki_ordered", data, seed=3) == [
        {"text": "A .", "document": "0"}
    ]
    assert unavailable("wiki1m", data) is None  # the shared folder's sets: their loaders say, at load


def test_a_catalogue_set_with_a_data_dir_that_is_no_data_folder_is_a_problem_not_a_crash(tmp_path: Path):
    from clsr.config.trial import DataConfig
    from clsr.data.external import data_source_problem

    problem, unavailable_why = data_source_problem(
        DataConfig(train="qqp_pairs", data_dir=str(tmp_path / "nowhere")), ("anchor", "positive")
    )
    assert problem.startswith("data.data_dir: ") and str(tmp_path / "nowhere") in problem
    assert unavailable_why is None
