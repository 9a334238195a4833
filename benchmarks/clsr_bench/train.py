"""Training throughput: the platform's trainer step against sentence-transformers' MNRL training.

Both sides train the same encoder (mean pooling) on the same batches of the same rows, with the same
sequence length, precision, learning rate, AdamW, gradient clipping at 1.0 and a linear schedule, in
this process, both models loaded; warm-up steps are not timed. The timed steps come in ``rounds``
(``--rounds``, 1 by default) that alternate, clsr's round then sentence-transformers' (clsr's run from
the other trainer's step callback, untimed there): a machine whose speed drifts by tens of per cent
within minutes (a shared VM) slows both sides of a round alike, and the median of the rounds' ratios is
the figure to read there. On a GPU, clsr's cached blocks are handed back after each of its rounds. The
clsr side is one optimiser step of ``clsr.train.loop.fit`` (collate, forward, loss, backward, clip, step)
without evaluation or logging; it tokenises every row once per trial (``method.prepare_rows``, timed
apart), as the trainer does.
The sentence-transformers side is what a user of it runs: ``SentenceTransformerTrainer`` with its
``MultipleNegativesRankingLoss``, its data collator (tokenising every batch), its default batch sampler
and its AdamW, linear schedule, clipping and autocast (``bf16``/``fp16`` arguments), on the same rows,
batch size, length, learning rate and number of steps; a ``TrainerCallback`` times the steps after the
warm-up ones. Earlier versions timed a hand-written loop of the same operations instead, which left
out the trainer's own overhead (data loader, collator, accelerate): the ratio here is against the
tool a user would otherwise use.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clsr_bench import autocast, format_table, resolve_device, resolve_precision, synchronize

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
    attention: str | None = "auto",
):
    """A trial of ``method`` with mean pooling (as the sentence-transformers model) and no evaluation."""
    from clsr.config.trial import TrialConfig

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
        from clsr.methods import build_method
        from clsr.train.gradcache import check_gradcache
        from clsr.train.loop import compiled
        from clsr.train.optim import build_optimizer, build_scheduler

        t = trial.trainer
        self.trial, self.device = trial, device
        self.method = build_method(trial)
        check_gradcache(self.method, t.gradcache_chunk_rows)
        pipeline = self.method.text_pipeline(trial, None)
        started = time.perf_counter()
        self.rows = rows = self.method.rows_for_training(rows, trial)
        self.batcher = self.method.prepare_rows(rows, pipeline, trial)  # tokenised once per trial
        self.tokenise_s = time.perf_counter() - started
        self.collate_s: list[float] = []  # per step: building the batch from the token tables
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
        started = time.perf_counter()
        cpu_batch = self.batcher.collate(indices)
        self.collate_s.append(time.perf_counter() - started)
        mask = cpu_batch["attention_mask"]
        real = int(mask.sum())
        packed = any(getattr(m, "packed", False) for m in self.model.modules())  # flash_attention_2
        tokens = (real, real if packed else grouped_width_tokens(mask, cpu_batch.get("length_group_size")))
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in cpu_batch.items()}
        if t.gradcache_chunk_rows:
            loss = gradcache_backward(
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
        else:
            with self.autocast:
                loss = self.method.training_loss(self.model, batch)
            loss.backward()
        if t.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = loss.detach()  # read once at the end: the loop reads it a log window at a time
        return tokens


def sentence_transformers_trainer(
    model: str,
    columns: Sequence[str],
    rows: Sequence[dict[str, str]],
    batch: int,
    length: int,
    precision: str,
    lr: float,
    device: torch.device,
    steps: int,
    warmup: int,
    attention: str | None = None,
    rounds: int = 1,
    between: Callable[[int], None] | None = None,
) -> tuple[list[float], int, int]:
    """(seconds of each round, real tokens, encoder tokens with padding) of ``rounds`` × ``steps``
    optimiser steps of ``SentenceTransformerTrainer`` after ``warmup`` untimed ones, as a user trains
    MNRL; ``between(r)`` runs, untimed, before round ``r``."""
    import tempfile

    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from clsr.data.hub.model_registry import resolve_model_path

    if attention == "sdpa_packed":  # clsr's packing; sentence-transformers pads its batches for sdpa
        attention = "sdpa"
    if attention == "auto":  # clsr's default; sentence-transformers takes transformers' own
        attention = None
    kwargs = {"attn_implementation": attention} if attention else {}
    st_model = SentenceTransformer(resolve_model_path(model), device=str(device), model_kwargs=kwargs)
    st_model.max_seq_length = length
    data = Dataset.from_list([{c: row[c] for c in columns} for row in rows])
    clock = StepClock(warmup, steps, rounds, device, between)

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **_):
            if warmup == 0 and state.global_step == 0:  # no warm-up: from the first step's start
                clock.tick(0)

        def on_step_end(self, args, state, control, **_):
            clock.tick(state.global_step)

    with tempfile.TemporaryDirectory(prefix="clsr-bench-st-") as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out, max_steps=warmup + rounds * steps, per_device_train_batch_size=batch,
            learning_rate=lr, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, bf16=precision == "bf16", fp16=precision == "fp16",
            use_cpu=device.type == "cpu", seed=0, data_seed=0, dataloader_drop_last=True,
            save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        )  # fmt: skip
        trainer = SentenceTransformerTrainer(
            model=st_model, args=args, train_dataset=data, loss=MultipleNegativesRankingLoss(st_model),
            callbacks=[Timer()],
        )  # fmt: skip
        trainer.data_collator = CountingCollator(trainer.data_collator, columns, clock)
        trainer.train()
    return clock.seconds(), clock.tokens, clock.padded


class StepClock:
    """Times each round of ``steps`` optimiser steps after the first ``warmup``, ``between(r)`` run
    untimed before round ``r``, and counts the tokens of the batches collated for them (the collator
    runs a batch ahead of its step only by the loader's prefetch: equal counts)."""

    def __init__(
        self,
        warmup: int,
        steps: int,
        rounds: int,
        device: torch.device,
        between: Callable[[int], None] | None = None,
    ) -> None:
        self.warmup, self.steps, self.rounds, self.device = warmup, steps, rounds, device
        self.between = between
        self.started: float | None = None
        self.rounds_s: list[float] = []
        self.batches = 0
        self.tokens = self.padded = 0

    def tick(self, step: int) -> None:
        """At the end of optimiser step ``step`` (0: before the first, when nothing is warm-up)."""
        synchronize(self.device)
        done = step - self.warmup
        if done < 0 or done % self.steps:
            return
        if self.started is not None:
            self.rounds_s.append(time.perf_counter() - self.started)
            self.started = None
        if done // self.steps < self.rounds:
            if self.between is not None:
                self.between(done // self.steps)
                synchronize(self.device)
            self.started = time.perf_counter()

    def count(self, real: int, ran: int) -> None:
        self.batches += 1
        if self.warmup < self.batches <= self.warmup + self.rounds * self.steps:
            self.tokens, self.padded = self.tokens + real, self.padded + ran

    def seconds(self) -> list[float]:
        if len(self.rounds_s) < self.rounds:
            raise RuntimeError("sentence-transformers' trainer stopped before the timed steps")
        return self.rounds_s


class CountingCollator:
    """The trainer's collator, counting each batch's real and padded tokens (its
    ``<column>_attention_mask``); every other attribute is the collator's own (the trainer reads some)."""

    def __init__(self, collate: Any, columns: Sequence[str], clock: StepClock) -> None:
        self.collate, self.columns, self.clock = collate, list(dict.fromkeys(columns)), clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collate, name)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collate(features)
        masks = [batch[f"{c}_attention_mask"] for c in self.columns if f"{c}_attention_mask" in batch]
        self.clock.count(sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks))
        return batch


