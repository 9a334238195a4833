"""RCL: Regularized Contrastive Learning (Tan, Rolland & Tian, NLPCC 2022), methods.md §6.

A batch holds ``M`` (query, index) tuples with embeddings ``q_i``, ``ind_i`` (for STS: NLI premise,
entailment) and optionally one hard negative ``neg_i`` (the contradiction). ``s(u, v) = λ cos(u, v)``
with the scale λ = 20 (τ = 0.05) of the sentence-transformers checkpoint the paper starts from; the paper
writes no temperature (λ = 1) [unverified]. Every loss is a mean over the tuples of the (global) batch.

Eq. 1, the base objective (MNRL with an optional hard negative; negatives only in the denominator):

    ℓ^CE_i = -log [ e^{s(q_i, ind_i)} / ( Σ_{j=1..M} e^{s(q_i, ind_j)} + Σ_{j=1..M} e^{s(q_i, neg_j)} ) ]

Eq. 2, an entropy model with weight φ (stage 1, one model per φ, early-stopped on the training loss):

    J_i = ℓ^CE_i - φ Σ_{j≠i} p_ij log p_ij = ℓ^CE_i + φ H_i,   p_ij = e^{s(q_i, ind_j)} / Σ_{k=1..M} e^{s(q_i, ind_k)}

p_ij is normalised over the M in-batch indices (no hard negatives) and H_i sums over the off-diagonal
j ≠ i only. φ > 0 makes the off-diagonal similarity distribution more peaked, φ < 0 flatter.

Eq. 3, the final model with 2N "contrastive regulators" (stage 2, from the pretrained checkpoint again).
``Au^n_{q_k}``, ``Au^n_{ind_k}``: entropy model n's stored embeddings of tuple k, constants:

    J_i = ℓ^CE_i - Σ_n log [ e^{s(q_i, Au^n_{q_i})} / Σ_k e^{s(q_i, Au^n_{q_k})} ]
                 - Σ_n log [ e^{s(ind_i, Au^n_{ind_i})} / Σ_k e^{s(ind_i, Au^n_{ind_k})} ]

(the paper's first numerator reads ``ind_j``, a typo for ``ind_i``); k runs over the in-batch tuples,
hard negatives never enter the regulators, and every regulator has weight 1 [unverified].

Checkpoint of an entropy model: its best-dev weights (``best_model.pt``, STS-B dev Spearman; our choice).
The loop scores the best-dev weights on the test sets (Table 5) and stage 2 embeds with the same weights
(``entropy_weights: best``), so the regulators come from the model Table 5 reports; the paper keeps the
best dev checkpoint of its final models and says nothing else, and early stopping on the training loss
(after 3 stalled steps) only ends stage 1. ``last`` (``state.pt``) remains an option.

Input contract: rows ``anchor`` (query), ``positive`` (index), ``negative`` (hard negative, unless
``hard_negatives: false``). Stage 2 (``rcl``) embeds every query and index of the training rows with each
entropy model once per study (``prepare_shared``, shared through Ray's object store); its batches carry
the row indices so that ``embeddings_loss`` can pick the rows' stored embeddings.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from clsr.config.model import ModelConfig
from clsr.config.trial import TrialConfig
from clsr.data.batching import TextViewBatcher, text_batches
from clsr.encoders.trained import load_trained_encoder
from clsr.encoders.transformer import load_tokenizer
from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy
from clsr.runtime.distributed import gather_with_grad

# --- losses ----------------------------------------------------------------------------------------


def rcl_base_loss(
    q: torch.Tensor, ind: torch.Tensor, neg: torch.Tensor | None = None, scale: float = 20.0
) -> torch.Tensor:
    """Eq. 1: mean over i of ℓ^CE_i. ``q``, ``ind``, ``neg``: (M, d)."""
    candidates = ind if neg is None else torch.cat([ind, neg])
    return in_batch_cross_entropy(scale * cos_sim(q, candidates))


def entropy_term(q: torch.Tensor, ind: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """Eq. 2's H_i = -Σ_{j≠i} p_ij log p_ij, mean over i (≥ 0).

    Reading of §6.2: p_ij is the softmax of ``scale · cos(q_i, ind_j)`` over the M in-batch indices
    (hard negatives are not candidates here), and the entropy leaves out the diagonal j = i while the
    normalisation keeps it.
    """
    log_p = torch.log_softmax(scale * cos_sim(q, ind), dim=1)
    off_diagonal = ~torch.eye(len(q), dtype=torch.bool, device=q.device)
    return -(log_p.exp() * log_p * off_diagonal).sum(1).mean()


def entropy_model_loss(
    q: torch.Tensor, ind: torch.Tensor, neg: torch.Tensor | None, phi: float, scale: float = 20.0
) -> torch.Tensor:
    """Eq. 2: mean over i of J_i = ℓ^CE_i + φ H_i (the paper's ``- φ Σ_{j≠i} p_ij log p_ij``)."""
    return rcl_base_loss(q, ind, neg, scale) + phi * entropy_term(q, ind, scale)


def regulator_loss(
    q: torch.Tensor, ind: torch.Tensor, q_reg: torch.Tensor, ind_reg: torch.Tensor, scale: float = 20.0
) -> torch.Tensor:
    """Eq. 3's 2N regulator terms, mean over i. ``q``, ``ind``: (M, d); ``q_reg``, ``ind_reg``: (N, M, d),
    entropy model n's stored embeddings of the batch's queries / indices (detached: no gradient)."""
    if q_reg.shape != ind_reg.shape or q_reg.dim() != 3 or q_reg.shape[1:] != q.shape:
        raise ValueError(
            f"q_reg and ind_reg must both be (models, {len(q)}, {q.size(-1)}); got {tuple(q_reg.shape)} "
            f"and {tuple(ind_reg.shape)}"
        )
    total = q.new_zeros(())
    for stored_q, stored_ind in zip(q_reg.detach(), ind_reg.detach(), strict=True):
        total = total + in_batch_cross_entropy(scale * cos_sim(q, stored_q.to(q.dtype)))
        total = total + in_batch_cross_entropy(scale * cos_sim(ind, stored_ind.to(ind.dtype)))
    return total


def rcl_final_loss(
    q: torch.Tensor,
    ind: torch.Tensor,
    neg: torch.Tensor | None,
    q_reg: torch.Tensor,
    ind_reg: torch.Tensor,
    scale: float = 20.0,
) -> torch.Tensor:
    """Eq. 3: Eq. 1 plus the 2N regulators, mean over i."""
    return rcl_base_loss(q, ind, neg, scale) + regulator_loss(q, ind, q_reg, ind_reg, scale)


# --- shared by both stages ---------------------------------------------------------------------------

# methods.md §6.4: SRoBERTa-base from sentence-transformers (exact checkpoint, lr, length: unverified);
# final training 1 epoch, batch 64, STS-B dev every 10 % of the samples, best kept.
_PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "sentence-transformers/nli-roberta-base-v2", "pooling": "avg", "max_seq_length": 75},
    "data": {"train": "nli_triplets"},
    "trainer": {
        "batch_size": 64,
        "lr": 2e-5,
        "epochs": 1,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "eval_epochs": 0.1,
    },
}


