"""Frozen word vectors for word-level encoders (GCLSR): tokenise, look up, pad.

Sentences become token lists (the GCLSR code's "words" rule, or WordPiece), the distinct tokens of the
corpus are looked up once in pre-trained vectors, and only those rows are kept in a small table:

* row ``PAD_ID`` (0): one fixed padding vector drawn from U(-a, a), a = sqrt(3/dim) (GCLSR: seed 2);
* row ``OOV_ID`` (1): zeros, a placeholder; the model draws a fresh U(-a, a) vector for every OOV
  position each time a sentence is embedded (the GCLSR code redraws instead of caching; in GCLSR
  training each view draws its own unless ``method.oov_draw: shared``);
* rows 2..: the vocabulary tokens that have a vector.

Vectors come from a named set (:data:`NAMED_VECTORS`), a word2vec / GloVe file, or the input token
embeddings of a transformer checkpoint (e.g. ``minilm``, usable offline).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from clsr import runtime_dir
from clsr.data.sources import ENV_VAR, DataUnavailableError, resolve_data_dir

PAD_ID = 0
OOV_ID = 1
EMPTY_WORD = "sickeningly"  # what the GCLSR code substitutes for a sentence without words

VectorFormat = Literal["auto", "word2vec_bin", "word2vec_text", "glove", "transformer"]
Tokenization = Literal["auto", "words", "wordpiece"]

_NON_LETTERS = re.compile(r"[^a-z]+")
# A missing source with one of these endings is a mistyped file, not a transformer name.
_FILE_SUFFIXES = (".bin", ".txt", ".vec", ".gz", ".model", ".npy")


# ---------------------------------------------------------------------------------------------- tokenising


def words_of(text: str) -> list[str]:
    """The GCLSR code's text → words rule: letters a–z only, lower-cased; empty → ["sickeningly"]."""
    text = text.replace("’", "").replace("'", "")
    text = text.replace("-", " ").replace("\t", " ").replace("\n", " ").lower()
    words = _NON_LETTERS.sub(" ", text).split()
    return words or [EMPTY_WORD]


class WordTokenizer:
    """Text → tokens, either ``words`` (:func:`words_of`) or ``wordpiece`` (a HF tokenizer).

    Picklable: the HF tokenizer is loaded lazily and not pickled, so Ray ships only the names.
    """

    def __init__(self, kind: Literal["words", "wordpiece"], model_name: str | None = None):
        if kind not in ("words", "wordpiece"):
            raise ValueError(f"tokenization must be 'words' or 'wordpiece', not {kind!r}")
        if kind == "wordpiece" and not model_name:
            raise ValueError("wordpiece tokenization needs a model_name (e.g. 'minilm')")
        self.kind = kind
        self.model_name = model_name
        self._hf: Any = None

    @property
    def hf_tokenizer(self) -> Any:
        """The Hugging Face tokenizer behind ``wordpiece`` (loaded on first use)."""
        if self._hf is None:
            from clsr.encoders.transformer import load_tokenizer  # torch/transformers: only when needed

            self._hf = load_tokenizer(str(self.model_name))
        return self._hf

    def __call__(self, text: str) -> list[str]:
        if self.kind == "words":
            return words_of(text)
        return self.hf_tokenizer.tokenize(text) or self.hf_tokenizer.tokenize(EMPTY_WORD)

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "model_name": self.model_name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["kind"], state["model_name"])

    def __repr__(self) -> str:
        return f"WordTokenizer({self.kind!r}, model_name={self.model_name!r})"


# ---------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class NamedVectors:
    """A short name for a set of word vectors: a word2vec/GloVe file on the hub (at a pinned revision,
    with its SHA-256), or a local file. Never a gensim ``.model``: that is a pickle (rule 2)."""

    fmt: VectorFormat
    hub_repo: str | None = None
    hub_file: str | None = None  # a word2vec/GloVe file in that repo, read with load_word2vec_format
    local_file: str | None = None  # relative to the data folder
    revision: str | None = None  # the hub commit the file was checked at
    sha256: str | None = None  # of that file
    download: str | None = None  # where a local file comes from, said when it is missing


