"""STS evaluation sets, read the way SimCSE's SentEval reads them (methods.md §8.1).

Local layout (data README §1–2): ``<data_dir>/senteval/downstream/STS/STS1x-en-test/`` with one
``STS.input.<subset>.txt`` / ``STS.gs.<subset>.txt`` pair per subset, ``STS/STSBenchmark/`` and
``SICK/``. Subset lists are fixed (never globbed): STS13 ships ``STS.gs.SMT.txt`` without its input.
Pairs whose gold line is empty (STS15/16) are dropped, and sentences are split on whitespace and
re-joined with single spaces, as SentEval does before tokenising.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clsr.data.hub.manifest import HUB_DATASETS, STS_HUB_IDS
from clsr.data.sources import load_from_hub, local_dir, require_file

STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")

STS_ROOT = "senteval/downstream"
YEAR_SUBSETS: dict[str, tuple[str, ...]] = {
    "sts12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "sts13": ("FNWN", "headlines", "OnWN"),
    "sts14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "sts15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "sts16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
SPLIT_FILES: dict[str, dict[str, str]] = {
    "stsb": {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"},
    "sickr": {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"},
}
HUB_IDS = STS_HUB_IDS
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclass(frozen=True)
class STSSplit:
    task: str
    split: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # float64 gold scores (0–5; SICK-R 1–5)
    subsets: list[str]  # subset name per pair ("MSRpar", …; the task name for stsb/sickr)


def allowed_splits(task: str) -> tuple[str, ...]:
    return tuple(SPLIT_FILES[task]) if task in SPLIT_FILES else ("test",)


def load_sts(task: str, split: str = "test", data_dir: str | os.PathLike[str] | None = None) -> STSSplit:
    """One STS split from ``data_dir`` (the shared-data root), or from the hub when it is None."""
    if task not in STS_TASKS:
        raise ValueError(f"unknown STS task {task!r}; allowed: {', '.join(STS_TASKS)}")
    if split not in allowed_splits(task):
        raise ValueError(f"{task} has no split {split!r}; allowed: {', '.join(allowed_splits(task))}")
    root = local_dir(data_dir)
    if root is None:
        return _load_embedded(task, split) or _load_hub(task, split)
    if task in YEAR_SUBSETS:
        return _load_year(task, root)
    return _load_pair_file(task, split, root)


def subsample(split: STSSplit, max_pairs: int | None, seed: int = 0) -> STSSplit:
    """About ``max_pairs`` pairs, drawn with a fixed seed from each subset in proportion to its size (at
    least 3 each, so every subset keeps a Spearman correlation: a little more than ``max_pairs`` when a
    year has many small subsets); the whole split when it is no larger."""
    if max_pairs is None or len(split.scores) <= max_pairs:
        return split
    rng = np.random.default_rng(seed)
    subsets = np.asarray(split.subsets)
    kept: list[int] = []
    for name in dict.fromkeys(split.subsets):
        members = np.flatnonzero(subsets == name)
        share = max(3, round(max_pairs * len(members) / len(subsets)))
        kept.extend(rng.choice(members, size=min(share, len(members)), replace=False).tolist())
    order = sorted(kept)
    return STSSplit(
        task=split.task,
        split=split.split,
        sentences1=[split.sentences1[i] for i in order],
        sentences2=[split.sentences2[i] for i in order],
        scores=split.scores[order],
        subsets=[split.subsets[i] for i in order],
    )


def _normalise(sentence: str) -> str:
    return " ".join(sentence.split())


def _read_lines(path: Path) -> list[str]:
    # utf-8-sig: tolerate a BOM in user-provided copies; splitlines() as SentEval does.
    return path.read_text(encoding="utf-8-sig").splitlines()


def _year_dir(task: str) -> str:
    return f"{STS_ROOT}/STS/STS{task[-2:]}-en-test"


def pair_file(task: str, split: str) -> str:
    folder = "STS/STSBenchmark" if task == "stsb" else "SICK"
    return f"{STS_ROOT}/{folder}/{SPLIT_FILES[task][split]}"


def _load_year(task: str, root: Path) -> STSSplit:
    year_dir = _year_dir(task)
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    subsets: list[str] = []
    for subset in YEAR_SUBSETS[task]:
        inputs = _read_lines(require_file(root, HUB_IDS[task], f"{year_dir}/STS.input.{subset}.txt"))
        gold = _read_lines(require_file(root, HUB_IDS[task], f"{year_dir}/STS.gs.{subset}.txt"))
        if len(inputs) != len(gold):
            raise ValueError(f"{task}/{subset}: {len(inputs)} input lines but {len(gold)} gold lines")
        for line, score in zip(inputs, gold, strict=True):
            if not score.strip():  # no gold score (STS15/16): SentEval drops the pair
                continue
            a, b = line.split("\t")
            s1.append(_normalise(a))
            s2.append(_normalise(b))
            scores.append(float(score))
            subsets.append(subset)
    return STSSplit(task, "test", s1, s2, np.asarray(scores, dtype=np.float64), subsets)


def _load_pair_file(task: str, split: str, root: Path) -> STSSplit:
    lines = _read_lines(require_file(root, HUB_IDS[task], pair_file(task, split)))
    if task == "sickr":  # header; pair_ID, sentence_A, sentence_B, relatedness_score, entailment
        rows = [(f[1], f[2], f[3]) for f in (line.split("\t") for line in lines[1:] if line)]
    else:  # no header, no quoting; only the first 7 of 7-or-9 fields: genre … score, s1, s2
        rows = [(f[5], f[6], f[4]) for f in (line.split("\t")[:7] for line in lines if line)]
    return STSSplit(
        task=task,
        split=split,
        sentences1=[_normalise(a) for a, _, _ in rows],
        sentences2=[_normalise(b) for _, b, _ in rows],
        scores=np.asarray([float(score) for _, _, score in rows], dtype=np.float64),
        subsets=[task] * len(rows),
    )


def _load_embedded(task: str, split: str) -> STSSplit | None:
    """The package's sample of the split when neither a data folder nor the hub can serve it."""
    from clsr.data import embedded  # imports this module

    if not embedded.serves_sts(task, split):
        return None
    subsets, scores, first, second = zip(*embedded.sts_rows(task, split) or (), strict=True)
    pairs = [_normalise(s) for s in first], [_normalise(s) for s in second]
    return STSSplit(task, split, *pairs, np.asarray(scores, dtype=np.float64), list(subsets))


def _load_hub(task: str, split: str) -> STSSplit:
    hint = (
        f"{_year_dir(task)}/STS.input.<subset>.txt and STS.gs.<subset>.txt"
        if task in YEAR_SUBSETS
        else pair_file(task, split)
    )
    data = load_from_hub(HUB_IDS[task], local_hint=hint, split=HUB_SPLITS[split])
    if note := HUB_DATASETS[HUB_IDS[task]].missing if task == "sickr" else "":
        warnings.warn(f"{task} {split} from the hub: {note}", stacklevel=2)
    return STSSplit(
        task=task,
        split=split,
        sentences1=[_normalise(s) for s in data["sentence1"]],
        sentences2=[_normalise(s) for s in data["sentence2"]],
        scores=np.asarray(data["score"], dtype=np.float64),
        subsets=[task] * len(data),
    )
