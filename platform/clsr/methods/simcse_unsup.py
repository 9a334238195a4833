"""Unsupervised SimCSE (Gao, Yao & Chen, EMNLP 2021), methods.md §2.1.

Each sentence is encoded twice in one forward pass; the two dropout masks make the two views
``h_i`` and ``h_i^+``. Loss, paper Eq. 4:

    ℓ = (1/N) Σ_i  -log [ exp(sim(h_i, h_i^+)/τ) / Σ_{j=1..N} exp(sim(h_i, h_j^+)/τ) ]

Negatives are the second views of the other sentences of the (global) batch; first views are not
candidates, and the loss is not symmetrised.

``same_dropout_mask: true`` is Table 3's "Fixed 0.1": dropout stays on (p = ``model.dropout``) but both
copies get the same mask. Identical masks give identical outputs, so each sentence is encoded once and
its embedding serves as both ``h_i`` and ``h_i^+`` (the gradient is the same as for two copies).

``positive`` (Table 1, §3 "Dropout noise as data augmentation"): the second view is an augmented copy
of the sentence instead of a second dropout pass (both views still see dropout unless
``model.dropout: 0``, the "w/o dropout" row): ``crop`` keeps a random contiguous ``1 - positive_ratio``
of the words, ``word_deletion`` deletes ``positive_ratio`` of them, ``delete_one_word`` one, and
``synonym_replacement`` swaps one word for a WordNet synonym (nlpaug's defaults, via
``clsr.augment.positives``; needs nltk's WordNet). Each row gets one augmented copy per trial, drawn
with ``trainer.seed`` (the paper trains one epoch, so per-epoch and per-trial copies are the same).
The paper's "MLM 15 %" row (BERT replaces 15 % of the words) is not an option. The augmentations are
hand-written because nlpaug is not a dependency (see ``clsr.augment.positives``).

``positive: next_sentence`` and ``next_3_sentences`` are Table 2's other objectives: the positive of a
sentence is the sentence after it, or one of the three after it (drawn with ``trainer.seed``), in the
same document. They need ordered text: the training rows in their order, with a ``document`` column
where a corpus holds several documents (without one, the rows are one document); a document's last
sentence has no positive and is left out. ``wiki1m`` is independently sampled sentences, so these
positives train on ``wiki_ordered`` (10^6 consecutive sentences of Wikipedia articles,
``clsr.data.ordered_text``) or a corpus of the user's (``data.train``: a file in order), and
``data.max_rows``, which samples the rows, is refused with them.

``two_encoders: true`` is Table 2's (f_θ1, f_θ2): the first view goes through one encoder and the second
through another, both loaded from ``model.name`` and trained separately (Eq. 4 with h_i = f_θ1(x_i) and
h_i^+ = f_θ2(x_i^+)); evaluation, export and a later stage use f_θ1. Both encoders run in one forward
pass of the model (``TwoEncoders``), so that DDP sees one forward per step.

Input: rows with a ``text`` column (e.g. ``wiki1m``). Pooling: ``cls`` with the MLP in training only.
"""

from __future__ import annotations

from random import Random
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from clsr.augment.positives import random_deletion, synonym_replacement, wordnet_synonym_source
from clsr.config.model import ModelConfig
from clsr.config.trial import TrialConfig
from clsr.data.catalog import is_ordered
from clsr.data.sources import DataUnavailableError
from clsr.encoders.transformer import COMPILE_WIDTH_MULTIPLE, TransformerEncoder
from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy


