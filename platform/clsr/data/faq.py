"""FAQ retrieval data sets (methods.md §6.5, data README §7): StackFAQ, FAQIR and COUGH.

Each loader returns :class:`FAQData`: the queries, for each query the positions of its relevant
FAQ items, and the FAQ collection (question and answer of every item). Whitespace runs are
collapsed to one space; nothing else is changed. Local layout (``<data_dir>`` is the shared-data
root):

* ``stackfaq`` — ``faq/stackfaq/stackExchange-FAQ.xml`` (TakeLab's StackFAQ, Karan & Šnajder 2018;
  here as a stand-in for FAQIR). ``<root>`` holds 125 ``<qapair>`` threads, each with ``<rephr>``
  paraphrased queries (125 placeholders ``*`` and one empty ``<rephr>`` are skipped: 1,249
  queries, the count COUGH's comparison table gives), one ``<question>`` and
  several ``<answer>``. Every (thread question, answer) is one FAQ item (719); a query's relevant
  items are all the answers of its own thread.
* ``faqir`` — ``faq/faqir/FAQIRv1.0.xml`` (Karan & Šnajder, LREC 2016; takelab.fer.hr/data/faqir),
  laid out as its readme documents: ``<IRSet>`` with ``<queries>`` (``<Query>``: ``<QueryID>``,
  ``<QueryGroupID>``, ``<QueryString>``, …), ``<KB><Pairs>`` (``<qaPair>``: ``<Id>``,
  ``<Question>``, ``<Answer>``, …) and ``<relCandidates>`` (per query template an
  ``<IRCandidateList>`` with ``<grpId>`` and ``<candidates>`` of ``<IRCandidate>``: ``<Id>`` and
  ``<Annotations>`` of ``<Annotation>`` whose ``<Val>`` is 1 relevant, 2 useful, 3 useless,
  4 irrelevant). Judgements are per query template, so every query of a group shares them. An item
  is relevant when any annotator gave it a value <= ``max_level`` (default 1 = "relevant" only,
  which is also what the BERT-FAQ toolkit's parser does; the paper's own rule is **[unverified]**).
  Tag names are matched case-insensitively and without XML namespaces (the file is C# serializer
  output). The readme says 4,133 FAQ pairs; parsers of the real file report 4,313. BERT-FAQ drops
  the 50 queries whose ``<original>`` is ``temp``; they are kept here (1,233 queries, the published
  count). This loader was tested on a hand-made file in that layout only: FAQIR is not available
  where it was written.
* ``cough`` — ``faq/cough/{FAQ_Bank_eval.csv, User_Query_Bank.csv, Annotated_Relevance_Set.csv}``
  as released in ``sunlab-osu/covid-faq`` (``data/``, CC BY-NC-SA 4.0). The collection is
  ``FAQ_Bank_eval.csv`` (7,117 English non-forum items; the release says to use it to replicate the
  paper), read by column name (``index``, ``question``, ``answer``); queries are
  ``User_Query_Bank.csv`` (``index``, ``query``); relevance is ``Annotated_Relevance_Set.csv``
  (``Query_index``, ``FAQ_index`` and the label column ``Label (mean score > 3 as positive)``; any
  column whose name starts with ``Label`` is accepted) where the value ``positive`` marks a relevant
  item. Judgements of query ids missing from the query bank (the 35 removed unanswerable queries)
  and of items missing from the collection are ignored and counted. Only the User Query Bank is in
  the shared data folder; the loader was tested on hand-made files in the released format.

Queries with no relevant item in the collection are dropped (counted in ``FAQData.dropped``).

Training on an FAQ set (RCL Table 2: "fine-tune … with Eq. 1 … highest MAP on the development dataset",
"5-fold"; methods.md §6.5): ``fold_split`` splits the queries into 5 seeded query-level folds; fold f's
test part is fold f, its dev part a seeded 10 % of the other folds' queries (the proposal of §6.5), the
rest trains. ``training_rows`` makes one (query, FAQ item) row per relevant item of a training query, so
every answer of a StackFAQ thread is a positive (rows ``anchor`` = query, ``positive`` = the item's
text as it is embedded for retrieval).

No copy of these three data sets on the Hugging Face hub is known (none could be searched for or
verified offline where this was written), so without a local folder the loaders raise
:class:`~clsr.data.sources.DataUnavailableError` naming the files to download and where to put them.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clsr.data.sources import ENV_VAR, DataUnavailableError, local_dir

FAQ_TASKS = ("stackfaq", "faqir", "cough")
FOLDS = 5  # RCL Table 2: "with 5-fold method"
FOLD_SEED = 1111  # the seed of clsr.eval.faq's folds (SentEval's), so both modules split alike
DEV_FRACTION = 0.1  # methods.md §6.5's proposal: dev = 10 % of the training folds' queries
CANDIDATE_FIELDS = ("question_answer", "question", "answer")

FILES: dict[str, tuple[str, ...]] = {
    "stackfaq": ("faq/stackfaq/stackExchange-FAQ.xml",),
    "faqir": ("faq/faqir/FAQIRv1.0.xml",),
    "cough": (
        "faq/cough/FAQ_Bank_eval.csv",
        "faq/cough/User_Query_Bank.csv",
        "faq/cough/Annotated_Relevance_Set.csv",
    ),
}
DOWNLOAD: dict[str, str] = {
    "stackfaq": "http://takelab.fer.hr/data/StackFAQ/ (or ML-Recipes/BERT-FAQ, data/StackFAQ/)",
    "faqir": "http://takelab.fer.hr/data/faqir/",
    "cough": "https://github.com/sunlab-osu/covid-faq/tree/main/data",
}


@dataclass(frozen=True)
class FAQData:
    """Queries, their relevant items (positions in the collection) and the FAQ collection."""

    name: str
    query_ids: list[str]
    queries: list[str]
    relevant: list[tuple[int, ...]]  # per query: sorted positions into the collection, at least one
    item_ids: list[str]  # per FAQ item: its id in the release (StackFAQ: "<thread>-<answer>")
    questions: list[str]  # per FAQ item: its question ("" when the release has none)
    answers: list[str]  # per FAQ item: its answer
    dropped: dict[str, int] = field(default_factory=dict)  # what the loader left out, and why

    def __len__(self) -> int:
        return len(self.queries)

    def candidates(self, fields: str = "question_answer") -> list[str]:
        """The text each FAQ item is embedded as: ``question_answer`` (question, a space, answer),
        ``question`` or ``answer``."""
        if fields == "question":
            return list(self.questions)
        if fields == "answer":
            return list(self.answers)
        if fields == "question_answer":
            return [
                " ".join(p for p in (q, a) if p) for q, a in zip(self.questions, self.answers, strict=True)
            ]
        raise ValueError(f"unknown FAQ candidate fields {fields!r}; allowed: {', '.join(CANDIDATE_FIELDS)}")


def load_faq(name: str, data_dir: str | os.PathLike[str] | None = None, max_level: int = 1) -> FAQData:
    """One FAQ data set from ``data_dir`` (the shared-data root). ``max_level``: FAQIR only."""
    if name not in FAQ_TASKS:
        raise ValueError(f"unknown FAQ data set {name!r}; allowed: {', '.join(FAQ_TASKS)}")
    root = local_dir(data_dir)
    paths = _require(name, root)
    if name == "stackfaq":
        return read_stackfaq(paths[0])
    if name == "faqir":
        return read_faqir(paths[0], max_level=max_level)
    return read_cough(*paths)


def _require(name: str, root: Path | None) -> list[Path]:
    wanted = ", ".join(f"<data_dir>/{relative}" for relative in FILES[name])
    if root is None:
        raise DataUnavailableError(
            f"{name}: no Hugging Face hub copy is known, so it needs a local data folder: download "
            f"{DOWNLOAD[name]} and put {wanted}, then point {ENV_VAR} / data.data_dir / --data-dir at "
            "<data_dir>."
        )
    missing = [relative for relative in FILES[name] if not (root / relative).is_file()]
    if missing:
        raise DataUnavailableError(
            f"{name}: missing {', '.join(str(root / m) for m in missing)} (data_dir = {root}). "
            f"It needs {wanted}; download from {DOWNLOAD[name]}."
        )
    return [root / relative for relative in FILES[name]]


def _normalise(text: str | None) -> str:
    return " ".join((text or "").split())


def _finish(
    name: str,
    query_ids: list[str],
    queries: list[str],
    relevant_ids: list[set[str]],
    item_ids: list[str],
    questions: list[str],
    answers: list[str],
    dropped: dict[str, int],
) -> FAQData:
    """Map relevant item ids to positions; drop queries left without a relevant item."""
    position = {item: i for i, item in enumerate(item_ids)}
    if len(position) != len(item_ids):
        raise ValueError(f"{name}: FAQ item ids are not unique")
    keep_ids, keep_queries, keep_relevant = [], [], []
    outside = without = 0
    for qid, query, wanted in zip(query_ids, queries, relevant_ids, strict=True):
        found = tuple(sorted(position[i] for i in wanted if i in position))
        outside += len(wanted) - len(found)
        if not found:
            without += 1
            continue
        keep_ids.append(qid)
        keep_queries.append(query)
        keep_relevant.append(found)
    dropped = dropped | {"judgements_outside_collection": outside}
    if without:
        dropped["queries_without_relevant"] = without
    return FAQData(name, keep_ids, keep_queries, keep_relevant, item_ids, questions, answers, dropped)


# ------------------------------------------------------------------------------------------ StackFAQ


def read_stackfaq(path: str | os.PathLike[str]) -> FAQData:
    """TakeLab's ``stackExchange-FAQ.xml`` (see the module docstring)."""
    root = _parse(path)
    query_ids, queries, relevant = [], [], []
    item_ids, questions, answers = [], [], []
    placeholders = empty = 0
    for t, thread in enumerate(_find_all(root, "qapair")):
        question = _normalise(_text(thread, "question"))
        own = set()
        for a, answer in enumerate(_children(thread, "answer")):
            item_ids.append(f"{t}-{a}")
            questions.append(question)
            answers.append(_normalise(answer.text))
            own.add(item_ids[-1])
        for r, rephrasing in enumerate(_children(thread, "rephr")):
            text = _normalise(rephrasing.text)
            if text in ("", "*"):  # "*": the release's placeholder for a missing rephrasing
                placeholders += int(text == "*")
                empty += int(text == "")
                continue
            query_ids.append(f"{t}-{r}")
            queries.append(text)
            relevant.append(own)
    dropped = {"placeholder_queries": placeholders, "empty_queries": empty}
    return _finish("stackfaq", query_ids, queries, relevant, item_ids, questions, answers, dropped)


