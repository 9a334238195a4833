"""Turn rows of text into padded batches: tokenise once, pad each batch to its own longest sentence."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from clsr.data.token_cache import token_ids


def shuffled_batches(num_rows: int, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
    """A seeded permutation per epoch cut into full batches (``drop_last``, as SimCSE's trainer)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_rows)
    usable = (num_rows // batch_size) * batch_size
    return [order[i : i + batch_size].tolist() for i in range(0, usable, batch_size)]


@contextlib.contextmanager
def parallel_tokenisation() -> Iterator[None]:
    """The fast tokenizer's batch encoding on its own thread pool, for the calls inside.

    The study runner sets ``TOKENIZERS_PARALLELISM=false`` for every Ray process: a process that forks
    after the Rust pool has run can deadlock in the child, and the library warns at every fork. A trial
    tokenises its training rows once, before it starts anything, so that one call may use the pool: the
    variable is ``true`` inside and restored after (a set variable also keeps the fork warning quiet),
    and the pool gets the trial's CPUs (``OMP_NUM_THREADS``, as Ray sets it) unless
    ``RAYON_NUM_THREADS`` says otherwise (the pool reads it once, when it starts)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    if os.environ.get("OMP_NUM_THREADS"):
        os.environ.setdefault("RAYON_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class TextViewBatcher:
    """Holds token ids of every column a method reads; ``collate`` builds one forward pass.

    Sentences of a batch are laid out row-major: row 0 view 0, row 0 view 1, ..., so that the pooled
    output reshapes to ``(rows, views, dim)``. With ``length_group_size`` the batch tells the encoder to
    run its sentences in groups of similar length (``TransformerEncoder.forward``).

    Each column is tokenised once (the fast tokenizer encodes the list in one call, on its own threads:
    ``parallel_tokenisation``; a large column's ids are cached by ``datasets`` for the next trial:
    ``clsr.data.token_cache``) and padded once into a contiguous int32 table with the lengths beside it, so that ``collate`` is
    tensor indexing: building a batch one sentence at a time in Python took 88 ms for 512 triplets.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, str]],
        views: Sequence[str],
        tokenizer: Any,
        max_length: int,
        length_group_size: int | None = None,
    ):
        self.views = tuple(views)
        self.length_group_size = length_group_size  # the encoder's length groups (trainer.length_group_size)
        self.num_rows = len(rows)
        self.pad_id = tokenizer.pad_token_id or 0
        with parallel_tokenisation():  # cached by datasets for large columns (clsr.data.token_cache)
            encoded = {
                column: token_ids([row[column] for row in rows], tokenizer, max_length)
                for column in dict.fromkeys(self.views)
            }
        lengths = {column: _lengths(ids) for column, ids in encoded.items()}
        width = max((int(n.max()) for n in lengths.values() if len(n)), default=1)
        self.tokens: dict[str, torch.Tensor] = {}  # column -> (rows, width) int32, padded with pad_id
        self.lengths: dict[str, torch.Tensor] = {}  # column -> (rows,) int64
        for column, ids in encoded.items():
            if isinstance(ids, tuple):  # a cached (rows, max_length) table
                table = np.ascontiguousarray(ids[0][:, :width])
            else:
                table = np.full((len(ids), width), self.pad_id, dtype=np.int32)
                # row-major: the True cells of the mask, in order, are the concatenated sequences
                table[np.arange(width) < lengths[column][:, None]] = np.fromiter(
                    itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths[column].sum())
                )
            self.tokens[column] = torch.from_numpy(table)
            self.lengths[column] = torch.from_numpy(lengths[column])

    def __len__(self) -> int:
        return self.num_rows

    def collate(self, indices: Sequence[int]) -> dict[str, Any]:
        rows = torch.as_tensor(list(indices), dtype=torch.long)
        lengths = torch.stack([self.lengths[view][rows] for view in self.views], dim=1).reshape(-1)
        longest = int(lengths.max())
        input_ids = torch.stack([self.tokens[view][rows, :longest] for view in self.views], dim=1)
        input_ids = input_ids.reshape(-1, longest).long()
        attention_mask = (torch.arange(longest) < lengths[:, None]).long()
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "num_rows": len(rows)}
        return batch | ({"length_group_size": self.length_group_size} if self.length_group_size else {})


def _lengths(ids: list[list[int]] | tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    if isinstance(ids, tuple):
        return ids[1].astype(np.int64)
    return np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))


def no_duplicate_batches(
    rows: Sequence[dict[str, str]], columns: Sequence[str], batch_size: int, epoch: int, seed: int
) -> list[list[int]]:
    """sentence-transformers' ``NoDuplicatesDataLoader`` (methods.md §3): greedy batches from a shuffled
    list that skip any row sharing a text (stripped, lower-cased) with the batch so far; skipped rows
    wait for the next pass. The epoch has ``len(rows) // batch_size`` batches, and the list is
    reshuffled whenever the pointer wraps."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(rows)).tolist()
    pointer, batches = 0, []
    for _ in range(len(rows) // batch_size):
        batch: list[int] = []
        seen: set[str] = set()
        scanned = 0
        while len(batch) < batch_size:
            if scanned >= len(order):
                raise ValueError(
                    f"cannot fill a batch of {batch_size} rows without duplicate texts; lower trainer.batch_size"
                )
            if pointer >= len(order):
                order = rng.permutation(len(rows)).tolist()
                pointer = 0
            index = order[pointer]
            pointer += 1
            scanned += 1
            texts = {rows[index][c].strip().lower() for c in columns}
            if texts & seen:
                continue
            seen |= texts
            batch.append(index)
        batches.append(batch)
    return batches


def text_batches(
    rows: Sequence[dict[str, str]],
    columns: Sequence[str],
    batch_size: int,
    epoch: int,
    seed: int,
    no_duplicates: bool,
) -> list[list[int]]:
    """The batch order of the in-batch-negative methods: NoDuplicates batches over ``columns`` (a text
    seen twice in a batch would be its own negative), or plain shuffled batches."""
    if not no_duplicates:
        return shuffled_batches(len(rows), batch_size, epoch, seed)
    return no_duplicate_batches(rows, columns, batch_size, epoch, seed)