# The two GCLSR defaults are published on the hub only as gensim pickles (fse/…: a .model and its .npy)
# at no pinned revision (rule 2): they are read as their publishers' own files, placed in the data folder.
# Their hashes cannot be known offline: a trial records the file's (``model.vectors_sha256``) instead.
NAMED_VECTORS: dict[str, NamedVectors] = {
    "word2vec-google-news-300": NamedVectors(
        "word2vec_bin",
        local_file="word_vectors/GoogleNews-vectors-negative300.bin",
        download="GoogleNews-vectors-negative300.bin.gz from https://code.google.com/archive/p/word2vec/ (unpacked)",
    ),
    "glove-wiki-gigaword-300": NamedVectors(
        "glove",
        local_file="word_vectors/glove.6B.300d.txt",
        download="glove.6B.300d.txt from https://nlp.stanford.edu/data/glove.6B.zip",
    ),
    # shipped with the data folder: its hash is known, and a changed file is refused
    "glove-6b-50d-local": NamedVectors(
        "glove",
        local_file="word_vectors/glove.6B.50d.top2446.txt",
        sha256="20f31df07c7d7f7cbe326529ca3cb03352d7c18cce7e618016ef6b5f6d4e5124",
    ),
}


def _first_line(path: Path) -> str:
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
            return fh.readline()
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return fh.readline()


def detect_format(source: str, data_dir: str | os.PathLike[str] | None = None) -> VectorFormat:
    """Named set → its format; ``*.bin`` → word2vec_bin; text with an "N D" first line → word2vec_text;
    other text → glove; not a file → transformer (a hub id, a local checkpoint folder or 'minilm').

    ``data_dir`` is accepted for symmetry with :func:`build_word_table`; detection does not need it.
    """
    if source in NAMED_VECTORS:
        return NAMED_VECTORS[source].fmt
    path = Path(source).expanduser()
    if not path.is_file():
        if not path.is_dir() and path.name.lower().endswith(_FILE_SUFFIXES):
            raise _missing_file(path)
        return "transformer"
    if path.name.lower().endswith((".bin", ".bin.gz")):
        return "word2vec_bin"
    head = _first_line(path).split()
    return "word2vec_text" if len(head) == 2 and all(p.isdigit() for p in head) else "glove"


def _missing_file(path: Path) -> DataUnavailableError:
    return DataUnavailableError(
        f"word vectors file not found: {path}. Point model.vectors at an existing word2vec (.bin or text) "
        f"or GloVe file, or use a named set ({', '.join(NAMED_VECTORS)}) or 'minilm'."
    )


def _hub_unavailable(name: str, repo: str, err: Exception) -> DataUnavailableError:
    return DataUnavailableError(
        f"word vectors {name!r} need the Hugging Face hub ({repo}); offline, point model.vectors at a local "
        f"word2vec/GloVe file, or use 'minilm' (WordPiece input embeddings of the offline MiniLM package). "
        f"({type(err).__name__}: {err})"
    )


# ---------------------------------------------------------------------------------------------- lookup

# A lookup returns (vectors of the tokens found, found mask over the tokens, dim).
Lookup = tuple[np.ndarray, np.ndarray, int]


def _lookup_keyed(kv: Any, tokens: Sequence[str]) -> Lookup:
    """Rows of a gensim KeyedVectors for ``tokens`` (exact match only), copied out of the big table."""
    rows = [kv.key_to_index.get(tok, -1) for tok in tokens]
    found = np.array([r >= 0 for r in rows], dtype=bool)
    idx = np.array([r for r in rows if r >= 0], dtype=np.int64)
    vecs = np.array(kv.vectors[idx], dtype=np.float32).reshape(len(idx), kv.vector_size)  # a copy, not a view
    return vecs, found, int(kv.vector_size)


def _keyed_vectors() -> Any:
    """gensim's KeyedVectors (GCLSR only: the ``gclsr`` extra; a slow import, done here)."""
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        raise ImportError(
            "GCLSR's word vectors need gensim: pip install 'clsr-platform[gclsr]' (or pip install gensim)"
        ) from None
    return KeyedVectors


