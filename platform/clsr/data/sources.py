"""Where data comes from: a local data folder (``CLSR_DATA_DIR`` / ``data.data_dir``) or the HF hub.

The canonical local folder is the shared-data root, the folder that holds ``senteval/``, ``nli/``
and ``wiki/``. Every loader turns "not found" into :class:`DataUnavailableError`, whose message
says which file to provide, so an offline run fails with an instruction rather than a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV_VAR = "CLSR_DATA_DIR"


class DataUnavailableError(RuntimeError):
    """Neither a local file nor the Hugging Face hub can provide a data set."""


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """``explicit``, else ``$CLSR_DATA_DIR``, else None (= use the hub).

    SentEval's ``PATH_TO_DATA`` (``<root>/senteval``) is accepted too and mapped to its parent.
    """
    raw = explicit if explicit is not None else os.environ.get(ENV_VAR) or None
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_dir():
        origin = "data.data_dir" if explicit is not None else f"${ENV_VAR}"
        raise DataUnavailableError(
            f"{origin} = {str(raw)!r} is not a folder. Point it at the shared data folder "
            "(the one holding senteval/, nli/ and wiki/), or unset it and go online to use the hub."
        )
    if path.name == "senteval" and (path / "downstream").is_dir():
        return path.parent
    return path


KNOWN_FOLDERS = ("senteval", "nli", "wiki", "sts_original", "faq", "word_vectors")


def data_folder_problem(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """Why the data folder (``explicit``, else ``$CLSR_DATA_DIR``) is not the shared data folder, with
    where it probably is; None when it holds one of the folders the catalogue reads (or none is set).
    Checked before a study starts: a folder one level off would otherwise fail every trial at load."""
    raw = explicit if explicit is not None else os.environ.get(ENV_VAR) or None
    if raw is None:
        return None
    origin = "data.data_dir" if explicit is not None else f"${ENV_VAR}"
    try:
        path = resolve_data_dir(raw)
    except DataUnavailableError as err:
        return str(err)
    assert path is not None
    if any((path / name).is_dir() for name in KNOWN_FOLDERS):
        return None
    wanted = ", ".join(f"{name}/" for name in KNOWN_FOLDERS[:3])
    guess = next((c for c in _nearby(path) if any((c / name).is_dir() for name in KNOWN_FOLDERS)), None)
    hint = f"; did you mean {str(guess)!r}?" if guess else ""
    return (
        f"{origin} = {str(raw)!r} holds none of {', '.join(f'{n}/' for n in KNOWN_FOLDERS)}: it should be "
        f"the folder holding {wanted}{hint}"
    )


def _nearby(path: Path) -> list[Path]:
    """Where a data folder one level off usually is: a ``data`` folder inside, another child, the parent."""
    children = sorted(c for c in path.iterdir() if c.is_dir()) if path.is_dir() else []
    return [path / "data", *children, path.parent]


def local_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    """Validate a caller's ``data_dir`` without consulting the environment (None means the hub)."""
    return None if data_dir is None else resolve_data_dir(data_dir)


def local_files(data_dir: str | os.PathLike[str] | None, *relative: str) -> list[Path] | None:
    """The files under the data folder, when a data folder is given and holds all of them."""
    root = local_dir(data_dir)
    paths = [root / r for r in relative] if root is not None else []
    return paths if paths and all(p.is_file() for p in paths) else None


def datasets_cache() -> Path:
    """datasets' Arrow cache folder, from the environment now (as ``datasets`` will read it)."""
    from huggingface_hub import constants

    home = os.environ.get("HF_HOME") or constants.HF_HOME
    return Path(os.environ.get("HF_DATASETS_CACHE") or Path(home) / "datasets").expanduser()


def arrow_cached(hub_id: str, config: str | None = None) -> bool:
    """Whether datasets' Arrow cache holds a prepared copy of ``hub_id`` (of ``config``, when named): what
    ``load_dataset`` reads offline. Per repository and configuration, not per file: a repository with
    two files (``data_files=``) counts as cached when either is; its loader then says which is missing."""
    folder = datasets_cache() / hub_id.replace("/", "___")
    return any(folder.glob(f"{config or '*'}/*/*"))


def files_or_hub_unavailable(
    root: Path | None, files: tuple[str, ...], hub_id: str | None, config: str | None = None, hint: str = ""
) -> str | None:
    """Why a loader that reads ``files`` under the data folder, or else ``hub_id`` from the hub, cannot
    read either here (None: one of them is here, or the hub may answer)."""
    if root is not None and all((root / f).is_file() for f in files):
        return None
    wanted = f"{' and '.join(f'<data_dir>/{f}' for f in files)} (data folder: {root or 'none set'})"
    if hub_id is None:
        return f"it has no hub copy; provide {wanted}{f': {hint}' if hint else ''}"
    from clsr.data.hub.reach import datasets_hub_off

    if (off := datasets_hub_off()) is None or arrow_cached(hub_id, config):
        return None
    return (
        f"it reads {hub_id} from the hub, which {off}, and datasets' cache ({datasets_cache()}) has no copy; "
        f"provide {wanted} or run where the hub answers"
    )


def require_file(root: Path, hub_id: str, *candidates: str) -> Path:
    """The first of ``root / candidate`` that exists, else DataUnavailableError naming them all."""
    for relative in candidates:
        if (root / relative).is_file():
            return root / relative
    wanted = " or ".join(f"<data_dir>/{relative}" for relative in candidates)
    raise DataUnavailableError(
        f"missing {root / candidates[0]}: put the file at {wanted} (data_dir = {root}), "
        f"or point {ENV_VAR} / data.data_dir at a folder that has it, or leave data_dir unset and go online "
        f"to load {hub_id!r} from the hub."
    )


def load_from_hub(
    hub_id: str, local_hint: str, alternative: str = "", reads: Iterable[str] = (), **kwargs: Any
) -> Any:
    """``datasets.load_dataset(hub_id, **kwargs)`` for a source ``clsr.data.hub.manifest`` lists (with
    the ``split``, the ``data_files`` and the splits the caller ``reads`` from a DatasetDict); an
    unlisted request or any failure becomes DataUnavailableError naming the local file to provide.

    With ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1``, or when the hub cannot be reached from here
    (``clsr.data.hub.reach``), this fails in about a second unless the data set is in the local HF cache.
    """
    from clsr.data.hub.manifest import NotInManifest, require_listed

    split, files = kwargs.get("split"), kwargs.get("data_files")
    try:
        entry = require_listed(
            hub_id, [*([split] if split else []), *reads], [files] if files else [], kwargs.get("name")
        )
    except NotInManifest as err:
        raise DataUnavailableError(
            f"{err}. Provide <data_dir>/{local_hint} and point {ENV_VAR} / data.data_dir at that data_dir. "
            f"{alternative}".rstrip()
        ) from None
    from clsr.data.hub.reach import go_offline_if_unreachable

    go_offline_if_unreachable()  # no route to the hub: the local cache at once, not ~25 s of retries
    try:
        from datasets import load_dataset  # slow import, only needed on the hub path

        if entry.revision is not None:  # pinned in the manifest: that commit, not whatever main is now
            kwargs.setdefault("revision", entry.revision)
        return load_dataset(hub_id, **kwargs)
    except Exception as exc:
        raise DataUnavailableError(
            f"could not load {hub_id!r} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            f"Offline, provide <data_dir>/{local_hint} and point {ENV_VAR} / data.data_dir at that "
            f"data_dir, or go online. {alternative}".rstrip()
        ) from exc
