"""The method plug-in contract: ``Method`` (exported as ``clsr.Method``; its docstring is the reference,
docs/methods/your-own.md the guide).

The trainer never branches on the method: it asks the method for a text pipeline (a tokenizer, or a
word-vector table), a model, a batch order, and a loss. Methods whose model is not a transformer
encoder (GCLSR) set ``encoder_type`` and override ``text_pipeline``, ``prepare_rows``, ``build_model``,
``training_loss`` and ``make_embedder``. Expensive inputs that many trials share (a word-vector table,
a tokenised corpus) come from ``prepare_shared``: the study runner builds them once per distinct
``shared_key`` and hands them to every trial through Ray's object store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeAlias

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from clsr.config.model import ModelConfig
from clsr.config.steps import plan_steps
from clsr.config.trial import TrialConfig
from clsr.data.batching import TextViewBatcher, shuffled_batches
from clsr.encoders.trained import load_trained_encoder
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from clsr.methods.losses import full_precision
from clsr.runtime.distributed import gather_with_grad
from clsr.tracking.run_logger import RunLogger

Row: TypeAlias = dict[str, str]  # one training row: column -> text
Batch: TypeAlias = dict[
    str, Any
]  # one forward pass: input_ids, attention_mask, num_rows[, length_group_size]


class Batcher(Protocol):
    """What ``prepare_rows`` returns: the tokenised rows, one forward pass per ``collate``."""

    def __len__(self) -> int: ...

    def collate(self, indices: Sequence[int]) -> Batch: ...


class MethodConfig(BaseModel):
    """A method's hyperparameters: pydantic fields with the paper's defaults, read from the study's
    ``method:`` section (unknown keys and non-finite floats refused). ``name`` is the method's name."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # every float finite

    name: str


