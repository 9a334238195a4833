"""SupMPN training rows (Dehghan & Amasyali 2022; methods.md §4.1–4.2) and the paper's Table 1 counts.

A SupMPN row is ``(anchor; positive_1..P; negative_1..Q)`` with P = Q = 5 in the paper: premises are
anchors, their entailment hypotheses positives and their contradiction hypotheses negatives;
neutral hypotheses are not used. The paper's data-building code is not released, so the rules for
short rows follow the reading in methods.md §4.2 (items 3–5, all **[unverified]**):

* more than P entailments (or Q contradictions): the first P (Q) in file order;
* fewer than P entailments: the remaining slots hold verbatim copies of the premise ("we simply
  copy each anchor several times as its positive samples"); Table A1's alternatives instead fill
  them with augmented copies of the row's own entailments (``augment``, see
  :mod:`clsr.augment.positives`);
* fewer than Q contradictions: the remaining slots hold hypotheses (entailment or contradiction)
  of *other* premises, drawn uniformly with a seeded RNG, never one of the row's own texts.

Premises are grouped by identical (stripped) text; duplicate hypotheses of a premise are kept once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from clsr.data.corpora import NLIPair

Row = dict[str, str]
Augment = Callable[[str, random.Random], str]

# Paper Table 1 (full train splits), for comparison in format_table1.
PAPER_TABLE1_SNLI = {"exactly_one": 139_299, "two_to_four": 1_890, "five_or_more": 7_956}
PAPER_TABLE1_MNLI = {1: 125_860, 2: 1_783, 3: 489}  # premises with exactly k of each


@dataclass(frozen=True)
class PremiseGroup:
    """One premise with its distinct entailment and contradiction hypotheses, in first-seen order."""

    premise: str
    entailments: tuple[str, ...]
    contradictions: tuple[str, ...]


def group_by_premise(pairs: Iterable[NLIPair]) -> dict[str, PremiseGroup]:
    """premise → :class:`PremiseGroup`, in first-seen order of the premises and of their hypotheses.

    Neutral pairs are ignored, so a premise seen only with neutral hypotheses has no group.
    A hypothesis repeated under the same premise and label is kept once.
    """
    found: dict[str, tuple[dict[str, None], dict[str, None]]] = {}
    for pair in pairs:
        if pair.label == "neutral":
            continue
        entailments, contradictions = found.setdefault(pair.premise, ({}, {}))
        (entailments if pair.label == "entailment" else contradictions)[pair.hypothesis] = None
    return {
        premise: PremiseGroup(premise, tuple(entailments), tuple(contradictions))
        for premise, (entailments, contradictions) in found.items()
    }


# --- Table 1 --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table1Stats:
    """SupMPN Table 1 counts over premises, from distinct entailment (E) and contradiction (C) hypotheses.

    The three SNLI bins of the paper, "of each" read as a condition on both counts:
    ``exactly_one``: E = C = 1; ``two_to_four``: 2 ≤ E ≤ 4 and 2 ≤ C ≤ 4; ``five_or_more``: E ≥ 5
    and C ≥ 5. The MNLI rows ("exactly 1/2/3") are ``balanced[k]``: premises with E = C = k.
    Premises outside the three bins are counted too, so the bins can be regrouped: ``mixed`` (≥1 of
    each but e.g. 1 E + 2 C, or 3 E + 6 C), ``no_contradiction``, ``no_entailment`` and
    ``neutral_only``; the eight counts from ``exactly_one`` on sum to ``premises``.
    """

    pairs: int
    premises: int
    exactly_one: int
    two_to_four: int
    five_or_more: int
    mixed: int
    no_contradiction: int
    no_entailment: int
    neutral_only: int
    balanced: dict[int, int] = field(default_factory=dict)

    @property
    def with_both(self) -> int:
        """Premises with ≥1 entailment and ≥1 contradiction: the rows of ``build_supmpn_rows``."""
        return self.exactly_one + self.two_to_four + self.five_or_more + self.mixed


def _bin(entailments: int, contradictions: int) -> str:
    if entailments == 0 and contradictions == 0:
        return "neutral_only"
    if contradictions == 0:
        return "no_contradiction"
    if entailments == 0:
        return "no_entailment"
    if entailments == contradictions == 1:
        return "exactly_one"
    if 2 <= entailments <= 4 and 2 <= contradictions <= 4:
        return "two_to_four"
    if entailments >= 5 and contradictions >= 5:
        return "five_or_more"
    return "mixed"


def table1_statistics(pairs: Iterable[NLIPair]) -> Table1Stats:
    """The paper's Table 1 grouping statistics for a set of NLI pairs (see :class:`Table1Stats`)."""
    pairs = list(pairs)
    groups = group_by_premise(pairs)
    premises = dict.fromkeys(pair.premise for pair in pairs)
    bins: Counter[str] = Counter()
    balanced: Counter[int] = Counter()
    for premise in premises:
        group = groups.get(premise)
        e, c = (len(group.entailments), len(group.contradictions)) if group else (0, 0)
        bins[_bin(e, c)] += 1
        if e == c > 0:
            balanced[e] += 1
    return Table1Stats(
        pairs=len(pairs),
        premises=len(premises),
        exactly_one=bins["exactly_one"],
        two_to_four=bins["two_to_four"],
        five_or_more=bins["five_or_more"],
        mixed=bins["mixed"],
        no_contradiction=bins["no_contradiction"],
        no_entailment=bins["no_entailment"],
        neutral_only=bins["neutral_only"],
        balanced=dict(sorted(balanced.items())),
    )


