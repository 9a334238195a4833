"""Load an encoder some earlier trial trained: the input of a later stage of a staged study.

A *source* is one of

* a checkpoint folder written by the trainer (``state.pt``: the weights when the trial stopped, plus
  optimiser state; ``best_model.pt``: the best-dev weights, when a dev set was scored);
* one of those ``.pt`` files;
* a saved Hugging Face model folder (``config.json``), or a hub name;
* any of the folders above on cloud storage (``s3://…``, ``gs://…``): copied to a local folder first.

The trainer's files hold only weights, so the architecture comes from the consuming trial's ``model``
section (same ``name``; its pooling decides which heads are needed). They load as tensors and plain
data only (a file that would run code is refused) and are checked against the folder's
``manifest.json`` of SHA-256 (``clsr.encoders.checkpoint_files``). The trainer writes that manifest with
every checkpoint, so its files (``state.pt``, ``best_model.pt``, in a folder or named directly) are
refused without it; any other ``.pt`` file named directly is a model of the user's own, trained
elsewhere, and loads without one.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from torch import nn

from clsr.config.model import ModelConfig
from clsr.encoders.checkpoint_files import MANIFEST, load_tensors
from clsr.encoders.transformer import TransformerEncoder

Weights = Literal["last", "best"]
WEIGHT_FILES = {"last": "state.pt", "best": "best_model.pt"}


def is_checkpoint(source: str) -> bool:
    """A trainer checkpoint (local or remote), not a model name for the hub."""
    if "://" in source:
        return True
    path = Path(source).expanduser()
    return path.suffix == ".pt" or (path.is_dir() and not (path / "config.json").exists())


def local_folder(source: str) -> Path:
    """A local path for ``source``: itself, or a fresh local copy of a remote folder."""
    if "://" not in source:
        return Path(source).expanduser()
    import pyarrow.fs

    target = tempfile.mkdtemp(prefix="clsr-upstream-")
    filesystem, path = pyarrow.fs.FileSystem.from_uri(source)
    pyarrow.fs.copy_files(path, target, source_filesystem=filesystem)
    return Path(target)


def load_trained_encoder(source: str, model_cfg: ModelConfig, weights: Weights = "last") -> nn.Module:
    """``model_cfg``'s encoder with ``source``'s weights (see the module doc for what a source is)."""
    if not is_checkpoint(source):
        return TransformerEncoder(model_cfg.model_copy(update={"name": source}))
    path = local_folder(source)
    try:
        state = _read_weights(source, path, weights)
    finally:
        if "://" in source:  # the local copy of a remote checkpoint has served its purpose
            shutil.rmtree(path, ignore_errors=True)
    model = TransformerEncoder(model_cfg)
    missing, _ = model.load_state_dict(state, strict=False)  # a head the consumer does not pool with: unused
    if missing:
        raise ValueError(
            f"{source} does not hold the weights of a {model_cfg.name} encoder with {model_cfg.pooling} "
            f"pooling (missing: {missing[:3]}...); train the upstream trial with the same model.name"
        )
    return model


def _read_weights(source: str, path: Path, weights: Weights) -> dict:
    if not path.exists():
        raise FileNotFoundError(
            f"trained encoder {source!r} does not exist; name the checkpoint folder of a finished trial "
            f"(its MLflow run's tag clsr.checkpoint)"
        )
    if path.is_dir():
        if not (path / WEIGHT_FILES[weights]).exists():
            hint = (
                "the trial scored no dev set, use weights: last"
                if weights == "best"
                else "is it a checkpoint?"
            )
            if weights == "best" and (moved := _best_model_uri(path)):
                hint = (
                    f"its finished study kept its best weights once, as the MLflow model {moved} (`platform "
                    f"eval --model {moved}`); use weights: last, or keep_checkpoints: true in the study"
                )
            raise FileNotFoundError(f"{source} has no {WEIGHT_FILES[weights]} (weights: {weights}); {hint}")
        path = path / WEIGHT_FILES[weights]
    # checked against the folder's manifest (the trainer's files must have one); tensors and plain data only
    state = load_tensors(path, manifest_required=path.name in WEIGHT_FILES.values())
    if isinstance(state, dict) and isinstance(state.get("model"), dict):  # state.pt: weights + optimiser
        state = state["model"]
    return state


def _best_model_uri(folder: Path) -> str | None:
    """Where a finished study's retention moved the checkpoint's best weights (the manifest's note)."""
    try:
        note = json.loads((folder / MANIFEST).read_text()).get("best_model")
    except (OSError, ValueError, AttributeError):
        return None
    return note if isinstance(note, str) else None
