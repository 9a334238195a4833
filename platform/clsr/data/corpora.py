"""Training corpora: SimCSE's Wikipedia sentences and NLI pairs/triplets (methods.md §2, §3).

Offline, only samples exist locally (data README §5, §6, §9): an 11,914-line head of
``wiki1m_for_simcse.txt`` and ~120k gold-labelled NLI pairs from SNLI dev/test, MultiNLI dev and a
train sample, XNLI-en, "New Protocols" and counterfactual SNLI. ``build_simcse_triplets`` and
``build_sbert_v2_triplets`` turn any NLI pairs into the two papers' triplet formats.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from clsr.data.hub.manifest import SIMCSE_HUB_ID
from clsr.data.sources import DataUnavailableError, load_from_hub, local_dir, require_file

WIKI_FILES = ("wiki/wiki1m_for_simcse.txt", "wiki/wiki1m_for_simcse.head11914.txt")
NLI_FOR_SIMCSE_FILE = "nli/nli_for_simcse.csv"
LABELS = ("entailment", "neutral", "contradiction")  # index = HF integer label (SNLI, MNLI, XNLI)
_LABEL_NAMES = {**{name: name for name in LABELS}, **{str(i): name for i, name in enumerate(LABELS)}}


@dataclass(frozen=True)
class NLIPair:
    premise: str
    hypothesis: str
    label: str  # "entailment" | "neutral" | "contradiction"


@dataclass(frozen=True)
class _TableFormat:
    """A delimited NLI file with a header row (data README §9)."""

    pattern: str  # glob under the data root
    delimiter: str
    quoting: int  # QUOTE_NONE where quotes are literal text, QUOTE_MINIMAL where fields are quoted
    columns: tuple[str, str, str]  # premise, hypothesis, label


# SNLI dev/test (SentEval's three parallel files) are read separately; see _read_senteval_snli.
_NLI_TABLES = (
    _TableFormat(
        "nli/mnli_dev_csv/multinli_1.0_dev_*.csv", ",", csv.QUOTE_MINIMAL, ("sentence1", "sentence2", "label")
    ),
    _TableFormat(
        "nli/mnli_train_sample20k/mnli_train.tsv", "\t", csv.QUOTE_NONE, ("sentence1", "sentence2", "label")
    ),
    _TableFormat(
        "nli/snli_counterfactual_cad/*/*.tsv",
        "\t",
        csv.QUOTE_MINIMAL,
        ("sentence1", "sentence2", "gold_label"),
    ),
    # CRLF line endings and "" escapes; the duplicate "null" header names are never read.
    _TableFormat(
        "nli/nli_new_protocols_wiki/*/*.tsv",
        "\t",
        csv.QUOTE_MINIMAL,
        ("sentence1", "sentence2", "gold_label"),
    ),
    _TableFormat("nli/xnli_en_devtest/*.tsv", "\t", csv.QUOTE_NONE, ("premise", "hypothesis", "label")),
)
_SENTEVAL_SNLI = "nli/snli_senteval_devtest"


# --- Wikipedia ------------------------------------------------------------------------------------


def load_wiki_sentences(data_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """SimCSE's unsupervised corpus, one sentence per line; empty lines dropped.

    Local: the full ``wiki/wiki1m_for_simcse.txt`` if present, else the 11,914-line head. With neither a
    data folder nor the hub: the embedded sample (``clsr.data.embedded``).
    """
    root = local_dir(data_dir)
    if root is None:
        from clsr.data import embedded  # imports this module

        if embedded.serves_wiki():  # no data folder and no hub: the sample shipped in the package
            return list(embedded.wiki_sentences())
        data = load_from_hub(
            SIMCSE_HUB_ID, local_hint=WIKI_FILES[0], data_files="wiki1m_for_simcse.txt", split="train"
        )
        return _non_empty(data["text"])
    path = require_file(root, SIMCSE_HUB_ID, *WIKI_FILES)
    return _non_empty(path.read_text(encoding="utf-8-sig").splitlines())


def _non_empty(lines: Iterable[str]) -> list[str]:
    return [text for line in lines if (text := line.strip())]


# --- NLI pairs ------------------------------------------------------------------------------------


def load_nli_pairs(data_dir: str | os.PathLike[str] | None = None) -> list[NLIPair]:
    """Gold-labelled NLI pairs: SNLI + MultiNLI train from the hub, or every local NLI file.

    Pairs without a gold label (``-``, -1) or with an empty side are dropped; text is stripped.
    """
    root = local_dir(data_dir)
    if root is None:
        hint = "nli/... (the NLI files listed in the data README §5, §9)"
        rows: list[tuple[str, str, str]] = []
        for hub_id in ("stanfordnlp/snli", "nyu-mll/multi_nli"):
            data = load_from_hub(hub_id, local_hint=hint, split="train")
            rows += zip(data["premise"], data["hypothesis"], map(str, data["label"]), strict=True)
        return list(_pairs(rows))
    rows = [*_read_senteval_snli(root), *(row for fmt in _NLI_TABLES for row in _read_table(root, fmt))]
    if not rows:
        raise DataUnavailableError(
            f"no NLI files under {root / 'nli'}: expected e.g. {root / _SENTEVAL_SNLI}/s1.dev "
            "(see the data README §5, §9), or leave data_dir unset and go online for SNLI + MultiNLI."
        )
    return list(_pairs(rows))


def _pairs(rows: Iterable[tuple[str, str, str]]) -> Iterator[NLIPair]:
    for premise, hypothesis, label in rows:
        name = _LABEL_NAMES.get(label.strip().lower())
        premise, hypothesis = premise.strip(), hypothesis.strip()
        if name and premise and hypothesis:
            yield NLIPair(premise, hypothesis, name)


def _read_senteval_snli(root: Path) -> Iterator[tuple[str, str, str]]:
    """SentEval's SNLI: ``s1.<split>``, ``s2.<split>``, ``labels.<split>`` aligned line by line."""
    folder = root / _SENTEVAL_SNLI
    for split in ("dev", "test"):
        files = [folder / f"{name}.{split}" for name in ("s1", "s2", "labels")]
        if all(f.is_file() for f in files):
            columns = [f.read_text(encoding="utf-8-sig").splitlines() for f in files]
            yield from zip(*columns, strict=True)


