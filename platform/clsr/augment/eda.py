"""EDA, easy data augmentation (Wei & Zou, EMNLP 2019), the text-level baseline of GCLSR Table 2.

The four operations of the EDA reference code (``code/eda.py`` of jasonwei20/eda_nlp): synonym
replacement (SR), random insertion (RI), random swap (RS) and random deletion (RD), with EDA's text
cleaning (lower case, letters and spaces only) and its stop-word list. One call gives ONE augmented
sentence by one operation chosen uniformly (EDA generates equally many sentences per operation).

Synonyms come from WordNet, as in EDA, or, offline, from the nearest word vectors by cosine.
All randomness goes through an explicit ``random.Random``; word order never depends on set order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from random import Random
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from clsr.data.sources import DataUnavailableError

Synonyms = Callable[[str], list[str]]

# The reference code's hard-coded stop-word list: these words are never replaced by SR.
# fmt: off
STOP_WORDS = frozenset([
    "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours", "yourself",
    "yourselves", "he", "him", "his", "himself", "she", "her", "hers", "herself", "it", "its", "itself",
    "they", "them", "their", "theirs", "themselves", "what", "which", "who", "whom", "this", "that",
    "these", "those", "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had",
    "having", "do", "does", "did", "doing", "a", "an", "the", "and", "but", "if", "or", "because", "as",
    "until", "while", "of", "at", "by", "for", "with", "about", "against", "between", "into", "through",
    "during", "before", "after", "above", "below", "to", "from", "up", "down", "in", "out", "on", "off",
    "over", "under", "again", "further", "then", "once", "here", "there", "when", "where", "why", "how",
    "all", "any", "both", "each", "few", "more", "most", "other", "some", "such", "no", "nor", "not",
    "only", "own", "same", "so", "than", "too", "very", "s", "t", "can", "will", "just", "don", "should",
    "now",
    "",
])
# fmt: on

WORDNET_MISSING = (
    "EDA needs the WordNet corpus: run `python -m nltk.downloader wordnet` on every node (internet), "
    "or set method.eda.synonyms: vectors to take synonyms from the word vectors"
)
_CLEAN_WORD = re.compile(r"^[a-z]+$")


class EDAConfig(BaseModel):
    """EDA rates (the reference defaults, 0.1 each) and where synonyms come from."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    alpha_sr: float = 0.1
    alpha_ri: float = 0.1
    alpha_rs: float = 0.1
    p_rd: float = 0.1
    synonyms: Literal["wordnet", "vectors"] = "wordnet"
    neighbours: int = 10  # "vectors": candidates among the nearest words by cosine


def clean_text(line: str) -> str:
    """EDA's ``get_only_chars``: drop apostrophes, lower-case, every non-letter becomes a space."""
    line = line.replace("’", "").replace("'", "").lower()
    return " ".join(re.sub(r"[^a-z]", " ", line).split())


# --- synonym sources ------------------------------------------------------------------------------------


def _clean_lemma(name: str) -> str:
    return "".join(
        ch for ch in name.replace("_", " ").replace("-", " ").lower() if ch in " abcdefghijklmnopqrstuvwxyz"
    )


def wordnet_synonyms() -> Synonyms:
    """EDA's ``get_synonyms`` on WordNet (nltk); DataUnavailableError when nltk or the corpus is missing."""
    try:
        from nltk.corpus import wordnet
    except ImportError as err:
        raise DataUnavailableError(f"{WORDNET_MISSING} (and `pip install nltk`)") from err
    try:
        wordnet.synsets("test")
    except LookupError as err:
        raise DataUnavailableError(WORDNET_MISSING) from err

    @lru_cache(maxsize=200_000)
    def lookup(word: str) -> tuple[str, ...]:
        # Ordered de-duplication (EDA uses a set, whose order varies between processes).
        found = dict.fromkeys(
            _clean_lemma(lemma.name()) for syn in wordnet.synsets(word) for lemma in syn.lemmas()
        )
        found.pop(word, None)
        return tuple(found)

    return lambda word: list(lookup(word))


