"""The evaluation suite: an encoder scored on STS, the SentEval transfer tasks, FAQ retrieval and the
user's own sets, in that order, as one flat metrics dict. A trial's final evaluation
(``clsr.train.evaluator.Evaluator.final``) and ``platform eval`` both run it; what differs between them
is a setting here (the trial caps and folds, the command prints), so the metric names are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clsr.config.custom_task import CustomTask
from clsr.data.sources import resolve_data_dir
from clsr.data.sts import load_sts, subsample
from clsr.encoders.embed import Embedder
from clsr.eval.alignment import alignment_uniformity
from clsr.eval.custom import ClassifierSettings, evaluate_custom
from clsr.eval.faq import evaluate_faq, faq_summary_metrics
from clsr.eval.sts import evaluate_sts, evaluate_sts_prefixes, prefix_metrics, summary_metrics
from clsr.eval.transfer import TransferScore, evaluate_transfer, transfer_summary_metrics

# called once a group is scored: its name ("sts", "transfer", "faq", "custom"), its scores by task
# (the metrics themselves for "custom"), its metrics and the seconds it took
OnGroup = Callable[[str, Mapping[str, Any], dict[str, float], float], None]


@dataclass(frozen=True)
class SuiteTasks:
    """What to score: task names as ``clsr.data.tasks.split_eval_tasks`` sorts them, and the user's sets."""

    sts: list[str] = field(default_factory=list)
    transfer: list[str] = field(default_factory=list)
    faq: list[str] = field(default_factory=list)
    custom: Mapping[str, CustomTask] = field(default_factory=dict)


@dataclass(frozen=True)
class SuiteSettings:
    """How to score. ``split``: the STS split (metrics ``<split>_<task>``); the caps are None for the
    whole sets; ``device``: the GPU the classifier fits run on (None: the CPU); ``faq_test_fold``: the
    FAQ set and fold a trial trained on (its test fold is scored); ``alignment_uniformity``: also the
    alignment and uniformity of the STS-B dev pairs (a trial's diagnostic); ``truncate_dims``: the STS
    sets also scored on each prefix of the embedding (``<metric>_dim<d>``, Matryoshka representations)."""

    data_dir: str | Path | None = None
    split: str = "test"
    sts_max_pairs: int | None = None
    transfer_mode: str = "test"
    transfer_classifier: str = "senteval_pytorch"
    transfer_max_examples: int | None = None
    device: str | None = None
    faq_max_queries: int | None = None
    faq_max_items: int | None = None
    faq_test_fold: tuple[str, int] | None = None
    alignment_uniformity: bool = False
    truncate_dims: tuple[int, ...] = ()


def evaluate_suite(
    embed: Embedder,
    tasks: SuiteTasks,
    settings: SuiteSettings = SuiteSettings(),
    *,
    transfer: dict[str, TransferScore] | None = None,
    on_group: OnGroup | None = None,
    on_transfer_task: Callable[[TransferScore], None] | None = None,
) -> dict[str, float]:
    """Every group's metrics. ``transfer``: the transfer scores when they were computed elsewhere (the
    ranks of a trial share them); ``on_transfer_task``: called as each transfer task ends."""
    s = settings
    say = on_group or (lambda name, scores, found, seconds: None)
    metrics: dict[str, float] = {}
    if tasks.sts:
        started = time.perf_counter()
        metrics |= _said(say, "sts", *_sts(embed, tasks.sts, s), started)
    if tasks.transfer:
        started = time.perf_counter()
        scores = transfer if transfer is not None else _transfer(embed, tasks.transfer, s, on_transfer_task)
        metrics |= _said(say, "transfer", scores, transfer_summary_metrics(scores), started)
    if tasks.faq:  # 5-fold CV over the queries, whole collection as the pool (methods.md §6.5)
        started = time.perf_counter()
        caps = {"max_queries": s.faq_max_queries, "max_items": s.faq_max_items}
        faq = evaluate_faq(embed, tasks.faq, s.data_dir, **caps, test_fold=s.faq_test_fold)
        metrics |= _said(say, "faq", faq, faq_summary_metrics(faq), started)
    if tasks.custom:  # the user's own sets (clsr.eval.custom)
        started = time.perf_counter()
        fits = ClassifierSettings(s.transfer_mode, s.transfer_classifier, device=s.device)
        custom = evaluate_custom(embed, tasks.custom, fits)
        metrics |= _said(say, "custom", custom, custom, started)
    if s.alignment_uniformity:
        dev = load_sts("stsb", "dev", resolve_data_dir(s.data_dir))
        metrics |= alignment_uniformity(subsample(dev, s.sts_max_pairs), embed)
    return metrics


def _said(say: OnGroup, name: str, scores: Mapping[str, Any], found: dict[str, float], started: float):
    """``found``, once ``say`` has been told of the group."""
    say(name, scores, found, time.perf_counter() - started)
    return found


def _sts(embed: Embedder, tasks: list[str], s: SuiteSettings) -> tuple[dict[str, Any], dict[str, float]]:
    """The STS scores by task and their metrics, those of each ``truncate_dims`` prefix included."""
    if not s.truncate_dims:
        sts = evaluate_sts(embed, tasks, s.split, s.data_dir, s.sts_max_pairs)
        return sts, summary_metrics(sts, prefix=f"{s.split}_")
    # None: the whole embedding, scored from the same encoding as its prefixes
    by_dim = evaluate_sts_prefixes(
        embed, (None, *s.truncate_dims), tasks, s.split, s.data_dir, s.sts_max_pairs
    )
    sts = by_dim.pop(None)
    return sts, summary_metrics(sts, prefix=f"{s.split}_") | prefix_metrics(by_dim, prefix=f"{s.split}_")


def _transfer(embed: Embedder, tasks: list[str], s: SuiteSettings, on_task) -> dict[str, TransferScore]:
    return evaluate_transfer(
        embed,
        tasks,
        s.data_dir,
        mode=s.transfer_mode,
        max_examples=s.transfer_max_examples,
        classifier=s.transfer_classifier,
        device=s.device,
        on_task=on_task,
    )
