"""FAQ retrieval evaluation (RCL, methods.md §6.5): Acc@1/3/5 and MAP with 5-fold cross-validation.

Protocol, for a frozen encoder:

* Every query and every FAQ item is embedded once (one embedder call per data set, distinct texts
  only). An item is embedded as its question and answer joined by a space (``candidate=
  "question_answer"``, the default; ``"question"`` or ``"answer"`` alone are options). Which text
  the paper embedded is **[unverified]**.
* Each query ranks the **whole** FAQ collection by cosine similarity (the pool is never split).
  Ties are broken by collection order (the earlier item ranks first; a stable sort), so scores are
  deterministic; identical texts get identical vectors and therefore tie exactly.
* Acc@k: the fraction of queries with **any** relevant item among the k first. AP of a query:
  the mean, over its R relevant items, of the precision at the rank of each (every item is ranked,
  so all R are retrieved); MAP: the mean AP (Karan & Šnajder 2018). Reported values are × 100.
* 5-fold cross-validation: the queries are split into ``folds`` seeded folds of (near-)equal size;
  each fold's queries are scored against the whole collection and the reported value is the mean
  over the folds (the per-fold values are kept). For an encoder that is not trained on the other
  folds this equals the mean over all queries up to the unequal fold sizes; the folds are what a
  training run would use as its test splits.

``max_queries`` keeps a seeded subsample of the queries (smoke runs); the collection stays whole
unless ``max_items`` also cuts it to a seeded subset that keeps every item relevant to a kept query
(smoke runs only: a smaller pool makes retrieval easier, so those scores are not comparable).
A model trained on fold f of an FAQ set (``data.train: faq:<set>``, ``data.fold: f``; clsr.data.faq's
``fold_split``) is scored on that set's fold-f test queries only (``test_fold``; the five folds' trials
are averaged by the study, as seeds are), and selected on the MAP of the fold's dev queries
(``dev_map``). Other FAQ sets are scored as above.
A request for the ``faq`` group scores every FAQ data set whose files are present and skips (with a
warning) the ones that are not; a data set named explicitly must be present.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from clsr.data.faq import CANDIDATE_FIELDS, FAQ_TASKS, FOLD_SEED, FAQData, fold_split, load_faq, query_folds
from clsr.data.sources import DataUnavailableError, resolve_data_dir

if TYPE_CHECKING:
    from clsr.encoders.embed import Embedder

SEED = FOLD_SEED
KS = (1, 3, 5)
GROUP = "faq"
DISPLAY_NAMES = {"stackfaq": "StackFAQ", "faqir": "FAQIR", "cough": "COUGH"}


@dataclass
class FAQScore:
    dataset: str
    top1: float  # Acc@1 × 100, mean over the folds
    top3: float
    top5: float
    map: float  # MAP × 100, mean over the folds
    queries: int  # queries scored (after max_queries)
    candidates: int  # FAQ items ranked for every query
    folds: list[dict[str, float]] = field(default_factory=list)  # per fold: top1/top3/top5/map, queries
    candidate: str = "question_answer"
    embed_seconds: float = 0.0
    score_seconds: float = 0.0


def expand_faq_tasks(datasets: str | Iterable[str]) -> tuple[list[str], set[str]]:
    """(data sets in order, the ones implied only by the ``faq`` group and so allowed to be missing)."""
    if isinstance(datasets, str):
        datasets = [d for d in datasets.split(",") if d.strip()]
    names: list[str] = []
    explicit: set[str] = set()
    for entry in datasets:
        name = entry.strip()
        members = FAQ_TASKS if name == GROUP else (name,)
        for member in members:
            if member not in FAQ_TASKS:
                allowed = ", ".join([GROUP, *FAQ_TASKS])
                raise ValueError(f"unknown FAQ data set {entry!r}; allowed: {allowed}")
            if member not in names:
                names.append(member)
        if name != GROUP:
            explicit.add(name)
    return names, set(names) - explicit


def cosine_matrix(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Cosine similarity of every query to every candidate (a zero vector scores 0 against all)."""
    q = np.asarray(queries, dtype=np.float64)
    c = np.asarray(candidates, dtype=np.float64)
    qn = np.linalg.norm(q, axis=1, keepdims=True)
    cn = np.linalg.norm(c, axis=1, keepdims=True)
    q = np.divide(q, qn, out=np.zeros_like(q), where=qn > 0)
    c = np.divide(c, cn, out=np.zeros_like(c), where=cn > 0)
    return q @ c.T