def format_table1(stats: Table1Stats, title: str | None = None) -> str:
    """A Markdown table of :class:`Table1Stats`, with the paper's full-train numbers for comparison."""
    snli = PAPER_TABLE1_SNLI
    ks = sorted({*PAPER_TABLE1_MNLI, *stats.balanced})
    lines = [f"### {title}", ""] if title else []
    lines += [
        f"{stats.pairs:,} pairs, {stats.premises:,} distinct premises "
        "(counts of distinct entailment E / contradiction C hypotheses per premise)",
        "",
        "| premises with | count | paper, SNLI train |",
        "|---|---:|---:|",
        f"| exactly 1 E and 1 C | {stats.exactly_one:,} | {snli['exactly_one']:,} |",
        f"| 2–4 E and 2–4 C | {stats.two_to_four:,} | {snli['two_to_four']:,} |",
        f"| ≥5 E and ≥5 C | {stats.five_or_more:,} | {snli['five_or_more']:,} |",
        f"| ≥1 of each, other mixes (e.g. 1 E + 2 C) | {stats.mixed:,} | |",
        f"| **≥1 E and ≥1 C (SupMPN rows)** | **{stats.with_both:,}** | |",
        f"| E but no C | {stats.no_contradiction:,} | |",
        f"| C but no E | {stats.no_entailment:,} | |",
        f"| neutral hypotheses only | {stats.neutral_only:,} | |",
        "",
        "| exactly k E and k C (MNLI-style rows) | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---:|" * len(ks),
        "| premises | " + " | ".join(f"{stats.balanced.get(k, 0):,}" for k in ks) + " |",
        "| paper, MNLI train | "
        + " | ".join(f"{PAPER_TABLE1_MNLI[k]:,}" if k in PAPER_TABLE1_MNLI else "" for k in ks)
        + " |",
    ]
    return "\n".join(lines)


# --- rows -----------------------------------------------------------------------------------------


def supmpn_columns(positives: int = 5, negatives: int = 5) -> tuple[str, ...]:
    """``anchor, positive_1..positive_P, negative_1..negative_Q``."""
    return (
        "anchor",
        *(f"positive_{k}" for k in range(1, positives + 1)),
        *(f"negative_{k}" for k in range(1, negatives + 1)),
    )


def _as_groups(
    pairs_or_groups: Iterable[NLIPair] | Iterable[PremiseGroup] | Mapping[str, PremiseGroup],
) -> list[PremiseGroup]:
    if isinstance(pairs_or_groups, Mapping):
        return list(pairs_or_groups.values())
    items = list(pairs_or_groups)
    if all(isinstance(item, PremiseGroup) for item in items):
        return items  # type: ignore[return-value]
    return list(group_by_premise(items).values())  # type: ignore[arg-type]


def _sample_other(
    pool: Sequence[str], exclude: set[str], count: int, rng: random.Random, premise: str
) -> list[str]:
    """``count`` distinct texts drawn uniformly from ``pool`` (distinct texts), none in ``exclude``."""
    chosen: list[str] = []
    taken = set(exclude)
    for _ in range(50 * count + 50):  # rejection sampling: the pool is normally far larger than a row
        if len(chosen) == count:
            return chosen
        text = pool[rng.randrange(len(pool))]
        if text not in taken:
            chosen.append(text)
            taken.add(text)
    eligible = [text for text in pool if text not in taken]  # tiny pools: draw from what is left
    if len(eligible) < count - len(chosen):
        raise ValueError(
            f"premise {premise!r} needs {count} sampled negatives but only {len(chosen) + len(eligible)} "
            "hypotheses of other premises are available; use fewer negatives or more NLI pairs"
        )
    return chosen + rng.sample(eligible, count - len(chosen))


