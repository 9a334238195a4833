"""Turn rows of text into padded batches: tokenise once, pad each batch to its own longest sentence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def shuffled_batches(num_rows: int, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
    """A seeded permutation per epoch cut into full batches (``drop_last``, as SimCSE's trainer)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_rows)
    usable = (num_rows // batch_size) * batch_size
    return [order[i : i + batch_size].tolist() for i in range(0, usable, batch_size)]


class TextViewBatcher:
    """Holds token ids of every column a method reads; ``collate`` builds one forward pass.

    Sentences of a batch are laid out row-major: row 0 view 0, row 0 view 1, ..., so that the pooled
    output reshapes to ``(rows, views, dim)``. With ``length_group_size`` the batch tells the encoder to
    run its sentences in groups of similar length (``TransformerEncoder.forward``).
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
        self.ids: dict[str, list[list[int]]] = {}
        for column in dict.fromkeys(self.views):
            texts = [row[column] for row in rows]
            encoded = tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True)
            self.ids[column] = encoded["input_ids"]

    def __len__(self) -> int:
        return self.num_rows

    def collate(self, indices: Sequence[int]) -> dict[str, Any]:
        sequences = [self.ids[view][i] for i in indices for view in self.views]
        longest = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
        for row, seq in enumerate(sequences):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[row, : len(seq)] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "num_rows": len(indices)}
        return batch | ({"length_group_size": self.length_group_size} if self.length_group_size else {})


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
