"""SelfCCL: curriculum contrastive learning by self-taught scoring (Dehghan & Amasyali 2023), methods.md §5.

No code was released, so only the outline below is the paper's; every rule marked *proposed* is
methods.md's reading of what it leaves open, kept configurable.

Rows are NLI triplets ``(x, x⁺, x⁻)`` (premise, entailment, contradiction; paper §4.2).

**Phase 1, scoring (paper §4.3; once per study, shared by its trials).** A frozen encoder (default:
the pretrained encoder and pooling the trial starts from; ``cls`` scores with ``cls_before_pooler``,
as the freshly initialised MLP means nothing yet; or, beyond the paper, a trained trial's checkpoint,
which a staged study passes in with ``needs: {method.scoring_model: ...}``) embeds every triplet;
with the cosine distance ``d(u, v) = 1 − cos(u, v)`` and the margin ``δ = d(x, x⁻) − d(x, x⁺)`` each triplet is

    easy        δ > m               (d(x,x⁺) + m < d(x,x⁻))
    semi-hard   0 < δ ≤ m           (d(x,x⁺) < d(x,x⁻) < d(x,x⁺) + m)
    hard        δ ≤ 0               (d(x,x⁻) < d(x,x⁺))

with m = 0.2; boundary ties go to the harder class (*proposed*). The rows are then listed easy,
semi-hard, hard (``order: curriculum``); inside a class in a seeded shuffle (*proposed*) or by δ,
largest first (``within: margin``). ``anti`` lists hard first (by δ, smallest first), ``random`` a
seeded permutation with the same pacing (the random curriculum of paper §3.2), ``none`` no
curriculum at all (plain shuffled epochs: supervised SimCSE for as many epochs).

**Phase 2, pacing (paper §4.3).** ``g(t) = (t/T)^λ · k`` with k the number of rows and λ = 1
(linear; ½ root, 2 quadratic). Per epoch (``pacing_unit: epoch``, the default: the paper calls g(t)
"the size of training data to be used at epoch t"): epoch e = 1..E, E = ⌈trainer.epochs⌉, is one
seeded shuffled pass over the first ``n_e = max(B, ⌈(e/E)^λ·k⌉)`` listed rows, cut into ⌊n_e/B⌋ full
batches: every row of the pool once (the n_e mod B < B rows the shuffle leaves last wait for the next
epoch, the ``drop_last`` of plain epochs). Epochs therefore have different lengths: the trial trains
Σ_e ⌊n_e/B⌋ steps (the last epoch cut to the fraction of a fractional ``trainer.epochs``, then
capped by ``trainer.max_steps``), which ``plan_steps`` gives the loop for its LR schedule; the loop
still asks ``batch_order`` for ⌊k/B⌋ steps at a time, its slice of the paced epochs laid end to end.
Per step (``pacing_unit: step``, *proposed*, Bengio 2009 / Hacohen & Weinshall 2019): at step
t = 1..T, T = the trial's optimiser steps (epochs × ⌊k/B⌋, capped by ``trainer.max_steps``), the pool
is the first ``max(B, ⌈g(t)⌉)`` rows of the list and the batch is B rows drawn uniformly without
replacement from it, seeded by (seed, epoch); over 4 epochs a row at list fraction u is drawn about
4·ln(1/u) times (the easiest 1 % ≈ 18–22 times, the hardest 10 % ≈ 0.2), so "4 epochs" are not 4 passes.
``batch_order`` sees only (rows, B, epoch, seed), so the method keeps its plan from the trial config
it is given in ``prepare_rows``.

**Loss (paper §4.4).** Supervised SimCSE with one hard negative (SimCSE Eq. 5, α = 1; identical to
MNRL at scale 1/τ), ``s = cos/τ``, τ = 0.05, mean over the N rows of the (global) batch:

    ℓ_i = −log [ e^{s(h_i,h_i⁺)} / Σ_{j=1..N} ( e^{s(h_i,h_j⁺)} + e^{s(h_i,h_j⁻)} ) ]

The paper's own equation numbers are not recorded in methods.md; §4.3/§4.4 are its section numbers.

Artifacts of each trial's MLflow run: ``selfccl/scored_triplets.csv`` (per row: class, distances,
δ, place in the list), ``selfccl/scoring_summary.json`` (counts per class, settings, examples), the
metrics ``selfccl_easy`` / ``selfccl_semi_hard`` / ``selfccl_hard`` / ``selfccl_scoring_s``, the draws
of the trial's planned steps (mean times a row is drawn) per class, ``curriculum_draws_easy`` /
``_semi_hard`` / ``_hard``, and per tenth of the rows by δ, ``curriculum_draws_decile_01`` (easiest)
… ``_10`` (hardest), and
Figure 4: ``selfccl/fig4_sickr_start.png`` and ``selfccl/fig4_sickr_final.png`` (cosine similarity
against the human relatedness of the SICK-R test pairs, for the starting and the trained encoder).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from clsr.config.model import PoolingName
from clsr.config.steps import plan_steps
from clsr.config.trial import TrialConfig
from clsr.data.batching import shuffled_batches
from clsr.methods.base import Method, MethodConfig
from clsr.methods.simcse_sup import simcse_sup_loss
from clsr.tracking.run_logger import RunLogger

EASY, SEMI_HARD, HARD = 0, 1, 2
CLASS_NAMES = ("easy", "semi_hard", "hard")
PACING_LAMBDAS = {"root": 0.5, "linear": 1.0, "quadratic": 2.0}
Order = Literal["curriculum", "anti", "random", "none"]
Within = Literal["shuffle", "margin"]
TRIPLET = ("anchor", "positive", "negative")


class SelfCCLConfig(MethodConfig):
    name: str = "selfccl"
    order: Order = Field(
        "curriculum", description="curriculum (easy→hard), anti (hard→easy), random (paced), none"
    )
    pacing: Literal["root", "linear", "quadratic"] | float = Field(
        "linear", description="λ of g(t) = (t/T)^λ·k: root = ½, linear = 1, quadratic = 2, or a number"
    )
    pacing_unit: Literal["epoch", "step"] = Field(
        "epoch",
        description="t counts epochs (each a pass over its pool; paper: g(t) is 'the size of training data "
        "to be used at epoch t') or optimiser steps (our option: a batch drawn from a new pool every step)",
    )
    margin: float = Field(0.2, ge=0, description="m of the easy / semi-hard boundary")
    within: Within = Field("shuffle", description="order inside a class: seeded shuffle, or by δ")
    scoring_model: str | None = Field(
        None,
        description="frozen scoring encoder: a model name, or a trained trial's checkpoint folder (a staged "
        "study fills it with needs:); None: the trial's model.name",
    )
    scoring_weights: Literal["last", "best"] = Field(
        "best", description="with a checkpoint as scoring_model: its best-dev weights, or its last ones"
    )
    scoring_pooling: PoolingName | None = Field(
        None, description="pooling for scoring; None: the trial's (cls → cls_before_pooler)"
    )
    scoring_batch_size: int = Field(256, ge=1)
    temperature: float = Field(0.05, gt=0, description="τ of SimCSE Eq. 5")
    figure: bool = Field(True, description="log Figure 4 (SICK-R test scatter) at the start and the end")
    figure_max_pairs: int | None = Field(None, ge=2, description="seeded subset of SICK-R test pairs")

    @field_validator("pacing")
    @classmethod
    def _positive_lambda(cls, value: str | float) -> str | float:
        if not isinstance(value, str) and value <= 0:
            raise ValueError(f"pacing λ must be > 0 (or root / linear / quadratic), got {value}")
        return value

    @property
    def lam(self) -> float:
        return PACING_LAMBDAS[self.pacing] if isinstance(self.pacing, str) else float(self.pacing)


# --- phase 1: scoring -----------------------------------------------------------------------------
def triplet_margins(
    anchor: np.ndarray, positive: np.ndarray, negative: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine distances ``(d(x, x⁺), d(x, x⁻))`` per row of three ``(n, dim)`` arrays."""

    def unit(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    a = unit(anchor)
    return 1.0 - np.sum(a * unit(positive), axis=1), 1.0 - np.sum(a * unit(negative), axis=1)


def classify_triplets(d_pos: np.ndarray, d_neg: np.ndarray, margin: float = 0.2) -> np.ndarray:
    """0 easy (δ > m), 1 semi-hard (0 < δ ≤ m), 2 hard (δ ≤ 0), δ = d_neg − d_pos; ties go harder."""
    delta = np.asarray(d_neg, dtype=np.float64) - np.asarray(d_pos, dtype=np.float64)
    return np.where(delta > margin, EASY, np.where(delta > 0, SEMI_HARD, HARD)).astype(np.int8)


def curriculum_order(
    classes: np.ndarray,
    margins: np.ndarray,
    order: Order = "curriculum",
    within: Within = "shuffle",
    seed: int = 0,
) -> np.ndarray:
    """Row indices in training-list order. ``margins``: δ = d_neg − d_pos (larger = easier)."""
    classes, margins = np.asarray(classes), np.asarray(margins, dtype=np.float64)
    rng = np.random.default_rng(seed)
    if order == "none":
        return np.arange(len(classes))
    if order == "random":
        return rng.permutation(len(classes))
    if order not in ("curriculum", "anti"):
        raise ValueError(f"order must be curriculum, anti, random or none, got {order!r}")
    hard_first = order == "anti"
    parts = []
    for c in (HARD, SEMI_HARD, EASY) if hard_first else (EASY, SEMI_HARD, HARD):
        idx = np.flatnonzero(classes == c)
        if within == "margin":
            idx = idx[np.argsort(margins[idx] if hard_first else -margins[idx], kind="stable")]
        elif within == "shuffle":
            idx = rng.permutation(idx)
        else:
            raise ValueError(f"within must be shuffle or margin, got {within!r}")
        parts.append(idx)
    return np.concatenate(parts) if parts else np.arange(0)


@dataclass(frozen=True)
class TripletScores:
    """Phase 1's output for one row list: built once per study, shared through Ray's object store."""

    d_pos: np.ndarray  # float32 (k,)
    d_neg: np.ndarray
    fingerprint: str  # of the rows scored, checked against the rows a trial trains on
    encoder: str
    pooling: str
    max_length: int
    seconds: float


def rows_fingerprint(rows: Sequence[dict[str, str]]) -> str:
    digest = hashlib.sha1()
    for row in rows:
        digest.update("\x1f".join(row[c] for c in TRIPLET).encode() + b"\x1e")
    return f"{len(rows)}:{digest.hexdigest()}"


def score_triplets(
    rows: Sequence[dict[str, str]], embed: Callable[[list[str]], np.ndarray], chunk_rows: int = 16384
) -> tuple[np.ndarray, np.ndarray]:
    """``(d_pos, d_neg)`` for every row, embedding ``chunk_rows`` rows (their distinct texts) at a time."""
    d_pos, d_neg = np.empty(len(rows), np.float32), np.empty(len(rows), np.float32)
    for start in range(0, len(rows), chunk_rows):
        part = rows[start : start + chunk_rows]
        vectors = embed([row[c] for row in part for c in TRIPLET]).reshape(len(part), 3, -1)
        d_pos[start : start + len(part)], d_neg[start : start + len(part)] = triplet_margins(
            vectors[:, 0], vectors[:, 1], vectors[:, 2]
        )
    return d_pos, d_neg


# --- phase 2: pacing --------------------------------------------------------------------------------
def pacing_size(t: float, total: float, k: int, lam: float, minimum: int = 0) -> int:
    """``max(minimum, ⌈(t/T)^λ·k⌉)``, at most k: the number of listed rows available at step t."""
    if total <= 0:
        raise ValueError(f"T must be > 0, got {total}")
    g = (min(max(t, 0.0), total) / total) ** lam * k
    return int(min(k, max(minimum, math.ceil(g - 1e-9))))


def epoch_pool_sizes(k: int, batch_size: int, epochs: int, lam: float, count: int) -> list[int]:
    """Per-epoch pacing: the pools ``max(B, ⌈(e/E)^λ·k⌉)`` of epochs e = 1..count (all k rows past E)."""
    return [pacing_size(e, epochs, k, lam, batch_size) for e in range(1, count + 1)]


def epoch_paced_batches(
    order: np.ndarray, batch_size: int, pool: int, epoch: int, seed: int
) -> list[list[int]]:
    """Paced epoch ``epoch`` (from 0): a pass over the first ``pool`` rows of ``order``, each once, in a
    seeded shuffle cut into full batches (what plain epochs do with all the rows)."""
    return [order[batch].tolist() for batch in shuffled_batches(pool, batch_size, epoch, seed)]


def paced_batches(
    order: np.ndarray,
    batch_size: int,
    steps: Sequence[float],
    total: float,
    lam: float,
    rng: np.random.Generator,
) -> list[list[int]]:
    """One batch per t in ``steps``: B distinct rows drawn uniformly from the first max(B, ⌈g(t)⌉) of ``order``."""
    k = len(order)
    if batch_size > k:
        raise ValueError(f"batch size {batch_size} exceeds the {k} rows")
    return [
        order[rng.choice(pacing_size(t, total, k, lam, batch_size), batch_size, replace=False)].tolist()
        for t in steps
    ]


def draw_means(draws: np.ndarray, classes: np.ndarray, margins: np.ndarray) -> dict[str, float]:
    """Mean draws per row of each class (``curriculum_draws_easy`` …) and of each tenth of the rows
    ranked by δ, easiest first (``curriculum_draws_decile_01`` … ``_10``); empty groups are left out."""
    out = {
        f"curriculum_draws_{name}": float(draws[classes == c].mean())
        for c, name in enumerate(CLASS_NAMES)
        if np.any(classes == c)
    }
    tenths = np.array_split(np.argsort(-np.asarray(margins), kind="stable"), 10)
    out |= {
        f"curriculum_draws_decile_{i:02d}": float(draws[t].mean()) for i, t in enumerate(tenths, 1) if len(t)
    }
    return out


# --- Figure 4 ----------------------------------------------------------------------------------------
def plot_sick_relatedness(
    embed: Callable[[list[str]], np.ndarray],
    path: str | Path,
    data_dir: str | Path | None = None,
    title: str = "",
    max_pairs: int | None = None,
    seed: int = 0,
) -> float:
    """Paper Figure 4: cosine similarity of each SICK-R test pair against its human relatedness (1–5),
    coloured by relatedness; saved as a PNG at ``path``. Returns Spearman × 100 on the pairs drawn."""
    from matplotlib.figure import Figure
    from scipy.stats import spearmanr

    from clsr.data.sources import resolve_data_dir
    from clsr.data.sts import load_sts

    split = load_sts("sickr", "test", resolve_data_dir(data_dir))
    pick = np.arange(len(split.scores))
    if max_pairs is not None and max_pairs < len(pick):
        pick = np.sort(np.random.default_rng(seed).choice(len(pick), max_pairs, replace=False))
    first, second = [split.sentences1[i] for i in pick], [split.sentences2[i] for i in pick]
    vectors = embed(first + second)
    sims = 1.0 - triplet_margins(vectors[: len(pick)], vectors[len(pick) :], vectors[len(pick) :])[0]
    gold = split.scores[pick]
    rho = 100 * float(spearmanr(sims, gold).statistic)
    fig = Figure(figsize=(5.5, 4.2))  # no pyplot: no global backend state, renders with Agg
    ax = fig.add_subplot()
    points = ax.scatter(gold, sims, c=gold, cmap="viridis", s=6, alpha=0.7, linewidths=0)
    fig.colorbar(points, ax=ax, label="human relatedness")
    ax.set_xlabel("human relatedness score (SICK-R test)")
    ax.set_ylabel("cosine similarity")
    ax.set_title(f"{title} (Spearman {rho:.2f}, n = {len(pick)})".strip(), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    return rho


class SelfCCL(Method):
    name = "selfccl"
    Config = SelfCCLConfig
    paper = "SelfCCL (Dehghan & Amasyali, 2023); curriculum over supervised SimCSE Eq. 5"
    # methods.md §5.4, SelfCCL-BERT-base in the SimCSE-sup setup (lr, length, no warm-up: [unverified]).
    paper_defaults: ClassVar = {
        "model": {"name": "bert-base-uncased", "pooling": "avg_first_last", "max_seq_length": 32},
        "data": {"train": "nli_for_simcse"},
        "trainer": {"batch_size": 512, "lr": 5e-5, "epochs": 4, "eval_steps": 125, "weight_decay": 0.0},
    }

    def __init__(self, cfg: SelfCCLConfig):
        super().__init__(cfg)
        self._scores: TripletScores | None = None
        self._plan: dict[str, Any] | None = None  # list order and T, set by prepare_rows

    def views(self) -> tuple[str, ...]:
        return TRIPLET

    # --- phase 1, once per study -------------------------------------------------------------------
    def scoring_setup(self, trial: TrialConfig) -> tuple[str, str, int]:
        """(encoder, pooling, max length) that score the triplets."""
        pooling = self.cfg.scoring_pooling or trial.model.pooling
        if pooling == "cls":
            pooling = "cls_before_pooler"
        return self.cfg.scoring_model or trial.model.name, pooling, trial.model.max_seq_length

    def shared_key(self, trial: TrialConfig) -> str:
        """The scores depend on the rows (set, size, subset seed) and the scoring encoder only."""
        d = trial.data
        subset = d.subset_seed if d.subset_seed is not None else trial.trainer.seed
        encoder, pooling, length = self.scoring_setup(trial)
        weights = self.cfg.scoring_weights
        return f"selfccl-score:{d.train}:{d.data_dir}:{d.max_rows}:{subset}:{encoder}:{weights}:{pooling}:{length}"

    def prepare_shared(self, trial: TrialConfig) -> TripletScores:
        from clsr.config.model import ModelConfig
        from clsr.data.training import training_rows
        from clsr.encoders.embed import transformer_embedder
        from clsr.encoders.trained import is_checkpoint, load_trained_encoder
        from clsr.encoders.transformer import load_tokenizer

        rows = training_rows(trial)
        encoder_name, pooling, length = self.scoring_setup(trial)
        started = time.perf_counter()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # a trained checkpoint holds weights only: the trial's own model.name gives architecture and vocabulary
        base_name = trial.model.name if is_checkpoint(encoder_name) else encoder_name
        config = ModelConfig(name=base_name, pooling=pooling, max_seq_length=length)
        encoder = load_trained_encoder(encoder_name, config, self.cfg.scoring_weights)
        encoder.to(device).eval().requires_grad_(False)
        tokenizer = load_tokenizer(base_name)
        tokenizer.model_max_length = length  # score what training sees: the same truncation
        d_pos, d_neg = score_triplets(
            rows, transformer_embedder(encoder, tokenizer, self.cfg.scoring_batch_size)
        )
        del encoder
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return TripletScores(
            d_pos, d_neg, rows_fingerprint(rows), encoder_name, pooling, length, time.perf_counter() - started
        )

    def text_pipeline(self, trial: TrialConfig, shared: Any) -> Any:
        self._scores = shared
        return super().text_pipeline(trial, shared)

    # --- phase 2: the list and its pacing ----------------------------------------------------------
    def prepare_rows(self, rows: list[dict[str, str]], pipeline: Any, trial: TrialConfig) -> Any:
        """Classifies and orders the rows, and keeps the plan (T, B, seed, epochs) for ``batch_order``."""
        self.check_columns(rows)
        if self._scores is None:
            self._scores = self.prepare_shared(trial)
        if self._scores.fingerprint != rows_fingerprint(rows):
            raise ValueError(
                "the shared SelfCCL scores were computed for other training rows; the shared_key must "
                "name everything the rows depend on"
            )
        classes = classify_triplets(self._scores.d_pos, self._scores.d_neg, self.cfg.margin)
        margins = self._scores.d_neg.astype(np.float64) - self._scores.d_pos
        order = curriculum_order(classes, margins, self.cfg.order, self.cfg.within, trial.trainer.seed)
        t = trial.trainer
        steps_per_epoch, total_steps = plan_steps(len(rows), trial, 1)
        self._plan = {
            "rows": rows,
            "classes": classes,
            "margins": margins,
            "order": order,
            "steps_per_epoch": steps_per_epoch,
            "total_steps": total_steps,
            "epochs": math.ceil(t.epochs),
            "batch_size": t.batch_size,
            "seed": t.seed,
        }
        if self.per_epoch:
            self._plan["total_steps"] = self.epoch_paced_steps(len(rows), t)
        return super().prepare_rows(rows, pipeline, trial)

    @property
    def per_epoch(self) -> bool:
        return self.cfg.order != "none" and self.cfg.pacing_unit == "epoch"

    def epoch_paced_steps(self, k: int, t: Any) -> int:
        """Σ_e ⌊n_e/B⌋ over the E = ⌈epochs⌉ paced epochs, the last cut to the fraction of a fractional
        ``epochs``, capped by ``max_steps``."""
        epochs = math.ceil(t.epochs)
        lengths = [n // t.batch_size for n in epoch_pool_sizes(k, t.batch_size, epochs, self.cfg.lam, epochs)]
        total = sum(lengths[:-1]) + math.ceil((t.epochs - epochs + 1) * lengths[-1] - 1e-9)
        return total if t.max_steps is None else min(total, t.max_steps)

    def plan_steps(self, num_rows: int, trial: TrialConfig, world: int) -> tuple[int, int]:
        """The loop's ⌊k/B⌋ steps per epoch (the slices ``batch_order`` hands out); per-epoch pacing's
        own total, planned by ``prepare_rows``."""
        steps_per_epoch, total_steps = super().plan_steps(num_rows, trial, world)  # the batch-size checks
        if not self.per_epoch:
            return steps_per_epoch, total_steps
        if self._plan is None or len(self._plan["order"]) != num_rows:
            raise RuntimeError("SelfCCL.plan_steps needs prepare_rows on the same rows first")
        return steps_per_epoch, self._plan["total_steps"]

    def batch_order(
        self, rows: Sequence[dict[str, str]], batch_size: int, epoch: int, seed: int
    ) -> list[list[int]]:
        if self.cfg.order == "none":
            return shuffled_batches(len(rows), batch_size, epoch, seed)
        plan = self._plan
        if plan is None or len(plan["order"]) != len(rows):
            raise RuntimeError("SelfCCL.batch_order needs prepare_rows on the same rows first")
        per_epoch = len(rows) // batch_size
        if self.per_epoch:
            return self.epoch_paced_slice(batch_size, epoch * per_epoch, (epoch + 1) * per_epoch, seed)
        steps = [epoch * per_epoch + j + 1 for j in range(per_epoch)]
        rng = np.random.default_rng([seed, epoch])
        return paced_batches(plan["order"], batch_size, steps, plan["total_steps"], self.cfg.lam, rng)

    def epoch_paced_slice(self, batch_size: int, start: int, stop: int, seed: int) -> list[list[int]]:
        """Batches ``start`` … ``stop − 1`` of the paced epochs laid end to end (full passes past E)."""
        order, epochs = self._plan["order"], self._plan["epochs"]
        out: list[list[int]] = []
        first, epoch = 0, 0  # the stream position where paced epoch ``epoch`` (from 0) begins
        while first < stop:
            pool = pacing_size(epoch + 1, epochs, len(order), self.cfg.lam, batch_size)
            length = pool // batch_size
            if first + length > start:
                batches = epoch_paced_batches(order, batch_size, pool, epoch, seed)
                out += batches[max(0, start - first) : stop - first]
            first, epoch = first + length, epoch + 1
        return out

    def draws(self) -> np.ndarray:
        """How many times each row is drawn in the trial's planned steps (the loop's batches)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("no draws before prepare_rows")
        total, per_epoch, size = plan["total_steps"], plan["steps_per_epoch"], plan["batch_size"]
        counts = np.zeros(len(plan["order"]), np.int64)
        for epoch in range(math.ceil(total / per_epoch)):
            batches = self.batch_order(plan["rows"], size, epoch, plan["seed"])[: total - epoch * per_epoch]
            if batches:
                counts += np.bincount(np.concatenate(batches), minlength=len(counts))
        return counts

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return simcse_sup_loss(embeddings, self.cfg.temperature)

    # --- MLflow artifacts ------------------------------------------------------------------------------
    def scored_table(self) -> tuple[str, dict[str, Any]]:
        """(CSV of every row's class, distances, δ, list position and planned draws; summary with counts,
        mean draws per class and per tenth by δ, and examples)."""
        plan, scores = self._plan, self._scores
        if plan is None or scores is None:
            raise RuntimeError("no scored table before prepare_rows")
        classes, order = plan["classes"], plan["order"]
        position = np.empty(len(order), np.int64)
        position[order] = np.arange(len(order))
        draws = self.draws()
        out = io.StringIO()
        out.write("row,class,label,d_pos,d_neg,margin,position,draws\n")
        for i in range(len(classes)):
            out.write(
                f"{i},{classes[i]},{CLASS_NAMES[classes[i]]},{scores.d_pos[i]:.6f},{scores.d_neg[i]:.6f},"
                f"{plan['margins'][i]:.6f},{position[i]},{draws[i]}\n"
            )
        counts = {name: int(np.sum(classes == c)) for c, name in enumerate(CLASS_NAMES)}
        summary: dict[str, Any] = {
            "rows": len(classes),
            "counts": counts,
            "fractions": {n: round(v / max(1, len(classes)), 4) for n, v in counts.items()},
            "margin": self.cfg.margin,
            "scoring": {
                "encoder": scores.encoder,
                "pooling": scores.pooling,
                "max_length": scores.max_length,
                "seconds": round(scores.seconds, 1),
            },
            "order": self.cfg.order,
            "within": self.cfg.within,
            "pacing_lambda": self.cfg.lam,
            "pacing_unit": self.cfg.pacing_unit,
            "total_steps": plan["total_steps"],
            "draws": draw_means(draws, classes, plan["margins"]),
        }
        if self.per_epoch:
            e, b = plan["epochs"], plan["batch_size"]
            summary["epoch_pools"] = epoch_pool_sizes(len(order), b, e, self.cfg.lam, e)
        rows = plan["rows"]
        summary["examples"] = {
            name: [
                {**{c: rows[i][c] for c in TRIPLET}, "margin": round(float(plan["margins"][i]), 4)}
                for i in np.flatnonzero(classes == c)[:3]
            ]
            for c, name in enumerate(CLASS_NAMES)
        }
        return out.getvalue(), summary

    def log_artifacts(self, stage: str, embed: Callable, logger: RunLogger, trial: TrialConfig) -> None:
        if stage == "start":
            table, summary = self.scored_table()
            logger.log_text(table, "selfccl/scored_triplets.csv")
            logger.log_text(json.dumps(summary, indent=2), "selfccl/scoring_summary.json")
            metrics = {f"selfccl_{name}": n for name, n in summary["counts"].items()} | summary["draws"]
            logger.log(metrics | {"selfccl_scoring_s": summary["scoring"]["seconds"]}, 0)
            logger.flush()
        if self.cfg.figure:
            label = {"start": "starting encoder", "final": "trained (SelfCCL)"}.get(stage, stage)
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / f"fig4_sickr_{stage}.png"
                plot_sick_relatedness(
                    embed,
                    path,
                    trial.data.data_dir,
                    f"{trial.model.name}, {label}",
                    self.cfg.figure_max_pairs,
                )
                logger.log_artifact(path, "selfccl")
