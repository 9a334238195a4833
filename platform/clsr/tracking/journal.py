"""The write journal of a run (``clsr.tracking.spool``): its format, one JSON entry a line, the checks an
entry read back passes before it is executed, sending one entry to MLflow, and its local files.

A journal read back is untrusted input: others can write the study's storage (a shared bucket or
file system), and checkpoints live there. Each entry is checked before anything is done with it
(``refusal``): a known operation with well-formed values, a local file named by one plain name and
read only inside its journal's own ``files/`` (never through a link), MLflow artifact paths relative
and without ``..``. An entry refused, a line that cannot be read, or a write MLflow refuses for good
is skipped with a warning; the journal that held it is not deleted but kept aside
(``journal.kept.jsonl``, not replayed again) for a person to read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOURNAL = "journal.jsonl"
FILES = "files"
STATUSES = ("FINISHED", "FAILED", "KILLED")
FILE_NAME = re.compile(r"[0-9a-f]{12}-[^/\\\x00]+")  # what ``Spool.artifacts`` names its copies

# --- a journal read back: untrusted ----------------------------------------------------------------------


@dataclass
class Read:
    """A journal's entries, and how many of its lines could not be read (never executed)."""

    entries: list[Any]
    unreadable: int


def read_journal(text: str) -> Read:
    """A journal's entries; a line that cannot be read is skipped and counted, and reading goes on."""
    entries, unreadable = [], 0
    for line in text.splitlines():
        if line.strip():
            try:
                entries.append(json.loads(line))
            except (ValueError, RecursionError):
                unreadable += 1
    return Read(entries, unreadable)


def refusal(entry: Any) -> str | None:
    """Why a journal entry read back must not be executed; None when it may."""
    if not isinstance(entry, dict):
        return "not a journal entry"
    check = _CHECKS.get(entry.get("op"))  # type: ignore[arg-type]
    if check is None:
        return f"unknown operation {str(entry.get('op'))[:40]!r}"
    try:
        return check(entry)
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"a malformed {entry['op']} entry"


def _metric_points(entry: dict[str, Any]) -> str | None:
    def point(p: Any) -> bool:
        return (
            isinstance(p, list)
            and len(p) == 4
            and isinstance(p[0], str)
            and isinstance(p[1], int | float)
            and all(isinstance(n, int) for n in p[2:])
        )

    points = entry["points"]
    return None if isinstance(points, list) and all(point(p) for p in points) else "malformed metric points"


def _strings(entry: dict[str, Any], field: str) -> str | None:
    values = entry[field]
    plain = isinstance(values, dict) and all(isinstance(v, str) for v in values.values())
    return None if plain else f"malformed {field}"


def _text(entry: dict[str, Any]) -> str | None:
    if not isinstance(entry["text"], str):
        return "malformed text"
    return _artifact_path_refusal(entry["file"])


def _artifacts(entry: dict[str, Any]) -> str | None:
    name = entry["file"]
    if not isinstance(name, str) or FILE_NAME.fullmatch(name) is None:
        return f"file {str(name)[:200]!r} is not one plain name in the journal's own files/"
    return None if entry["artifact_path"] is None else _artifact_path_refusal(entry["artifact_path"])


def _terminate(entry: dict[str, Any]) -> str | None:
    ok = entry["status"] in STATUSES and isinstance(entry["end_time"], int)
    return None if ok else "malformed terminate"


_CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "metrics": _metric_points,
    "params": lambda entry: _strings(entry, "params"),
    "tags": lambda entry: _strings(entry, "tags"),
    "text": _text,
    "artifacts": _artifacts,
    "terminate": _terminate,
}


def _artifact_path_refusal(path: Any) -> str | None:
    """An MLflow artifact path must stay inside its run: relative, '/'-separated, no '..'. (MLflow's
    local store refuses '..' itself; not every artifact store does.)"""
    parts = path.split("/") if isinstance(path, str) else [""]
    if "\\" in str(path) or "\x00" in str(path) or any(p in ("", ".", "..") for p in parts):
        return f"artifact path {str(path)[:200]!r} leaves its run"
    return None


