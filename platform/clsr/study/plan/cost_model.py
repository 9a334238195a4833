"""``platform study plan`` before anything has run: a trial's seconds from its resolved configuration
alone (model size, lengths, batch, steps, evaluation sets), priced by FLOPs.

Training costs 6 × N × tokens and encoding 2 × N × tokens (N: the encoder's non-embedding parameters;
Kaplan et al. 2020, the formula ``platform bench train`` reports its MFU with), divided by an effective
throughput that ``platform bench train`` measured on each device (below, each with its source). A trial
holding a fraction of a GPU gets that fraction of the card's throughput; a CPU trial gets the measured
2-core figure scaled by its CPUs. Fixed costs (set-up, checkpoint writes, the transfer tasks'
classifier fits) are measured seconds. Every figure is rough by design (a factor of two either way):
``--probe`` or ``--from`` a run of the same configuration replaces it with measurements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from clsr.config.trial import TrialConfig
from clsr.data.tasks import TASK_GROUPS

# Effective FLOP/s of a trial holding the whole device: 6 × non-embedding parameters × real
# (unpadded) tokens per second of `platform bench train --method simcse_sup --length 32`.
THROUGHPUT = {
    # 2 CPU cores, fp32, MiniLM batch 64: 6 × 10,646,784 × 1,559.7 tokens/s
    # (benchmarks/results/2026-11-29-cpu2/bench-train-quiet-1.json)
    "cpu": 9.96e10,
    # one H100, bf16, BERT-base batch 512: MFU 10.2 % of 989 TFLOP/s (benchmarks/results/2026-11-25-h100)
    "h100": 1.009e14,
    # one H200, bf16, BERT-base batch 512: 6 × 85,054,464 × 247,980.5 tokens/s (MFU 12.8 %;
    # benchmarks/results/2026-11-26-h200/b512_sdpa.json)
    "h200": 1.266e14,
    # not measured: the H100's 10.2 % MFU of the A100's 312 TFLOP/s bf16 peak (extrapolated)
    "a100": 3.18e13,
}
MEASURED_ON = {"cpu": True, "h100": True, "h200": True, "a100": False}
CPU_CORES_MEASURED = 2  # the cpu figure's cores; a trial with more is scaled linearly (extrapolated)
# Mean real tokens of a sentence at max_seq_length 32: 509,554 tokens in 20 steps of 512 NLI triplets
# (b512_sdpa.json above); other corpora and lengths are extrapolated as min(length, this).
TOKENS_PER_SENTENCE = 16.6
# One trial's set-up (model, data, word table): 8.4 s, the GCLSR probe on an H100
# (benchmarks/results/2026-11-25-h100, "The full GCLSR study, probed").
SETUP_S = 8.4
# One checkpoint (model, AdamW moments, best weights): 1,752,038,027 bytes in 4.18 s for BERT-base's
# 108,891,648 parameters (benchmarks/results/2026-11-26-h200/evalckpt.json): bytes per parameter, bytes/s.
CHECKPOINT_BYTES_PER_PARAM = 16.1
CHECKPOINT_BYTES_PER_S = 4.19e8
# The seven SentEval transfer tasks, test mode, on a trial's 2 CPUs: about 10 minutes
# (benchmarks/results/2026-11-26-h200, "The transfer fits, stacked").
TRANSFER_S = 600.0
TRANSFER_EXAMPLES = (
    10_000  # the size of a typical transfer set (MR 10,662, SUBJ 10,000): fast mode scales by it
)
# Test pairs of each STS task (SentEval's files) and STS-B dev, two sentences each.
STS_PAIRS = {
    "sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000, "sts16": 1186, "stsb": 1379, "sickr": 4927,
}  # fmt: skip
DEV_PAIRS = {"stsb": 1500, "sickr": 500}
# (layers, hidden, intermediate, vocabulary) of the models the shipped studies name, from each model's
# published config.json: their sizes offline, where the hub's copy is not in the local cache.
KNOWN_SHAPES = {
    "bert-base-uncased": (12, 768, 3072, 30522),
    "bert-large-uncased": (24, 1024, 4096, 30522),
    "roberta-base": (12, 768, 3072, 50265),
    "sentence-transformers/nli-roberta-base-v2": (12, 768, 3072, 50265),
    "minilm": (6, 384, 1536, 30522),  # all-MiniLM-L6-v2
}
# How much of the transformer's effective throughput each encoder gets: a GCLSR step (TextCNN, batch 512,
# eight trials sharing an H100) took 99 ms where its FLOPs at the H100's figure take 32 ms
# (benchmarks/results/2026-11-25-h100, the GCLSR probe): word lookups, augmentation and small kernels.
EFFICIENCY = {"transformer": 1.0, "textcnn": 0.32}
# Sentences a training row encodes where the method's views() does not say it: GCLSR encodes two
# augmented views of its one text column (methods/gclsr.py).
ENCODED_VIEWS = {"gclsr": 2}
VECTOR_DIMS = {"word2vec-google-news-300": 300, "glove-6b-50d-local": 50}  # else the name's trailing number


@dataclass(frozen=True)
class ModelSize:
    """An encoder's non-embedding and total parameters, and where the figure came from."""

    dense: int
    total: int
    source: str  # "config.json", "known shape", or "assumed: ..." (an unknown model)


def transformer_size(layers: int, hidden: int, intermediate: int, vocab: int) -> tuple[int, int]:
    """(non-embedding, total) parameters: attention 4h² and feed-forward 2h·i per layer (biases and
    layer norms left out: 0.2 % of BERT-base)."""
    dense = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return dense, dense + vocab * hidden


