"""Named training data sets (``data.train`` in a study) and their row format.

Every data set yields rows ``{column: text}`` with the columns a method asks for: ``text`` for
unsupervised corpora, ``anchor``/``positive``[/``negative``[/``neutral``]] for pairs and triplets,
``anchor``/``positive_1..5``/``negative_1..5`` for SupMPN's rows (``nli_supmpn``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from clsr.data.corpora import (
    NLI_FOR_SIMCSE_FILE,
    SIMCSE_HUB_ID,
    build_sbert_v2_triplets,
    build_simcse_triplets,
    load_nli_for_simcse,
    load_nli_pairs,
    load_wiki_sentences,
)
from clsr.data.ordered_text import load_wiki_ordered, wiki_ordered_unavailable
from clsr.data.pair_sources import (
    ANLI_FILES,
    ANLI_HUB_ID,
    FLICKR_FILE,
    FLICKR_HUB_ID,
    PARANMT_FILE,
    PARANMT_RELEASE,
    QQP_FILE,
    QQP_HUB_ID,
    load_flickr30k_pairs,
    load_nli_anli_for_simcse,
    load_paranmt_pairs,
    load_qqp_pairs,
)
from clsr.data.sources import files_or_hub_unavailable, resolve_data_dir
from clsr.data.supmpn_rows import build_supmpn_rows, supmpn_columns

Row = dict[str, str]
TRIPLET = ("anchor", "positive", "negative")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    columns: tuple[str, ...]
    description: str
    loader: Callable[[Path | None, int], list[Row]]  # (data_dir or None for the hub, seed) → rows
    # Checked before a study starts: why the set cannot be loaded here (data folder or None) → None when it
    # can. Unset: its loader says, at load (sets read from the shared data folder's files, or the hub).
    unavailable: Callable[[Path | None], str | None] | None = None
    ordered: bool = False  # rows in the text's order, with a ``document`` column (next-sentence positives)


def _wiki1m(data_dir: Path | None, seed: int) -> list[Row]:
    return [{"text": sentence} for sentence in load_wiki_sentences(data_dir)]


def _nli_for_simcse(data_dir: Path | None, seed: int) -> list[Row]:
    return load_nli_for_simcse(data_dir)


def _nli_triplets(data_dir: Path | None, seed: int) -> list[Row]:
    return build_simcse_triplets(load_nli_pairs(data_dir), seed)


def _nli_triplets_neutral(data_dir: Path | None, seed: int) -> list[Row]:
    return build_simcse_triplets(load_nli_pairs(data_dir), seed, neutral=True)


def _nli_sbert_v2(data_dir: Path | None, seed: int) -> list[Row]:
    return build_sbert_v2_triplets(load_nli_pairs(data_dir), seed)


def _nli_pairs_of(*labels: str) -> Callable[[Path | None, int], list[Row]]:
    """(premise, hypothesis) pairs of the NLI pairs whose gold label is one of ``labels``, as positives
    (SimCSE Table 4: each label's pairs, and all three together, as the supervised pairs)."""

    def load(data_dir: Path | None, seed: int) -> list[Row]:
        pairs = load_nli_pairs(data_dir)
        return [{"anchor": p.premise, "positive": p.hypothesis} for p in pairs if p.label in labels]

    return load


def _qqp_pairs(data_dir: Path | None, seed: int) -> list[Row]:
    return load_qqp_pairs(data_dir)


def _flickr30k_pairs(data_dir: Path | None, seed: int) -> list[Row]:
    return load_flickr30k_pairs(data_dir)


def _nli_anli_for_simcse(data_dir: Path | None, seed: int) -> list[Row]:
    return load_nli_anli_for_simcse(data_dir, seed)


def _paranmt_pairs(data_dir: Path | None, seed: int) -> list[Row]:
    return load_paranmt_pairs(data_dir)


def _wiki_ordered(data_dir: Path | None, seed: int) -> list[Row]:
    return load_wiki_ordered(data_dir)


def _nli_supmpn(data_dir: Path | None, seed: int) -> list[Row]:
    return build_supmpn_rows(load_nli_pairs(data_dir), positives=5, negatives=5, seed=seed)


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "wiki1m",
            ("text",),
            "SimCSE's 10^6 Wikipedia sentences (unsupervised); locally the full file or its 11,914-line head",
            _wiki1m,
        ),
        DatasetSpec(
            "wiki_ordered",
            ("text", "document"),
            "consecutive sentences of English Wikipedia articles, 10^6 (SimCSE Table 2's next-sentence "
            "rows; hub wikimedia/wikipedia 20231101.en, split with NLTK's Punkt, or wiki/wiki_ordered.txt)",
            _wiki_ordered,
            unavailable=wiki_ordered_unavailable,
            ordered=True,
        ),
        DatasetSpec(
            "nli_for_simcse",
            TRIPLET,
            "SimCSE's released SNLI+MNLI triplets (nli_for_simcse.csv, 275,601 rows; hub or local file)",
            _nli_for_simcse,
            unavailable=lambda root: files_or_hub_unavailable(root, (NLI_FOR_SIMCSE_FILE,), SIMCSE_HUB_ID),
        ),
        DatasetSpec(
            "nli_triplets",
            TRIPLET,
            "SimCSE-style (premise, entailment, seeded contradiction) built from the NLI pairs",
            _nli_triplets,
        ),
        DatasetSpec(
            "nli_triplets_neutral",
            (*TRIPLET, "neutral"),
            "nli_triplets with a seeded neutral hypothesis per row (premises with an E, a C and an N; "
            "SimCSE Table 7)",
            _nli_triplets_neutral,
        ),
        DatasetSpec(
            "nli_sbert_v2",
            TRIPLET,
            "SBERT-nli-v2 triplets: both directions, two rows per sentence with an E and a C (seeded)",
            _nli_sbert_v2,
        ),
        DatasetSpec(
            "nli_pairs",
            ("anchor", "positive"),
            "(premise, entailment hypothesis) pairs from the NLI pairs",
            _nli_pairs_of("entailment"),
        ),
        DatasetSpec(
            "nli_neutral_pairs",
            ("anchor", "positive"),
            "(premise, neutral hypothesis) pairs from the NLI pairs, as positives (SimCSE Table 4)",
            _nli_pairs_of("neutral"),
        ),
        DatasetSpec(
            "nli_contradiction_pairs",
            ("anchor", "positive"),
            "(premise, contradiction hypothesis) pairs from the NLI pairs, as positives (SimCSE Table 4)",
            _nli_pairs_of("contradiction"),
        ),
        DatasetSpec(
            "nli_all_pairs",
            ("anchor", "positive"),
            "every gold-labelled (premise, hypothesis) pair of the NLI pairs, as positives (SimCSE Table 4)",
            _nli_pairs_of("entailment", "neutral", "contradiction"),
        ),
        DatasetSpec(
            "qqp_pairs",
            ("anchor", "positive"),
            "QQP's duplicate question pairs of GLUE's train split (134,378; SimCSE Table 4; hub or "
            "qqp/train.tsv)",
            _qqp_pairs,
            unavailable=lambda root: files_or_hub_unavailable(root, (QQP_FILE,), QQP_HUB_ID, "qqp"),
        ),
        DatasetSpec(
            "flickr30k_pairs",
            ("anchor", "positive"),
            "every two captions of one Flickr30k image (317,830; SimCSE Table 4; hub or "
            "flickr30k/flickr30k_captions.jsonl.gz)",
            _flickr30k_pairs,
            unavailable=lambda root: files_or_hub_unavailable(root, (FLICKR_FILE,), FLICKR_HUB_ID),
        ),
        DatasetSpec(
            "nli_anli_for_simcse",
            TRIPLET,
            "nli_for_simcse followed by SimCSE-style triplets of ANLI's training rounds (SimCSE Table 4's "
            "+ ANLI; hub or anli/R1-R3/train.jsonl)",
            _nli_anli_for_simcse,
            unavailable=lambda root: (  # each part from its files or its hub copy
                files_or_hub_unavailable(root, (NLI_FOR_SIMCSE_FILE,), SIMCSE_HUB_ID)
                or files_or_hub_unavailable(root, ANLI_FILES, ANLI_HUB_ID)
            ),
        ),
        DatasetSpec(
            "paranmt_pairs",
            ("anchor", "positive"),
            "ParaNMT's filtered 5m paraphrase pairs (SimCSE Table 4; local only: "
            "paranmt/para-nmt-5m-processed.txt, Wieting & Gimpel's release)",
            _paranmt_pairs,
            unavailable=lambda root: files_or_hub_unavailable(
                root, (PARANMT_FILE,), None, hint=PARANMT_RELEASE
            ),
        ),
        DatasetSpec(
            "nli_supmpn",
            supmpn_columns(5, 5),
            "SupMPN rows: premise, 5 entailments (anchor copies fill), 5 contradictions (seeded fill "
            "from other premises' hypotheses); one per premise with an E and a C",
            _nli_supmpn,
        ),
    )
}


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; allowed: {', '.join(DATASETS)}")
    return DATASETS[name]


