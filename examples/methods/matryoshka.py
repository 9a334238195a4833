"""Matryoshka representation learning (Kusupati et al., NeurIPS 2022) around any method's loss, built
only on the public contract (``from clsr import ...``): an example of docs/methods/your-own.md.

MRL trains the first ``m`` coordinates of the embedding to be an embedding by themselves, for each ``m``
of a nested set M: the inner method's loss ``L`` is applied to every prefix and the results are summed
with weights ``c_m`` (paper Eq. 1, there with a classifier per prefix; here the inner loss):

    ℓ_MRL = Σ_{m ∈ M} c_m · L(z_{1:m})

``z_{1:m}`` is ``embeddings[..., :m]`` of every view of the global batch (cosine-based losses renormalise
each prefix). ``inner`` names the method whose views, data, model and loss are used (a name a study
accepts), ``inner_config`` its hyperparameters; ``dims`` is M and ``weights`` the c_m (default 1 each,
the paper's). A dim above the embedding's size is clipped to it and counted once (its first weight), so
the paper's [768, 512, 256, 128, 64] trains a 384-d model on 384, 256, 128 and 64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field, model_validator

from clsr import Method, MethodConfig, TrialConfig, get_method


class MatryoshkaConfig(MethodConfig):
    name: str = "matryoshka"
    inner: str = Field("simcse_unsup", description="the method whose loss is applied to each prefix")
    inner_config: dict[str, Any] = Field(default_factory=dict, description="the inner method's options")
    dims: list[int] = Field([768, 512, 256, 128, 64], min_length=1, description="M: the prefix sizes")
    weights: list[float] | None = Field(None, description="c_m, one per dim (default: 1 each)")

    @model_validator(mode="after")
    def _consistent(self) -> MatryoshkaConfig:
        if any(d < 1 for d in self.dims) or len(set(self.dims)) != len(self.dims):
            raise ValueError(f"dims: distinct positive sizes (given: {self.dims})")
        if self.weights is not None and len(self.weights) != len(self.dims):
            raise ValueError(f"weights: one per dim ({len(self.dims)}), given {len(self.weights)}")
        if self.weights is not None and any(w < 0 for w in self.weights):
            raise ValueError(f"weights: not negative (given: {self.weights})")
        get_method(self.inner).Config(**self.inner_config)  # the inner method's own checks
        return self


def nested_prefixes(dims: list[int], weights: list[float] | None, size: int) -> list[tuple[int, float]]:
    """``(m, c_m)`` with each m clipped to ``size``; a clipped duplicate keeps the first weight."""
    chosen: dict[int, float] = {}
    for dim, weight in zip(dims, weights or [1.0] * len(dims), strict=True):
        chosen.setdefault(min(dim, size), weight)
    return list(chosen.items())


class Matryoshka(Method):
    name = "matryoshka"
    Config = MatryoshkaConfig
    paper = "Matryoshka representation learning (Kusupati et al., NeurIPS 2022); Eq. 1"

    def __init__(self, cfg: MatryoshkaConfig):
        super().__init__(cfg)
        inner = get_method(cfg.inner)
        self.inner: Method = inner(inner.Config(**cfg.inner_config))

    def _nested(self, embeddings: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        prefixes = nested_prefixes(self.cfg.dims, self.cfg.weights, embeddings.size(-1))
        return torch.stack([weight * loss(embeddings[..., :dim]) for dim, weight in prefixes]).sum()

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self._nested(embeddings, self.inner.loss_from_embeddings)

    def embeddings_loss(self, embeddings: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        return self._nested(embeddings, lambda prefix: self.inner.embeddings_loss(prefix, batch))

    def trial_problems(self, trial: TrialConfig) -> list[str]:
        if type(self.inner).training_loss is not Method.training_loss:
            return [f"method.inner {self.cfg.inner!r} has its own training step, not a loss on embeddings"]
        return self.inner.trial_problems(trial)

    # What is trained and on which rows is the inner method's.
    def views(self) -> tuple[str, ...]:
        return self.inner.views()

    def required_columns(self) -> tuple[str, ...]:
        return self.inner.required_columns()

    def shared_key(self, trial: TrialConfig) -> str | None:
        return self.inner.shared_key(trial)

    def prepare_shared(self, trial: TrialConfig) -> Any:
        return self.inner.prepare_shared(trial)

    def text_pipeline(self, trial: TrialConfig, shared: Any) -> Any:
        return self.inner.text_pipeline(trial, shared)

    def unavailable(self, trial: TrialConfig) -> str | None:
        return self.inner.unavailable(trial)

    def rows_for_training(self, rows: list[dict[str, str]], trial: TrialConfig) -> list[dict[str, str]]:
        return self.inner.rows_for_training(rows, trial)

    def prepare_rows(self, rows: list[dict[str, str]], pipeline: Any, trial: TrialConfig) -> Any:
        return self.inner.prepare_rows(rows, pipeline, trial)

    def batch_order(self, rows: Any, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
        return self.inner.batch_order(rows, batch_size, epoch, seed)

    def plan_steps(self, num_rows: int, trial: TrialConfig, world: int) -> tuple[int, int]:
        return self.inner.plan_steps(num_rows, trial, world)

    def build_model(self, model_cfg: Any, pipeline: Any = None) -> torch.nn.Module:
        return self.inner.build_model(model_cfg, pipeline)

    def encode_rows(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return self.inner.encode_rows(model, batch)
