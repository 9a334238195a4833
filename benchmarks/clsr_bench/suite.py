"""``platform bench suite``: every figure of docs/performance.md in one command.

On a CPU it runs the CPU targets: ``simcse_sup`` (with the default length groups and with
``sdpa_packed``) and ``supmpn`` training throughput on MiniLM against sentence-transformers, GradCache
memory, the 7-task STS evaluation and the smoke study. On a GPU it adds, in bf16, the same training on a BERT-base-shaped encoder at batch 64 and 512, the projected time
of one SimCSE-sup epoch (275,602 NLI triplets) from the batch-512 throughput, and the full GCLSR study.
Every part runs even when another fails; a failed part is printed with its error.

The BERT-base-shaped encoder has bert-base-uncased's architecture and vocabulary (MiniLM's tokenizer
is bert-base-uncased's WordPiece vocabulary) with random weights: the hub is out of reach on the
benchmark machines, and speed does not depend on the weights. ``--random-weights TOKENIZER_DIR`` uses
a MiniLM-shaped random encoder in place of all-MiniLM-L6-v2 too, for machines that cannot hold the
model package (the scores then mean nothing; times and memory are the same).
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clsr_bench import format_table, resolve_device

# rows of SimCSE's supervised training set (nli_for_simcse.csv: SNLI + MNLI entailment/contradiction)
SIMCSE_SUP_TRIPLETS = 275_602
SIMCSE_SUP_EVAL_STEPS = 125  # SimCSE's run_sup_example.sh: STS-B dev (and a checkpoint) every 125 steps
SIMCSE_SUP_BATCH = 512
TARGETS = {  # the targets (docs/performance.md)
    "cpu_train_ratio": 1.6,  # simcse_sup, MiniLM, batch 64, length 32, fp32: clsr / SentenceTransformerTrainer
    "cpu_sts_eval_ratio": 0.7,  # clsr / sentence-transformers wall time
    "gpu_train_ratio": 1.5,  # bf16 on one H200
    "gpu_epoch_s": 90.0,  # one SimCSE-sup epoch, BERT-base
    "gpu_gclsr_study_s": 20 * 60.0,  # the full GCLSR study, 3 seeds
}


# all-MiniLM-L6-v2's architecture (BertConfig's defaults are bert-base's)
MINILM_SHAPE = {
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
}


def shaped_encoder(folder: Path, tokenizer: str = "minilm", **shape: int) -> str:
    """Save a randomly initialised BERT of ``shape`` (default: bert-base) with ``tokenizer`` in ``folder``."""
    from transformers import BertConfig, BertModel

    from clsr.encoders.transformer import load_tokenizer

    words = load_tokenizer(tokenizer)  # MiniLM's is bert-base-uncased's vocabulary
    BertModel(BertConfig(vocab_size=words.vocab_size, **shape)).save_pretrained(folder)
    words.save_pretrained(folder)
    return str(folder)


def attempt(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one part; its figures, or its error (the other parts still run)."""
    print(f"[bench suite] {name} ...", flush=True)
    try:
        return run()
    except Exception as err:  # a benchmark part, not the program: record it and go on
        return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}


def run_suite(
    device: str = "auto",
    steps: int = 10,
    warmup: int = 3,
    study: bool = True,
    random_weights: str | None = None,
) -> dict[str, Any]:
    """Every part on ``device``; ``random_weights``: a tokenizer folder for random MiniLM-shaped weights."""
    gpu = resolve_device(device).type == "cuda"
    parts: dict[str, Any] = {"device": "cuda" if gpu else "cpu", "random_weights": bool(random_weights)}
    with tempfile.TemporaryDirectory(prefix="clsr-bench-models-") as tmp:
        small = "minilm"
        if random_weights:
            small = shaped_encoder(Path(tmp, "minilm"), random_weights, **MINILM_SHAPE)
        large = shaped_encoder(Path(tmp, "bert-base"), random_weights or "minilm") if gpu else None
        parts |= model_parts(device, steps, warmup, small, large)
        if study:
            parts |= study_parts(small, gpu)
    return parts


