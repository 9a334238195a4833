"""What data a trial read, as a typed record: where it came from (a local path, a hub id with the commit
it resolved to, or the package's embedded sample) and a SHA-256 of the rows actually read.

The hash is over a canonical serialisation of the rows, not the files: one JSON line per row (UTF-8,
sorted keys, no spaces), so it does not depend on file layout, compression or a cache's Arrow format,
and it covers what filters, ``max_rows``, folds and evaluation caps left. Two trials read the same data
exactly when their ``data.<name>.sha256`` agree (docs/data.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["local", "hub", "embedded"]
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_VALUE = 500  # MLflow's smallest param value limit (older servers): a long path is cut from the left


@dataclass(frozen=True)
class DataIdentity:
    """One source a trial read: ``name`` (``train``, ``stsb``, ``stsb_dev``, ``mr``, ``vectors`` …), its
    ``kind`` and ``where`` (a path or a hub id), the hub ``revision`` it resolved to (None: a local or
    embedded source, or a hub commit not known here), the rows' ``sha256`` and their count."""

    name: str
    kind: Kind
    where: str
    revision: str | None
    sha256: str
    rows: int

    def params(self) -> dict[str, str]:
        """The params ``data.<name>.source|revision|sha256|rows`` of a trial's run."""
        source = f"{self.kind}:{self.where}"
        if len(source) > MAX_VALUE:
            source = "…" + source[-(MAX_VALUE - 1) :]
        prefix = f"data.{self.name}"
        return {
            f"{prefix}.source": source,
            f"{prefix}.revision": self.revision or "none",
            f"{prefix}.sha256": self.sha256,
            f"{prefix}.rows": str(self.rows),
        }


def canonical_line(row: Any) -> bytes:
    """A row as its canonical line: JSON (sorted keys, no spaces, non-ASCII kept), UTF-8, newline."""
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return (text + "\n").encode()


def rows_digest(rows: Iterable[Any]) -> tuple[str, int]:
    """(SHA-256 of the rows' canonical lines, row count)."""
    digest, count = hashlib.sha256(), 0
    for row in rows:
        digest.update(canonical_line(row))
        count += 1
    return digest.hexdigest(), count


def identity(name: str, kind: Kind, where: str, revision: str | None, rows: Iterable[Any]) -> DataIdentity:
    sha256, count = rows_digest(rows)
    return DataIdentity(name, kind, where, revision, sha256, count)


def _hub_cache() -> Path:
    from huggingface_hub import constants

    home = os.environ.get("HF_HOME") or constants.HF_HOME
    return Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub").expanduser()


def resolved_revision(hub_id: str, revision: str | None = None) -> str | None:
    """The commit ``hub_id`` at ``revision`` (None: the default branch) resolved to, from what is on this
    machine after loading it: a full commit as given; huggingface_hub's ``refs/<revision>`` file; else the
    commit folder of datasets' Arrow cache (``owner___name/<config>/<version>/<commit>``, the newest).
    None when neither cache knows (a loader that did not leave one)."""
    if revision and COMMIT.match(revision):
        return revision
    ref = _hub_cache() / f"datasets--{hub_id.replace('/', '--')}" / "refs" / (revision or "main")
    if ref.is_file() and COMMIT.match(commit := ref.read_text().strip()):
        return commit
    from clsr.data.sources import datasets_cache

    folders = [p for p in (datasets_cache() / hub_id.replace("/", "___")).glob("*/*/*") if p.is_dir()]
    commits = [p for p in folders if COMMIT.match(p.name)]
    return max(commits, key=lambda p: p.stat().st_mtime).name if commits else None