def _load_file(path: Path, fmt: VectorFormat) -> Any:
    KeyedVectors = _keyed_vectors()

    if not path.is_file():
        raise _missing_file(path)
    # unicode_errors="replace": real files hold stray non-UTF-8 keys (the local GloVe has a cp1252 dash).
    return KeyedVectors.load_word2vec_format(
        str(path), binary=fmt == "word2vec_bin", no_header=fmt == "glove", unicode_errors="replace"
    )


def _load_hub(name: str, spec: NamedVectors) -> Any:
    """A pinned word2vec/GloVe file from the hub, its SHA-256 checked, read without unpickling."""
    assert spec.hub_repo
    if not (spec.hub_file and spec.revision and spec.sha256):
        raise DataUnavailableError(
            f"word vectors {name!r}: the hub's {spec.hub_repo} is a gensim pickle at no pinned revision, which "
            f"the platform does not load; download the vectors as a word2vec/GloVe file (e.g. "
            f"GoogleNews-vectors-negative300.bin) and set model.vectors to its path, or use 'minilm'"
        )
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(spec.hub_repo, spec.hub_file, revision=spec.revision))
    except Exception as err:  # offline mode, no network, missing repo: all end the same way
        raise _hub_unavailable(name, spec.hub_repo, err) from err
    _check_sha256(path, spec.sha256)
    return _load_file(path, spec.fmt)


