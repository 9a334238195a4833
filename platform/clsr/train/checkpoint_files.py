"""The files of a trainer checkpoint: written atomically, recorded in a manifest, checked when read.

A checkpoint folder holds ``state.pt`` (and ``best_model.pt`` when a dev set was scored) plus
``manifest.json``: each file's SHA-256, written last, so a folder with a manifest was written completely.
Every file lands under a temporary name in its folder and is renamed (``os.replace``) once complete, so
a reader never sees half a file under its real name. Loading goes through ``load_tensors``: the manifest
is required and checked (the trainer always writes one: a folder without it is incomplete or was
changed), and ``torch.load`` runs with ``weights_only=True`` (tensors and plain data only; a pickle that
would run code is refused). Only a weights file of the user's own, named directly, may come without a
manifest (``manifest_required=False``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class UntrustedCheckpoint(pickle.UnpicklingError):
    """A checkpoint file that ``torch.load(weights_only=True)`` refused: it would run code when loaded."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then rename it to ``path``; no leftover on
    error (and the old ``path``, if any, is kept)."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb") as f:  # on disk before the rename makes it visible under its real name
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_tensors(obj: Any, path: Path) -> str:
    """``torch.save`` ``obj`` to ``path`` atomically; its SHA-256."""
    write_atomic(path, lambda tmp: torch.save(obj, tmp))
    return sha256(path)


def write_manifest(folder: Path, hashes: dict[str, str]) -> None:
    """Record ``{file name: SHA-256}`` of the folder's files; write it after the files themselves."""
    text = json.dumps({"sha256": hashes}, indent=1, sort_keys=True)
    write_atomic(Path(folder) / MANIFEST, lambda tmp: tmp.write_text(text))


def verify(path: Path, required: bool = True) -> None:
    """Raise unless ``path``'s SHA-256 is the one recorded in its folder's manifest.

    ``required=False``: a folder without a manifest of the trainer's (a user's own weights file) is not
    checked. A checkpoint the platform restores (a trial's resume, an upstream trial's output) always
    has one: its absence means a file was deleted, so nothing vouches for the others.
    """
    path = Path(path)
    manifest = path.parent / MANIFEST
    recorded = _recorded(manifest) if manifest.is_file() else None
    if recorded is None:
        if required:
            raise ValueError(
                f"checkpoint file {path} has no SHA-256 recorded (no trainer's {MANIFEST} beside it): the "
                f"trainer writes one with every checkpoint, so this folder is incomplete or was changed "
                f"after it was written; use a complete checkpoint folder of the trial (its MLflow run's "
                f"tag clsr.checkpoint), or rerun the trial that wrote it"
            )
        return
    expected = recorded.get(path.name)
    if expected is None:
        raise ValueError(f"checkpoint file {path} is not listed in {manifest}; it was added after the fact")
    if sha256(path) != expected:
        raise ValueError(
            f"checkpoint file {path} does not match its recorded SHA-256; "
            f"it was changed or truncated after it was written"
        )


def _recorded(manifest: Path) -> dict | None:
    """``{file name: SHA-256}`` of a trainer's manifest; None for some other tool's ``manifest.json``."""
    try:
        content = json.loads(manifest.read_text())
    except ValueError as err:
        raise ValueError(
            f"checkpoint manifest {manifest} is not valid JSON ({err}); it was changed"
        ) from None
    recorded = content.get("sha256") if isinstance(content, dict) else None
    return recorded if isinstance(recorded, dict) else None


def load_tensors(path: Path, manifest_required: bool = True) -> Any:
    """``torch.load`` of a checkpoint file on the CPU, tensors and plain data only, after ``verify``."""
    verify(path, manifest_required)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
        detail = f"it refers to {found.group(1)}" if found else "it is not a plain tensor file"
        raise UntrustedCheckpoint(
            f"checkpoint file {path} holds more than tensors and plain data, so it is not trusted and was "
            f"not loaded ({detail})"
        ) from None