def _nearest(unit: torch.Tensor, cand: torch.Tensor, self_col: torch.Tensor, k: int) -> torch.Tensor:
    """(V, k) indices into ``cand`` of the k most cosine-similar candidates, the word itself excluded."""
    rows = max(1, 2**25 // max(1, cand.shape[0]))  # ~128 MB of similarities per chunk
    out = []
    for start in range(0, unit.shape[0], rows):
        sims = unit[start : start + rows] @ cand.T
        own = self_col[start : start + rows]
        hit = torch.nonzero(own >= 0).squeeze(1)
        sims[hit, own[hit]] = -torch.inf
        out.append(sims.topk(k, dim=1).indices)
    return torch.cat(out)


def vector_synonyms(words: list[str], vectors: np.ndarray, neighbours: int) -> Synonyms:
    """Synonyms = the ``neighbours`` nearest vocabulary words by cosine (precomputed, chunked).

    Candidates are restricted to plain lower-case words so that cleaning never empties a synonym.
    A word outside ``words`` has no synonyms. Cost is O(V²·D): pass the corpus vocabulary, not all of GloVe.
    """
    mat = torch.as_tensor(np.asarray(vectors, dtype=np.float32))
    unit = mat / mat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cand_ids = [i for i, word in enumerate(words) if _CLEAN_WORD.match(word)]
    k = min(neighbours, len(cand_ids) - 1)
    index = {word: i for i, word in reversed(list(enumerate(words)))}  # first occurrence wins
    if k <= 0:
        return lambda word: []
    self_col = torch.full((len(words),), -1, dtype=torch.long)
    self_col[cand_ids] = torch.arange(len(cand_ids))
    nearest = _nearest(unit, unit[cand_ids], self_col, k).numpy()
    cand_words = [words[i] for i in cand_ids]

    def lookup(word: str) -> list[str]:
        row = index.get(word)
        return [] if row is None else [cand_words[j] for j in nearest[row]]

    return lookup


# --- the four operations --------------------------------------------------------------------------------


def synonym_replacement(words: list[str], n: int, synonyms: Synonyms, rng: Random) -> list[str]:
    """Replace every occurrence of up to ``n`` distinct non-stop words by a random synonym."""
    candidates = [word for word in dict.fromkeys(words) if word not in STOP_WORDS]
    rng.shuffle(candidates)
    new_words, replaced = list(words), 0
    for word in candidates:
        options = synonyms(word)
        if options:
            choice = rng.choice(options)
            new_words = [choice if w == word else w for w in new_words]
            replaced += 1
        if replaced >= n:
            break
    return " ".join(new_words).split(" ")  # multi-word synonyms become several words, as in EDA


def random_insertion(words: list[str], n: int, synonyms: Synonyms, rng: Random) -> list[str]:
    """Insert, ``n`` times, the first synonym of a random word (10 tries) at a random position."""
    new_words = list(words)
    for _ in range(n):
        for _try in range(10):
            options = synonyms(new_words[rng.randint(0, len(new_words) - 1)])
            if options:
                new_words.insert(rng.randint(0, len(new_words) - 1), options[0])
                break
    return new_words


def random_swap(words: list[str], n: int, rng: Random) -> list[str]:
    """Swap two random positions ``n`` times (EDA gives up a swap after 3 draws equal to the first)."""
    new_words = list(words)
    for _ in range(n):
        first = rng.randint(0, len(new_words) - 1)
        for _try in range(3):
            second = rng.randint(0, len(new_words) - 1)
            if second != first:
                new_words[first], new_words[second] = new_words[second], new_words[first]
                break
    return new_words


def random_deletion(words: list[str], p: float, rng: Random) -> list[str]:
    """Delete each word with probability ``p``; never return an empty sentence."""
    if len(words) == 1:
        return list(words)
    kept = [word for word in words if rng.uniform(0, 1) > p]
    return kept or [words[rng.randint(0, len(words) - 1)]]


def eda(sentence: str, cfg: EDAConfig, synonyms: Synonyms, rng: Random) -> str:
    """One EDA-augmented sentence: clean, apply one of SR/RI/RS/RD chosen uniformly, clean again."""
    words = clean_text(sentence).split()
    if not words:
        return ""
    op = rng.randrange(4)
    if op == 0:
        new_words = synonym_replacement(words, max(1, int(cfg.alpha_sr * len(words))), synonyms, rng)
    elif op == 1:
        new_words = random_insertion(words, max(1, int(cfg.alpha_ri * len(words))), synonyms, rng)
    elif op == 2:
        new_words = random_swap(words, max(1, int(cfg.alpha_rs * len(words))), rng)
    else:
        new_words = random_deletion(words, cfg.p_rd, rng)
    return clean_text(" ".join(new_words))