class SimCSEUnsupConfig(MethodConfig):
    name: str = "simcse_unsup"
    temperature: float = Field(0.05, gt=0, description="τ of Eq. 4 (paper)")
    same_dropout_mask: bool = Field(
        False, description="one dropout mask for both views: Table 3's 'Fixed 0.1' (paper); false: Eq. 4"
    )
    positive: Literal[
        "dropout",
        "crop",
        "word_deletion",
        "delete_one_word",
        "synonym_replacement",
        "next_sentence",
        "next_3_sentences",
    ] = Field(
        "dropout",
        description="the second view (Table 1): a second dropout pass (paper, Eq. 4), or an augmented copy: "
        "crop, word_deletion (positive_ratio of the words), delete_one_word, synonym_replacement (one "
        "word, WordNet); or (Table 2) the next sentence, or one of the next 3, of ordered training text "
        "(a document column separates documents)",
    )
    positive_ratio: float = Field(
        0.1, gt=0, lt=1, description="Table 1's k: the share of the words cropped away or deleted"
    )
    two_encoders: bool = Field(
        False,
        description="Table 2's two encoders (f_θ1, f_θ2): the second view through a second encoder loaded from "
        "model.name and trained separately; evaluation uses the first (false: one encoder, the paper's)",
    )

    @model_validator(mode="after")
    def _one_second_view(self) -> SimCSEUnsupConfig:
        if self.same_dropout_mask and self.positive != "dropout":
            raise ValueError(
                f"same_dropout_mask (Table 3) shares one pass between the views; with positive "
                f"{self.positive!r} the second view is another text: use one of them"
            )
        if self.same_dropout_mask and self.two_encoders:
            raise ValueError(
                "same_dropout_mask (Table 3) encodes once; two_encoders (Table 2) needs two passes"
            )
        return self


class TwoEncoders(TransformerEncoder):
    """f_θ1 (this encoder: what evaluation, export and checkpoints' ``backbone.*`` keys are) and f_θ2
    (``second``), loaded alike from ``model.name``. ``forward(..., two_views=True)`` takes the rows'
    two views interleaved (row 0's first, row 0's second, ...) and encodes each through its encoder.
    Parameter names of f_θ2 start with ``second.`` (``trainer.lr_by_module`` prefixes name them so)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.second = TransformerEncoder(cfg)

    def compile_for_training(
        self, mode: str = "default", width_multiple: int = COMPILE_WIDTH_MULTIPLE
    ) -> None:
        super().compile_for_training(mode, width_multiple)
        self.second.compile_for_training(mode, width_multiple)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length_group_size: int | None = None,
        two_views: bool = False,
    ) -> torch.Tensor:
        if not two_views:
            return super().forward(input_ids, attention_mask, length_group_size)
        ids, mask = input_ids.view(-1, 2, input_ids.size(1)), attention_mask.view(-1, 2, input_ids.size(1))
        first = super().forward(ids[:, 0].contiguous(), mask[:, 0].contiguous(), length_group_size)
        second = self.second(ids[:, 1].contiguous(), mask[:, 1].contiguous(), length_group_size)
        return torch.stack([first, second], dim=1).flatten(0, 1)


def crop(text: str, rng: Random, ratio: float) -> str:
    """A random contiguous span of ``max(1, round((1 - ratio) · words))`` whitespace words."""
    words = text.split()
    keep = max(1, round((1 - ratio) * len(words)))
    start = rng.randrange(len(words) - keep + 1) if words else 0
    return " ".join(words[start : start + keep])


FOLLOWING = {"next_sentence": 1, "next_3_sentences": 3}  # Table 2: how many following sentences qualify


def next_sentence_rows(rows: list[dict[str, str]], following: int, rng: Random) -> list[dict[str, str]]:
    """Each row whose document goes on, with a positive: the next sentence (``following`` 1) or one of the
    next ``following`` of its document, drawn with ``rng``; rows are in the corpus's order and a
    ``document`` column (if any) names each row's document."""
    paired = []
    for i, row in enumerate(rows):
        later = [
            r["text"] for r in rows[i + 1 : i + 1 + following] if r.get("document") == row.get("document")
        ]
        if later:
            paired.append({**row, "positive": later[0] if following == 1 else rng.choice(later)})
    return paired


def positive_view(kind: str, ratio: float) -> Any:
    """``augment(text, rng) -> text`` for a Table 1 ``positive`` kind (WordNet loaded here)."""
    if kind == "crop":
        return lambda text, rng: crop(text, rng, ratio)
    if kind == "word_deletion":
        return lambda text, rng: random_deletion(text, rng, p=ratio, max_words=None)
    if kind == "delete_one_word":
        return lambda text, rng: random_deletion(text, rng, max_words=1)
    synonyms = wordnet_synonym_source()
    return lambda text, rng: synonym_replacement(text, rng, synonyms=synonyms, max_words=1)