def _augmented(augment: Augment | None, text: str, rng: random.Random) -> str:
    new = augment(text, rng) if augment is not None else text
    return new if new.strip() else text


def build_supmpn_rows(
    pairs_or_groups: Iterable[NLIPair] | Iterable[PremiseGroup] | Mapping[str, PremiseGroup],
    positives: int = 5,
    negatives: int = 5,
    seed: int = 0,
    positive_fill: Literal["anchor", "entailment"] = "anchor",
    augment: Augment | None = None,
    require_contradiction: bool = True,
) -> list[Row]:
    """SupMPN rows ``{anchor, positive_1..P, negative_1..Q}``, one per premise, in first-seen order.

    Which premises make a row: those with ≥1 entailment and, by default, ≥1 contradiction. The
    paper's data are the premises of its Table 1, all of which have both (SNLI 139,299 + 1,890 +
    7,956 and MNLI 125,860 + 1,783 + 489 = 277,277, its "≈280k premises"), and every other NLI
    recipe it builds on (SimCSE's triplets) also requires a contradiction; a premise without one
    would have only randomly sampled negatives. ``require_contradiction=False`` also keeps those.

    Positives: the premise's first P entailments; the remaining slots are filled with

    * ``positive_fill="anchor"`` (default, the paper): verbatim copies of the premise;
    * ``positive_fill="entailment"``: verbatim copies of the row's own entailments, cycling;
    * ``augment`` given (a ``(text, rng) -> text`` callable, Table A1's RD / SR / PP): augmented copies
      of the row's own entailments, cycling through them, a fresh draw per slot (this overrides
      ``positive_fill``). An augmenter with a ``prepare(texts)`` method (the paraphraser) is first
      given every entailment it will see, so it can work in batches. An empty result falls back to
      the entailment itself.

    Negatives: the premise's first Q contradictions, then hypotheses (entailment or contradiction)
    of other rows' premises, drawn uniformly from their distinct texts with ``random.Random(seed)``,
    never the row's anchor, entailments or contradictions, and never twice in a row.

    Deterministic for a given input order and seed (augmentation draws use a separate seeded stream,
    so changing ``augment`` never changes the sampled negatives).
    """
    if positives < 1 or negatives < 0:
        raise ValueError(f"need positives >= 1 and negatives >= 0, got P={positives}, Q={negatives}")
    if positive_fill not in ("anchor", "entailment"):
        raise ValueError(f"positive_fill must be 'anchor' or 'entailment', got {positive_fill!r}")
    groups = [
        g
        for g in _as_groups(pairs_or_groups)
        if g.entailments and (g.contradictions or not require_contradiction)
    ]
    pool = list(dict.fromkeys(text for g in groups for text in (*g.entailments, *g.contradictions)))
    fill = "augment" if augment is not None else positive_fill
    if augment is not None and hasattr(augment, "prepare"):
        augment.prepare(  # type: ignore[attr-defined]
            list(dict.fromkeys(e for g in groups if len(g.entailments) < positives for e in g.entailments))
        )
    negative_rng = random.Random(seed)
    augment_rng = random.Random(f"supmpn-augment/{seed}")
    rows: list[Row] = []
    for g in groups:
        own = list(g.entailments[:positives])
        missing = positives - len(own)
        if fill == "anchor":
            extra = [g.premise] * missing
        else:
            sources = [g.entailments[k % len(g.entailments)] for k in range(missing)]
            extra = (
                sources if fill == "entailment" else [_augmented(augment, s, augment_rng) for s in sources]
            )
        negs = list(g.contradictions[:negatives])
        if len(negs) < negatives:
            exclude = {g.premise, *g.entailments, *g.contradictions}
            negs += _sample_other(pool, exclude, negatives - len(negs), negative_rng, g.premise)
        row = {"anchor": g.premise}
        row.update({f"positive_{k}": text for k, text in enumerate(own + extra, 1)})
        row.update({f"negative_{k}": text for k, text in enumerate(negs, 1)})
        rows.append(row)
    return rows
