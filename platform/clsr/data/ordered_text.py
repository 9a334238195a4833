"""Text in its order, for SimCSE Table 2's next-sentence positives (``wiki_ordered``): consecutive
sentences of English Wikipedia articles, each row's ``document`` the article it comes from.

SimCSE's ``wiki1m`` is 10^6 sentences sampled independently, so no sentence in it has its neighbour.
Table 2's "next sentence" and "next 3 sentences" rows need text in order. Here it is the English dump
Wikimedia publishes on the hub (``wikimedia/wikipedia``, configuration ``20231101.en``), streamed in the
hub's order so that only the first articles are downloaded, until 10^6 sentences. The paper names
neither its dump nor its sentence splitter, so the rows trained on it stand in for the paper's.

* Prose only: a line of the plain-text dump is kept when it ends like a sentence and has at least three
  words; headings, list items and table rows are not sentences.
* Sentences: NLTK's Punkt (Kiss & Strunk, 2006), unsupervised, trained on the stream's first 1,000
  articles. No tokenizer model is downloaded, and the same articles give the same split anywhere.

Locally: ``<data_dir>/wiki/wiki_ordered.txt``, one sentence a line and an empty line between documents
(the text format of BERT's pre-training data).

Why by hand: the prose filter and the grouping into documents are a few lines; the splitting is Punkt's.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clsr.data.sources import DataUnavailableError, load_from_hub, local_files

WIKI_HUB_ID, WIKI_CONFIG = "wikimedia/wikipedia", "20231101.en"
ORDERED_FILE = "wiki/wiki_ordered.txt"
SENTENCES = 1_000_000  # SimCSE §3: 10^6 sentences from English Wikipedia
PUNKT_ARTICLES = 1_000  # the articles Punkt learns abbreviations and sentence starters from
MIN_WORDS = 3
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")

Row = dict[str, str]


def prose_paragraphs(text: str) -> list[str]:
    """The lines of an article that read as prose: ending like a sentence, at least ``MIN_WORDS`` words."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if _SENTENCE_END.search(line) and len(line.split()) >= MIN_WORDS]


def punkt_splitter(paragraphs: Iterable[str]) -> Any:
    """NLTK's Punkt sentence tokenizer trained (unsupervised) on ``paragraphs``."""
    try:
        from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer
    except ImportError as err:
        raise DataUnavailableError(
            "wiki_ordered splits sentences with NLTK's Punkt: pip install nltk"
        ) from err
    trainer = PunktTrainer()
    trainer.train("\n\n".join(paragraphs), finalize=True)
    return PunktSentenceTokenizer(trainer.get_params())


def ordered_rows(
    articles: Iterable[tuple[str, str]], limit: int = SENTENCES, train_on: int = PUNKT_ARTICLES
) -> list[Row]:
    """``(document, text)`` in order → ``{"text", "document"}`` rows, sentence by sentence, until ``limit``
    rows; Punkt is trained on the first ``train_on`` articles."""
    stream = iter(articles)
    head = list(itertools.islice(stream, train_on))
    splitter = punkt_splitter(p for _, text in head for p in prose_paragraphs(text))
    rows: list[Row] = []
    for document, text in itertools.chain(head, stream):
        for paragraph in prose_paragraphs(text):
            rows += [{"text": s, "document": str(document)} for s in splitter.tokenize(paragraph)]
        if len(rows) >= limit:
            break
    return rows[:limit]


def read_ordered_file(path: Path) -> list[Row]:
    """One sentence a line, an empty line between documents (numbered from 0 as ``document``)."""
    rows: list[Row] = []
    document = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if text := line.strip():
                rows.append({"text": text, "document": str(document)})
            elif rows and rows[-1]["document"] == str(document):
                document += 1
    return rows


def load_wiki_ordered(data_dir: str | os.PathLike[str] | None = None) -> list[Row]:
    """``wiki_ordered``: the local file when the data folder has it, else the hub's first articles."""
    if files := local_files(data_dir, ORDERED_FILE):
        return read_ordered_file(files[0])
    articles = load_from_hub(
        WIKI_HUB_ID, local_hint=ORDERED_FILE, name=WIKI_CONFIG, split="train", streaming=True
    )
    return ordered_rows((article["id"], article["text"]) for article in articles)