def _check_sha256(path: Path, expected: str) -> None:
    got = file_sha256(path)
    if got != expected:
        raise DataUnavailableError(f"word vectors {path}: SHA-256 {got} is not the pinned {expected}; not loaded")


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, computed once per machine (the publishers' files are GBs):
    kept in the private scratch folder (rule 1) under the file's identity, whose change time moves with
    any write to it."""
    import hashlib

    info = path.stat()
    identity = f"{path.resolve()}|{info.st_dev}|{info.st_ino}|{info.st_size}|{info.st_mtime_ns}|{info.st_ctime_ns}"
    cached = runtime_dir.subfolder(runtime_dir.scratch(), "sha256") / hashlib.sha256(identity.encode()).hexdigest()
    with contextlib.suppress(OSError, ValueError):
        with os.fdopen(os.open(cached, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), encoding="ascii") as file:
            digest = file.read()
        if re.fullmatch("[0-9a-f]{64}", digest):  # else another process is still writing it
            return digest
    sha = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    with contextlib.suppress(FileExistsError):  # another trial wrote it first
        runtime_dir.write_private(cached, sha.hexdigest())
    return sha.hexdigest()


def vectors_sha256(source: str, data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The SHA-256 of the file ``source`` names (a named set's, or a path), for the trial's record; None
    for a transformer or a file not there (loading it then says why)."""
    spec = NAMED_VECTORS.get(source)
    if spec is None:
        path = Path(source).expanduser()
    elif spec.local_file is None:
        return spec.sha256  # a hub file, checked against it when loaded
    else:
        try:
            root = resolve_data_dir(data_dir)
        except DataUnavailableError:
            return None
        if root is None:
            return None
        path = root / spec.local_file
    return file_sha256(path) if path.is_file() else None


def vectors_where(source: str, data_dir: str | os.PathLike[str] | None = None) -> tuple[str, str | None]:
    """Where the word vectors ``source`` names are read: (``local:<path>`` or ``hub:<repo>/<file>``, the hub
    revision or None), for the trial's ``data.vectors.*`` params."""
    spec = NAMED_VECTORS.get(source)
    if spec is None:
        return f"local:{Path(source).expanduser().resolve()}", None
    if spec.local_file is None:
        return f"hub:{spec.hub_repo}/{spec.hub_file}", spec.revision
    try:
        root = resolve_data_dir(data_dir)
    except DataUnavailableError:
        root = None
    return f"local:{(root or Path('<data_dir>')) / spec.local_file}", None


def _load_named(name: str, data_dir: str | os.PathLike[str] | None) -> Any:
    spec = NAMED_VECTORS[name]
    if spec.local_file is None:
        return _load_hub(name, spec)
    root = resolve_data_dir(data_dir)
    if root is None:
        raise DataUnavailableError(
            f"word vectors {name!r} are a local file (<data_dir>/{spec.local_file}); set {ENV_VAR} or "
            f"data.data_dir to the shared data folder."
        )
    if spec.download and not (root / spec.local_file).is_file():
        raise _missing_named(name, spec, root)
    if spec.sha256 and (root / spec.local_file).is_file():
        _check_sha256(root / spec.local_file, spec.sha256)
    return _load_file(root / spec.local_file, spec.fmt)


def _missing_named(name: str, spec: NamedVectors, root: Path) -> DataUnavailableError:
    return DataUnavailableError(
        f"word vectors {name!r} are read from {root / str(spec.local_file)}, which is not there: put "
        f"{spec.download} there, or set model.vectors to a word2vec/GloVe file's path (the hub has these "
        f"vectors only as gensim pickles, which the platform does not load)"
    )


def named_vectors_unavailable(name: str, data_dir: str | os.PathLike[str] | None) -> str | None:
    """Why the named vectors ``name`` cannot load here, as ``_load_named`` would find it without loading
    (``validate`` and ``skip_unavailable`` use it), or None: names that are not in ``NAMED_VECTORS`` (a
    file or a transformer) are left to their loaders."""
    spec = NAMED_VECTORS.get(name)
    if spec is None:
        return None
    try:
        if spec.local_file is None:
            if not (spec.hub_file and spec.revision and spec.sha256):
                _load_hub(name, spec)  # refuses before any download
            return None
        root = resolve_data_dir(data_dir)
    except DataUnavailableError as err:
        return str(err)
    if root is None:
        return (
            f"word vectors {name!r} are a local file (<data_dir>/{spec.local_file}); set {ENV_VAR} or "
            f"data.data_dir to the shared data folder."
        )
    if (root / spec.local_file).is_file():
        try:
            if spec.sha256:
                _check_sha256(root / spec.local_file, spec.sha256)
        except DataUnavailableError as err:
            return str(err)
        return None
    return str(_missing_named(name, spec, root) if spec.download else _missing_file(root / spec.local_file))


def _lookup_transformer(name: str, tokens: Sequence[str], tokenizer: Any) -> Lookup:
    """Input token embeddings of a checkpoint; a token outside its vocabulary (not [UNK] itself) is OOV."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from clsr.data.hub.model_registry import describe_load_failure, resolve_model_path

    hf_logging.disable_progress_bar()  # the "Loading weights" bar would clutter every trial's log
    try:
        model = AutoModel.from_pretrained(resolve_model_path(name))
    except (OSError, ValueError) as err:
        raise describe_load_failure(name, err) from err
    table = model.get_input_embeddings().weight.detach().cpu().numpy().astype(np.float32)
    ids = np.array(tokenizer.convert_tokens_to_ids(list(tokens)), dtype=np.int64).reshape(-1)
    unk_id, unk = tokenizer.unk_token_id, tokenizer.unk_token
    found = np.array([i != unk_id or t == unk for t, i in zip(tokens, ids, strict=True)], dtype=bool)
    return table[ids[found]], found, int(table.shape[1])


# ---------------------------------------------------------------------------------------------- table


@dataclass
class WordTable:
    """The rows a word-level encoder needs: PAD, OOV, then one row per vocabulary token."""

    words: list[str]  # words[i] is the token of row i + 2
    vectors: np.ndarray  # (len(words) + 2, dim) float32
    tokenizer: WordTokenizer
    max_words: int
    oov_words: int  # distinct vocabulary tokens without a vector (for logging)
    source: str
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = {w: i + 2 for i, w in enumerate(self.words)}

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def ids_of(self, text: str) -> list[int]:
        """Row ids of the tokens of one text (OOV → OOV_ID), not truncated."""
        return [self._index.get(tok, OOV_ID) for tok in self.tokenizer(text)]

    def encode(self, texts: Sequence[str], *, truncate: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 (N, L), mask bool (N, L)): tokens → row ids, OOV → OOV_ID, padded with PAD_ID.

        L = ``max_words`` (longer texts cut); with ``truncate=False`` L = the longest text, nothing cut.
        """
        rows = [self.ids_of(t) for t in texts]
        if truncate:
            rows = [r[: self.max_words] for r in rows]
            width = self.max_words
        else:
            width = max((len(r) for r in rows), default=1)
        ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = True
        return ids, mask


def uniform_bound(dim: int) -> float:
    """a = sqrt(3 / dim): U(-a, a) has unit variance per vector (GCLSR's law for padding and OOV)."""
    return math.sqrt(3.0 / dim)


def _vocabulary(texts: Iterable[str], tokenizer: WordTokenizer) -> list[str]:
    """Distinct tokens of ``texts`` in first-seen order."""
    seen: dict[str, None] = {}
    for text in texts:
        seen.update(dict.fromkeys(tokenizer(text)))
    return list(seen)


def _resolve_tokenization(tokenization: Tokenization, fmt: VectorFormat, source: str) -> WordTokenizer:
    kind = tokenization if tokenization != "auto" else ("wordpiece" if fmt == "transformer" else "words")
    if kind == "wordpiece" and fmt != "transformer":
        raise ValueError(
            f"wordpiece tokenization needs transformer vectors (e.g. 'minilm'); {source!r} is {fmt}"
        )
    # A transformer source keeps its name even with "words": its tokenizer maps words to vocabulary ids.
    return WordTokenizer(kind, source if fmt == "transformer" else None)


def _lookup(
    source: str, fmt: VectorFormat, vocab: list[str], tokenizer: WordTokenizer, data_dir: Any
) -> Lookup:
    if fmt == "transformer":
        return _lookup_transformer(source, vocab, tokenizer.hf_tokenizer)
    kv = (
        _load_named(source, data_dir)
        if source in NAMED_VECTORS
        else _load_file(Path(source).expanduser(), fmt)
    )
    return _lookup_keyed(kv, vocab)  # kv (possibly millions of rows) is dropped on return


def build_word_table(
    source: str,
    texts: Iterable[str],
    *,
    fmt: VectorFormat = "auto",
    tokenization: Tokenization = "auto",
    max_words: int = 64,
    oov: Literal["redraw", "fixed"] = "redraw",
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 2,
) -> WordTable:
    """Look up the distinct tokens of ``texts`` in ``source`` and keep only those rows.

    ``oov="redraw"``: tokens without a vector map to OOV_ID (the model redraws them every call, as
    GCLSR does); ``oov="fixed"``: each gets its own row drawn once from U(-a, a) with seed ``seed + 1``.
    """
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, not {max_words}")
    if oov not in ("redraw", "fixed"):
        raise ValueError(f"oov must be 'redraw' or 'fixed', not {oov!r}")
    if fmt == "auto":
        fmt = detect_format(source, data_dir)
    tokenizer = _resolve_tokenization(tokenization, fmt, source)
    vocab = _vocabulary(texts, tokenizer)
    found_vecs, found, dim = _lookup(source, fmt, vocab, tokenizer, data_dir)
    a = uniform_bound(dim)
    pad = np.random.default_rng(seed).uniform(-a, a, dim)
    words = [w for w, f in zip(vocab, found, strict=True) if f]
    rows = [pad[None, :], np.zeros((1, dim)), found_vecs.reshape(-1, dim)]
    missing = [w for w, f in zip(vocab, found, strict=True) if not f]
    if oov == "fixed" and missing:
        words += missing
        rows.append(np.random.default_rng(seed + 1).uniform(-a, a, (len(missing), dim)))
    vectors = np.concatenate(rows).astype(np.float32)
    return WordTable(words, vectors, tokenizer, max_words, len(missing), source)


def word_vector_average_embedder(table: WordTable) -> Callable[[Sequence[str]], np.ndarray]:
    """GCLSR Table 2's "Word2vec embeddings (avg.)": mean of the word vectors of each sentence.

    No truncation; OOV tokens are skipped; a sentence whose tokens are all OOV gets a zero vector.
    """

    def embed(texts: Sequence[str]) -> np.ndarray:
        ids, mask = table.encode(texts, truncate=False)
        keep = mask & (ids != OOV_ID)
        sums = (table.vectors[ids] * keep[..., None]).sum(axis=1)
        counts = np.maximum(keep.sum(axis=1, keepdims=True), 1)
        return (sums / counts).astype(np.float32)

    return embed
