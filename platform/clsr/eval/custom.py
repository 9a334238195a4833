"""Evaluation sets a user names (``eval.custom`` in a study, ``platform eval --custom FILE``): files, folders
or hub ids read like training data (``clsr.data.external``, HF ``datasets``), scored like the built-in tasks.

* ``sts``: sentence pairs with a gold score; Spearman × 100 of their cosine similarity (SimCSE's STS
  protocol: no regressor). Metric ``test_<name>``.
* ``retrieval``: queries with their relevant corpus ids, and a corpus of (id, text); every query ranks the
  whole corpus by cosine. MAP, MRR@10, nDCG@10 (binary relevance) and Acc@1/5/10, × 100, as
  ``test_<name>_map`` …; ``test_<name>`` is MAP (RCL's FAQ metric).
* ``classification``: texts with labels; SentEval's logistic-regression protocol on frozen embeddings
  (``clsr.eval.transfer.classify``): with a ``split`` column of train/test rows, C chosen by k-fold on
  train and accuracy on test (as TREC); without one, nested k-fold (as MR). Metric ``test_<name>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from clsr.config.custom_task import CORPUS_ROLES, KS, ROLES, CustomTask, text_roles
from clsr.data.identity.digest import DataIdentity
from clsr.data.sts import STSSplit
from clsr.eval.faq import average_precision, cosine_matrix, relevant_ranks
from clsr.eval.sts import Embedder, score_split


def source_of(task: CustomTask, path: str) -> SimpleNamespace:
    """What ``clsr.data.external`` reads (a DataConfig's source fields)."""
    return SimpleNamespace(
        train=path, config=task.config, split=task.split, revision=task.revision, columns=None, filter=None
    )


def _parts(task: CustomTask) -> list[tuple[str, tuple[str, ...]]]:
    """(field, roles) of each file the task reads: ``path``, and ``corpus`` for retrieval."""
    return [("path", ROLES[task.type])] + ([("corpus", CORPUS_ROLES)] if task.corpus else [])


def _mapping(task: CustomTask, roles: tuple[str, ...]) -> dict[str, str]:
    return {role: column for role, column in (task.columns or {}).items() if role in roles}


def in_task_terms(message: str, name: str, field: str) -> str:
    """``clsr.data.external`` speaks of ``data.train``/``data.columns`` and the method; say it in this
    task's fields, so the user is pointed at the line of the study (or --custom file) to change."""
    prefix = f"eval.custom.{name}"
    for theirs, ours in (
        ("data.train ", f"{prefix}.{field} "),
        ("data.columns", f"{prefix}.columns"),
        ("data.split", f"{prefix}.split"),
        ("the method needs", "the task needs"),
    ):
        message = message.replace(theirs, ours)
    return message


def _table(
    name: str, task: CustomTask, field: str, roles: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, list]:
    """``{role: values}`` of the file in ``task.<field>``, plus the ``optional`` columns it has that no
    role is mapped to."""
    from clsr.data.external import DataSourceError, columns_problem, load_source

    try:
        dataset = load_source(source_of(task, getattr(task, field)))
    except DataSourceError as err:
        raise DataSourceError(in_task_terms(str(err), name, field)) from None
    mapping = _mapping(task, roles)
    if problem := columns_problem(dataset.column_names, mapping, roles):
        raise DataSourceError(f"eval.custom.{name}.{field}: {in_task_terms(problem, name, field)}")
    table = {role: dataset[mapping.get(role, role)] for role in roles}
    extra = [c for c in optional if c in dataset.column_names and c not in mapping.values()]
    return table | {column: dataset[column] for column in extra}


def identities(name: str, task: CustomTask) -> list[DataIdentity]:
    """The identity of each file the task reads (``custom.<name>``, a retrieval corpus
    ``custom.<name>_corpus``): rows ``{role: value}`` as scored (the Arrow cache serves the second read)."""
    from clsr.data.identity.digest import identity
    from clsr.data.identity.sources import external_source

    found = []
    for field, roles in _parts(task):
        table = _table(name, task, field, roles)
        rows = (dict(zip(table, values, strict=True)) for values in zip(*table.values(), strict=True))
        label = f"custom.{name}" + ("_corpus" if field == "corpus" else "")
        found.append(identity(label, *external_source(source_of(task, getattr(task, field))), rows))
    return found


def task_texts(name: str, task: CustomTask) -> list[str]:
    """Every text the task embeds (GCLSR builds its word table from the evaluation texts too)."""
    texts: list[str] = []
    for field, roles in _parts(task):
        table = _table(name, task, field, roles)
        texts += [str(t) for role in text_roles(roles) for t in table[role]]
    return texts


def source_problems(name: str, task: CustomTask) -> list[str]:
    """Problems of the task's files, from their headers (``study validate``)."""
    from clsr.data.external import columns_problem, source_columns

    problems = []
    for field, roles in _parts(task):
        path = getattr(task, field)
        try:
            columns = source_columns(source_of(task, path))
        except Exception as err:  # DataSourceError, DataUnavailableError, unreadable files
            problems.append(in_task_terms(str(err), name, field))
            continue
        if problem := columns_problem(columns, _mapping(task, roles), roles):
            problems.append(f"eval.custom.{name}.{field} {path!r}: {in_task_terms(problem, name, field)}")
    return problems


@dataclass(frozen=True)
class ClassifierSettings:
    """How classification tasks are fitted: ``eval.transfer_mode``, ``eval.transfer_classifier`` and the
    GPU that ``eval.transfer_device: auto`` resolved to (None: the CPU), as for the transfer tasks."""

    mode: str = "test"
    classifier: str = "senteval_pytorch"
    seed: int = 1111
    device: str | None = None


def evaluate_custom(
    embed: Embedder, tasks: Mapping[str, CustomTask], settings: ClassifierSettings = ClassifierSettings()
) -> dict[str, float]:
    """``test_<name>…`` metrics of every task."""
    metrics: dict[str, float] = {}
    for name, task in tasks.items():
        scorer = {"sts": _sts, "retrieval": _retrieval, "classification": _classification}[task.type]
        metrics |= scorer(name, task, embed, settings)
    return metrics


def _sts(name: str, task: CustomTask, embed: Embedder, settings: ClassifierSettings) -> dict[str, float]:
    table = _table(name, task, "path", ROLES["sts"])
    pairs = STSSplit(
        task=name,
        split=task.split,
        sentences1=[str(s) for s in table["sentence1"]],
        sentences2=[str(s) for s in table["sentence2"]],
        scores=np.asarray(table["score"], dtype=np.float64),
        subsets=[name] * len(table["score"]),
    )
    return {f"test_{name}": score_split(pairs, embed).all}


def _relevant_ids(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [part.strip() for part in str(value).split("|") if part.strip()]


def _retrieval(
    name: str, task: CustomTask, embed: Embedder, settings: ClassifierSettings
) -> dict[str, float]:
    queries = _table(name, task, "path", ROLES["retrieval"])
    corpus = _table(name, task, "corpus", CORPUS_ROLES)
    position = {str(i): n for n, i in enumerate(corpus["id"])}
    relevant = []
    for q, value in zip(queries["query"], queries["relevant"], strict=True):
        ids = _relevant_ids(value)
        if unknown := [i for i in ids if i not in position]:
            raise ValueError(
                f"custom task {name}: query {q!r} names corpus ids not in the corpus: {unknown[:5]}"
            )
        if not ids:
            raise ValueError(f"custom task {name}: query {q!r} has no relevant id")
        relevant.append(sorted(position[i] for i in ids))
    similarity = cosine_matrix(
        embed([str(q) for q in queries["query"]]), embed([str(t) for t in corpus["text"]])
    )
    ranks = relevant_ranks(similarity, relevant)
    values = retrieval_scores(ranks)
    metrics = {f"test_{name}_{metric}": value for metric, value in values.items()}
    return metrics | {f"test_{name}": values["map"]}


def retrieval_scores(ranks: list[np.ndarray]) -> dict[str, float]:
    """× 100 means over queries from each query's sorted 1-based ranks of its relevant items."""
    ap, rr, ndcg, hits = [], [], [], {k: [] for k in KS}
    for r in ranks:
        ap.append(average_precision(r))
        rr.append(1.0 / r[0] if r[0] <= 10 else 0.0)
        dcg = sum(1.0 / math.log2(x + 1) for x in r if x <= 10)
        ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(r), 10) + 1))
        ndcg.append(dcg / ideal)
        for k in KS:
            hits[k].append(float(r[0] <= k))
    scores = {"map": ap, "mrr10": rr, "ndcg10": ndcg} | {f"acc{k}": hits[k] for k in KS}
    return {metric: 100 * float(np.mean(values)) for metric, values in scores.items()}


