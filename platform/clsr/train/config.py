"""The resolved configuration of one trial: small validated sections with defaults written once.

Precedence when a study is resolved (lowest first): these class defaults, the method's paper
defaults (``Method.paper_defaults``), the study's ``base``, the ablation point, the seed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clsr.encoders.transformer import ModelConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    train: str = Field("wiki1m", description="training data set name from the catalog (clsr.data.catalog)")
    data_dir: str | None = Field(None, description="local data folder; default: $CLSR_DATA_DIR, else the hub")
    max_rows: int | None = Field(None, ge=1, description="seeded random subset of the training rows")


class TrainerConfig(Section):
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimiser steps")
    batch_size: int = Field(64, ge=2, description="global batch: rows per optimiser step over all workers")
    grad_accum_steps: int = Field(1, ge=1)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    no_decay: list[str] = Field(default_factory=lambda: ["bias", "LayerNorm.weight", "LayerNorm.bias"])
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    lr_by_module: dict[str, float] = Field(
        default_factory=dict, description="absolute LR for parameters whose name starts with a prefix"
    )
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    warmup_steps: int = Field(0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto = bf16 autocast on a GPU that supports it, fp32 on CPU"
    )
    eval_steps: int = Field(125, ge=1, description="evaluate on the dev set every N optimiser steps")
    log_every: int = Field(10, ge=1, description="send per-step metrics to MLflow every N steps")
    seed: int = 42

    @model_validator(mode="after")
    def _one_warmup(self) -> TrainerConfig:
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError("set either warmup_steps or warmup_ratio, not both")
        return self


class EvalConfig(Section):
    dev_tasks: list[Literal["stsb", "sickr"]] = Field(
        default_factory=lambda: ["stsb"], description="dev splits scored every eval_steps"
    )
    select_on: Literal["stsb", "sickr"] = Field("stsb", description="dev task that picks the best checkpoint")

    @model_validator(mode="after")
    def _select_on_scored(self) -> EvalConfig:
        if self.dev_tasks and self.select_on not in self.dev_tasks:
            raise ValueError(f"select_on {self.select_on!r} must be one of dev_tasks {self.dev_tasks}")
        return self

    tasks: list[str] = Field(
        default_factory=lambda: ["sts"], description="final test evaluation: 'sts' or STS task names"
    )
    batch_size: int = Field(128, ge=1)
    alignment_uniformity: bool = Field(True, description="Wang & Isola metrics on STS-B dev")

    @model_validator(mode="after")
    def _known_tasks(self) -> EvalConfig:
        from clsr.eval.sts import expand_tasks

        expand_tasks(self.tasks)  # raises with the allowed names
        return self


class TrialConfig(Section):
    """Everything one trial needs. ``method`` holds ``name`` plus the method's own hyperparameters."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    method: dict[str, Any]
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("method")
    @classmethod
    def _method_section(cls, method: dict[str, Any]) -> dict[str, Any]:
        """Validate the hyperparameters with the method's own Config class and fill its defaults."""
        from clsr.methods import get_method

        return get_method(method.get("name", "")).Config(**method).model_dump()
