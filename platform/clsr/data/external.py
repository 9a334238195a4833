"""Training data the catalogue does not name: a local file or folder, or a Hugging Face hub data set.

``data.train`` is then read with HF ``datasets`` (its ``csv``/``json``/``parquet``/``text`` builders,
``load_from_disk``, or a hub id with ``data.config``/``data.split``/``data.revision``), so parsing, the
Arrow cache (fingerprinted: a second trial or study reuses it) and the hub's download logic are the
library's. This module only decides which of those applies, maps the data's columns onto the method's
views (``data.columns``: ``{view: column}``), keeps the rows ``data.filter`` selects, and reads a
source's column names cheaply for ``study validate``.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from clsr.data.sources import DataUnavailableError

Row = dict[str, str]

# file suffix → (datasets builder, extra builder arguments)
FILE_BUILDERS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t", "quoting": csv.QUOTE_NONE}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
}
HUB_ID = re.compile(
    r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$"
)  # name or owner/name (huggingface_hub's rule, loosely)


class DataSourceError(ValueError):
    """``data.train`` names something that is not there or not readable as training data."""


def absolute_local(value: Any) -> Any:
    """``value`` made absolute when it names an existing local file or folder (trials run in other
    folders); anything else (names, hub ids, URIs, missing files ``study validate`` reports) unchanged."""
    if not isinstance(value, str) or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def looks_like_path(train: str) -> bool:
    """A value meant as a local file or folder (even one that does not exist)."""
    return (
        train.startswith(("/", "./", "../", "~"))
        or Path(train).suffix.lower() in FILE_BUILDERS
        or Path(train).expanduser().exists()
    )


def source_kind(train: str) -> str:
    """``file`` (one file a builder reads), ``saved`` (a ``save_to_disk`` folder), ``folder`` (files of one
    kind), or ``hub`` (a hub data set id); DataSourceError for a missing path or an unusable name."""
    if looks_like_path(train):
        path = Path(train).expanduser()
        if path.is_file():
            if path.suffix.lower() not in FILE_BUILDERS:
                raise DataSourceError(
                    f"data.train {train!r}: a {path.suffix or 'suffix-less'} file; allowed suffixes: "
                    f"{', '.join(FILE_BUILDERS)} (plain text: one sentence a line)"
                )
            return "file"
        if path.is_dir():
            if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
                return "saved"
            _folder_files(path)  # one kind of file, or an error
            return "folder"
        raise DataSourceError(
            f"data.train {train!r}: no such file or folder (relative paths are read from the folder "
            f"`platform study` runs in: {Path.cwd()})"
        )
    if not HUB_ID.match(train):
        raise DataSourceError(
            f"data.train {train!r} is not a catalogue set, a file or folder, or a hub data set id "
            f"(owner/name)"
        )
    return "hub"


def _folder_files(folder: Path) -> tuple[str, list[str]]:
    """(suffix, files) of a folder holding training files of one kind."""
    by_suffix: dict[str, list[str]] = {}
    for file in sorted(folder.iterdir()):
        if file.is_file() and file.suffix.lower() in FILE_BUILDERS:
            by_suffix.setdefault(file.suffix.lower(), []).append(str(file))
    if len(by_suffix) != 1:
        found = ", ".join(by_suffix) or "none"
        raise DataSourceError(
            f"data.train {str(folder)!r}: a folder must hold files of one kind ({', '.join(FILE_BUILDERS)}); "
            f"found {found}. Point data.train at one file, or keep one kind in the folder"
        )
    ((suffix, files),) = by_suffix.items()
    return suffix, files


def _cache_dir() -> str | None:
    return os.environ.get("HF_DATASETS_CACHE") or None  # read per call: tests and users may set it late


def load_source(data: Any) -> Any:
    """The ``datasets.Dataset`` that ``data`` (a ``DataConfig``) names, its split chosen, filter applied."""
    import datasets

    kind = source_kind(data.train)
    try:
        if kind == "saved":
            loaded = datasets.load_from_disk(str(Path(data.train).expanduser()))
        elif kind == "hub":
            loaded = datasets.load_dataset(
                data.train, data.config, split=data.split, revision=data.revision, cache_dir=_cache_dir()
            )
        else:
            if kind == "file":
                path = Path(data.train).expanduser()
                suffix, files = path.suffix.lower(), [str(path)]
            else:
                suffix, files = _folder_files(Path(data.train).expanduser())
            builder, options = FILE_BUILDERS[suffix]
            loaded = datasets.load_dataset(
                builder, data_files={"train": files}, split="train", cache_dir=_cache_dir(), **options
            )
    except DataSourceError:
        raise
    except Exception as err:  # datasets raises many kinds; the user needs the source and the reason
        where = "the hub" if kind == "hub" else "the file"
        hint = (
            " Offline, the data set must be in the local HF datasets cache (load it once online), or "
            "point data.train at a local file."
            if kind == "hub"
            else ""
        )
        raise DataUnavailableError(
            f"data.train {data.train!r}: could not read it from {where} ({type(err).__name__}: {err}).{hint}"
        ) from err
    if isinstance(loaded, datasets.DatasetDict):
        if data.split not in loaded:
            raise DataSourceError(
                f"data.split {data.split!r}: {data.train!r} has splits {', '.join(loaded)}; set data.split"
            )
        loaded = loaded[data.split]
    return _filtered(loaded, data)


def _filtered(dataset: Any, data: Any) -> Any:
    if not data.filter:
        return dataset
    missing = [c for c in data.filter if c not in dataset.column_names]
    if missing:
        raise DataSourceError(
            f"data.filter: {data.train!r} has no column {', '.join(map(repr, missing))} "
            f"(its columns: {', '.join(dataset.column_names)})"
        )
    wanted = {column: {str(v) for v in _as_list(value)} for column, value in data.filter.items()}
    return dataset.filter(
        lambda *values: all(str(v) in wanted[c] for c, v in zip(wanted, values, strict=True)),
        input_columns=list(wanted),
    )


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def source_columns(data: Any) -> list[str]:
    """The column names of ``data.train`` without reading every row (for validation)."""
    return _source_columns(data.train, data.config, data.split, data.revision, _stamp(data.train))


def _stamp(train: str) -> float:
    path = Path(train).expanduser()
    return path.stat().st_mtime if path.exists() else 0.0  # a file edited between checks is read again


@lru_cache(maxsize=64)
def _source_columns(train: str, config: str | None, split: str, revision: str | None, _: float) -> list[str]:
    kind = source_kind(train)
    path = Path(train).expanduser()
    if kind == "folder":
        suffix, files = _folder_files(path)
        path = Path(files[0])
    elif kind == "file":
        suffix = path.suffix.lower()
    if kind in ("file", "folder"):
        return _file_columns(path, suffix)
    if kind == "saved":
        import datasets

        loaded = datasets.load_from_disk(str(path))  # memory-mapped: the header only is read
        if isinstance(loaded, datasets.DatasetDict):
            return list(loaded[split].column_names) if split in loaded else []
        return list(loaded.column_names)
    return _hub_columns(train, config, split, revision)


def _file_columns(path: Path, suffix: str) -> list[str]:
    if suffix == ".txt":
        return ["text"]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with path.open(encoding="utf-8", newline="") as handle:
        if suffix in (".csv", ".tsv"):
            return next(csv.reader(handle, delimiter="\t" if suffix == ".tsv" else ","), [])
        if suffix == ".jsonl":
            first = next((line for line in handle if line.strip()), "{}")
            return list(json.loads(first))
        return list(_first_json_record(handle.read()))


def _first_json_record(text: str) -> dict[str, Any]:
    value = json.loads(text) if text.strip() else {}
    if isinstance(value, list):
        return value[0] if value and isinstance(value[0], dict) else {}
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return value  # columns as lists
    return value if isinstance(value, dict) else {}


def _hub_columns(train: str, config: str | None, split: str, revision: str | None) -> list[str]:
    import datasets

    try:
        builder = datasets.load_dataset_builder(train, config, revision=revision, cache_dir=_cache_dir())
    except Exception as err:
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if "NotFound" in type(err).__name__ and not _offline():
            raise DataSourceError(
                f"data.train {train!r}: no such data set on the Hugging Face hub ({reason}); check the id "
                f"(owner/name) and data.config"
            ) from None
        raise DataUnavailableError(
            f"data.train {train!r}: a hub data set that cannot be read here ({reason}). Offline, load it "
            f"once online so it is in the HF datasets cache (same HF_HOME), or point data.train at a local "
            f"file"
        ) from None
    features = builder.info.features
    return list(features) if features is not None else []  # unknown until loaded: checked at load


def _offline() -> bool:
    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return any(flag in ("1", "ON", "YES", "TRUE") for flag in flags)


def data_source_problem(
    data: Any, needed: Sequence[str], fewer: Sequence[str] = ()
) -> tuple[str | None, str | None]:
    """``(problem, unavailable)`` for ``data`` (a ``DataConfig``) and the views a method ``needed``,
    reading column names only: ``problem`` when it can never work as written (a missing file, columns
    the data lacks), ``unavailable`` when it could elsewhere (a hub set not cached while offline).
    ``fewer``: the method's settings that need fewer columns, said before any mapping hint."""
    if not data.external():
        from clsr.data.catalog import DATASETS, unavailable

        if data.train not in DATASETS:
            return None, None  # a FAQ set: its loader says what is missing
        try:  # a catalogue set: its files and hub copies by name
            return None, unavailable(data.train, data.data_dir)
        except DataUnavailableError as err:  # data.data_dir is not a data folder
            return f"data.data_dir: {err}", None
    try:
        columns = source_columns(data)
    except DataSourceError as err:
        return str(err), None
    except DataUnavailableError as err:
        return None, str(err)
    except Exception as err:  # an unreadable file: bad encoding, broken JSON or Parquet
        return f"data.train {data.train!r}: could not read its columns ({type(err).__name__}: {err})", None
    if columns and (absent := [c for c in data.filter or {} if c not in columns]):
        return (
            f"data.filter: {data.train!r} has no column {', '.join(map(repr, absent))} (its columns: {', '.join(columns)})",
            None,
        )
    if problem := columns_problem(columns, data.columns, needed, fewer):
        return f"data.train {data.train!r}: {problem}", None
    return None, None