# ------------------------------------------------------------------------------------------ FAQIR


def read_faqir(path: str | os.PathLike[str], max_level: int = 1) -> FAQData:
    """FAQIR v1.0's XML (see the module docstring); relevant = any annotation ``Val <= max_level``."""
    if not 1 <= max_level <= 4:
        raise ValueError(f"max_level must be 1 (relevant) … 4 (irrelevant), given {max_level}")
    root = _parse(path)
    item_ids, questions, answers = [], [], []
    for pair in _find_all(root, "qapair"):
        item_ids.append(_normalise(_text(pair, "id")))
        questions.append(_normalise(_text(pair, "question")))
        answers.append(_normalise(_text(pair, "answer")))
    by_group: dict[str, set[str]] = {}
    for listing in _find_all(root, "ircandidatelist"):
        group = by_group.setdefault(_normalise(_text(listing, "grpid")), set())
        for candidate in _find_all(listing, "ircandidate"):
            values = [int(_normalise(_text(a, "val"))) for a in _find_all(candidate, "annotation")]
            if values and min(values) <= max_level:
                group.add(_normalise(_text(candidate, "id")))
    query_ids, queries, relevant = [], [], []
    empty = 0
    for query in _find_all(root, "query"):
        text = _normalise(_text(query, "querystring"))
        if not text:
            empty += 1
            continue
        query_ids.append(_normalise(_text(query, "queryid")))
        queries.append(text)
        relevant.append(by_group.get(_normalise(_text(query, "querygroupid")), set()))
    dropped = {"empty_queries": empty}
    return _finish("faqir", query_ids, queries, relevant, item_ids, questions, answers, dropped)


