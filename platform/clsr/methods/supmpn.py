"""SupMPN: supervised multiple positives and negatives (Dehghan & Amasyali, Appl. Sci. 2022), methods.md §4.

A row is one anchor ``x_i`` (an NLI premise), ``P`` positives ``x⁺_{i1..iP}`` (its entailments, the
empty slots filled with copies of the anchor or with augmented entailments, Table A1) and ``Q``
negatives ``x⁻_{i1..iQ}`` (its contradictions, filled with other premises' hypotheses). SupMPNRL,
paper Eq. 7, with ``s = cos/τ``, mean over the N anchors of the (global) batch:

    L_i = (1/P) Σ_k -log [ e^{s(x_i,x⁺_ik)} /
              ( e^{s(x_i,x⁺_ik)} + Σ_{j≠i} Σ_k' e^{s(x_i,x⁺_jk')} + Σ_j Σ_q e^{s(x_i,x⁻_jq)} ) ]

The anchor's own other positives ``x⁺_ik'`` (k' ≠ k) are not in the denominator. The released loss
(``loss_variant: code``) keeps them with their logit overwritten by 0, so each adds e⁰ = 1: a
constant ``P − 1`` in the denominator with no gradient. Other rows' positives (every slot) and every
row's negatives are the in-batch negatives; other anchors never are. With P = Q = 1 both variants
are supervised SimCSE's Eq. 5 (α = 1).

The default is the released loss (``code``), as methods.md §4.3 recommends: it is the only code the
authors published, so it is the best evidence of what produced the paper's numbers; Eq. 7 (``paper``)
is the variant to compare against it (the study's ``loss_variant`` ablation).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from clsr.augment.positives import (
    PositiveAugmentation,
    make_positive_augmenter,
    positive_augmentation_available,
)
from clsr.config.trial import TrialConfig
from clsr.data.batching import TextViewBatcher, text_batches
from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim

MAX_SLOTS = 5  # the nli_supmpn data set carries 5 positives and 5 negatives per row (paper §5.1)


class SupMPNConfig(MethodConfig):
    name: str = "supmpn"
    positives: int = Field(5, ge=1, le=MAX_SLOTS, description="P, positives per anchor")
    negatives: int = Field(5, ge=0, le=MAX_SLOTS, description="Q, hard negatives per anchor")
    temperature: float = Field(0.05, gt=0, description="τ of Eq. 7 (the code's scale 20)")
    loss_variant: Literal["paper", "code"] = Field(
        "code",
        description="code (released code, the default: it produced the published numbers): own other "
        "positives kept with logit 0; paper: Eq. 7, left out",
    )
    positive_augmentation: PositiveAugmentation = Field(
        default_factory=PositiveAugmentation,
        description="what fills the positive slots a premise has no entailment for (Table A1)",
    )
    no_duplicates: bool = Field(True, description="NoDuplicatesDataLoader batching (README of the code)")


def positive_columns(count: int) -> tuple[str, ...]:
    return tuple(f"positive_{k}" for k in range(1, count + 1))


def negative_columns(count: int) -> tuple[str, ...]:
    return tuple(f"negative_{k}" for k in range(1, count + 1))


def supmpn_loss(
    embeddings: torch.Tensor, positives: int, temperature: float, loss_variant: str = "code"
) -> torch.Tensor:
    """``embeddings``: (N, 1 + P + Q, d) — anchor, P positives, Q negatives per row."""
    n = embeddings.size(0)
    anchors = embeddings[:, 0]
    slot_major = embeddings[:, 1 : 1 + positives].transpose(0, 1).reshape(positives * n, -1)
    positive_logits = (cos_sim(anchors, slot_major) / temperature).view(n, positives, n)
    negative_logits = cos_sim(anchors, embeddings[:, 1 + positives :].flatten(0, 1)) / temperature
    own = torch.eye(n, dtype=torch.bool, device=embeddings.device)  # [i, j]: column j is row i's own
    fill = 0.0 if loss_variant == "code" else float("-inf")
    rows = torch.arange(n, device=embeddings.device)
    losses = []
    for k in range(positives):
        others_own = own.unsqueeze(1).repeat(1, positives, 1)
        others_own[:, k] = False  # slot k's own positive is the target, not masked
        logits = torch.cat([positive_logits.masked_fill(others_own, fill).flatten(1), negative_logits], dim=1)
        losses.append(F.cross_entropy(logits, k * n + rows))
    return torch.stack(losses).mean()


class SupMPN(Method):
    name = "supmpn"
    Config = SupMPNConfig
    paper = "SupMPN (Dehghan & Amasyali, 2022); SupMPNRL, Eq. 7"
    # methods.md §4.4 "proposed defaults": the SimCSE-sup setup the paper names (§5.3). SupMPN's own:
    # bert-base-uncased, avg_first_last, nli_supmpn rows (P = Q = 5, §5.1), batch 256 and 3 epochs.
    # BORROWED from SimCSE-sup (SupMPN states none of them): lr 5e-5 (SimCSE Table A.1, BERT-base),
    # max_seq_length 32 (SimCSE's run_sup_example.sh), STS-B dev every 125 steps with the best checkpoint
    # kept (run_sup_example.sh; the SimCSE paper says 250) and weight decay 0 (SimCSE's trainer default).
    paper_defaults: ClassVar = {
        "model": {
            "name": "bert-base-uncased",
            "pooling": "avg_first_last",
            "max_seq_length": 32,  # borrowed: SimCSE-sup's length (SupMPN's README example uses 150)
        },
        "data": {"train": "nli_supmpn"},
        "trainer": {
            "batch_size": 256,
            "lr": 5e-5,  # borrowed: SimCSE-sup BERT-base (BERT-large: 1e-5, studies' bert_large row)
            "epochs": 3,
            "eval_steps": 125,  # borrowed: SimCSE-sup's STS-B dev interval (run_sup_example.sh)
            "weight_decay": 0.0,  # borrowed: SimCSE-sup's (the transformers Trainer default)
        },
    }

    def views(self) -> tuple[str, ...]:
        return ("anchor", *positive_columns(self.cfg.positives), *negative_columns(self.cfg.negatives))

    # --- data: fill slots, optionally augmented -------------------------------------------------
    def unavailable(self, trial: TrialConfig) -> str | None:
        return positive_augmentation_available(self.cfg.positive_augmentation)

    def shared_key(self, trial: TrialConfig) -> str | None:
        """Paraphrasing every row with a T5 model is costly: done once per study, shared."""
        aug = self.cfg.positive_augmentation
        if aug.kind != "paraphrase":
            return None
        subset_seed = trial.data.subset_seed if trial.data.subset_seed is not None else trial.trainer.seed
        subset = (
            f"{trial.data.max_rows}@{subset_seed}" if trial.data.max_rows else "all"
        )  # the rows it paraphrases
        return f"supmpn-pp:{trial.data.train}:{subset}:{aug.model_dump_json()}"

    def prepare_shared(self, trial: TrialConfig) -> list[dict[str, str]]:
        from clsr.data.training import training_rows

        return self.fill_positives(training_rows(trial), seed=0)

    def text_pipeline(self, trial: TrialConfig, shared: Any) -> Any:
        self._filled_rows = shared  # paraphrased rows built once for the study, if any
        return super().text_pipeline(trial, shared)

    def prepare_rows(self, rows: list[dict[str, str]], pipeline: Any, trial: TrialConfig) -> TextViewBatcher:
        self.check_columns(rows)
        rows = getattr(self, "_filled_rows", None) or self.fill_positives(rows, seed=trial.trainer.seed)
        return self.text_view_batcher(rows, pipeline, trial)

    def fill_positives(self, rows: list[dict[str, str]], seed: int) -> list[dict[str, str]]:
        """Table A1: slots that hold a copy of the anchor get an augmented entailment of the row instead.

        Entailments are the row's positive slots that differ from the anchor (every row has one);
        they are used in turn, with a fresh random draw per filled slot.
        """
        augment = make_positive_augmenter(self.cfg.positive_augmentation)
        if augment is None:
            return rows
        rng = random.Random(seed)
        columns = positive_columns(MAX_SLOTS)
        if hasattr(augment, "prepare"):  # the paraphraser generates in batches, once per distinct text
            augment.prepare(
                sorted({row[c] for row in rows for c in columns if c in row and row[c] != row["anchor"]})
            )
        filled = []
        for row in rows:
            present = [c for c in columns if c in row]
            entailments = [row[c] for c in present if row[c] != row["anchor"]]
            new = dict(row)
            empty = [c for c in present if row[c] == row["anchor"]]
            for turn, column in enumerate(empty):
                new[column] = (
                    augment(entailments[turn % len(entailments)], rng) if entailments else row[column]
                )
            filled.append(new)
        return filled

    def batch_order(self, rows, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
        # the same text twice within a row (anchor copies) is allowed; across rows of a batch it is not
        return text_batches(rows, self.required_columns(), batch_size, epoch, seed, self.cfg.no_duplicates)

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return supmpn_loss(embeddings, self.cfg.positives, self.cfg.temperature, self.cfg.loss_variant)