def mapped_columns(columns: Sequence[str], mapping: Mapping[str, str] | None) -> list[str]:
    """The views ``columns`` provide under ``mapping`` ({view: column}): mapped views, and same-named ones."""
    mapping = dict(mapping or {})
    used = set(mapping.values())
    return [*mapping, *(c for c in columns if c not in used and c not in mapping)]


def columns_problem(
    columns: Sequence[str], mapping: Mapping[str, str] | None, needed: Sequence[str], fewer: Sequence[str] = ()
) -> str | None:
    """Why ``needed`` views cannot be read from ``columns`` under ``mapping``, or None. ``fewer``: settings
    that need fewer columns (``method.hard_negatives: false``), offered before mapping another column."""
    if not columns:
        return None  # a hub set that publishes no features: the loader checks
    absent = [f"{view}: {column}" for view, column in (mapping or {}).items() if column not in columns]
    if absent:
        return f"data.columns maps to columns the data lacks ({', '.join(absent)}); its columns: {', '.join(columns)}"
    if shared := _one_column_many_roles(mapping or {}):
        return f"data.columns maps {shared}: each role needs a column of its own"
    provided = mapped_columns(columns, mapping)
    if missing := [view for view in needed if view not in provided]:
        options = "".join(f"; {option}" for option in fewer)
        return (
            f"the method needs columns {list(needed)} and the data provides {provided} (missing {missing})"
            f"{options}; {'otherwise ' if fewer else ''}map them with data.columns, e.g. "
            f"{{{missing[0]}: <a column of: {', '.join(columns)}>}}"
        )
    return None


