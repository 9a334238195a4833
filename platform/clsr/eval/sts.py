"""STS evaluation exactly as SimCSE's modified SentEval does it (methods.md §8.1).

Cosine similarity of the two sentence embeddings, Spearman ρ against the gold scores. STS12–16 use
the "all" setting (one ρ over the concatenation of every subset of the year); STS-B and SICK-R use
their test split with no regressor. Reported numbers are ρ × 100; the average is the plain mean.
``mean`` and ``wmean`` (per-subset averages) are computed too, for comparison with other papers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clsr.data.sources import resolve_data_dir
from clsr.data.sts import STS_TASKS, STSSplit, load_sts, subsample
from clsr.encoders.embed import Embedder
from clsr.eval.tables import paper_table

TASK_GROUPS = {"sts": STS_TASKS}
DISPLAY_NAMES = {
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "stsb": "STS-B",
    "sickr": "SICK-R",
}


def expand_tasks(tasks: Iterable[str]) -> list[str]:
    """``["sts"]`` → the seven tasks; unknown names raise with the allowed values."""
    expanded: list[str] = []
    for task in tasks:
        names = TASK_GROUPS.get(task, (task,))
        for name in names:
            if name not in STS_TASKS:
                allowed = ", ".join([*TASK_GROUPS, *STS_TASKS])
                raise ValueError(f"unknown evaluation task {task!r}; allowed: {allowed}")
            if name not in expanded:
                expanded.append(name)
    return expanded


def cosine_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.sum(a * b, axis=1) / norms
    return np.nan_to_num(cos, nan=0.0)  # SentEval maps NaN to 0


def spearman(pred: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr  # here: study validation imports this module for its task names

    return float(spearmanr(pred, gold).statistic)


@dataclass
class STSScore:
    task: str
    split: str
    all: float  # ρ × 100 over the concatenation of subsets (the reported number)
    mean: float
    wmean: float
    pairs: int
    subsets: dict[str, float] = field(default_factory=dict)


def score_split(split: STSSplit, embed: Embedder) -> STSScore:
    """Embed both sides once and compute all / mean / wmean Spearman ×100."""
    return score_predictions(split, cosine_scores(embed(split.sentences1), embed(split.sentences2)))


def score_predictions(split: STSSplit, pred: np.ndarray) -> STSScore:
    """all / mean / wmean Spearman ×100 of the predicted similarities ``pred`` of the split's pairs."""
    subsets = np.asarray(split.subsets)
    names = list(dict.fromkeys(split.subsets))
    per_subset = {n: 100 * spearman(pred[subsets == n], split.scores[subsets == n]) for n in names}
    sizes = np.array([np.sum(subsets == n) for n in names])
    values = np.array([per_subset[n] for n in names])
    return STSScore(
        task=split.task,
        split=split.split,
        all=100 * spearman(pred, split.scores),
        mean=float(values.mean()),
        wmean=float((values * sizes).sum() / sizes.sum()),
        pairs=len(pred),
        subsets=per_subset,
    )


def evaluate_sts(
    embed: Embedder,
    tasks: Iterable[str] = ("sts",),
    split: str = "test",
    data_dir: str | Path | None = None,
    max_pairs: int | None = None,
) -> dict[str, STSScore]:
    """Score each task on ``split`` (``test`` for the paper tables, ``dev`` for model selection);
    ``max_pairs``: a seeded subsample of each (smoke runs; not the papers' numbers)."""
    folder = resolve_data_dir(data_dir)  # explicit folder, else $CLSR_DATA_DIR, else the hub
    return {
        task: score_split(subsample(load_sts(task, split, folder), max_pairs), embed)
        for task in expand_tasks(tasks)
    }


def evaluate_sts_prefixes(
    embed: Embedder,
    dims: Sequence[int | None],
    tasks: Iterable[str] = ("sts",),
    split: str = "test",
    data_dir: str | Path | None = None,
    max_pairs: int | None = None,
) -> dict[int | None, dict[str, STSScore]]:
    """``evaluate_sts`` of the embeddings' first ``dim`` coordinates, for each of ``dims`` (Matryoshka
    representations): each split is embedded once. None, or a dim at or above the embedding's size: all
    of it."""
    folder = resolve_data_dir(data_dir)
    scores: dict[int | None, dict[str, STSScore]] = {dim: {} for dim in dims}
    for task in expand_tasks(tasks):
        pairs = subsample(load_sts(task, split, folder), max_pairs)
        a, b = embed(pairs.sentences1), embed(pairs.sentences2)
        for dim in dims:
            scores[dim][task] = score_predictions(pairs, cosine_scores(a[:, :dim], b[:, :dim]))
    return scores


STS12_15 = ("sts12", "sts13", "sts14", "sts15")


def summary_metrics(scores: dict[str, STSScore], prefix: str = "test_") -> dict[str, float]:
    """Flat metric dict: one value per task plus the average over the tasks scored."""
    metrics = {f"{prefix}{task}": s.all for task, s in scores.items()}
    if len(scores) > 1:
        metrics[f"{prefix}sts_avg"] = float(np.mean([s.all for s in scores.values()]))
    if all(task in scores for task in STS12_15):  # GCLSR's Tables 4-11 average these four only
        metrics[f"{prefix}sts12_15_avg"] = float(np.mean([scores[t].all for t in STS12_15]))
    return metrics


def prefix_metrics(scores: dict[int | None, dict[str, STSScore]], prefix: str = "test_") -> dict[str, float]:
    """``summary_metrics`` of each prefix's scores, named ``<metric>_dim<d>`` (``test_sts_avg_dim64``)."""
    return {
        f"{name}_dim{dim}": value
        for dim, by_task in scores.items()
        for name, value in summary_metrics(by_task, prefix).items()
    }


def format_table(scores: dict[str, STSScore]) -> str:
    """A one-line-per-format table as the papers print it: tasks as columns, then Avg."""
    return paper_table({DISPLAY_NAMES.get(t, t): s.all for t, s in scores.items()})