def grouped_width_tokens(mask: torch.Tensor, group: int | None) -> int:
    """Tokens the encoder runs (padding included) for ``mask`` cut into length groups of ``group``."""
    extent = (mask * torch.arange(1, mask.size(1) + 1)).amax(dim=1).sort().values.tolist()
    size = group or len(extent)
    return sum(len(extent[i : i + size]) * extent[i : i + size][-1] for i in range(0, len(extent), size))


def timed(step: Callable[[Any], tuple[int, int]], batches: Sequence[Any], device) -> tuple[float, int, int]:
    """(seconds, real tokens, encoder tokens with padding) of a step on each of ``batches``."""
    synchronize(device)
    started, tokens, padded = time.perf_counter(), 0, 0
    for batch in batches:
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
    attention: str | None = "auto",
    rounds: int = 1,
) -> dict[str, Any]:
    """Time ``rounds`` × ``steps`` optimiser steps (after ``warmup`` untimed ones) of clsr and of
    sentence-transformers, round by round, clsr's round first."""
    from clsr.data.catalog import load_rows

    if method not in DATASETS:
        raise ValueError(f"--method must be one of {', '.join(DATASETS)}")
    if rounds < 1:
        raise ValueError(f"--rounds must be 1 or more, got {rounds}")
    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    total = warmup + rounds * steps
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
    batches = clsr_step.batches(clsr_step.rows, total)
    params = sum(p.numel() for p in clsr_step.model.parameters())
    dense = sum(p.numel() for n, p in clsr_step.model.named_parameters() if "embeddings" not in n)
    peak = peak_flops(dev)
    for warm in batches[:warmup]:
        clsr_step(warm)
    clsr_rounds: list[tuple[float, int, int]] = []

    def clsr_round(index: int) -> None:  # run by sentence-transformers' trainer before its round
        first = warmup + index * steps
        clsr_rounds.append(timed(clsr_step, batches[first : first + steps], dev))
        if dev.type == "cuda":  # the other trainer's round gets the memory clsr's left cached
            torch.cuda.empty_cache()

    torch.manual_seed(0)
    st_rounds, st_tokens, st_padded = sentence_transformers_trainer(
        model, columns, rows, batch, length, precision, lr, dev, steps, warmup, attention, rounds, clsr_round
    )
    if not torch.isfinite(clsr_step.last_loss):
        raise FloatingPointError(f"the clsr loss became {clsr_step.last_loss.item()}; lower --lr")
    group = clsr_step.trial.trainer.resolved_length_group_size()
    clsr_attention = clsr_step.model.backbone.config._attn_implementation  # what the model runs
    tokenise_s = clsr_step.tokenise_s
    collate_ms = 1000 * sum(clsr_step.collate_s[warmup:]) / max(len(clsr_step.collate_s[warmup:]), 1)

    clsr_seconds = sum(r[0] for r in clsr_rounds)
    clsr_tokens, clsr_padded = sum(r[1] for r in clsr_rounds), sum(r[2] for r in clsr_rounds)
    round_ratios = [st / ours for (ours, _, _), st in zip(clsr_rounds, st_rounds, strict=True)]
    timed_steps = rounds * steps
    sentences = timed_steps * batch * len(columns)
    clsr = side_figures(clsr_seconds, clsr_tokens, clsr_padded, timed_steps, sentences, dense, peak)
    st = side_figures(sum(st_rounds), st_tokens, st_padded, timed_steps, sentences, dense, peak)
    return {
        "benchmark": "train",
        "method": method,
        "data": DATASETS[method],
        "columns": list(columns),
        "model": model,
        "batch": batch,
        "length": length,
        "steps": steps,
        "rounds": rounds,
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
        "clsr_collate_ms_per_step": collate_ms,
        "clsr_tokenised_rows": len(rows),
        "clsr": clsr,
        "sentence_transformers": st,
        "ratio_clsr_over_st": clsr["sentences_per_s"] / st["sentences_per_s"],
        "round_ratios": round_ratios,  # each round's: the same steps, sentences and rows' count
        "ratio_median_of_rounds": statistics.median(round_ratios),
    }