class _RCLConfig(MethodConfig):
    scale: float = Field(20.0, gt=0, description="λ of s = λ·cos (the paper writes none; 20 = τ 0.05)")
    hard_negatives: bool = Field(True, description="the contradiction column as Eq. 1's hard negative")
    no_duplicates: bool = Field(True, description="NoDuplicatesDataLoader batching (sentence-transformers)")


class _RCLMethod(Method):
    paper_defaults: ClassVar = _PAPER_DEFAULTS

    def views(self) -> tuple[str, ...]:
        return ("anchor", "positive", "negative") if self.cfg.hard_negatives else ("anchor", "positive")

    def batch_order(
        self, rows: Sequence[dict[str, str]], batch_size: int, epoch: int, seed: int
    ) -> list[list[int]]:
        return text_batches(rows, self.required_columns(), batch_size, epoch, seed, self.cfg.no_duplicates)

    @staticmethod
    def split(embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(rows, views, d) -> queries, indices, hard negatives (or None)."""
        return embeddings[:, 0], embeddings[:, 1], embeddings[:, 2] if embeddings.size(1) > 2 else None


# --- stage 1: entropy models -------------------------------------------------------------------------


class RCLEntropyConfig(_RCLConfig):
    name: str = "rcl_entropy"
    phi: float = Field(0.01, description="φ of Eq. 2 (> 0: lower off-diagonal entropy; < 0: raise it)")
    early_stop_patience: int | None = Field(
        3, ge=1, description="stop when the training loss has not decreased for N steps (None: never)"
    )


class RCLEntropy(_RCLMethod):
    """Stage 1: fine-tune one entropy model with Eq. 2; its checkpoint feeds ``rcl``'s regulators."""

    name = "rcl_entropy"
    Config = RCLEntropyConfig
    paper = "RCL (Tan et al., 2022), entropy model; Eq. 2"

    def stop_when_loss_stalls(self) -> int | None:
        return self.cfg.early_stop_patience

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        q, ind, neg = self.split(embeddings)
        return entropy_model_loss(q, ind, neg, self.cfg.phi, self.cfg.scale)


# --- stage 2: the final model with regulators --------------------------------------------------------


class RCLConfig(_RCLConfig):
    name: str = "rcl"
    phis: list[float] = Field(
        default_factory=lambda: [0.01, 0.02, 0.03, 0.04],
        description="φ of the entropy models whose regulators are used (2 regulators each; Table 4); "
        "[]: Eq. 1 alone (the baselines)",
    )
    entropy_models: dict[float, str] = Field(
        default_factory=dict,
        description="φ -> an entropy model: a checkpoint folder of an rcl_entropy trial (local or s3://…; "
        "a staged study fills it with needs:), or a saved Hugging Face model folder; each is embedded "
        "once per study",
    )
    entropy_weights: Literal["last", "best"] = Field(
        "best",
        description="best (our choice): an entropy model's best-dev weights (best_model.pt), the ones its "
        "trial scores for Table 5, as the paper keeps the best dev checkpoint; last: the weights when "
        "stage 1 stopped early (state.pt)",
    )
    store_dtype: Literal["float16", "float32"] = Field(
        "float16", description="dtype of the stored entropy-model embeddings (memory in the object store)"
    )

    @model_validator(mode="after")
    def _every_phi_has_a_model(self) -> RCLConfig:
        if len(set(self.phis)) != len(self.phis):
            raise ValueError(f"method.phis has repeated values: {self.phis}")
        missing = [phi for phi in self.phis if phi not in self.entropy_models]
        if missing:
            raise ValueError(
                f"method.entropy_models has no checkpoint for φ = {missing}; give one folder per φ, "
                f"e.g. entropy_models: {{{missing[0]}: /path/to/rcl_entropy/checkpoint}}"
            )
        return self


@dataclass
class RCLShared:
    """Every entropy model's embeddings of the training rows' queries and indices, built once per study.

    ``vectors[n, t]``: model ``phis[n]``'s embedding of ``texts``' t-th distinct text; ``query[r]`` and
    ``index[r]``: the text ids of row r's query and index; ``fingerprint`` identifies the rows.
    """

    phis: tuple[float, ...]
    vectors: np.ndarray  # (models, distinct texts, dim)
    query: np.ndarray  # (rows,) int64
    index: np.ndarray  # (rows,) int64
    fingerprint: str


def rows_fingerprint(rows: Sequence[dict[str, str]]) -> str:
    digest = hashlib.sha1()
    for row in rows:
        digest.update(f"{row['anchor']}\t{row['positive']}\n".encode())
    return digest.hexdigest()


class RowIndexBatcher(TextViewBatcher):
    """``TextViewBatcher`` whose batches also carry their row indices (``rows``, a long tensor)."""

    def collate(self, indices: Sequence[int]) -> dict[str, Any]:
        return super().collate(indices) | {"rows": torch.tensor(list(indices), dtype=torch.long)}


@torch.inference_mode()
def encode_token_ids(model: nn.Module, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    """Pooled eval-mode embeddings of tokenised texts, longest first, returned in input order."""
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort([-len(x) for x in ids], kind="stable")
    out: np.ndarray | None = None
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        longest = max(len(ids[i]) for i in chunk)
        input_ids = torch.full((len(chunk), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), longest), dtype=torch.long)
        for row, i in enumerate(chunk):
            input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            pooled = model(input_ids.to(device), mask.to(device)).float().cpu().numpy()
        if out is None:
            out = np.empty((len(ids), pooled.shape[1]), dtype=np.float32)
        out[chunk] = pooled
    assert out is not None
    return out


class RCL(_RCLMethod):
    """Stage 2: Eq. 3 with the stored embeddings of the entropy models named by ``phis``."""

    name = "rcl"
    Config = RCLConfig
    paper = "RCL (Tan et al., 2022), final model with contrastive regulators; Eq. 3"

    # --- the entropy models' embeddings, once per study -------------------------------------------
    def shared_key(self, trial: TrialConfig) -> str | None:
        if not self.cfg.phis:  # Eq. 1 alone: no entropy model to embed with
            return None
        subset_seed = trial.data.subset_seed if trial.data.subset_seed is not None else trial.trainer.seed
        model = trial.model.model_dump(include={"name", "pooling", "mlp_only_train", "max_seq_length"})
        models = sorted(self.cfg.entropy_models.items())
        return json.dumps(
            [self.name, trial.data.model_dump(), subset_seed, model, models]
            + [self.cfg.entropy_weights, self.cfg.store_dtype],
            sort_keys=True,
        )

    def prepare_shared(self, trial: TrialConfig) -> RCLShared:
        """Embed every distinct query and index text of the training rows once with every entropy model
        in ``entropy_models`` (all of them, so that trials with other ``phis`` share the result)."""
        from clsr.data.training import training_rows

        rows = training_rows(trial)
        self.check_columns(rows)
        position: dict[str, int] = {}
        query = np.array([position.setdefault(r["anchor"], len(position)) for r in rows], dtype=np.int64)
        index = np.array([position.setdefault(r["positive"], len(position)) for r in rows], dtype=np.int64)
        tokenizer = load_tokenizer(trial.model.name)
        ids = tokenizer(list(position), truncation=True, max_length=trial.model.max_seq_length)["input_ids"]
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        phis = tuple(sorted(self.cfg.entropy_models))
        stacked = []
        for phi in phis:
            started = time.perf_counter()
            model = self.load_entropy_model(self.cfg.entropy_models[phi], trial.model).to(device)
            vectors = encode_token_ids(model, ids, tokenizer.pad_token_id or 0, trial.eval.batch_size)
            stacked.append(vectors.astype(self.cfg.store_dtype))
            del model
            seconds = time.perf_counter() - started
            print(
                f"rcl: embedded {len(ids):,} training texts with the entropy model φ={phi} in {seconds:.0f} s"
            )
        return RCLShared(phis, np.stack(stacked), query, index, rows_fingerprint(rows))

    def load_entropy_model(self, path: str, model_cfg: ModelConfig) -> nn.Module:
        return load_trained_encoder(path, model_cfg, self.cfg.entropy_weights)

    def text_pipeline(self, trial: TrialConfig, shared: RCLShared) -> Any:
        self._shared = shared
        return super().text_pipeline(trial, shared)

    def prepare_rows(self, rows: list[dict[str, str]], pipeline: Any, trial: TrialConfig) -> Any:
        if not self.cfg.phis:
            return super().prepare_rows(rows, pipeline, trial)
        self.check_columns(rows)
        shared: RCLShared | None = getattr(self, "_shared", None)
        if shared is None:
            raise RuntimeError("rcl needs its shared input (prepare_shared) before prepare_rows")
        if shared.fingerprint != rows_fingerprint(rows):
            raise RuntimeError("the stored entropy-model embeddings were built for other training rows")
        missing = [phi for phi in self.cfg.phis if phi not in shared.phis]
        if missing:
            raise RuntimeError(f"the stored embeddings have no entropy model for φ = {missing}")
        self._models = [shared.phis.index(phi) for phi in self.cfg.phis]
        return self.text_view_batcher(rows, pipeline, trial, kind=RowIndexBatcher)

    def stored(self, rows: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' stored query and index embeddings, each (N models, rows, d), float32 on ``device``."""
        shared: RCLShared = self._shared
        picked = rows.cpu().numpy()
        models = np.asarray(self._models)[:, None]
        q_reg = shared.vectors[models, shared.query[picked][None, :]]  # copies only the batch's rows
        ind_reg = shared.vectors[models, shared.index[picked][None, :]]
        return (
            torch.from_numpy(q_reg).to(device, torch.float32),
            torch.from_numpy(ind_reg).to(device, torch.float32),
        )

    # --- loss ------------------------------------------------------------------------------------
    def embeddings_loss(self, embeddings: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """Eq. 3 on the global batch: gather the row indices too, to pick the rows' stored embeddings."""
        if not self.cfg.phis:
            return self.loss_from_embeddings(embeddings)
        q_reg, ind_reg = self.stored(gather_with_grad(batch["rows"]), embeddings.device)
        return self.loss_from_embeddings(embeddings, q_reg, ind_reg)

    def loss_from_embeddings(
        self,
        embeddings: torch.Tensor,
        q_reg: torch.Tensor | None = None,
        ind_reg: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, ind, neg = self.split(embeddings)
        if not self.cfg.phis:
            return rcl_base_loss(q, ind, neg, self.cfg.scale)
        if q_reg is None or ind_reg is None:
            raise ValueError("rcl's loss needs the rows' stored entropy-model embeddings (q_reg, ind_reg)")
        return rcl_final_loss(q, ind, neg, q_reg, ind_reg, self.cfg.scale)
