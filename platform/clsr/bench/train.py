"""Training throughput: the platform's trainer step against sentence-transformers' MNRL training.

Both sides train the same encoder (mean pooling) on the same batches of the same rows, with the same
sequence length, precision, learning rate, AdamW, gradient clipping at 1.0 and a linear schedule, one
after the other in this process; warm-up steps are not timed. The clsr side is one optimiser step of
``clsr.train.loop.fit`` (collate, forward, loss, backward, clip, step) without evaluation or logging;
it tokenises every row once per trial (``method.prepare_rows``, timed apart), as the trainer does.
The sentence-transformers side is the plain PyTorch loop its trainer runs: ``model.preprocess`` of
each column per batch (what its data collator does, every step), ``MultipleNegativesRankingLoss``,
backward, clip, AdamW step.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clsr.bench import autocast, format_table, resolve_device, resolve_precision, synchronize

# the training rows each method reads (local NLI data); MNRL gets the same columns
DATASETS = {"simcse_sup": "nli_triplets", "supmpn": "nli_supmpn"}
# dense bf16 peak FLOP/s (SXM parts; H100 PCIe: 756e12)
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12}


def trial_config(
    method: str,
    model: str,
    batch: int,
    length: int,
    precision: str,
    lr: float = 5e-5,
    chunk_rows: int | None = None,
    data: str | None = None,
    length_group: int | str | None = "auto",
    compile: bool = False,
    attention: str | None = None,
):
    """A trial of ``method`` with mean pooling (as the sentence-transformers model) and no evaluation."""
    from clsr.train.config import TrialConfig

    return TrialConfig(
        model={
            "name": model,
            "pooling": "avg",
            "mlp_only_train": False,
            "max_seq_length": length,
            "attention": attention,
        },
        data={"train": data or DATASETS.get(method, "nli_triplets")},
        trainer={
            "batch_size": batch,
            "lr": lr,
            "precision": precision,
            "gradcache_chunk_rows": chunk_rows,
            "length_group_size": length_group,
            "compile": compile,
        },
        method={"name": method},
        eval={"dev_tasks": [], "tasks": ["sts"]},
    )


class PlatformStep:
    """One optimiser step of ``clsr.train.loop.fit`` (one worker, no accumulation, no eval, no logs)."""

    def __init__(self, trial, rows: list[dict[str, str]], device: torch.device, total_steps: int = 1):
        from clsr.train.gradcache import check_gradcache
        from clsr.train.loop import build_method, compiled
        from clsr.train.optim import build_optimizer, build_scheduler

        t = trial.trainer
        self.trial, self.device = trial, device
        self.method = build_method(trial)
        check_gradcache(self.method, t.gradcache_chunk_rows)
        pipeline = self.method.text_pipeline(trial, None)
        started = time.perf_counter()
        self.batcher = self.method.prepare_rows(rows, pipeline, trial)  # tokenised once per trial
        self.tokenise_s = time.perf_counter() - started
        self.model = compiled(self.method.build_model(trial.model, pipeline), t).to(device)
        self.optimizer = build_optimizer(
            self.model, t, self.method.param_group_lrs(), self.method.fixed_lr_prefixes()
        )
        self.scheduler = build_scheduler(self.optimizer, t, total_steps)
        self.autocast = autocast(resolve_precision(t.precision, device), device)
        self.model.train()

    def batches(self, rows: Sequence[dict[str, str]], count: int) -> list[list[int]]:
        """``count`` batches in the method's order (more epochs when the rows run out)."""
        t, out, epoch = self.trial.trainer, [], 0
        while len(out) < count:
            out += self.method.batch_order(rows, t.batch_size, epoch, t.seed)
            epoch += 1
        return out[:count]

    def __call__(self, indices: Sequence[int]) -> tuple[int, int]:
        """Train on the rows ``indices``; returns the batch's real tokens and the tokens the encoder ran
        (padding included)."""
        from clsr.train.gradcache import gradcache_backward

        t = self.trial.trainer
        cpu_batch = self.batcher.collate(indices)
        mask = cpu_batch["attention_mask"]
        tokens = (int(mask.sum()), grouped_width_tokens(mask, cpu_batch.get("length_group_size")))
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in cpu_batch.items()}
        if t.gradcache_chunk_rows:
            loss = float(
                gradcache_backward(
                    self.method,
                    self.model,
                    self.batcher,
                    list(indices),
                    batch,
                    t.gradcache_chunk_rows,
                    device=self.device,
                    scale=1.0,
                    autocast=self.autocast,
                )
            )
        else:
            with self.autocast:
                loss_tensor = self.method.training_loss(self.model, batch)
            loss_tensor.backward()
            loss = loss_tensor.item()  # the loop reads the loss every step too
        if t.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if loss != loss:
            raise FloatingPointError("the clsr loss became NaN")
        return tokens