def _read_table(root: Path, fmt: _TableFormat) -> Iterator[tuple[str, str, str]]:
    premise, hypothesis, label = fmt.columns
    for path in sorted(root.glob(fmt.pattern)):
        with path.open(encoding="utf-8-sig", newline="") as f:
            for row in csv.DictReader(f, delimiter=fmt.delimiter, quoting=fmt.quoting):
                yield row[premise], row[hypothesis], row[label]


# --- Triplets -------------------------------------------------------------------------------------


def _group(pairs: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, list[str]]]:
    """key sentence → label → other sentences, in first-seen order (deterministic, unlike sets)."""
    groups: dict[str, dict[str, list[str]]] = {}
    for key, other, label in pairs:
        groups.setdefault(key, {name: [] for name in LABELS})[label].append(other)
    return groups


def build_simcse_triplets(
    pairs: Iterable[NLIPair], seed: int = 0, neutral: bool = False
) -> list[dict[str, str]]:
    """Supervised SimCSE rows: one per (premise, entailment) whose premise has a contradiction.

    When the premise has several contradictions one is drawn with a seeded RNG (paper footnote 7).
    ``neutral``: keep only premises that also have a neutral hypothesis and add one, drawn the same
    way, as column ``neutral`` (SimCSE Table 7's "Contra.+Neutral" hard negatives).
    """
    rng = random.Random(seed)
    groups = _group((p.premise, p.hypothesis, p.label) for p in pairs)
    rows = []
    for premise, by_label in groups.items():
        if not by_label["contradiction"] or (neutral and not by_label["neutral"]):
            continue
        for positive in by_label["entailment"]:
            row = {"anchor": premise, "positive": positive, "negative": rng.choice(by_label["contradiction"])}
            if neutral:
                row["neutral"] = rng.choice(by_label["neutral"])
            rows.append(row)
    return rows


def build_sbert_v2_triplets(pairs: Iterable[NLIPair], seed: int = 0) -> list[dict[str, str]]:
    """SBERT-nli-v2 rows (``training_nli_v2.py``, methods.md §3), with a seeded RNG.

    Pairs are indexed in both directions (premise→hypothesis and hypothesis→premise); every key
    sentence with ≥1 entailment and ≥1 contradiction yields (key, e, c) and (e', key, c'), each
    partner drawn independently. Duplicate partners are kept once, as the original uses sets.
    """
    rng = random.Random(seed)
    both_ways = (
        (a, b, p.label) for p in pairs for a, b in ((p.premise, p.hypothesis), (p.hypothesis, p.premise))
    )
    rows: list[dict[str, str]] = []
    for key, by_label in _group(both_ways).items():
        entailments = list(dict.fromkeys(by_label["entailment"]))
        contradictions = list(dict.fromkeys(by_label["contradiction"]))
        if entailments and contradictions:
            rows.append(
                {"anchor": key, "positive": rng.choice(entailments), "negative": rng.choice(contradictions)}
            )
            rows.append(
                {"anchor": rng.choice(entailments), "positive": key, "negative": rng.choice(contradictions)}
            )
    return rows


# --- SimCSE's released triplets -------------------------------------------------------------------


def load_nli_for_simcse(data_dir: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """SimCSE's ``nli_for_simcse.csv`` (sent0, sent1, hard_neg) as anchor/positive/negative rows.

    Local ``nli/nli_for_simcse.csv`` if present, else the hub (also when a data_dir lacks the file,
    since the shared data never has it).
    """
    root = local_dir(data_dir)
    if root is not None and (root / NLI_FOR_SIMCSE_FILE).is_file():
        with (root / NLI_FOR_SIMCSE_FILE).open(encoding="utf-8-sig", newline="") as f:
            rows = [(r["sent0"], r["sent1"], r["hard_neg"]) for r in csv.DictReader(f)]
    else:
        data = load_from_hub(
            SIMCSE_HUB_ID,
            local_hint=NLI_FOR_SIMCSE_FILE,
            alternative="Or train on the data set 'nli_triplets' (SimCSE-style triplets built from the "
            "local NLI files) instead.",
            data_files="nli_for_simcse.csv",
            split="train",
        )
        rows = list(zip(data["sent0"], data["sent1"], data["hard_neg"], strict=True))
    return [{"anchor": a, "positive": p, "negative": n} for a, p, n in rows]
