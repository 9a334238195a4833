"""The embedded default data set: a few thousand Wikipedia sentences and samples of STS-B dev/test and
STS16, shipped in the package (``clsr/data/embedded/``, licences in its ``LICENSES.md``) so the smoke
study runs from a fresh clone with neither a data folder nor the hub.

Used only as the last resort, per data set: no data folder is set (``CLSR_DATA_DIR`` / ``data.data_dir``),
the hub will not serve (an offline flag, or no route to it) and datasets' cache has no copy. Its rows are
a sample, so its scores are not the papers'; ``data.source`` in a trial's params says which source served.
Rebuilt from the shared data folder by ``benchmarks/build_embedded_data.py``.
"""

from __future__ import annotations

import functools
import gzip
import os
from collections.abc import Iterable
from pathlib import Path

from clsr.data.hub.manifest import SIMCSE_HUB_ID
from clsr.data.hub.manifest import STS_HUB_IDS as HUB_IDS

EMBEDDED_DIR = Path(__file__).with_name("embedded")
WIKI_FILE = "wiki1m_sample.txt.gz"
STS_FILE = "sts_sample.tsv.gz"  # task, split, subset, score, sentence 1, sentence 2
TRAIN_SETS = ("wiki1m",)  # the catalogue sets it stands in for

StsRow = tuple[str, float, str, str]  # subset, gold score, sentence 1, sentence 2


def _lines(name: str) -> list[str]:
    with gzip.open(EMBEDDED_DIR / name, "rt", encoding="utf-8") as lines:
        return lines.read().splitlines()


@functools.cache
def wiki_sentences() -> tuple[str, ...]:
    """The embedded sample of SimCSE's Wikipedia sentences (3,000)."""
    return tuple(_lines(WIKI_FILE))


@functools.cache
def _sts_rows() -> dict[tuple[str, str], tuple[StsRow, ...]]:
    rows: dict[tuple[str, str], list[StsRow]] = {}
    for line in _lines(STS_FILE):
        task, split, subset, score, first, second = line.split("\t")
        rows.setdefault((task, split), []).append((subset, float(score), first, second))
    return {key: tuple(value) for key, value in rows.items()}


def sts_rows(task: str, split: str) -> tuple[StsRow, ...] | None:
    """The embedded pairs of one STS split; None when it has none."""
    return _sts_rows().get((task, split))


def hub_serves(hub_id: str) -> bool:
    """Whether ``load_dataset(hub_id)`` can answer here: the hub may be reached, or its cache has a copy."""
    from clsr.data.hub.reach import datasets_hub_off
    from clsr.data.sources import arrow_cached

    return datasets_hub_off() is None or arrow_cached(hub_id)


def serves_wiki() -> bool:
    """No data folder was given (the caller's case) and the hub cannot serve the Wikipedia sentences."""
    return not hub_serves(SIMCSE_HUB_ID)


def serves_sts(task: str, split: str) -> bool:
    """No data folder was given (the caller's case), the hub cannot serve ``task``, and the embedded set has
    its ``split``."""
    return sts_rows(task, split) is not None and not hub_serves(HUB_IDS[task])


def served_by(data_dir: str | os.PathLike[str] | None, train: str, tasks: Iterable[str]) -> str:
    """Which source serves a trial's catalogue training set ``train`` and its STS ``tasks``: ``data_dir``,
    ``hub``, ``embedded`` (or ``file``: a training file of the user's), joined with ``+`` when they differ (the hub's cache counts as the hub)."""
    from clsr.data.sources import DataUnavailableError, resolve_data_dir

    try:
        if resolve_data_dir(data_dir) is not None:
            return "data_dir"
    except DataUnavailableError:
        return "data_dir"  # the folder's own error is what the trial meets
    sources = {"file" if Path(train).expanduser().exists() else "hub"}  # a file or a hub data set
    if train in TRAIN_SETS:
        sources = {"embedded" if serves_wiki() else "hub"}
    read = [task for task in tasks if task in HUB_IDS or task == "sts"]  # "sts": every STS task
    sources |= {"embedded" if serves_sts(task, "test") else "hub" for task in read}
    return "+".join(sorted(sources))


def served_note(data_dir: str | os.PathLike[str] | None, train: str, tasks: Iterable[str]) -> str | None:
    """What ``validate`` says when the embedded sample will serve (None when it will not)."""
    source = served_by(data_dir, train, tasks)
    if "embedded" not in source.split("+"):
        return None
    return (
        f"data.source {source}: no data folder is set and the hub will not serve, so the package's embedded "
        "sample does (3,000 Wikipedia sentences, 300 STS-B pairs a split, 200 of STS16): a sample's scores, "
        "not the papers'; set CLSR_DATA_DIR to the shared data folder for the full sets"
    )