def dataset_columns(name: str) -> tuple[str, ...]:
    return _spec(name).columns


def is_ordered(name: str) -> bool:
    """A catalogue set whose rows are a text in order (a ``document`` column): next-sentence positives."""
    return name in DATASETS and DATASETS[name].ordered


def unavailable(name: str, data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Why catalogue set ``name`` cannot be loaded here (None: it can, or its loader will say): read from
    file names, the environment and, when no offline flag is set, one connection to the hub."""
    check = _spec(name).unavailable
    why = check(resolve_data_dir(data_dir)) if check is not None else None
    return f"data.train {name}: {why}" if why else None


@lru_cache(maxsize=8)
def _cached_rows(name: str, data_dir: Path | None, seed: int) -> tuple[Row, ...]:
    return tuple(DATASETS[name].loader(data_dir, seed))


def load_rows(
    name: str, data_dir: str | os.PathLike[str] | None = None, max_rows: int | None = None, seed: int = 0
) -> list[Row]:
    """Rows of a catalogue data set; ``data_dir`` falls back to ``$CLSR_DATA_DIR``, then the hub.

    ``max_rows`` keeps a seeded random subset (in the original order), so a smoke run sees varied
    data rather than the first lines of a file. Loading is cached per (name, data_dir, seed); the
    returned rows are copies, so callers may modify them.
    """
    _spec(name)
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    rows = _cached_rows(name, resolve_data_dir(data_dir), seed)
    return [dict(row) for row in seeded_subset(rows, max_rows, seed)]


def seeded_subset(rows: Sequence[Row], max_rows: int | None, seed: int) -> Sequence[Row]:
    """``max_rows`` rows drawn with ``seed``, kept in their original order (all rows when None)."""
    if max_rows is None or max_rows >= len(rows):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), max_rows))
    return [rows[i] for i in keep]
