"""Where each data set a trial reads comes from, decided as its loader decides (a data folder, else the
embedded sample when the hub cannot serve, else the hub), and the canonical rows that are hashed for
its identity (``clsr.data.identity.digest``). The loaders stay as they are; this names their source."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from clsr.data import embedded
from clsr.data.faq import FAQData
from clsr.data.hub.manifest import SIMCSE_HUB_ID, STS_HUB_IDS, pinned_revision
from clsr.data.identity.digest import DataIdentity, Kind, identity, resolved_revision
from clsr.data.sources import resolve_data_dir
from clsr.data.sts import STS_ROOT, YEAR_SUBSETS, STSSplit, pair_file
from clsr.data.transfer import BINARY_FILES, HUB_SOURCES, ROOT, SPLIT_FILES, TransferSplit

Source = tuple[Kind, str, str | None]  # kind, where, revision
EMBEDDED_WHERE = "clsr/data/embedded/"  # the package's sample, named relative to the package
_NLI_HUB = ("stanfordnlp/snli", "nyu-mll/multi_nli")
CATALOGUE_HUB_IDS: dict[str, tuple[str, ...]] = {  # the hub ids each catalogue set's loader reads
    "wiki1m": (SIMCSE_HUB_ID,),
    "nli_for_simcse": (SIMCSE_HUB_ID,),
    "wiki_ordered": ("wikimedia/wikipedia",),
    "qqp_pairs": ("nyu-mll/glue",),
    "flickr30k_pairs": ("embedding-data/flickr30k_captions_quintets",),
    "nli_anli_for_simcse": (SIMCSE_HUB_ID, "facebook/anli"),
}


def hub_source(hub_ids: Iterable[str], asked: str | None = None) -> Source:
    """A hub source of one or more ids; each revision is the manifest's pin, else the commit resolved
    from this machine's caches, else ``asked`` (a branch or tag a user named), else ``unknown``."""
    ids = list(dict.fromkeys(hub_ids))
    revisions = [pinned_revision(i) or resolved_revision(i, asked) or asked for i in ids]
    revision = "+".join(r or "unknown" for r in revisions) if any(revisions) else None
    return "hub", "+".join(ids), revision


def _data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    return resolve_data_dir(data_dir)


def sts_source(task: str, split: str, data_dir: str | os.PathLike[str] | None) -> Source:
    root = _data_dir(data_dir)
    if root is not None:
        relative = (
            f"{STS_ROOT}/STS/STS{task[-2:]}-en-test" if task in YEAR_SUBSETS else pair_file(task, split)
        )
        return "local", str(root / relative), None
    if embedded.serves_sts(task, split):
        return "embedded", EMBEDDED_WHERE + embedded.STS_FILE, None
    return hub_source([STS_HUB_IDS[task]])


def sts_rows(split: STSSplit) -> Iterator[list[Any]]:
    """An STS split's canonical rows: ``[subset, gold score, sentence 1, sentence 2]``."""
    for row in zip(split.subsets, split.scores.tolist(), split.sentences1, split.sentences2, strict=True):
        yield list(row)


def sts_identity(name: str, split: STSSplit, data_dir: str | os.PathLike[str] | None) -> DataIdentity:
    return identity(name, *sts_source(split.task, split.split, data_dir), sts_rows(split))


def transfer_source(task: str, data_dir: str | os.PathLike[str] | None) -> Source:
    root = _data_dir(data_dir)
    if root is not None:
        files = BINARY_FILES[task] if task in BINARY_FILES else tuple(SPLIT_FILES[task].values())
        return "local", str(root / ROOT / files[0].split("/")[0]), None
    return hub_source(hub_id for hub_id, _ in HUB_SOURCES[task].splits.values())


def transfer_rows(splits: dict[str, TransferSplit]) -> Iterator[list[Any]]:
    """A transfer task's canonical rows: ``[split, label, sentence]`` (MRPC: ``… sentence 1, sentence 2]``),
    the splits in name order."""
    for name in sorted(splits):
        split = splits[name]
        second = split.sentences2 or [None] * len(split.sentences)
        for label, first, other in zip(split.labels.tolist(), split.sentences, second, strict=True):
            yield [name, label, first] if other is None else [name, label, first, other]


def transfer_identity(
    task: str, splits: dict[str, TransferSplit], data_dir: str | os.PathLike[str] | None
) -> DataIdentity:
    return identity(task, *transfer_source(task, data_dir), transfer_rows(splits))


def train_source(data: Any) -> Source:
    """Where ``data`` (a ``DataConfig``) reads its training rows."""
    if data.faq_set() is not None or not data.external():  # a catalogue or FAQ set: by name
        root = _data_dir(data.data_dir)
        if root is not None or data.faq_set() is not None:  # FAQ sets are read from the data folder only
            return "local", f"{root} ({data.train})", None
        if data.train in embedded.TRAIN_SETS and embedded.serves_wiki():
            return "embedded", EMBEDDED_WHERE + embedded.WIKI_FILE, None
        return hub_source(CATALOGUE_HUB_IDS.get(data.train, _NLI_HUB))
    return external_source(data)


def external_source(data: Any) -> Source:
    """Where a user's file, folder or hub set is read (``data``: ``train``, ``config``, ``split``,
    ``revision``, as ``clsr.data.external`` reads them)."""
    from clsr.data.external import source_kind

    if source_kind(data.train) != "hub":
        return "local", str(Path(data.train).expanduser().resolve()), None
    where = data.train + (f" ({data.config})" if data.config else "")
    _, _, revision = hub_source([data.train], data.revision)
    return "hub", f"{where} split {data.split}", revision


def train_identity(data: Any, rows: Iterable[dict[str, str]]) -> DataIdentity:
    """The training rows a trial read (after ``data.filter``, ``max_rows`` and the FAQ fold), as
    ``{column: text}`` objects."""
    return identity("train", *train_source(data), rows)


def faq_rows(data: FAQData) -> Iterator[list[Any]]:
    """An FAQ set's canonical rows: ``["query", id, text, [relevant item ids]]`` per query, then
    ``["item", id, question, answer]`` per FAQ item."""
    for query_id, text, relevant in zip(data.query_ids, data.queries, data.relevant, strict=True):
        yield ["query", query_id, text, [data.item_ids[i] for i in relevant]]
    for row in zip(data.item_ids, data.questions, data.answers, strict=True):
        yield ["item", *row]


def faq_identity(name: str, data: FAQData, data_dir: str | os.PathLike[str] | None) -> DataIdentity:
    """FAQ sets are read from the data folder only."""
    return identity(name, "local", f"{_data_dir(data_dir)} (faq:{data.name})", None, faq_rows(data))