def _one_column_many_roles(mapping: Mapping[str, str]) -> str | None:
    """``"column 's2' to positive and negative"`` when one column is mapped to several roles: a positive
    read again as its own hard negative validates and trains nonsense."""
    roles: dict[str, list[str]] = {}
    for role, column in mapping.items():
        roles.setdefault(column, []).append(role)
    shared = [f"column {column!r} to {' and '.join(names)}" for column, names in roles.items() if len(names) > 1]
    return "; ".join(shared) or None


def external_rows(data: Any) -> list[Row]:
    """Every row of the source ``data`` names as ``{view or column: text}``: ``data.columns`` renames
    (view ← column), other columns keep their names. The method checks that its views are there."""
    key = json.dumps(
        [data.train, data.config, data.split, data.revision, data.columns, data.filter, _stamp(data.train)],
        sort_keys=True,
        default=str,
    )
    if key not in _ROWS:
        if len(_ROWS) >= 4:  # a study process reads few sources; keep the last ones
            _ROWS.pop(next(iter(_ROWS)))
        _ROWS[key] = _read_rows(data)
    return [dict(row) for row in _ROWS[key]]


_ROWS: dict[str, tuple[Row, ...]] = {}


def _read_rows(data: Any) -> tuple[Row, ...]:
    dataset = load_source(data)
    mapping = dict(data.columns or {})
    if problem := columns_problem(dataset.column_names, mapping, ()):
        raise DataSourceError(f"data.train {data.train!r}: {problem}")
    names = {column: view for view, column in mapping.items()}
    table = dataset.to_dict()
    named = {names.get(column, column): values for column, values in table.items()}
    for view, column in mapping.items():  # one column may feed two views
        named[view] = table[column]
    rows = tuple({name: _text(values[i]) for name, values in named.items()} for i in range(dataset.num_rows))
    if not rows:
        raise DataSourceError(
            f"data.train {data.train!r}: no rows{' after data.filter' if data.filter else ''}"
        )
    return rows


def _text(value: Any) -> str:
    return "" if value is None else str(value)
