"""The files of a trainer checkpoint: written atomically, recorded in a manifest, checked when read.

A checkpoint folder holds ``state.pt`` (and ``best_model.pt`` when a dev set was scored) plus
``manifest.json``: each file's SHA-256, written last, so a folder with a manifest was written completely.
Every file lands under a temporary name in its folder and is renamed (``os.replace``) once complete, so
a reader never sees half a file under its real name. Loading goes through ``load_tensors``: the manifest
is required and checked (the trainer always writes one: a folder without it is incomplete or was
changed), and ``torch.load`` runs with ``weights_only=True`` (tensors and plain data only; a pickle that
would run code is refused). Only a weights file of the user's own, named directly, may come without a
manifest (``manifest_required=False``).

A manifest entry is one SHA-256, or a list of them while ``clsr.study.record.retention`` swaps a file for a
smaller one (both hashes are accepted for those few moments). A reader reads the manifest, then opens the
file, hashes it and loads the very bytes it hashed; a mismatch is checked once more against the manifest
read again, which a swap has moved on by then: so no reader fails or loads an unchecked file during one.
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
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class UntrustedCheckpoint(pickle.UnpicklingError):
    """A checkpoint file that ``torch.load(weights_only=True)`` refused: it would run code when loaded."""


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_of(f)


def sha256_of(f: BinaryIO) -> str:
    """SHA-256 of an open binary file, read from where it is to its end."""
    digest = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def read_all(fs, path: str) -> bytes:
    """A whole file of a pyarrow filesystem (local, S3, GCS) as bytes."""
    with fs.open_input_stream(path) as stream:
        return stream.readall()


def accepts(entry: Any, digest: str) -> bool:
    """Whether a manifest entry (one SHA-256, or a list of them during a swap) accepts ``digest``."""
    return digest == entry if isinstance(entry, str) else isinstance(entry, list) and digest in entry


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
    import torch  # here: the record's modules read manifests without loading torch

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
    recorded = _listed(path, required)
    if recorded is not None:
        with open(path, "rb") as f:
            _check(path, f, recorded)


def _listed(path: Path, required: bool) -> dict | None:
    """The manifest beside ``path``, read before the file is opened (see the module doc); None for a
    file of the user's own (no manifest, ``required=False``); raises when it cannot vouch for ``path``."""
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
        return None
    if path.name not in recorded:
        raise ValueError(f"checkpoint file {path} is not listed in {manifest}; it was added after the fact")
    return recorded


def _check(path: Path, f: BinaryIO, recorded: dict) -> None:
    """Check the open file ``f`` of ``path`` against ``recorded``, the manifest read before ``f`` was
    opened; ``f`` is back at its start afterwards."""
    digest = sha256_of(f)
    f.seek(0)
    if accepts(recorded[path.name], digest):
        return
    # swapped for its smaller copy after the manifest was read (clsr.study.record.retention): the manifest
    # read now accepts the new file
    manifest = path.parent / MANIFEST
    again = (_recorded(manifest) if manifest.is_file() else None) or {}
    if not accepts(again.get(path.name), digest):
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
    import torch

    path = Path(path)
    recorded = _listed(path, manifest_required)  # before the file is opened (see the module doc)
    try:
        with open(path, "rb") as f:
            if recorded is not None:
                _check(path, f, recorded)
            return torch.load(f, map_location="cpu", weights_only=True)  # the bytes just checked
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
        detail = f"it refers to {found.group(1)}" if found else "it is not a plain tensor file"
        raise UntrustedCheckpoint(
            f"checkpoint file {path} holds more than tensors and plain data, so it is not trusted and was "
            f"not loaded ({detail})"
        ) from None