class SentenceTransformersStep:
    """Plain PyTorch MNRL training of a SentenceTransformer model, tokenising each batch."""

    def __init__(
        self,
        model: str,
        columns: Sequence[str],
        length: int,
        precision: str,
        lr: float,
        device,
        total_steps,
        attention: str | None = None,
    ):
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from transformers import get_linear_schedule_with_warmup

        from clsr.encoders.registry import resolve_model_path

        self.columns, self.device = tuple(columns), device
        kwargs = {"attn_implementation": attention} if attention else {}
        self.model = SentenceTransformer(resolve_model_path(model), device=str(device), model_kwargs=kwargs)
        self.model.max_seq_length = length
        self.loss = MultipleNegativesRankingLoss(self.model)  # scale 20 = τ 0.05
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, 0, total_steps)
        self.autocast = autocast(precision, device)
        self.model.train()

    def __call__(self, rows: Sequence[dict[str, str]]) -> tuple[int, int]:
        features, tokens = [], 0
        for column in self.columns:  # the data collator: one preprocess call per column, every step
            part = self.model.preprocess([row[column] for row in rows])
            tokens += int(part["attention_mask"].sum())
            features.append({k: v.to(self.device) if torch.is_tensor(v) else v for k, v in part.items()})
        with self.autocast:
            loss = self.loss(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if loss.item() != loss.item():
            raise FloatingPointError("the sentence-transformers loss became NaN")
        # its embed_columns: the anchors alone, the other columns merged at their widest
        widths = [f["input_ids"].shape[1] for f in features]
        return tokens, len(rows) * (widths[0] + (len(widths) - 1) * max(widths[1:], default=0))


def grouped_width_tokens(mask: torch.Tensor, group: int | None) -> int:
    """Tokens the encoder runs (padding included) for ``mask`` cut into length groups of ``group``."""
    extent = (mask * torch.arange(1, mask.size(1) + 1)).amax(dim=1).sort().values.tolist()
    size = group or len(extent)
    return sum(len(extent[i : i + size]) * extent[i : i + size][-1] for i in range(0, len(extent), size))


def timed(
    step: Callable[[Any], tuple[int, int]], batches: Sequence[Any], warmup: int, device
) -> tuple[float, int, int]:
    """(seconds, real tokens, encoder tokens with padding) of the steps after the first ``warmup`` ones."""
    for batch in batches[:warmup]:
        step(batch)
    synchronize(device)
    started, tokens, padded = time.perf_counter(), 0, 0
    for batch in batches[warmup:]:
        real, ran = step(batch)
        tokens, padded = tokens + real, padded + ran
    synchronize(device)
    return time.perf_counter() - started, tokens, padded


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def side_figures(
    seconds: float, tokens: int, padded: int, steps: int, sentences: int, params: int, peak: float | None
) -> dict[str, float | None]:
    return {
        "seconds": seconds,
        "s_per_step": seconds / steps,
        "sentences_per_s": sentences / seconds,
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
        "encoder_tokens": padded,
        "padding_share": 1 - tokens / padded,
        "mfu": 6 * params * tokens / (seconds * peak) if peak else None,
    }


def run_train(
    method: str = "simcse_sup",
    model: str = "minilm",
    batch: int = 64,
    length: int = 32,
    steps: int = 20,
    warmup: int = 3,
    precision: str = "auto",
    device: str = "auto",
    lr: float = 5e-5,
    data_dir: str | None = None,
    length_group: int | str | None = "auto",
    compile: bool = False,
    attention: str | None = None,
) -> dict[str, Any]:
    """Time ``steps`` optimiser steps (after ``warmup`` untimed ones) of clsr, then of sentence-transformers."""
    from clsr.data.catalog import load_rows

    if method not in DATASETS:
        raise ValueError(f"--method must be one of {', '.join(DATASETS)}")
    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    total = warmup + steps
    rows = load_rows(DATASETS[method], data_dir, max_rows=batch * total, seed=0)
    trial = trial_config(
        method,
        model,
        batch,
        length,
        precision,
        lr,
        length_group=length_group,
        compile=compile,
        attention=attention,
    )

    torch.manual_seed(0)
    clsr_step = PlatformStep(trial, rows, dev, total)
    columns = clsr_step.method.views()
    batches = clsr_step.batches(rows, total)
    params = sum(p.numel() for p in clsr_step.model.parameters())
    dense = sum(p.numel() for n, p in clsr_step.model.named_parameters() if "embeddings" not in n)
    peak = peak_flops(dev)
    clsr_seconds, clsr_tokens, clsr_padded = timed(clsr_step, batches, warmup, dev)
    group = clsr_step.trial.trainer.resolved_length_group_size()
    clsr_attention = clsr_step.model.backbone.config._attn_implementation  # what the model runs
    tokenise_s = clsr_step.tokenise_s
    del clsr_step
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    torch.manual_seed(0)
    st_step = SentenceTransformersStep(model, columns, length, precision, lr, dev, total, attention)
    st_seconds, st_tokens, st_padded = timed(st_step, [[rows[i] for i in b] for b in batches], warmup, dev)
    del st_step
    gc.collect()

    sentences = steps * batch * len(columns)
    clsr = side_figures(clsr_seconds, clsr_tokens, clsr_padded, steps, sentences, dense, peak)
    st = side_figures(st_seconds, st_tokens, st_padded, steps, sentences, dense, peak)
    return {
        "benchmark": "train",
        "method": method,
        "data": DATASETS[method],
        "columns": list(columns),
        "model": model,
        "batch": batch,
        "length": length,
        "steps": steps,
        "warmup": warmup,
        "precision": precision,
        "device": str(dev),
        "lr": lr,
        "length_group_size": group,
        "compile": compile,
        "attention": clsr_attention,
        "params": params,
        "params_non_embedding": dense,
        "peak_bf16_flops": peak,
        "clsr_tokenise_once_s": tokenise_s,
        "clsr_tokenised_rows": len(rows),
        "clsr": clsr,
        "sentence_transformers": st,
        "ratio_clsr_over_st": clsr["sentences_per_s"] / st["sentences_per_s"],
    }


def format_train(f: dict[str, Any]) -> str:
    sides = (("clsr " + f["method"], f["clsr"]), ("sentence-transformers MNRL", f["sentence_transformers"]))
    table = format_table(
        ["trainer", "s/step", "sentences/s", "tokens/s", "padding", "MFU"],
        [
            [
                name,
                s["s_per_step"],
                s["sentences_per_s"],
                s["tokens_per_s"],
                f"{s['padding_share']:.0%}",
                s["mfu"] and f"{s['mfu']:.1%}",
            ]
            for name, s in sides
        ],
    )
    mfu = (
        f"MFU = 6 × {f['params_non_embedding']:,} non-embedding parameters × real tokens / "
        f"(time × {f['peak_bf16_flops']:.3g} bf16 FLOP/s)"
        if f["peak_bf16_flops"]
        else "MFU: omitted (no GPU with a known bf16 peak)"
    )
    return "\n".join(
        [
            f"training throughput: {f['model']} (mean pooling), {f['data']} columns {', '.join(f['columns'])}; "
            f"batch {f['batch']} rows = {f['batch'] * len(f['columns'])} sentences, length {f['length']}, "
            f"{f['precision']} on {f['device']}, AdamW lr {f['lr']:g}, {f['attention']} attention"
            f"{', torch.compile' if f['compile'] else ''}; "
            f"{f['steps']} timed steps after {f['warmup']} warm-up steps",
            "",
            table,
            "",
            f"ratio clsr / sentence-transformers (sentences/s): {f['ratio_clsr_over_st']:.2f}",
            f"note: sentence-transformers tokenises every batch in the timed step (its data collator); clsr "
            f"tokenises every row once per trial, outside the step ({f['clsr_tokenised_rows']} rows in "
            f"{f['clsr_tokenise_once_s']:.2f} s, not in the figures above).",
            "note: clsr encodes all columns in one forward pass, "
            + (
                f"sorted by length in groups of {f['length_group_size']} sentences, each padded to its own "
                "longest (trainer.length_group_size)"
                if f["length_group_size"]
                else "padded to the batch's longest (length groups off)"
            )
            + "; MNRL encodes the anchors, then the other columns together, each padded to its longest. "
            "padding = share of the tokens the encoder ran that were padding.",
            mfu,
        ]
    )