class Refused(ValueError):
    """A journal entry that is never executed (``refusal`` says why); final for ``is_transient``."""


def send(uri: str, run_id: str, entry: dict[str, Any], folder: Path) -> None:
    """One journal entry to MLflow (idempotent); an artifact's file is read from ``folder/files/``."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    if reason := refusal(entry):
        raise Refused(f"a journal entry refused: {reason}")
    client = MlflowClient(uri)
    op = entry["op"]
    if op == "metrics":
        points = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in entry["points"]]
        for start in range(0, len(points), 1000):  # MLflow's per-request metric limit
            client.log_batch(run_id, metrics=points[start : start + 1000])
    elif op == "params":
        items = [Param(k, v) for k, v in entry["params"].items()]
        for start in range(0, len(items), 100):  # MLflow's per-request param limit
            client.log_batch(run_id, params=items[start : start + 100])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in entry["tags"].items()])
    elif op == "text":
        client.log_text(run_id, entry["text"], entry["file"])
    elif op == "artifacts":
        _send_artifacts(client, run_id, folder / FILES / entry["file"], entry["artifact_path"])
    else:
        client.set_terminated(run_id, status=entry["status"], end_time=entry["end_time"])


def _send_artifacts(client: Any, run_id: str, path: Path, artifact_path: str | None) -> None:
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
        return
    with tempfile.TemporaryDirectory() as tmp:  # the file keeps its name (the copy has a unique prefix)
        original = Path(tmp) / path.name.split("-", 1)[1]
        shutil.copy2(path, original)
        client.log_artifact(run_id, str(original), artifact_path)


# --- local files ------------------------------------------------------------------------------------------


def copy_local(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def remove_local(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def unlinked(anchor: Path, relative: str) -> bool:
    """Whether ``anchor/relative`` exists and resolves to itself: no part below ``anchor`` is a link."""
    path = os.path.join(os.path.realpath(anchor), relative)
    return os.path.lexists(path) and os.path.realpath(path) == path


def copy_inside(anchor: Path, relative: str, target: Path) -> str | None:
    """Copy a journal's file (or folder) ``anchor/relative``, which must lie there and hold no link;
    the reason it was refused, or None."""
    if not unlinked(anchor, relative):
        return f"{relative} is missing or reached through a link"
    source = Path(os.path.realpath(anchor)) / relative
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)  # a link inside stays a link here, and is refused
        if _holds_links(target):
            shutil.rmtree(target, ignore_errors=True)
            return f"{relative} holds a link"
    else:
        shutil.copy2(source, target, follow_symlinks=False)
        if target.is_symlink():
            target.unlink()
            return f"{relative} is a link"
    return None


def _holds_links(folder: Path) -> bool:
    for parent, folders, files in os.walk(folder):
        if any(os.path.islink(os.path.join(parent, name)) for name in folders + files):
            return True
    return False


def sound(entries: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The entries that may be written to ``where``; a refused one is left out with a warning."""
    kept = []
    for entry in entries:
        if reason := refusal(entry):
            warn(f"refused a write for {where}: {reason}")
        else:
            kept.append(entry)
    return kept


def write_journal(entries: list[dict[str, Any]], source: Path, target: Path) -> None:
    """A journal and its files into a local folder (a checkpoint's ``spool/``), the journal last."""
    entries = sound(entries, str(target))
    (target / FILES).mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry["op"] == "artifacts":
            copy_local(source / FILES / entry["file"], target / FILES / entry["file"])
    temporary = target / f".{JOURNAL}.{uuid.uuid4().hex[:12]}"
    temporary.write_text("".join(json.dumps(e) + "\n" for e in entries))
    os.replace(temporary, target / JOURNAL)


def warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)
