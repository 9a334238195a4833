"""Rule 2's third-party artefacts, pinned and hashed: the GloVe sample shipped with the data folder is
pinned to its SHA-256 and a changed copy is refused in one line (file, expected, got); the publishers'
big files (GoogleNews, GloVe 300d), whose hashes cannot be known offline, are hashed once per machine
(cached in the private scratch folder, rule 1) and recorded in the trial's params
(``model.vectors_sha256``), so the record says which file trained the model."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from clsr.config.trial import TrialConfig
from clsr.data.sources import DataUnavailableError
from clsr.encoders import word_vectors
from tests.security.rule123_cotenant import shared_tmp

SAMPLE = word_vectors.NAMED_VECTORS["glove-6b-50d-local"]


@pytest.fixture()
def shared(monkeypatch):
    with shared_tmp(monkeypatch) as folder:
        yield folder


def test_the_shipped_sample_is_pinned_and_a_changed_copy_refused(data_dir, tmp_path, shared):
    shipped = data_dir / str(SAMPLE.local_file)
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == SAMPLE.sha256
    copy = tmp_path / str(SAMPLE.local_file)
    copy.parent.mkdir()
    shutil.copyfile(shipped, copy)
    with copy.open("r+b") as file:  # one digit of "the"'s first value changed
        file.write(file.read(8).replace(b"0.418", b"0.419"))
    got = hashlib.sha256(copy.read_bytes()).hexdigest()
    with pytest.raises(DataUnavailableError) as err:
        word_vectors.build_word_table("glove-6b-50d-local", ["the"], data_dir=tmp_path)
    line = str(err.value)
    assert "\n" not in line and str(copy) in line and SAMPLE.sha256 in line and got in line
    assert word_vectors.named_vectors_unavailable("glove-6b-50d-local", tmp_path) == line


def _gclsr(vectors: str, data_dir: Path) -> TrialConfig:
    return TrialConfig.model_validate(
        {
            "model": {"type": "textcnn", "vectors": vectors, "filters": 8},
            "data": {"train": "wiki1m", "max_rows": 128, "data_dir": str(data_dir)},
            "method": {"name": "gclsr"},
        }
    )


def test_a_publishers_file_is_hashed_once_and_recorded_in_the_trials_params(tmp_path, shared):
    from clsr import runtime_dir
    from clsr.study.run.trial import trial_params
    from clsr.tracking.study_runs import flatten

    glove = tmp_path / str(word_vectors.NAMED_VECTORS["glove-wiki-gigaword-300"].local_file)
    glove.parent.mkdir()
    glove.write_text("the 0.1 0.2 0.3\ncat 0.4 0.5 0.6\n")
    expected = hashlib.sha256(glove.read_bytes()).hexdigest()
    params = flatten(trial_params(_gclsr("glove-wiki-gigaword-300", tmp_path)))
    assert params["model.vectors_sha256"] == expected
    # and beside the rows' identities (issue 55): the file it read, hashed whole
    assert params["data.vectors.sha256"] == expected and params["data.vectors.revision"] == "none"
    assert params["data.vectors.source"] == f"local:{glove}"
    [cached] = (runtime_dir.scratch() / "sha256").iterdir()  # private: rule 1's folder, 0600 file
    assert cached.read_text() == expected and cached.stat().st_mode & 0o077 == 0
    cached.unlink()
    runtime_dir.write_private(cached, "f" * 64)  # the cache is read, not the file: hashed once
    assert word_vectors.vectors_sha256("glove-wiki-gigaword-300", tmp_path) == "f" * 64
    glove.write_text("the 0.1 0.2 0.3\n")  # a new file: hashed again
    assert (
        word_vectors.vectors_sha256("glove-wiki-gigaword-300", tmp_path)
        == hashlib.sha256(glove.read_bytes()).hexdigest()
    )


def test_a_transformer_or_a_missing_file_records_no_hash(tmp_path, shared):
    from clsr.study.run.trial import trial_params

    assert "vectors_sha256" not in trial_params(_gclsr("minilm", tmp_path))["model"]
    assert word_vectors.vectors_sha256("word2vec-google-news-300", tmp_path) is None
