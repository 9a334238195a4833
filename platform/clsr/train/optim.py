"""Optimisers with parameter groups, and warm-up + decay schedules (transformers' own schedulers)."""

from __future__ import annotations

from torch import nn
from torch.optim import SGD, AdamW, Optimizer
from torch.optim.lr_scheduler import LRScheduler
from transformers import get_scheduler

from clsr.train.config import TrainerConfig

_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def parameter_groups(model: nn.Module, cfg: TrainerConfig, lr_by_module: dict[str, float]) -> list[dict]:
    """One group per (learning rate, weight decay) pair; the first matching name prefix sets the LR."""
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        lr = next((v for prefix, v in lr_by_module.items() if name.startswith(prefix)), cfg.lr)
        decay = 0.0 if any(marker in name for marker in cfg.no_decay) else cfg.weight_decay
        groups.setdefault((lr, decay), []).append(param)
    return [{"params": p, "lr": lr, "weight_decay": wd} for (lr, wd), p in groups.items()]


def build_optimizer(model: nn.Module, cfg: TrainerConfig, method_lrs: dict[str, float]) -> Optimizer:
    groups = parameter_groups(model, cfg, {**method_lrs, **cfg.lr_by_module})
    if cfg.optimizer == "sgd":
        return SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    return AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def warmup_steps(cfg: TrainerConfig, total_steps: int) -> int:
    return cfg.warmup_steps or round(cfg.warmup_ratio * total_steps)


def build_scheduler(optimizer: Optimizer, cfg: TrainerConfig, total_steps: int) -> LRScheduler:
    return get_scheduler(
        _SCHEDULES[cfg.schedule],
        optimizer,
        num_warmup_steps=warmup_steps(cfg, total_steps),
        num_training_steps=total_steps,
    )
