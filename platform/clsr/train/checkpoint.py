"""Checkpoint I/O: what a checkpoint keeps of the model (``trained_state``), writing it
(``save_checkpoint``) and restoring a trial from it (``load_checkpoint``)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch
from torch import nn

from clsr.encoders import checkpoint_files
from clsr.train.rng import restore_rng, rng_state
from clsr.train.staging import staging_folder

CPU = torch.device("cpu")


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def frozen_parameters(model: nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if not p.requires_grad}


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state a checkpoint keeps: everything but its frozen parameters (GCLSR's word table,
    gigabytes for word2vec), which ``build_model`` rebuilds from the trial's config on a resume."""
    frozen = frozen_parameters(model)
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def load_trained_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what ``trained_state`` kept; only frozen parameters may be missing."""
    frozen = frozen_parameters(model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - frozen:
        raise RuntimeError(
            f"the checkpoint does not fit the model: missing {sorted(set(missing) - frozen)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}; was it written by a trial of another model config?"
        )


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 of the model's trained state: names, dtypes, shapes and bytes, in name order. Two runs
    with the same digest ended on bitwise-equal weights (``trainer.deterministic``)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(trained_state(model).items()):
        value = tensor.detach().to(CPU).contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def save_checkpoint(
    model: nn.Module,
    optimizer,
    scheduler,
    state: dict,
    best_weights: dict | None,
    device: torch.device = CPU,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> Path:
    """A fresh folder with ``state.pt`` (and ``best_model.pt``), each written atomically, and a
    ``manifest.json`` of their SHA-256 written last; nothing is left behind when a write fails. The
    random states are the CPU's and ``device``'s only (``clsr.train.rng``: placement-independent)."""
    folder = staging_folder("ckpt")
    try:
        saved = {
            "model": trained_state(unwrap(model)),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(device),
            **state,
        }
        if grad_scaler is not None and grad_scaler.is_enabled():
            saved["grad_scaler"] = grad_scaler.state_dict()
        hashes = {"state.pt": checkpoint_files.save_tensors(saved, folder / "state.pt")}
        if best_weights is not None:
            hashes["best_model.pt"] = checkpoint_files.save_tensors(best_weights, folder / "best_model.pt")
        checkpoint_files.write_manifest(folder, hashes)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def load_checkpoint(
    folder: Path,
    model,
    optimizer,
    scheduler,
    state: dict,
    session,
    seed: int,
    device: torch.device = CPU,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> dict | None:
    """Restore what ``save_checkpoint`` wrote into the live objects and ``state``; the best weights.

    Files are checked against the folder's manifest and loaded as tensors and plain data only."""
    saved = checkpoint_files.load_tensors(folder / "state.pt")
    if "optimizer" not in saved:  # shrunk once its study finished (clsr.study.record.retention): weights only
        raise ValueError(
            f"{folder}: this checkpoint keeps weights only (its study finished and was shrunk), so training "
            "cannot continue from it; start the trial anew, or set keep_checkpoints: true in the study"
        )
    load_trained_state(unwrap(model), saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    scheduler.load_state_dict(saved.pop("scheduler"))
    scaler_state = saved.pop("grad_scaler", None)
    if grad_scaler is not None and grad_scaler.is_enabled() and scaler_state is not None:
        grad_scaler.load_state_dict(scaler_state)  # the loss scale it had found, not the initial 2^16
    state.update(saved)
    rng = state.pop("rng")  # rank 0's dropout masks continue as if the run had never stopped
    if session.rank == 0:
        restore_rng(rng, device)
    else:  # other ranks keep masks of their own
        torch.manual_seed(seed + session.rank + 7919 * state["step"])
    best = folder / "best_model.pt"
    return checkpoint_files.load_tensors(best) if best.exists() else None
