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
* A document is a whole article: a sentence's next one may open the next paragraph, past a dropped
  heading or list, as in running text.

The rows built from the hub are written once, in the local file's format, under datasets' cache
(``<HF_DATASETS_CACHE>/clsr-ordered-text/``): every later trial, study or offline run on this machine
reads that copy instead of streaming and splitting again. Locally: ``<data_dir>/wiki/wiki_ordered.txt``,
one sentence a line and an empty line between documents (the text format of BERT's pre-training data);
it is read instead of the hub when the data folder has it.

Why by hand: the prose filter and the grouping into documents are a few lines; the splitting is Punkt's.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clsr.data.sources import DataUnavailableError, datasets_cache, load_from_hub, local_files

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
    with path.open(encoding="utf-8-sig") as f:
        for line in f:
            if text := line.strip():
                rows.append({"text": text, "document": str(document)})
            elif rows and rows[-1]["document"] == str(document):
                document += 1
    return rows


def write_ordered_file(rows: list[Row], path: Path) -> None:
    """``rows`` in the local file's format, written whole or not at all (two trials may build at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False) as f:
        for previous, row in zip([None, *rows], rows, strict=False):
            if previous is not None and previous["document"] != row["document"]:
                f.write("\n")
            f.write(row["text"].replace("\n", " ") + "\n")
    os.replace(f.name, path)


def built_copy(cache: Path | None = None) -> Path:
    """Where the rows built from the hub are kept on this machine (under datasets' cache, or ``cache``)."""
    name = f"{WIKI_HUB_ID.replace('/', '___')}-{WIKI_CONFIG}-{SENTENCES}.txt"
    return (cache or datasets_cache()) / "clsr-ordered-text" / name


def wiki_ordered_unavailable(root: Path | None) -> str | None:
    """Why ``wiki_ordered`` cannot be read here: no local file, no copy built earlier, and the hub is off
    (a stream caches nothing) or NLTK, which splits it, is not installed."""
    from clsr.data.hub.reach import datasets_hub_off

    if local_files(root, ORDERED_FILE) or built_copy().is_file():
        return None
    wanted = f"<data_dir>/{ORDERED_FILE} (data folder: {root or 'none set'})"
    if off := datasets_hub_off():
        return f"it streams {WIKI_HUB_ID} from the hub, which {off}; provide {wanted} or run where the hub answers"
    try:
        import nltk  # noqa: F401
    except ImportError:
        return "its sentences are split with NLTK's Punkt: pip install 'clsr-platform[eda]' (or nltk)"
    return None


def load_wiki_ordered(data_dir: str | os.PathLike[str] | None = None) -> list[Row]:
    """``wiki_ordered``: the data folder's file, else the copy built earlier here, else the hub's first
    articles (then kept as that copy)."""
    if files := local_files(data_dir, ORDERED_FILE):
        return read_ordered_file(files[0])
    if (copy := built_copy()).is_file():
        return read_ordered_file(copy)
    articles = load_from_hub(
        WIKI_HUB_ID, local_hint=ORDERED_FILE, name=WIKI_CONFIG, split="train", streaming=True
    )
    try:  # a stream reads the hub while it is iterated
        rows = ordered_rows((article["id"], article["text"]) for article in articles)
    except DataUnavailableError:
        raise
    except Exception as err:  # the hub client's own errors (httpx, requests) share no base class
        raise DataUnavailableError(
            f"reading {WIKI_HUB_ID} ({WIKI_CONFIG}) from the hub failed ({type(err).__name__}: {err}); "
            f"provide <data_dir>/{ORDERED_FILE} or run where the hub answers"
        ) from err
    write_ordered_file(rows, copy)
    return read_ordered_file(copy)