def model_parts(device: str, steps: int, warmup: int, small: str, large: str | None) -> dict[str, Any]:
    """Training throughput of ``small`` (and of ``large`` at batch 64 and 512), GradCache memory of the
    largest model here, and the STS evaluation of ``small``."""
    from clsr_bench.memory import run_memory
    from clsr_bench.sts_eval import run_sts_eval
    from clsr_bench.train import run_train

    parts = {
        "train_simcse_sup_minilm_b64": attempt(
            "train simcse_sup", lambda: run_train("simcse_sup", small, 64, 32, steps, warmup, device=device)
        ),
        # sentences packed into one row without padding: the faster setting on a CPU (docs/performance.md)
        "train_simcse_sup_minilm_b64_sdpa_packed": attempt(
            "train simcse_sup, sdpa_packed",
            lambda: run_train(
                "simcse_sup", small, 64, 32, steps, warmup, device=device, attention="sdpa_packed"
            ),
        ),
        "train_supmpn_minilm_b16": attempt(
            "train supmpn", lambda: run_train("supmpn", small, 16, 32, max(steps // 2, 2), 1, device=device)
        ),
    }
    for batch in (64, 512) if large else ():
        parts[f"train_simcse_sup_bert_base_b{batch}"] = attempt(
            f"train simcse_sup BERT-base batch {batch}",
            lambda batch=batch: run_train("simcse_sup", large, batch, 32, steps, warmup, device=device),
        )
    for packed in ("sdpa_packed", "flash_attention_2") if large else ():
        # sentences packed without padding; without the flash-attn package its part says what to install
        parts[f"train_simcse_sup_bert_base_b512_{packed}"] = attempt(
            f"train simcse_sup BERT-base batch 512, {packed}",
            lambda packed=packed: run_train(
                "simcse_sup", large, 512, 32, steps, warmup, device=device, attention=packed
            ),
        )
    model = large or small
    parts["eval_and_checkpoint"] = attempt(
        "STS-B dev evaluation and checkpoint", lambda: eval_and_checkpoint(model, device)
    )
    parts["memory"] = attempt(
        "memory", lambda: run_memory((64, 256, 512), 16, "simcse_sup", model, 32, "auto", device)
    )
    parts["sts_eval"] = attempt("sts-eval", lambda: run_sts_eval(small, "sts", None, 128, device))
    return parts


def study_parts(small: str, gpu: bool) -> dict[str, Any]:
    """The smoke study with in-process trials on ``small``; on a GPU also the full GCLSR study."""
    from clsr_bench.study import run_study_bench

    overrides = ["resources.workers_per_trial=0", f"base.model.name={small}"]
    parts = {
        "study_smoke": attempt("study smoke", lambda: run_study_bench("studies/smoke.yaml", False, overrides))
    }
    if gpu:
        parts["study_gclsr"] = attempt(
            "study gclsr", lambda: run_study_bench("studies/gclsr_ablations.yaml", False, [])
        )
    return parts


def eval_and_checkpoint(model: str, device: str) -> dict[str, Any]:
    """Seconds of what a training epoch does besides its steps, at each ``eval_steps``: one STS-B dev
    evaluation (1,500 pairs, the trial's precision; the second of two, with the first's seconds beside
    it) and one checkpoint (model, AdamW state, best weights:
    what ``clsr.train.checkpoint.save_checkpoint`` writes), with the bytes written."""
    import shutil
    import time

    import torch

    from clsr.config.model import ModelConfig
    from clsr.encoders.embed import transformer_embedder
    from clsr.encoders.precision import resolved_precision
    from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
    from clsr.eval.sts import evaluate_sts
    from clsr.train.checkpoint import save_checkpoint
    from clsr_bench import synchronize

    dev = resolve_device(device)
    encoder = TransformerEncoder(ModelConfig(name=model, pooling="cls")).to(dev)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-5)
    encoder(torch.ones(2, 8, dtype=torch.long, device=dev), torch.ones(2, 8, device=dev)).sum().backward()
    optimizer.step()  # AdamW's moments exist, as in a checkpoint after the first step
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    embed = transformer_embedder(encoder, load_tokenizer(model), 128, resolved_precision("auto", dev))
    eval_s = []  # the first pays for one-time work (kernel selection per new shape, imports); a trial's
    for _ in range(2):  # later evaluations do not, and the epoch projection counts those
        started = time.perf_counter()
        evaluate_sts(embed, ["stsb"], "dev", None)
        synchronize(dev)
        eval_s.append(time.perf_counter() - started)
    best = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
    started = time.perf_counter()
    folder = save_checkpoint(encoder, optimizer, scheduler, {"step": 1}, best, dev)
    checkpoint_s = time.perf_counter() - started
    written = sum(f.stat().st_size for f in folder.iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "dev_eval_s": eval_s[1],
        "dev_eval_first_s": eval_s[0],
        "checkpoint_s": checkpoint_s,
        "checkpoint_bytes": written,
    }


def epoch_seconds(train: dict[str, Any], extras: dict[str, Any] | None = None) -> float | None:
    """One SimCSE-sup epoch (clsr side): its steps at the measured rows per second, plus an STS-B dev
    evaluation and a checkpoint every ``SIMCSE_SUP_EVAL_STEPS`` steps (and at the end) when measured."""
    if "clsr" not in train:
        return None
    rows_per_s = train["clsr"]["sentences_per_s"] / len(train["columns"])
    seconds = SIMCSE_SUP_TRIPLETS / rows_per_s
    if extras and "dev_eval_s" in extras:
        evaluations = -(-SIMCSE_SUP_TRIPLETS // (train["batch"] * SIMCSE_SUP_EVAL_STEPS))
        seconds += evaluations * (extras["dev_eval_s"] + extras["checkpoint_s"])
    return seconds


def target_rows(f: dict[str, Any]) -> list[list[Any]]:
    """(target, asked, measured, met) for each target this machine can measure."""

    def ratio(part: str, key: str) -> float | None:
        return f.get(part, {}).get(key)

    rows: list[list[Any]] = []
    if f["device"] == "cpu":
        train = ratio("train_simcse_sup_minilm_b64", "ratio_clsr_over_st")
        packed = ratio("train_simcse_sup_minilm_b64_sdpa_packed", "ratio_clsr_over_st")
        sts = ratio("sts_eval", "ratio_clsr_over_st_time")
        rows += [["simcse_sup MiniLM b64 speed vs ST", f"≥ {TARGETS['cpu_train_ratio']}", train]]
        rows += [["the same, model.attention sdpa_packed", f"≥ {TARGETS['cpu_train_ratio']}", packed]]
        rows += [["STS eval time vs ST", f"≤ {TARGETS['cpu_sts_eval_ratio']}", sts]]
    else:
        train = ratio("train_simcse_sup_bert_base_b512", "ratio_clsr_over_st")
        epoch = epoch_seconds(f.get("train_simcse_sup_bert_base_b512", {}), f.get("eval_and_checkpoint"))
        study = f.get("study_gclsr", {}).get("wall_s")
        rows += [["simcse_sup BERT-base b512 bf16 speed vs ST", f"≥ {TARGETS['gpu_train_ratio']}", train]]
        rows += [
            [
                f"SimCSE-sup epoch ({SIMCSE_SUP_TRIPLETS:,} triplets, evaluations and checkpoints), s",
                f"≤ {TARGETS['gpu_epoch_s']:.0f}",
                epoch,
            ]
        ]
        rows += [["GCLSR study (all tables, 3 seeds), s", f"≤ {TARGETS['gpu_gclsr_study_s']:.0f}", study]]
    for row in rows:
        limit = float(row[1].split()[-1])
        row.append(
            "-" if row[2] is None else ("yes" if (row[2] >= limit) == row[1].startswith("≥") else "no")
        )
    return rows


def format_eval_and_checkpoint(part: dict[str, Any]) -> str:
    return (
        f"STS-B dev evaluation {part['dev_eval_s']:.1f} s (the first {part['dev_eval_first_s']:.1f} s); checkpoint {part['checkpoint_s']:.1f} s, "
        f"{part['checkpoint_bytes'] / 2**20:,.0f} MiB written (model, AdamW state, best weights)"
    )


def format_suite(f: dict[str, Any]) -> str:
    from clsr_bench.memory import format_memory
    from clsr_bench.sts_eval import format_sts_eval
    from clsr_bench.study import format_study
    from clsr_bench.train import format_train

    formats = {"train": format_train, "memory": format_memory, "sts_eval": format_sts_eval}
    formats |= {"study": format_study, "eval_and_checkpoint": format_eval_and_checkpoint}
    out = []
    for name, part in f.items():
        kind = next((k for k in formats if name.startswith(k)), None)
        if kind is None:  # "device", "machine"
            continue
        out += [f"== {name} ==", ""]
        if "error" in part:
            out += [f"failed: {part['error']}", ""]
            continue
        out += [formats[kind](part), ""]
    out += ["== targets ==", "", format_table(["target", "asked", "measured", "met"], target_rows(f))]
    return "\n".join(out)
