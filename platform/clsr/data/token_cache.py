"""Token ids of a column of training text, cached on disk by HF ``datasets`` so that the next trial (or
study) on the same rows, tokenizer and length reads them instead of tokenising again.

The column becomes a ``datasets.Dataset``; ``Dataset.map`` tokenises it in batches into fixed-width
int32 ids plus lengths and writes the result to an Arrow file named by a fingerprint of everything the
ids depend on (the texts, the tokenizer's full serialised state, ``max_length``), which ``datasets``
loads instead of mapping again (``load_from_cache_file``); ``datasets`` writes it to a temporary file
and renames it, so trials starting together on one node never read half a file. Only fast (Rust) tokenizers are cached,
since their state serialises exactly; small columns are tokenised directly (cheaper than a file).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MIN_CACHED_TEXTS = 20_000  # below this a direct call is faster than writing and reading a file
CACHE_FOLDER = "clsr-token-ids"


def cache_dir() -> Path:
    """``$HF_DATASETS_CACHE/clsr-token-ids`` (``datasets``' own cache folder when unset)."""
    import datasets

    return Path(os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE) / CACHE_FOLDER


def fingerprint(texts: Sequence[str], tokenizer: Any, max_length: int) -> str | None:
    """What the ids depend on, hashed; None for a tokenizer whose state cannot be serialised."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    digest = hashlib.sha256()
    digest.update(backend.to_str().encode())
    digest.update(f"|{max_length}|{len(texts)}|".encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets
    from datasets.utils import logging as ds_logging

    was_disabled = datasets.are_progress_bars_disabled()
    level = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    try:
        yield
    finally:
        ds_logging.set_verbosity(level)
        if not was_disabled:
            datasets.enable_progress_bars()


def token_ids(
    texts: Sequence[str], tokenizer: Any, max_length: int
) -> list[list[int]] | tuple[np.ndarray, np.ndarray]:
    """The ids of ``texts``: a list of id lists (tokenised directly), or ``(ids, lengths)`` with ``ids`` an
    int32 ``(len(texts), max_length)`` table padded with the pad id, read from or written to the cache."""
    key = fingerprint(texts, tokenizer, max_length) if len(texts) >= MIN_CACHED_TEXTS else None
    if key is None:
        return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    import datasets

    pad_id = tokenizer.pad_token_id or 0

    def encode(batch: dict[str, list[str]]) -> dict[str, Any]:
        ids = tokenizer(batch["text"], truncation=True, max_length=max_length)["input_ids"]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int32, count=len(ids))
        table = np.full((len(ids), max_length), pad_id, dtype=np.int32)
        for row, sequence in enumerate(ids):
            table[row, : len(sequence)] = sequence
        return {"ids": table, "length": lengths}

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.arrow"
    with _quiet_datasets():
        if path.is_file():  # an earlier trial's: memory-mapped, nothing tokenised
            return _table(datasets.Dataset.from_file(str(path)), len(texts), max_length)
        column = datasets.Dataset.from_dict({"text": list(texts)})
        encoded = column.map(
            encode,
            batched=True,
            batch_size=10_000,
            remove_columns=["text"],
            cache_file_name=str(path),
            new_fingerprint=key,
            features=datasets.Features(
                {
                    "ids": datasets.Sequence(datasets.Value("int32"), length=max_length),
                    "length": datasets.Value("int32"),
                }
            ),
        )
        return _table(encoded, len(texts), max_length)


def _table(encoded: Any, rows: int, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    table = encoded.with_format("arrow")[:]  # one Arrow table: no per-row conversion
    ids = table.column("ids").combine_chunks().flatten().to_numpy().reshape(rows, max_length)
    return ids.astype(np.int32), table.column("length").to_numpy().astype(np.int64)  # writable copies