class Method(ABC):
    """A training objective: what a trial encodes and the loss it minimises (``clsr.Method``).

    Required (a subclass that lacks one cannot be built):

    * ``name``: the name runs record; ``Config``: a ``MethodConfig`` subclass whose ``name`` defaults to it;
    * ``views(self) -> tuple[str, ...]``: the data columns each row contributes to the forward pass, in
      order (a column may repeat: ``("text", "text")`` is two dropout views of one sentence);
    * ``loss_from_embeddings(self, embeddings) -> Tensor``: a scalar loss from the pooled embeddings of
      the *global* batch, shape ``(rows, views, dim)``, float32 (autocast off), rows gathered across
      workers in rank order (``gather_with_grad``: other workers' rows are in-batch negatives, only this
      worker's rows carry a gradient). Row ``i``'s views are ``embeddings[i, 0]``, ``embeddings[i, 1]``...

    What a method gets: ``self.cfg`` (its validated ``Config``), and in every hook that takes it the
    trial's ``TrialConfig`` (``trial.model``, ``trial.data``, ``trial.trainer``, ``trial.eval``).

    Optional, each with a default that fits a transformer encoder trained on in-batch negatives:

    * ``paper_defaults`` (class attribute): the paper's values for the other sections, e.g.
      ``{"model": {...}, "data": {"train": "wiki1m"}, "trainer": {...}}``, under the study's ``base``;
      ``paper``: a one-line citation;
    * ``embeddings_loss(embeddings, batch)``: when the loss needs more than the embeddings (RCL's rows);
    * ``batch_order(rows, batch_size, epoch, seed)``: the epoch's global batches of row indices
      (default ``shuffled_batches``; ``text_batches`` for no duplicate texts in a batch);
    * ``rows_for_training``, ``prepare_rows`` (returns a ``Batcher``, default ``TextViewBatcher``),
      ``required_columns``, ``trial_problems`` (reasons to refuse a trial before the study starts),
      ``unavailable`` (reasons it cannot run here);
    * ``build_model``, ``encode_rows``, ``training_loss`` (the whole step), ``param_group_lrs``,
      ``fixed_lr_prefixes``, ``stop_when_loss_stalls``, ``plan_steps``;
    * ``shared_key`` / ``prepare_shared``: one expensive input shared by the study's trials;
    * ``log_artifacts``, ``export_model``, ``make_embedder``: evaluation and export.

    Keep the loss a function of the embeddings (override ``loss_from_embeddings`` or ``embeddings_loss``,
    not ``training_loss``) and GradCache (``trainer.gradcache_chunk_rows``) works with it unchanged.
    """

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]]
    paper_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    paper: ClassVar[str] = ""
    encoder_type: ClassVar[str] = "transformer"  # the model.type this method trains

    def __init__(self, cfg: MethodConfig):
        self.cfg = cfg

    # --- data -----------------------------------------------------------------------------------
    @abstractmethod
    def views(self) -> tuple[str, ...]:
        """Column names encoded for each row, in order (a column may repeat)."""

    def required_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.views()))

    def fewer_columns(self) -> list[tuple[str, bool, tuple[str, ...]]]:
        """``(option, value, columns)`` for each on/off option of this method's config that, flipped, needs
        fewer columns (SimCSE's ``hard_negatives: false`` reads no third column): named to a user whose
        data lacks a column before any hint to map one, since mapping a wrong column trains nonsense."""
        fewer = []
        for option, value in self.cfg.model_dump().items():
            if not isinstance(value, bool):
                continue
            flipped = type(self)(self.cfg.model_copy(update={option: not value}))
            columns = flipped.required_columns()
            if set(columns) < set(self.required_columns()):
                fewer.append((option, not value, columns))
        return fewer

    # --- inputs shared by the trials of a study ---------------------------------------------------
    def shared_key(self, trial: TrialConfig) -> str | None:
        """Trials with the same key share one ``prepare_shared`` result; None: nothing to share."""
        return None

    def prepare_shared(self, trial: TrialConfig) -> Any:
        """Build what ``shared_key`` names (runs once per key, on a Ray worker or in-process)."""
        return None

    def unavailable(self, trial: TrialConfig) -> str | None:
        """Why this trial cannot run here (e.g. a hub-only model while offline), or None."""
        return None

    def trial_problems(self, trial: TrialConfig) -> list[str]:
        """Why this method cannot train ``trial`` as written anywhere, e.g. a setting of another section it
        cannot work with: the trial's configuration is refused with them (``TrialConfig``), so a study says
        it before it starts."""
        return []

    def text_pipeline(self, trial: TrialConfig, shared: Any) -> Any:
        """What turns text into model inputs: the transformer's tokenizer."""
        return load_tokenizer(trial.model.name)

    def rows_for_training(self, rows: list[Row], trial: TrialConfig) -> list[Row]:
        """The rows the loop trains on, made from the data set's (default: all of them as they are; a
        method whose rows are pairs of the data set's, like next-sentence positives, may have fewer)."""
        return rows

    def prepare_rows(self, rows: list[Row], pipeline: Any, trial: TrialConfig) -> Batcher:
        """Tokenise once; the returned object's ``collate(indices)`` builds one forward pass."""
        self.check_columns(rows)
        return self.text_view_batcher(rows, pipeline, trial)

    def text_view_batcher(
        self,
        rows: list[Row],
        pipeline: Any,
        trial: TrialConfig,
        kind: type[TextViewBatcher] = TextViewBatcher,
    ) -> TextViewBatcher:
        """The rows' token ids for this method's views, batched as ``trial.trainer`` says."""
        group = trial.trainer.resolved_length_group_size()
        return kind(rows, self.views(), pipeline, trial.model.max_seq_length, length_group_size=group)

    def check_columns(self, rows: list[Row]) -> None:
        missing = [c for c in self.required_columns() if rows and c not in rows[0]]
        if missing:
            raise ValueError(
                f"method {self.name!r} needs columns {self.required_columns()} but the training data "
                f"has {tuple(rows[0])}; choose a data.train set with those columns"
            )

    def batch_order(self, rows: Sequence[Row], batch_size: int, epoch: int, seed: int) -> list[list[int]]:
        """Global batches of row indices for one epoch (the same list on every worker)."""
        return shuffled_batches(len(rows), batch_size, epoch, seed)

    def plan_steps(self, num_rows: int, trial: TrialConfig, world: int) -> tuple[int, int]:
        """(steps per epoch, total steps): the loop asks ``batch_order`` for epoch ``step // steps per
        epoch`` and schedules the LR over the total. Default ``clsr.config.steps.plan_steps``; a method whose
        data does not come in ⌊k/B⌋-step epochs (SelfCCL's per-epoch pacing) returns its own total."""
        return plan_steps(num_rows, trial, world)

    # --- model and loss --------------------------------------------------------------------------
    def build_model(self, model_cfg: ModelConfig, pipeline: Any = None) -> nn.Module:
        if model_cfg.init_checkpoint:  # a later stage continuing an upstream trial's model
            return load_trained_encoder(model_cfg.init_checkpoint, model_cfg, model_cfg.init_weights)
        return TransformerEncoder(model_cfg)

    def param_group_lrs(self) -> dict[str, float]:
        """Absolute learning rates for parameter-name prefixes (empty: one LR for everything)."""
        return {}

    def fixed_lr_prefixes(self) -> tuple[str, ...]:
        """Parameter-name prefixes whose LR the schedule leaves alone."""
        return ()

    def stop_when_loss_stalls(self) -> int | None:
        """Patience in optimiser steps for stopping on a stalled training loss (None: never);
        ``trainer.stop_when_loss_stalls`` overrides it."""
        return None

    def training_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Encode all views of all rows in one forward pass (under the loop's autocast), gather across
        workers, apply the loss in float32 (autocast off: ``full_precision``)."""
        embeddings = gather_with_grad(self.encode_rows(model, batch)).float()
        with full_precision(embeddings):
            return self.embeddings_loss(embeddings, batch)

    def encode_rows(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """This worker's pooled embeddings ``(rows, views, dim)`` of a batch from ``collate``: every view
        of every row in one forward pass (GradCache calls it once per chunk of rows)."""
        groups = {"length_group_size": batch["length_group_size"]} if batch.get("length_group_size") else {}
        pooled = model(batch["input_ids"], batch["attention_mask"], **groups)
        return pooled.view(batch["num_rows"], len(self.views()), -1)

    def embeddings_loss(self, embeddings: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Loss on the global batch's embeddings ``(rows, views, dim)`` (gathered across workers, float32);
        ``batch``: this worker's batch, for methods whose loss needs more than the embeddings (RCL's row
        indices). GradCache computes it on cached, detached embeddings."""
        return self.loss_from_embeddings(embeddings)

    @abstractmethod
    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Loss on ``(rows, views, dim)`` embeddings of the global batch."""

    # GradCache (``trainer.gradcache_chunk_rows``) needs a loss that is a function of the embeddings
    # only, built from ``encode_rows`` and ``embeddings_loss``. None: yes exactly when the method keeps
    # the base ``training_loss`` (a method that overrides it, e.g. GCLSR, is refused unless it says True).
    supports_gradcache: ClassVar[bool | None] = None

    @classmethod
    def gradcache_supported(cls) -> bool:
        if cls.supports_gradcache is not None:
            return cls.supports_gradcache
        return cls.training_loss is Method.training_loss

    # --- evaluation ------------------------------------------------------------------------------
    def log_artifacts(
        self, stage: str, embed: Callable[[list[str]], np.ndarray], logger: RunLogger, trial: TrialConfig
    ) -> None:
        """Extra files and numbers for the trial's MLflow run (rank 0, only when it logs to MLflow).

        ``stage``: "start" (the freshly built model, before training or a resume) or "final" (the
        model scored on the test sets); ``embed`` encodes sentences with that model; ``logger``: the
        trial's ``RunLogger`` (``log``, ``log_text``, ``log_artifact``).
        """
        return None  # most methods log nothing beyond the loop's metrics

    def export_model(self, model: nn.Module, pipeline: Any, trial: TrialConfig, folder: Path) -> None:
        """Save the trained encoder in ``folder`` in a format users load without clsr: a
        sentence-transformers model for transformer encoders (see ``clsr.encoders.export``)."""
        from clsr.encoders.export import save_sentence_transformer

        save_sentence_transformer(model, pipeline, trial.model, folder, method=self.name)

    def make_embedder(
        self, model: nn.Module, pipeline: Any, batch_size: int = 128, precision: str = "auto"
    ) -> Callable[[list[str]], np.ndarray]:
        from clsr.encoders.embed import transformer_embedder

        return transformer_embedder(model, pipeline, batch_size=batch_size, precision=precision)