def _classification(
    name: str, task: CustomTask, embed: Embedder, settings: ClassifierSettings
) -> dict[str, float]:
    from clsr.eval.transfer import CV_TASKS, classify, default_n_jobs

    table = _table(name, task, "path", ROLES["classification"], optional=("split",))
    classes = {label: n for n, label in enumerate(sorted({str(v) for v in table["label"]}))}
    labels = np.array([classes[str(v)] for v in table["label"]], dtype=np.int64)
    features = embed([str(t) for t in table["text"]])
    if "split" in table:  # the user's train/test rows: C by k-fold on train, accuracy on test (as TREC)
        parts = np.array([str(s) for s in table["split"]])
        if set(parts) != {"train", "test"}:
            raise ValueError(
                f"custom task {name}: column split holds {sorted(set(parts))}; allowed: train, test"
            )
        chosen = {p: parts == p for p in ("train", "test")}
        scheme = "custom"  # C by k-fold on train, accuracy on test (as TREC)
        split_features = {p: features[m] for p, m in chosen.items()}
        split_labels = {p: labels[m] for p, m in chosen.items()}
    else:  # nested k-fold over all rows, as MR/CR/SUBJ/MPQA
        scheme, split_features, split_labels = CV_TASKS[0], {"all": features}, {"all": labels}
    result = classify(
        scheme,
        split_features,
        split_labels,
        mode=settings.mode,
        classifier=settings.classifier,
        seed=settings.seed,
        n_jobs=default_n_jobs(),
        n_classes=len(classes),
        device=settings.device,
    )
    return {f"test_{name}": float(result["acc"])}