def simcse_unsup_loss(views: torch.Tensor, temperature: float) -> torch.Tensor:
    """``views``: (N, 2, d) — the two dropout views of each sentence."""
    logits = cos_sim(views[:, 0], views[:, 1]) / temperature
    return in_batch_cross_entropy(logits)


class SimCSEUnsup(Method):
    name = "simcse_unsup"
    Config = SimCSEUnsupConfig
    paper = "SimCSE (Gao et al., 2021), unsupervised; Eq. 4"
    paper_defaults: ClassVar = {
        "model": {
            "name": "bert-base-uncased",
            "pooling": "cls",
            "mlp_only_train": True,
            "max_seq_length": 32,
        },
        "data": {"train": "wiki1m"},
        "trainer": {"batch_size": 64, "lr": 3e-5, "epochs": 1, "eval_steps": 125, "weight_decay": 0.0},
    }

    def views(self) -> tuple[str, ...]:
        if self.cfg.positive != "dropout":
            return ("text", "positive")  # the column prepare_rows adds
        return ("text",) if self.cfg.same_dropout_mask else ("text", "text")

    def required_columns(self) -> tuple[str, ...]:
        return ("text",)

    def unavailable(self, trial: TrialConfig) -> str | None:
        if self.cfg.positive == "synonym_replacement":
            try:
                wordnet_synonym_source()
            except DataUnavailableError as err:
                return str(err)
        return None

    def trial_problems(self, trial: TrialConfig) -> list[str]:
        if self.cfg.positive not in FOLLOWING:
            return []
        if not trial.data.external() and not is_ordered(trial.data.train):
            return [
                f"method.positive {self.cfg.positive} pairs each sentence with the ones after it: data.train "
                f"must be a corpus in order (wiki_ordered, or a file, folder or hub set of yours), not "
                f"{trial.data.train!r}, whose rows are not neighbours in a text"
            ]
        cut = [name for name in ("max_rows", "filter") if getattr(trial.data, name) is not None]
        if cut:
            return [
                f"method.positive {self.cfg.positive} pairs each sentence with the ones after it; "
                f"data.{' and data.'.join(cut)} would leave out sentences between them: unset it"
            ]
        return []

    def rows_for_training(self, rows: list[dict[str, str]], trial: TrialConfig) -> list[dict[str, str]]:
        if self.cfg.positive not in FOLLOWING:
            return rows
        self.check_columns(rows)
        paired = next_sentence_rows(rows, FOLLOWING[self.cfg.positive], Random(trial.trainer.seed))
        if not paired:
            raise ValueError(
                f"method.positive {self.cfg.positive}: no sentence of data.train {trial.data.train!r} has one "
                f"after it in its document (one sentence per document?)"
            )
        return paired

    def prepare_rows(self, rows: list[dict[str, str]], pipeline: Any, trial: TrialConfig) -> Any:
        if self.cfg.positive not in ("dropout", *FOLLOWING):  # an augmented copy of each row's text
            self.check_columns(rows)
            augment, rng = (
                positive_view(self.cfg.positive, self.cfg.positive_ratio),
                Random(trial.trainer.seed),
            )
            rows = [{**row, "positive": augment(row["text"], rng)} for row in rows]
        return super().prepare_rows(rows, pipeline, trial)

    def build_model(self, model_cfg: ModelConfig, pipeline: Any = None) -> nn.Module:
        if not self.cfg.two_encoders:
            return super().build_model(model_cfg, pipeline)
        if model_cfg.init_checkpoint:
            raise ValueError(
                "method.two_encoders loads both encoders from model.name, not model.init_checkpoint"
            )
        return TwoEncoders(model_cfg)

    def encode_rows(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        if not self.cfg.two_encoders:
            return super().encode_rows(model, batch)
        groups = {"length_group_size": batch["length_group_size"]} if batch.get("length_group_size") else {}
        pooled = model(batch["input_ids"], batch["attention_mask"], two_views=True, **groups)
        return pooled.view(batch["num_rows"], 2, -1)

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        if self.cfg.same_dropout_mask:  # one pass, one mask: the embedding is both views
            embeddings = embeddings.expand(-1, 2, -1)
        return simcse_unsup_loss(embeddings, self.cfg.temperature)