def format_train(f: dict[str, Any]) -> str:
    sides = (
        ("clsr " + f["method"], f["clsr"]),
        ("SentenceTransformerTrainer MNRL", f["sentence_transformers"]),
    )
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
            f"{f.get('rounds', 1) * f['steps']} timed steps after {f['warmup']} warm-up steps"
            + (f", in {f['rounds']} alternating rounds of {f['steps']}" if f.get("rounds", 1) > 1 else ""),
            "",
            table,
            "",
            f"ratio clsr / sentence-transformers (sentences/s): {f['ratio_clsr_over_st']:.2f}",
            *(
                [
                    "rounds (clsr's, then sentence-transformers'): "
                    + " ".join(f"{r:.2f}" for r in f["round_ratios"])
                    + f"; median {f['ratio_median_of_rounds']:.2f}"
                ]
                if f.get("rounds", 1) > 1
                else []
            ),
            f"note: sentence-transformers tokenises every batch in the timed step (its data collator); clsr "
            f"tokenises every row once per trial, outside the step ({f['clsr_tokenised_rows']} rows in "
            f"{f['clsr_tokenise_once_s']:.2f} s, not in the figures above); building a batch from its "
            f"token tables (collate, inside the step) took {f.get('clsr_collate_ms_per_step', 0):.2f} ms a step.",
            "note: clsr encodes all columns in one forward pass, "
            + (
                "packed into one row without padding (only sdpa_packed's attention pads, per sentence)"
                if "packed" in str(f["attention"]) or f["attention"] == "flash_attention_2"
                else f"sorted by length in groups of {f['length_group_size']} sentences, each padded to "
                "its own longest (trainer.length_group_size)"
                if f["length_group_size"]
                else "padded to the batch's longest (length groups off)"
            )
            + "; MNRL encodes the anchors, then the other columns together, each padded to its longest. "
            "padding = share of the tokens the encoder ran that were padding.",
            mfu,
        ]
    )