def known_parameters(name: str) -> int | None:
    """All parameters of a model of ``KNOWN_SHAPES`` (its published config), None for another."""
    return transformer_size(*KNOWN_SHAPES[name])[1] if name in KNOWN_SHAPES else None


def local_config(name: str) -> dict | None:
    """The model's config.json from a folder, a short name, or the local hub cache; never the network."""
    from clsr.data.hub.model_registry import ModelUnavailableError, hub_cache, resolve_model_path

    try:
        path = Path(resolve_model_path(name)) / "config.json"
    except ModelUnavailableError:
        return None
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        try:  # reads the cache folder only
            cached = try_to_load_from_cache(name, "config.json", cache_dir=hub_cache())
        except Exception:  # not a hub id: nothing to read
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def model_size(trial: TrialConfig) -> ModelSize:
    """The trial's encoder size: its config.json where it is here, else the known shapes, else BERT-base's
    (said so)."""
    model = trial.model
    if model.type == "textcnn":  # convolutions over frozen vectors: the table is looked up, not multiplied
        dim = VECTOR_DIMS.get(model.vectors) or int((re.findall(r"\d+", model.vectors) or ["300"])[-1])
        dense = sum(model.region_sizes) * dim * model.filters
        return ModelSize(dense, dense, f"TextCNN: {model.filters} filters x region sizes on {dim}-d vectors")
    name = model.name
    if (config := local_config(name)) and "hidden_size" in config:
        shape = (
            config.get("num_hidden_layers", 12),
            config["hidden_size"],
            config.get("intermediate_size", 4 * config["hidden_size"]),
            config.get("vocab_size", 30522),
        )
        return ModelSize(*transformer_size(*shape), "config.json")
    if name in KNOWN_SHAPES:
        return ModelSize(*transformer_size(*KNOWN_SHAPES[name]), "known shape (not in the local cache)")
    return ModelSize(*transformer_size(*KNOWN_SHAPES["bert-base-uncased"]), "assumed: BERT-base's shape")


def tokens_per_sentence(trial: TrialConfig) -> float:
    length = getattr(trial.model, "max_seq_length", None) or getattr(trial.model, "max_words", 32)
    return min(float(length), TOKENS_PER_SENTENCE)


def device_flops(kind: str, gpus: float, cpus: float) -> float:
    """The throughput a trial gets: its share of a GPU of ``kind``, or its CPUs."""
    if gpus > 0:
        return THROUGHPUT[kind] * gpus
    return THROUGHPUT["cpu"] * max(cpus, 1) / CPU_CORES_MEASURED


@dataclass(frozen=True)
class TrialCost:
    """A trial's priced parts, in seconds."""

    setup_s: float
    steps_s: float
    dev_eval_s: float
    checkpoint_s: float
    test_eval_s: float

    @property
    def total_s(self) -> float:
        return self.setup_s + self.steps_s + self.dev_eval_s + self.checkpoint_s + self.test_eval_s


def encoded_views(trial: TrialConfig) -> int:
    """Sentences each training row encodes."""
    from clsr.methods import build_method

    return ENCODED_VIEWS.get(trial.method["name"]) or len(build_method(trial).views())


def trial_cost(
    trial: TrialConfig, steps: int, evaluations: int, checkpoints: int, flops: float, cpus: float
) -> TrialCost:
    """``flops``: the trial's effective FLOP/s on its device (``device_flops``), scaled here by its
    encoder's ``EFFICIENCY``; ``cpus``: its CPUs (the transfer fits run there)."""
    views = encoded_views(trial)
    flops *= EFFICIENCY[trial.model.type]
    size = model_size(trial)
    tokens = tokens_per_sentence(trial)
    train = 6 * size.dense * trial.trainer.batch_size * views * tokens * steps
    cap = trial.eval.sts_max_pairs
    pairs = sum(min(DEV_PAIRS.get(t, 0), cap or DEV_PAIRS.get(t, 0)) for t in trial.eval.dev_tasks)
    dev = 2 * pairs * 2 * size.dense * tokens
    return TrialCost(
        setup_s=SETUP_S,
        steps_s=train / flops,
        dev_eval_s=evaluations * dev / flops,
        checkpoint_s=checkpoints * size.total * CHECKPOINT_BYTES_PER_PARAM / CHECKPOINT_BYTES_PER_S,
        test_eval_s=_test_flops(trial, size, tokens) / flops + _transfer_s(trial, cpus),
    )


def _test_flops(trial: TrialConfig, size: ModelSize, tokens: float) -> float:
    cap = trial.eval.sts_max_pairs
    tasks = [t for t in expand_tasks(trial.eval.tasks) if t in STS_PAIRS]
    pairs = sum(min(STS_PAIRS[t], cap or STS_PAIRS[t]) for t in tasks)
    return 2 * pairs * 2 * size.dense * tokens


def _transfer_s(trial: TrialConfig, cpus: float) -> float:
    if not set(expand_tasks(trial.eval.tasks)) & set(TASK_GROUPS["transfer"]):
        return 0.0
    share = 1.0
    if trial.eval.transfer_mode == "fast" and trial.eval.transfer_max_examples:
        share = min(1.0, trial.eval.transfer_max_examples / TRANSFER_EXAMPLES)
    return TRANSFER_S * share * CPU_CORES_MEASURED / max(cpus, 1)


def expand_tasks(tasks: list[str]) -> list[str]:
    """``sts`` / ``transfer`` groups as their tasks."""
    return [t for name in tasks for t in TASK_GROUPS.get(name, (name,))]