def _parse(path: str | os.PathLike[str]) -> ET.Element:
    try:
        return ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{path}: not well-formed XML ({err})") from err


def _local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].lower()


def _children(element: ET.Element, name: str) -> Iterator[ET.Element]:
    return (child for child in element if _local_name(child.tag) == name)


def _find_all(element: ET.Element, name: str) -> Iterator[ET.Element]:
    """Descendants named ``name`` (case-insensitive, namespaces ignored), in document order."""
    return (node for node in element.iter() if node is not element and _local_name(node.tag) == name)


def _text(element: ET.Element, name: str) -> str:
    """The text of the first child named ``name`` ("" when there is none)."""
    child = next(_children(element, name), None)
    return "" if child is None else "".join(child.itertext())


# ------------------------------------------------------------------------------------------ COUGH


def _rows(path: Path) -> Iterable[dict[str, str]]:
    limit = sys.maxsize
    while True:  # answers are long and may hold newlines: lift the csv module's 128 kB field cap
        try:
            csv.field_size_limit(limit)
            break
        except OverflowError:
            limit //= 2
    with path.open(encoding="utf-8-sig", newline="") as handle:
        yield from csv.DictReader(handle)


def _column(row: dict[str, str], path: Path, *names: str, prefix: str | None = None) -> str:
    for name in names:
        if name in row:
            return row[name] or ""
    if prefix is not None:
        for key, value in row.items():
            if key and key.startswith(prefix):
                return value or ""
    wanted = " or ".join(names) if prefix is None else f"{' or '.join(names)} or {prefix}…"
    raise ValueError(f"{path}: no column {wanted}; the header is {list(row)}")