def relevant_ranks(similarity: np.ndarray, relevant: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """1-based ranks of each query's relevant items, sorted; higher similarity first, ties by index."""
    similarity = np.asarray(similarity)
    if similarity.ndim != 2 or len(similarity) != len(relevant):
        raise ValueError(f"similarity has shape {similarity.shape} for {len(relevant)} queries")
    ranks = []
    for row, items in zip(similarity, relevant, strict=True):
        if len(items) == 0:
            raise ValueError("every query needs at least one relevant item")
        order = np.argsort(-row, kind="stable")  # stable: equal scores keep collection order
        position = np.empty(len(row), dtype=np.int64)
        position[order] = np.arange(1, len(row) + 1)
        ranks.append(np.sort(position[np.asarray(items, dtype=np.int64)]))
    return ranks


def average_precision(ranks: np.ndarray) -> float:
    """AP from the sorted 1-based ranks of all relevant items: mean of (j / rank_j), j = 1…R."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return float(np.mean(np.arange(1, len(ranks) + 1) / ranks))


def retrieval_metrics(
    similarity: np.ndarray, relevant: Sequence[Sequence[int]], ks: Sequence[int] = KS
) -> dict[str, np.ndarray]:
    """Per-query values (0/1 for ``top{k}``, AP for ``ap``), not yet averaged or scaled."""
    ranks = relevant_ranks(similarity, relevant)
    first = np.array([r[0] for r in ranks])
    metrics = {f"top{k}": (first <= k).astype(np.float64) for k in ks}
    metrics["ap"] = np.array([average_precision(r) for r in ranks])
    return metrics


def faq_folds(n_queries: int, folds: int = 5, seed: int = SEED) -> list[np.ndarray]:
    """Seeded split of ``range(n_queries)`` into ``min(folds, n_queries)`` near-equal sorted folds."""
    return query_folds(n_queries, folds, seed)


def select_queries(data: FAQData, positions: Sequence[int]) -> FAQData:
    """``data`` with the queries at ``positions`` only (in that order); the collection is whole."""
    keep = [int(i) for i in positions]
    return FAQData(
        data.name,
        [data.query_ids[i] for i in keep],
        [data.queries[i] for i in keep],
        [data.relevant[i] for i in keep],
        data.item_ids,
        data.questions,
        data.answers,
        data.dropped,
    )


def dev_map(
    data: FAQData,
    fold: int,
    embed: Embedder,
    candidate: str = "question_answer",
    max_queries: int | None = None,
    max_items: int | None = None,
) -> float:
    """MAP × 100 of fold ``fold``'s dev queries against the whole collection (model selection); the
    smoke caps as in ``evaluate_faq``."""
    dev = select_queries(data, fold_split(len(data), fold).dev)
    dev = subsample_items(subsample_queries(dev, max_queries), max_items)
    return score_faq(dev, embed, folds=1, candidate=candidate).map


def subsample_queries(data: FAQData, max_queries: int | None, seed: int = SEED) -> FAQData:
    """A seeded subsample of ``max_queries`` queries (original order kept); the collection is whole."""
    if max_queries is None or max_queries >= len(data):
        return data
    keep = np.sort(np.random.default_rng(seed).choice(len(data), size=max_queries, replace=False))
    return select_queries(data, keep)


def subsample_items(data: FAQData, max_items: int | None, seed: int = SEED) -> FAQData:
    """The collection cut to ``max_items`` items: every item relevant to a query, then seeded others."""
    if max_items is None or max_items >= len(data.item_ids):
        return data
    relevant = sorted({i for items in data.relevant for i in items})
    others = np.setdiff1d(np.arange(len(data.item_ids)), relevant)
    extra = max(0, max_items - len(relevant))
    chosen = np.random.default_rng(seed).choice(others, size=min(extra, len(others)), replace=False)
    keep = np.sort(np.concatenate([relevant, chosen]).astype(int)).tolist()
    new_position = {old: new for new, old in enumerate(keep)}
    return FAQData(
        data.name,
        data.query_ids,
        data.queries,
        [tuple(new_position[i] for i in items) for items in data.relevant],
        [data.item_ids[i] for i in keep],
        [data.questions[i] for i in keep],
        [data.answers[i] for i in keep],
        data.dropped,
    )


def score_faq(
    data: FAQData, embed: Embedder, folds: int = 5, seed: int = SEED, candidate: str = "question_answer"
) -> FAQScore:
    """Embed the distinct texts once, rank the whole collection per query, average over the folds."""
    started = time.perf_counter()
    items = data.candidates(candidate)
    unique = list(dict.fromkeys([*data.queries, *items]))
    vectors = np.asarray(embed(unique), dtype=np.float64)
    if vectors.ndim != 2 or len(vectors) != len(unique):
        raise ValueError(f"the embedder returned shape {vectors.shape} for {len(unique)} texts")
    row = {text: i for i, text in enumerate(unique)}
    queries = vectors[[row[q] for q in data.queries]]
    collection = vectors[[row[c] for c in items]]
    embedded = time.perf_counter()
    per_fold = []
    for part in faq_folds(len(data), folds, seed):
        values = retrieval_metrics(cosine_matrix(queries[part], collection), [data.relevant[i] for i in part])
        per_fold.append(
            {f"top{k}": 100 * float(values[f"top{k}"].mean()) for k in KS}
            | {"map": 100 * float(values["ap"].mean()), "queries": len(part)}
        )
    mean = {key: float(np.mean([f[key] for f in per_fold])) for key in ("top1", "top3", "top5", "map")}
    return FAQScore(
        dataset=data.name,
        queries=len(data),
        candidates=len(items),
        folds=per_fold,
        candidate=candidate,
        embed_seconds=embedded - started,
        score_seconds=time.perf_counter() - embedded,
        **mean,
    )


def evaluate_faq(
    embed: Embedder,
    datasets: str | Iterable[str] = ("stackfaq",),
    data_dir: str | Path | None = None,
    folds: int = 5,
    seed: int = SEED,
    max_queries: int | None = None,
    candidate: str = "question_answer",
    max_items: int | None = None,
    test_fold: tuple[str, int] | None = None,
) -> dict[str, FAQScore]:
    """Score ``embed`` on FAQ retrieval; ``datasets``: names or the ``faq`` group (see the module doc)."""
    if max_queries is not None and max_queries < 1:
        raise ValueError(f"max_queries must be at least 1 (given {max_queries})")
    if candidate not in CANDIDATE_FIELDS:
        raise ValueError(
            f"unknown FAQ candidate fields {candidate!r}; allowed: {', '.join(CANDIDATE_FIELDS)}"
        )
    sets = scored_sets(datasets, data_dir, seed, max_queries, max_items, test_fold)
    # trained on a set: its fold's test part, one part
    return {
        name: score_faq(data, embed, 1 if test_fold and test_fold[0] == name else folds, seed, candidate)
        for name, data in sets.items()
    }


def scored_sets(
    datasets: str | Iterable[str],
    data_dir: str | Path | None = None,
    seed: int = SEED,
    max_queries: int | None = None,
    max_items: int | None = None,
    test_fold: tuple[str, int] | None = None,
) -> dict[str, FAQData]:
    """Each FAQ set as ``evaluate_faq`` scores it: loaded (a group's missing members skipped, warned),
    the trained set's test fold, the caps applied."""
    names, optional = expand_faq_tasks(datasets)
    folder = resolve_data_dir(data_dir)  # explicit folder, else $CLSR_DATA_DIR (no hub copies known)
    sets: dict[str, FAQData] = {}
    skipped: list[str] = []
    for name in names:
        try:
            data = load_faq(name, folder)
        except DataUnavailableError as err:
            if name not in optional:
                raise
            skipped.append(f"{name}: {err}")
            warnings.warn(f"FAQ evaluation skips {err}", stacklevel=2)
            continue
        if test_fold is not None and test_fold[0] == name:
            data = select_queries(data, fold_split(len(data), test_fold[1]).test)
        sets[name] = subsample_items(subsample_queries(data, max_queries, seed), max_items, seed)
    if not sets and skipped:
        raise DataUnavailableError("no FAQ data set could be loaded:\n" + "\n".join(skipped))
    return sets


def faq_summary_metrics(scores: dict[str, FAQScore], prefix: str = "test_") -> dict[str, float]:
    """Flat metric dict: ``{prefix}{data set}_top1`` / ``_top3`` / ``_top5`` / ``_map`` (× 100)."""
    metrics: dict[str, float] = {}
    for name, s in scores.items():
        metrics |= {f"{prefix}{name}_{key}": getattr(s, key) for key in ("top1", "top3", "top5", "map")}
    return metrics


def format_faq_table(scores: dict[str, FAQScore]) -> str:
    """RCL Table 2's layout: one row per data set, columns Acc@1 Acc@3 Acc@5 MAP (× 100)."""
    names = [DISPLAY_NAMES.get(n, n) for n in scores]
    first = max([len("data set"), *map(len, names)])
    columns = ("Acc@1", "Acc@3", "Acc@5", "MAP")
    header = " | ".join(["data set".ljust(first), *(c.rjust(6) for c in columns)])
    rows = [
        " | ".join([n.ljust(first), *(f"{v:.2f}".rjust(6) for v in (s.top1, s.top3, s.top5, s.map))])
        for n, s in zip(names, scores.values(), strict=True)
    ]
    return "\n".join([header, "-" * len(header), *rows])
