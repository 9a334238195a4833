"""STS evaluation: the platform's (``clsr.eval.sts``) against sentence-transformers' ``encode`` + SciPy.

Both score the same model on the same pairs (``clsr.data.sts.load_sts``, the 'all' setting: one
Spearman ρ × 100 over every pair of a task) and must agree to ~1e-4. The sentence-transformers side is
written from scratch: ``encode`` both sides, cosine of each pair, ``scipy.stats.spearmanr``. Its
truncation length is set to the platform's (min(tokenizer limit, 512)) and, on a GPU, it encodes under
the same bf16 autocast as the platform's embedder, so that the scores can match. Wall times cover
reading the pairs, embedding and scoring; loading the models is not timed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from clsr_bench import format_table, resolve_device


def _pairs(task: str, data_dir: str | None, max_pairs: int | None):
    from clsr.data.sources import resolve_data_dir
    from clsr.data.sts import load_sts

    split = load_sts(task, "test", resolve_data_dir(data_dir))
    if max_pairs is None:
        return split
    return dataclasses.replace(
        split,
        sentences1=split.sentences1[:max_pairs],
        sentences2=split.sentences2[:max_pairs],
        scores=split.scores[:max_pairs],
        subsets=split.subsets[:max_pairs],
    )


def clsr_scores(
    embed, tasks: list[str], data_dir: str | None, max_pairs: int | None
) -> tuple[dict[str, float], float]:
    """({task: ρ × 100}, seconds) with ``evaluate_sts`` (``score_split`` on the first pairs with max_pairs)."""
    from clsr.eval.sts import evaluate_sts, score_split

    started = time.perf_counter()
    if max_pairs is None:
        scores = evaluate_sts(embed, tasks, "test", data_dir)
    else:
        scores = {task: score_split(_pairs(task, data_dir, max_pairs), embed) for task in tasks}
    return {task: s.all for task, s in scores.items()}, time.perf_counter() - started


def st_scores(
    model, tasks: list[str], data_dir: str | None, max_pairs: int | None, batch_size: int, autocast
) -> tuple[dict[str, float], float]:
    """({task: ρ × 100}, seconds) with ``SentenceTransformer.encode`` and ``scipy.stats.spearmanr``."""
    from scipy.stats import spearmanr

    started = time.perf_counter()
    scores = {}
    for task in tasks:
        split = _pairs(task, data_dir, max_pairs)
        with autocast:
            a = model.encode(split.sentences1, batch_size=batch_size, convert_to_numpy=True)
            b = model.encode(split.sentences2, batch_size=batch_size, convert_to_numpy=True)
        a, b = a.astype(np.float64), b.astype(np.float64)
        cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        scores[task] = 100 * float(spearmanr(cosine, split.scores).statistic)
    return scores, time.perf_counter() - started


def run_sts_eval(
    model: str = "minilm",
    tasks: str = "sts",
    max_pairs: int | None = None,
    batch_size: int = 128,
    device: str = "auto",
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Score ``model`` (mean pooling) on ``tasks`` both ways; wall times and per-task scores."""
    import torch
    from sentence_transformers import SentenceTransformer

    from clsr.config.model import ModelConfig
    from clsr.data.hub.model_registry import resolve_model_path
    from clsr.encoders.embed import transformer_embedder
    from clsr.encoders.export import eval_max_length
    from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
    from clsr.eval.sts import expand_tasks
    from clsr_bench import autocast

    names = expand_tasks(tasks.split(","))
    dev = resolve_device(device)
    tokenizer = load_tokenizer(model)
    encoder = TransformerEncoder(ModelConfig(name=model, pooling="avg")).to(dev).eval()
    clsr, clsr_s = clsr_scores(
        transformer_embedder(encoder, tokenizer, batch_size), names, data_dir, max_pairs
    )
    del encoder
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    st_model = SentenceTransformer(resolve_model_path(model), device=str(dev))
    st_model.max_seq_length = eval_max_length(tokenizer)
    precision = "bf16" if dev.type == "cuda" else "fp32"  # the platform's embedder: bf16 autocast on GPU
    st, st_s = st_scores(st_model, names, data_dir, max_pairs, batch_size, autocast(precision, dev))
    return {
        "benchmark": "sts-eval",
        "model": model,
        "tasks": names,
        "max_pairs": max_pairs,
        "batch_size": batch_size,
        "device": str(dev),
        "precision": precision,
        "max_length": eval_max_length(tokenizer),
        "clsr_s": clsr_s,
        "st_s": st_s,
        "ratio_clsr_over_st_time": clsr_s / st_s,
        "clsr": clsr,
        "sentence_transformers": st,
        "max_abs_diff": max(abs(clsr[t] - st[t]) for t in names),
    }


def format_sts_eval(f: dict[str, Any]) -> str:
    from clsr.eval.sts import DISPLAY_NAMES

    rows = [
        [
            DISPLAY_NAMES.get(t, t),
            f"{f['clsr'][t]:.4f}",
            f"{f['sentence_transformers'][t]:.4f}",
            f"{f['clsr'][t] - f['sentence_transformers'][t]:.1e}",
        ]
        for t in f["tasks"]
    ]
    table = format_table(["task", "clsr ρ×100", "ST ρ×100", "difference"], rows)
    capped = f", first {f['max_pairs']} pairs per task" if f["max_pairs"] else ""
    return "\n".join(
        [
            f"STS evaluation: {f['model']} (mean pooling), Spearman × 100, test split, 'all' setting{capped}; "
            f"batch {f['batch_size']}, max length {f['max_length']}, {f['precision']} on {f['device']}",
            "",
            table,
            "",
            f"max |difference|: {f['max_abs_diff']:.2e}",
            f"wall time: clsr {f['clsr_s']:.2f} s, sentence-transformers {f['st_s']:.2f} s, "
            f"ratio clsr / ST {f['ratio_clsr_over_st_time']:.2f}",
        ]
    )
