"""Word-vector tables for word-level encoders (GCLSR): tokenising, loading, encoding, averaging."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from clsr.data.sources import DataUnavailableError
from clsr.encoders.word_vectors import (
    OOV_ID,
    PAD_ID,
    WordTable,
    WordTokenizer,
    build_word_table,
    detect_format,
    word_vector_average_embedder,
    words_of,
)

VECS = {
    "foo": [1.0, 2.0, 3.0, 4.0],
    "bar": [-1.0, 0.5, 0.25, 0.0],
    "baz": [0.125, -2.0, 8.0, 1.5],
}


def _write_text(path: Path, header: bool) -> Path:
    lines = [f"{len(VECS)} 4"] if header else []
    lines += [f"{w} " + " ".join(str(x) for x in v) for w, v in VECS.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def w2v_text(tmp_path: Path) -> Path:
    return _write_text(tmp_path / "vecs.txt", header=True)


@pytest.fixture
def glove_text(tmp_path: Path) -> Path:
    return _write_text(tmp_path / "glove.txt", header=False)


@pytest.fixture
def w2v_bin(tmp_path: Path) -> Path:
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=4)
    kv.add_vectors(list(VECS), np.array(list(VECS.values()), dtype=np.float32))
    path = tmp_path / "vecs.bin"
    kv.save_word2vec_format(str(path), binary=True)
    return path


@pytest.fixture(scope="module")
def minilm_table() -> WordTable:
    return build_word_table("minilm", ["The cat sat.", "Sickeningly sweet!"])


# ------------------------------------------------------------------------------------------- tokenising


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Don't stop-believing!", ["dont", "stop", "believing"]),
        ("It’s 2023:\tCOVID-19\ncases  rise", ["its", "covid", "cases", "rise"]),
        ("Café au lait", ["caf", "au", "lait"]),
        ("rock'n'roll", ["rocknroll"]),
        ("", ["sickeningly"]),
        ("123 !! 4.5", ["sickeningly"]),
    ],
)
def test_words_of(text: str, words: list[str]) -> None:
    assert words_of(text) == words


def test_word_tokenizer_pickles_without_hf_state() -> None:
    tok = WordTokenizer("wordpiece", "minilm")
    assert tok("Hello world") == ["hello", "world"]
    clone = pickle.loads(pickle.dumps(tok))
    assert clone._hf is None and clone.model_name == "minilm"
    assert clone("") == ["sick", "##ening", "##ly"]
    with pytest.raises(ValueError, match="model_name"):
        WordTokenizer("wordpiece")


# ------------------------------------------------------------------------------------------- formats


def test_detect_format(tmp_path: Path, w2v_text: Path, glove_text: Path, w2v_bin: Path) -> None:
    assert detect_format("word2vec-google-news-300") == "word2vec_bin"
    assert detect_format("glove-wiki-gigaword-300") == "glove"
    assert detect_format("glove-6b-50d-local") == "glove"
    assert detect_format(str(w2v_bin)) == "word2vec_bin"
    assert detect_format(str(w2v_text)) == "word2vec_text"
    assert detect_format(str(glove_text)) == "glove"
    assert detect_format("minilm") == "transformer"
    assert detect_format("bert-base-uncased") == "transformer"
    assert detect_format(str(tmp_path)) == "transformer"  # a folder: a local checkpoint
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataUnavailableError, match="nope.txt"):
        detect_format(str(missing))


@pytest.mark.parametrize("fixture", ["w2v_text", "w2v_bin", "glove_text"])
def test_files_load_exact_vectors(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    table = build_word_table(str(path), ["baz foo", "BAR"])
    assert table.words == ["baz", "foo", "bar"]
    assert table.dim == 4 and table.oov_words == 0 and table.tokenizer.kind == "words"
    for i, word in enumerate(table.words):
        np.testing.assert_array_equal(table.vectors[i + 2], np.array(VECS[word], dtype=np.float32))
    np.testing.assert_array_equal(table.vectors[OOV_ID], np.zeros(4, dtype=np.float32))
    assert table.vectors.dtype == np.float32 and table.vectors.shape == (5, 4)


def test_local_glove_50d(data_dir: Path) -> None:
    table = build_word_table("glove-6b-50d-local", ["The of", "zzzqqq"], data_dir=data_dir)
    assert table.words == ["the", "of"] and table.oov_words == 1 and table.dim == 50
    np.testing.assert_allclose(table.vectors[2, :3], [0.418, 0.24968, -0.41242], rtol=1e-6)


def test_local_glove_without_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLSR_DATA_DIR", raising=False)
    with pytest.raises(DataUnavailableError, match="CLSR_DATA_DIR"):
        build_word_table("glove-6b-50d-local", ["the"])


def test_missing_file_names_path(tmp_path: Path) -> None:
    for path, fmt in [(tmp_path / "gone.bin", "auto"), (tmp_path / "gone", "glove")]:
        with pytest.raises(DataUnavailableError, match=str(path)):
            build_word_table(str(path), ["the"], fmt=fmt)


def test_a_named_set_not_in_the_data_folder_names_its_file_and_source(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match="code.google.com/archive/p/word2vec") as err:
        build_word_table("word2vec-google-news-300", ["the"], data_dir=tmp_path)
    assert str(tmp_path / "word_vectors" / "GoogleNews-vectors-negative300.bin") in str(err.value)


# ------------------------------------------------------------------------------------------- encoding


def test_encode_truncates_pads_and_marks_oov(w2v_text: Path) -> None:
    table = build_word_table(str(w2v_text), ["foo qux bar baz", "bar"], max_words=3)
    assert table.words == ["foo", "bar", "baz"] and table.oov_words == 1
    ids, mask = table.encode(["foo qux bar baz", "bar", ""])
    assert ids.dtype == np.int64 and mask.dtype == bool
    np.testing.assert_array_equal(ids, [[2, OOV_ID, 3], [3, PAD_ID, PAD_ID], [OOV_ID, PAD_ID, PAD_ID]])
    np.testing.assert_array_equal(mask, [[True, True, True], [True, False, False], [True, False, False]])
    full, full_mask = table.encode(["foo qux bar baz", "bar"], truncate=False)
    np.testing.assert_array_equal(full, [[2, OOV_ID, 3, 4], [3, PAD_ID, PAD_ID, PAD_ID]])
    assert full_mask.sum() == 5


def test_pad_vector_seeded_and_bounded(w2v_text: Path) -> None:
    a = math.sqrt(3 / 4)
    t1, t2 = (build_word_table(str(w2v_text), ["foo"]) for _ in range(2))
    t3 = build_word_table(str(w2v_text), ["foo"], seed=7)
    pad = t1.vectors[PAD_ID]
    assert np.all(np.abs(pad) <= a)
    np.testing.assert_array_equal(pad, t2.vectors[PAD_ID])
    expected = np.random.default_rng(2).uniform(-a, a, 4).astype(np.float32)
    np.testing.assert_array_equal(pad, expected)
    assert not np.array_equal(pad, t3.vectors[PAD_ID])


def test_fixed_oov_rows_are_deterministic(w2v_text: Path) -> None:
    texts = ["foo qux", "quux bar"]
    t1, t2 = (build_word_table(str(w2v_text), texts, oov="fixed") for _ in range(2))
    assert t1.words == ["foo", "bar", "qux", "quux"] and t1.oov_words == 2
    np.testing.assert_array_equal(t1.vectors, t2.vectors)
    a = math.sqrt(3 / 4)
    expected = np.random.default_rng(3).uniform(-a, a, (2, 4)).astype(np.float32)
    np.testing.assert_array_equal(t1.vectors[4:], expected)
    ids, _ = t1.encode(["qux quux foo"])
    np.testing.assert_array_equal(ids[0, :3], [4, 5, 2])


def test_wordpiece_rows_are_minilm_input_embeddings(minilm_table: WordTable) -> None:
    from transformers import AutoModel

    from clsr.data.hub.model_registry import resolve_model_path

    table = minilm_table
    assert table.tokenizer.kind == "wordpiece" and table.dim == 384 and table.oov_words == 0
    assert table.words[:4] == ["the", "cat", "sat", "."]
    emb = AutoModel.from_pretrained(resolve_model_path("minilm")).get_input_embeddings().weight
    hf = table.tokenizer.hf_tokenizer
    for i, token in enumerate(table.words):
        expected = emb[hf.convert_tokens_to_ids(token)].detach().numpy()
        np.testing.assert_array_equal(table.vectors[i + 2], expected)


def test_average_embedder(data_dir: Path) -> None:
    table = build_word_table("glove-6b-50d-local", ["the of"], max_words=1, data_dir=data_dir)
    embed = word_vector_average_embedder(table)
    out = embed(["The, of!", "zzzqqq", "of zzzqqq"])
    assert out.shape == (3, 50) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], (table.vectors[2] + table.vectors[3]) / 2, rtol=1e-6)  # not truncated
    np.testing.assert_array_equal(out[1], np.zeros(50, dtype=np.float32))  # all OOV
    np.testing.assert_allclose(out[2], table.vectors[3], rtol=1e-6)  # OOV skipped
