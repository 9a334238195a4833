"""The seven SentEval transfer tasks, read the way SentEval reads them (methods.md §8.2, data README §3).

Local layout: ``<data_dir>/senteval/downstream/{MR,CR,SUBJ,MPQA,SST/binary,TREC,MRPC}``, the files
SentEval's ``get_transfer_data.bash`` produces. Every sentence is split on whitespace and re-joined
with single spaces (SentEval tokenises with ``str.split`` and SimCSE's batcher joins with spaces).
Encodings and line handling follow SentEval: MR/CR/SUBJ/MPQA and TREC are read as Latin-1 (TREC's
``train_5500.label`` holds one Latin-1 byte), SST-2 as UTF-8, MRPC as UTF-8 with its BOM. Empty lines
of CR and MPQA are kept, as SentEval keeps them (3,775 and 10,606 sentences).

Labels follow SentEval: 1 = the first file of each binary pair (MR/CR/MPQA positive, SUBJ
*objective*), TREC classes ABBR, DESC, ENTY, HUM, LOC, NUM = 0…5, MRPC 1 = paraphrase.

Without a data folder the tasks come from the Hugging Face hub (``HUB_SOURCES``): public mirrors
whose ids, splits and columns are recorded in ``clsr.data.hub.manifest``; their rows have not been
compared with the SentEval files (no hub access where this was written), so a hub-loaded score may
differ from a local one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clsr.data.sources import load_from_hub, local_dir, require_file

TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
CV_TASKS = ("mr", "cr", "subj", "mpqa")  # no fixed split: one "all" split, scored by nested CV
PAIR_TASKS = ("mrpc",)

ROOT = "senteval/downstream"
BINARY_FILES: dict[str, tuple[str, str]] = {  # (label 1 file, label 0 file), SentEval's order
    "mr": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "cr": ("CR/custrev.pos", "CR/custrev.neg"),
    "subj": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "mpqa": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}
SPLIT_FILES: dict[str, dict[str, str]] = {
    "sst2": {
        "train": "SST/binary/sentiment-train",
        "dev": "SST/binary/sentiment-dev",
        "test": "SST/binary/sentiment-test",
    },
    "trec": {"train": "TREC/train_5500.label", "test": "TREC/TREC_10.label"},
    "mrpc": {"train": "MRPC/msr_paraphrase_train.txt", "test": "MRPC/msr_paraphrase_test.txt"},
}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's tgt2idx order
NUM_CLASSES = {task: 6 if task == "trec" else 2 for task in TRANSFER_TASKS}


@dataclass(frozen=True)
class HubSource:
    """Where a task lives on the hub: ``{our split: (hub id, hub splits concatenated)}``."""

    splits: dict[str, tuple[str, tuple[str, ...]]]


# Listed in clsr.data.hub.manifest (see the module docstring). Text columns are found by name ("text"/"sentence",
# "text1"/"sentence1", …); labels are "label", TREC's "coarse_label" mapped through its class names.
HUB_SOURCES: dict[str, HubSource] = {
    "mr": HubSource({"all": ("cornell-movie-review-data/rotten_tomatoes", ("train", "validation", "test"))}),
    "cr": HubSource({"all": ("SetFit/SentEval-CR", ("train", "test"))}),
    "subj": HubSource({"all": ("SetFit/subj", ("train", "test"))}),
    "mpqa": HubSource({"all": ("jxm/mpqa", ("train",))}),
    # GLUE's SST-2 has the 67,349 phrase-level training rows but no test labels; SetFit's has them.
    "sst2": HubSource(
        {
            "train": ("stanfordnlp/sst2", ("train",)),
            "dev": ("stanfordnlp/sst2", ("validation",)),
            "test": ("SetFit/sst2", ("test",)),
        }
    ),
    "trec": HubSource({"train": ("CogComp/trec", ("train",)), "test": ("CogComp/trec", ("test",))}),
    # MSR's train file = GLUE train + validation (3,668 + 408 = 4,076); SetFit keeps the test labels.
    "mrpc": HubSource(
        {"train": ("SetFit/mrpc", ("train", "validation")), "test": ("SetFit/mrpc", ("test",))}
    ),
}


@dataclass(frozen=True)
class TransferSplit:
    """One split: sentences (the first side for MRPC), the second sides for MRPC, integer labels."""

    task: str
    split: str  # "all" for MR/CR/SUBJ/MPQA; train/dev/test for SST-2, train/test for TREC and MRPC
    sentences: list[str]
    labels: np.ndarray  # int64
    sentences2: list[str] | None = None  # MRPC only

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class TransferData:
    task: str
    splits: dict[str, TransferSplit]
    num_classes: int

    @property
    def is_pair_task(self) -> bool:
        return self.task in PAIR_TASKS


def load_transfer(task: str, data_dir: str | os.PathLike[str] | None = None) -> TransferData:
    """Every split of one task from ``data_dir`` (the shared-data root), or from the hub when None."""
    if task not in TRANSFER_TASKS:
        raise ValueError(f"unknown transfer task {task!r}; allowed: {', '.join(TRANSFER_TASKS)}")
    root = local_dir(data_dir)
    if root is None:
        splits = {name: _load_hub_split(task, name) for name in HUB_SOURCES[task].splits}
    elif task in BINARY_FILES:
        splits = {"all": _load_binary(task, root)}
    else:
        reader = {"sst2": _read_sst, "trec": _read_trec, "mrpc": _read_mrpc}[task]
        splits = {
            name: reader(task, name, _local(root, task, path)) for name, path in SPLIT_FILES[task].items()
        }
    return TransferData(task, splits, NUM_CLASSES[task])


def _normalise(sentence: str) -> str:
    return " ".join(sentence.split())


def _local(root: Path, task: str, relative: str) -> Path:
    hub_ids = sorted({hub_id for hub_id, _ in HUB_SOURCES[task].splits.values()})
    return require_file(root, " + ".join(hub_ids), f"{ROOT}/{relative}")


def _labels(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _load_binary(task: str, root: Path) -> TransferSplit:
    sentences: list[str] = []
    labels: list[int] = []
    for label, relative in zip((1, 0), BINARY_FILES[task], strict=True):
        # SentEval: io.open(…, encoding='latin-1').read().splitlines(), empty lines included
        lines = _local(root, task, relative).read_text(encoding="latin-1").splitlines()
        sentences += [_normalise(line) for line in lines]
        labels += [label] * len(lines)
    return TransferSplit(task, "all", sentences, _labels(labels))


def _read_sst(task: str, split: str, path: Path) -> TransferSplit:
    sentences, labels = [], []
    with path.open(encoding="utf-8") as handle:
        for line in handle:  # "sentence<TAB>label"
            text, label = line.strip().split("\t")
            sentences.append(_normalise(text))
            labels.append(int(label))
    return TransferSplit(task, split, sentences, _labels(labels))


def _read_trec(task: str, split: str, path: Path) -> TransferSplit:
    sentences, labels = [], []
    with path.open(encoding="latin-1") as handle:
        for line in handle:  # "COARSE:fine question"
            target, rest = line.strip().split(":", 1)
            if target not in TREC_CLASSES:
                raise ValueError(f"{path}: unknown TREC class {target!r}")
            sentences.append(_normalise(rest.split(" ", 1)[1]))
            labels.append(TREC_CLASSES.index(target))
    return TransferSplit(task, split, sentences, _labels(labels))


def _read_mrpc(task: str, split: str, path: Path) -> TransferSplit:
    first, second, labels = [], [], []
    with path.open(encoding="utf-8-sig") as handle:
        next(handle)  # header: Quality, #1 ID, #2 ID, #1 String, #2 String
        for line in handle:
            fields = line.strip().split("\t")
            labels.append(int(fields[0]))
            first.append(_normalise(fields[3]))
            second.append(_normalise(fields[4]))
    return TransferSplit(task, split, first, _labels(labels), second)


def _column(data: Any, *names: str) -> list[Any]:
    for name in names:
        if name in data.column_names:
            return list(data[name])
    raise ValueError(f"hub data set has none of the columns {names}; it has {data.column_names}")


def _load_hub_split(task: str, split: str) -> TransferSplit:
    hub_id, hub_splits = HUB_SOURCES[task].splits[split]
    files = BINARY_FILES[task] if task in BINARY_FILES else (SPLIT_FILES[task][split],)
    hint = " and <data_dir>/".join(f"{ROOT}/{relative}" for relative in files)
    dataset = load_from_hub(hub_id, local_hint=hint, reads=hub_splits)
    sentences: list[str] = []
    sentences2: list[str] = []
    labels: list[int] = []
    for name in hub_splits:
        data = dataset[name]
        if task == "trec":
            names = data.features["coarse_label"].names  # hub order differs from SentEval's
            labels += [TREC_CLASSES.index(names[i]) for i in data["coarse_label"]]
            # SentEval's copy of TREC has every ` and ' removed (data README §3)
            text = [s.replace("`", "").replace("'", "") for s in _column(data, "text")]
        else:
            labels += [int(v) for v in _column(data, "label")]
            text = (
                _column(data, "text1", "sentence1")
                if task in PAIR_TASKS
                else _column(data, "text", "sentence")
            )
        sentences += [_normalise(s) for s in text]
        if task in PAIR_TASKS:
            sentences2 += [_normalise(s) for s in _column(data, "text2", "sentence2")]
    if min(labels, default=0) < 0:
        raise ValueError(f"{hub_id} split {hub_splits} has no labels (-1); it cannot score {task} {split}")
    return TransferSplit(task, split, sentences, _labels(labels), sentences2 if task in PAIR_TASKS else None)
