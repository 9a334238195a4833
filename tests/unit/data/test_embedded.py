"""The embedded default data set: shipped in the package, loaded only when neither a data folder nor the
hub can serve, and named by ``data.source`` (issue 53, "two commands from a fresh clone")."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clsr.data import corpora, embedded
from clsr.data.corpora import load_wiki_sentences
from clsr.data.hub import reach as hub_reach
from clsr.data.sts import load_sts

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No data folder, the hub off, datasets' cache empty: only the embedded set can serve."""
    monkeypatch.delenv("CLSR_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    return monkeypatch


def test_the_embedded_set_is_small_and_loads():
    files = [embedded.EMBEDDED_DIR / name for name in (embedded.WIKI_FILE, embedded.STS_FILE, "LICENSES.md")]
    assert sum(f.stat().st_size for f in files) < 1.5e6
    assert len(embedded.wiki_sentences()) == 3000
    assert [len(embedded.sts_rows("stsb", s) or ()) for s in ("dev", "test")] == [300, 300]
    assert {row[0] for row in embedded.sts_rows("sts16", "test") or ()} == {"headlines", "postediting"}
    assert embedded.sts_rows("sts12", "test") is None


def test_the_package_ships_it():
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/embedded/*" in data["clsr"]


def test_with_neither_folder_nor_hub_the_embedded_set_serves(nowhere):
    assert load_wiki_sentences() == list(embedded.wiki_sentences())
    dev = load_sts("stsb", "dev")
    assert len(dev.scores) == 300 and set(dev.subsets) == {"images", "track5.en-en", "headlines"}
    assert len(load_sts("sts16", "test").scores) == 200
    assert embedded.served_by(None, "wiki1m", ["sts16", "stsb"]) == "embedded"
    assert embedded.served_by(None, "wiki1m", ["sts12"]) == "embedded+hub"  # sts12 is not embedded
    assert "set CLSR_DATA_DIR" in (embedded.served_note(None, "wiki1m", ["stsb"]) or "")  # validate's note


def test_a_data_folder_serves_first(nowhere, data_dir):
    nowhere.setenv("CLSR_DATA_DIR", str(data_dir))
    assert len(load_wiki_sentences(data_dir)) == 11_914
    assert embedded.served_by(None, "wiki1m", ["stsb"]) == "data_dir"
    assert embedded.served_note(None, "wiki1m", ["stsb"]) is None


def test_the_hub_serves_before_the_embedded_set(nowhere):
    """Reachable (no offline flag), or offline with a copy in datasets' cache: the hub's copy."""
    nowhere.setattr(corpora, "load_from_hub", lambda *a, **k: {"text": ["from the hub"]})
    nowhere.delenv("HF_DATASETS_OFFLINE")
    nowhere.delenv("HF_HUB_OFFLINE", raising=False)
    nowhere.setattr(hub_reach, "hub_unreachable", lambda: None)
    assert load_wiki_sentences() == ["from the hub"]
    assert embedded.served_by(None, "wiki1m", ["stsb"]) == "hub"

    nowhere.setenv("HF_DATASETS_OFFLINE", "1")
    assert embedded.served_by(None, "wiki1m", ["stsb"]) == "embedded"
    from clsr.data.sources import datasets_cache

    (datasets_cache() / "princeton-nlp___datasets-for-simcse" / "default" / "0.0.0" / "abc").mkdir(
        parents=True
    )
    assert load_wiki_sentences() == ["from the hub"]
    assert (
        embedded.served_by(None, "wiki1m", ["stsb"]) == "embedded+hub"
    )  # wiki1m from the cache, stsb embedded


def test_the_builder_regenerates_the_shipped_files(data_dir, tmp_path):
    script = REPO_ROOT / "benchmarks" / "build_embedded_data.py"
    subprocess.run(
        [sys.executable, str(script), "--data-dir", str(data_dir), "--out", str(tmp_path)], check=True
    )
    for name in (embedded.WIKI_FILE, embedded.STS_FILE):
        assert (tmp_path / name).read_bytes() == (embedded.EMBEDDED_DIR / name).read_bytes(), name