def read_cough(
    faq_bank: str | os.PathLike[str],
    query_bank: str | os.PathLike[str],
    relevance: str | os.PathLike[str],
) -> FAQData:
    """COUGH's FAQ Bank (eval), User Query Bank and Annotated Relevance Set (released CSV files)."""
    faq_bank, query_bank, relevance = Path(faq_bank), Path(query_bank), Path(relevance)
    item_ids, questions, answers = [], [], []
    for row in _rows(faq_bank):
        item_ids.append(_column(row, faq_bank, "index").strip())
        questions.append(_normalise(_column(row, faq_bank, "question")))
        answers.append(_normalise(_column(row, faq_bank, "answer")))
    query_ids, queries = [], []
    for row in _rows(query_bank):
        query_ids.append(_column(row, query_bank, "index").strip())
        queries.append(_normalise(_column(row, query_bank, "query")))
    known = {qid: i for i, qid in enumerate(query_ids)}
    relevant: list[set[str]] = [set() for _ in query_ids]
    orphans = 0
    for row in _rows(relevance):
        label = _column(row, relevance, "Label", prefix="Label").strip().lower()
        qid = _column(row, relevance, "Query_index").strip()
        if qid not in known:
            orphans += 1
            continue
        if label == "positive":
            relevant[known[qid]].add(_column(row, relevance, "FAQ_index").strip())
    dropped = {"judgements_of_unknown_queries": orphans}
    return _finish("cough", query_ids, queries, relevant, item_ids, questions, answers, dropped)


# ------------------------------------------------------------------------------------------ training


@dataclass(frozen=True)
class FoldSplit:
    """Query positions of one cross-validation fold: trained on, used for model selection, scored."""

    train: np.ndarray
    dev: np.ndarray
    test: np.ndarray


def query_folds(n_queries: int, folds: int = FOLDS, seed: int = FOLD_SEED) -> list[np.ndarray]:
    """Seeded split of ``range(n_queries)`` into ``min(folds, n_queries)`` near-equal sorted folds."""
    if folds < 1:
        raise ValueError(f"folds must be at least 1 (given {folds})")
    if n_queries < 1:
        raise ValueError("no queries to split into folds")
    permutation = np.random.default_rng(seed).permutation(n_queries)
    return [np.sort(part) for part in np.array_split(permutation, min(folds, n_queries))]


def fold_split(
    n_queries: int, fold: int, folds: int = FOLDS, seed: int = FOLD_SEED, dev_fraction: float = DEV_FRACTION
) -> FoldSplit:
    """Fold ``fold``: its queries are the test part; a seeded ``dev_fraction`` (at least one query) of the
    other folds' queries is the dev part; the rest trains."""
    parts = query_folds(n_queries, folds, seed)
    if not 0 <= fold < len(parts):
        raise ValueError(f"data.fold must be 0 … {len(parts) - 1} (given {fold})")
    rest = np.sort(np.concatenate([p for i, p in enumerate(parts) if i != fold]))
    if len(rest) < 2:
        raise ValueError(f"{n_queries} queries leave no training and dev queries outside fold {fold}")
    size = min(len(rest) - 1, max(1, math.ceil(dev_fraction * len(rest))))
    dev = np.sort(np.random.default_rng([seed, fold]).choice(rest, size=size, replace=False))
    return FoldSplit(train=np.setdiff1d(rest, dev), dev=dev, test=parts[fold])


def training_rows(
    data: FAQData, queries: np.ndarray, candidate: str = "question_answer"
) -> list[dict[str, str]]:
    """One (query, relevant item) row per relevant item of each query in ``queries`` (positions)."""
    items = data.candidates(candidate)
    return [{"anchor": data.queries[q], "positive": items[i]} for q in queries for i in data.relevant[q]]
