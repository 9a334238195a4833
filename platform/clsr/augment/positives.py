"""SupMPN's ways to make extra positives from entailments (paper Appendix A.1, Table A1; methods.md §4.2.7).

When a premise has fewer than P entailments, the paper fills the free positive slots with copies of
the anchor ("None", the default). Table A1 compares three alternatives that perturb the row's own
entailments instead; each is an ``augment(text, rng) -> text`` callable for
:func:`clsr.data.supmpn_rows.build_supmpn_rows`:

* **RD** :func:`random_deletion`, delete 10 % of the words (nlpaug ``RandomWordAug(action="delete")``);
* **SR** :func:`synonym_replacement`, replace 20 % of the words by WordNet synonyms (nlpaug
  ``SynonymAug(aug_src="wordnet")``), through nltk's WordNet as in :mod:`clsr.augment.eda`;
* **PP** :class:`Paraphraser`, the Parrot T5 paraphraser (``prithivida/parrot_paraphraser_on_T5``,
  prompt ``"paraphrase: "``) applied to about half of the entailments.

nlpaug itself is not used (it is not a dependency); the word counts follow its defaults: at least
one and at most 10 words per sentence. All randomness goes through the ``random.Random`` passed in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from functools import partial
from random import Random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clsr.augment.eda import STOP_WORDS, Synonyms, wordnet_synonyms
from clsr.data.sources import DataUnavailableError

Augmenter = Callable[[str, Random], str]

PARROT_MODEL_ID = "prithivida/parrot_paraphraser_on_T5"
PARAPHRASE_PREFIX = "paraphrase: "
MAX_WORDS = 10  # nlpaug's aug_max default
WORDNET_MISSING = (
    "SupMPN's synonym-replacement positives (Table A1 'SR') need nltk's WordNet corpus: run "
    "`python -m nltk.downloader wordnet` (internet) on every node, or set the positive augmentation "
    "kind to none, random_deletion or paraphrase"
)
_EDGES = re.compile(r"^(\W*)(.*?)(\W*)$", re.DOTALL)


def _is_word(token: str) -> bool:
    return any(ch.isalnum() for ch in token)


def _count(p: float, words: int, max_words: int | None) -> int:
    """nlpaug's ``generate_aug_cnt``: int(p · words), at least 1, at most ``max_words``."""
    n = max(1, int(p * words))
    return min(n, max_words) if max_words else n


# --- RD ------------------------------------------------------------------------------------------------


def random_deletion(text: str, rng: Random, p: float = 0.1, max_words: int | None = MAX_WORDS) -> str:
    """Delete ``max(1, int(p · words))`` (≤ ``max_words``) randomly chosen words; never all of them.

    Words are whitespace tokens with a letter or digit (a lone ``.`` is not a word and is never
    deleted); at least one word always survives, and a one-word sentence is returned unchanged.
    """
    tokens = text.split()
    words = [i for i, token in enumerate(tokens) if _is_word(token)]
    if len(words) < 2:
        return text
    n = min(_count(p, len(words), max_words), len(words) - 1)
    drop = set(rng.sample(words, n))
    return " ".join(token for i, token in enumerate(tokens) if i not in drop)


# --- SR ------------------------------------------------------------------------------------------------


def wordnet_synonym_source() -> Synonyms:
    """WordNet synonyms (nltk) as in :func:`clsr.augment.eda.wordnet_synonyms`, with an SR-specific error."""
    try:
        return wordnet_synonyms()
    except DataUnavailableError as err:
        raise DataUnavailableError(WORDNET_MISSING) from err


def synonym_replacement(
    text: str,
    rng: Random,
    p: float = 0.2,
    synonyms: Synonyms | None = None,
    max_words: int | None = MAX_WORDS,
) -> str:
    """Replace ``max(1, int(p · words))`` (≤ ``max_words``) words by a random synonym each.

    Candidates are alphabetic words outside EDA's stop-word list (nlpaug skips determiners by POS
    tag; without a tagger the stop-word list does that job). They are visited in a random order and
    replaced until enough have been, skipping words without a synonym. A synonym keeps the
    word's leading capital and surrounding punctuation; multi-word synonyms stay as several words.
    ``synonyms`` maps a lower-case word to candidates (default: WordNet via nltk, loaded per call;
    pass it in, or use :func:`make_positive_augmenter`, to load it once).
    """
    lookup = synonyms if synonyms is not None else wordnet_synonym_source()
    tokens = text.split()
    parts = [_EDGES.match(token).groups() for token in tokens]  # type: ignore[union-attr]
    candidates = [
        i for i, (_, core, _) in enumerate(parts) if core.isalpha() and core.lower() not in STOP_WORDS
    ]
    n = _count(p, sum(map(_is_word, tokens)), max_words)
    rng.shuffle(candidates)
    replaced = 0
    for i in candidates:
        if replaced >= n:
            break
        head, core, tail = parts[i]
        options = [s for s in dict.fromkeys(lookup(core.lower())) if s and s.lower() != core.lower()]
        if not options:
            continue
        choice = rng.choice(options)
        if core[0].isupper():
            choice = choice[0].upper() + choice[1:]
        tokens[i] = f"{head}{choice}{tail}"
        replaced += 1
    return " ".join(tokens)


# --- PP ------------------------------------------------------------------------------------------------


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"


def paraphraser_unavailable(model_id: str, err: Exception) -> DataUnavailableError:
    """The loading failure as one message: what is missing and how to proceed."""
    offline = " (HF_HUB_OFFLINE=1: nothing is downloaded)" if _offline() else ""
    return DataUnavailableError(
        f"the paraphraser {model_id!r} for SupMPN's paraphrase positives (Table A1 'PP') cannot be "
        f"loaded{offline}: {type(err).__name__}: {str(err).strip().rstrip('.')}. Download it once online "
        f"(`hf download {model_id}`, then run offline from the HF cache), or set the paraphrase "
        "model to a local folder holding config.json, the weights and the tokenizer "
        "(`pip install sentencepiece` if the tokenizer is only spiece.model); otherwise use the "
        "positive augmentation kind none, random_deletion or synonym_replacement."
    )


def _load_paraphraser(model_id: str) -> tuple[Any, Any]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from clsr.data.hub.model_registry import resolve_model_path

    try:
        path = resolve_model_path(model_id)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=_offline())
        model = AutoModelForSeq2SeqLM.from_pretrained(path, local_files_only=_offline())
    except Exception as err:  # OSError offline / unknown id, ValueError/ImportError without sentencepiece
        raise paraphraser_unavailable(model_id, err) from err
    return tokenizer, model


def _same(a: str, b: str) -> bool:
    return re.sub(r"\W+", " ", a).strip().lower() == re.sub(r"\W+", " ", b).strip().lower()


class Paraphraser:
    """Parrot-style T5 paraphrases: ``"paraphrase: " + text`` → beam search → candidates.

    ``paraphraser(text, rng)`` paraphrases with probability ``fraction`` (seeded by ``rng``) and
    otherwise returns ``text``; a paraphrase is one of the ``candidates`` beam outputs that differ
    from the input (ignoring case and punctuation), drawn with ``rng``, so each slot gets a fresh
    draw while the model runs once per distinct text (results are cached; ``prepare`` fills the
    cache in batches). Parrot's adequacy/fluency/diversity re-ranking models are not used. The model
    loads on first use; a missing model raises :class:`DataUnavailableError`.
    """

    def __init__(
        self,
        model_id: str = PARROT_MODEL_ID,
        fraction: float = 0.5,
        candidates: int = 5,
        num_beams: int = 5,
        max_length: int = 32,  # Parrot's default output length (tokens)
        batch_size: int = 64,
        device: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.fraction = fraction
        self.candidates = candidates
        self.num_beams = max(num_beams, candidates)
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self._tokenizer: Any = None
        self._model: Any = None
        self._cache: dict[str, tuple[str, ...]] = {}

    def load(self) -> None:
        if self._model is not None:
            return
        import torch

        tokenizer, model = _load_paraphraser(self.model_id)
        self.device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._tokenizer, self._model = tokenizer, model.to(self.device).eval()

    def paraphrases(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """The distinct candidate paraphrases of each text (possibly none), batched and cached."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            self._generate(todo)
        return [self._cache[t] for t in texts]

    def prepare(self, texts: Sequence[str]) -> None:
        self.paraphrases(texts)

    def _generate(self, texts: list[str]) -> None:
        import torch

        self.load()
        order = sorted(texts, key=len)  # similar lengths per batch: less padding
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            encoded = self._tokenizer(
                [PARAPHRASE_PREFIX + t for t in batch], return_tensors="pt", padding=True, truncation=True
            ).to(self.device)
            with torch.inference_mode():
                out = self._model.generate(
                    **encoded,
                    num_beams=self.num_beams,
                    num_return_sequences=self.candidates,
                    max_length=self.max_length,
                    early_stopping=True,
                )
            decoded = self._tokenizer.batch_decode(out, skip_special_tokens=True)
            for i, text in enumerate(batch):
                outs = (d.strip() for d in decoded[i * self.candidates : (i + 1) * self.candidates])
                self._cache[text] = tuple(dict.fromkeys(d for d in outs if d and not _same(d, text)))

    def __call__(self, text: str, rng: Random) -> str:
        if rng.random() >= self.fraction:
            return text
        options = self.paraphrases([text])[0]
        return rng.choice(options) if options else text


# --- configuration -------------------------------------------------------------------------------------


class PositiveAugmentation(BaseModel):
    """How SupMPN fills free positive slots besides anchor copies (Table A1: None / RD / SR / PP)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["none", "random_deletion", "synonym_replacement", "paraphrase"] = "none"
    deletion_rate: float = Field(0.1, gt=0, lt=1)  # RD: share of words deleted
    synonym_rate: float = Field(0.2, gt=0, le=1)  # SR: share of words replaced
    paraphrase_model: str = PARROT_MODEL_ID  # PP: hub id or local folder
    paraphrase_fraction: float = Field(0.5, ge=0, le=1)  # PP: share of entailment copies paraphrased
    paraphrase_candidates: int = Field(5, ge=1)
    paraphrase_max_length: int = Field(32, ge=4)
    paraphrase_batch_size: int = Field(64, ge=1)


def make_positive_augmenter(cfg: PositiveAugmentation) -> Augmenter | None:
    """The ``augment`` callable for ``build_supmpn_rows``; None for kind ``none`` (anchor copies).

    WordNet is loaded here (DataUnavailableError when missing); the paraphraser loads on first use.
    """
    if cfg.kind == "none":
        return None
    if cfg.kind == "random_deletion":
        return partial(random_deletion, p=cfg.deletion_rate)
    if cfg.kind == "synonym_replacement":
        return partial(synonym_replacement, p=cfg.synonym_rate, synonyms=wordnet_synonym_source())
    return Paraphraser(
        cfg.paraphrase_model,
        fraction=cfg.paraphrase_fraction,
        candidates=cfg.paraphrase_candidates,
        max_length=cfg.paraphrase_max_length,
        batch_size=cfg.paraphrase_batch_size,
    )


def positive_augmentation_available(cfg: PositiveAugmentation) -> str | None:
    """None when ``cfg`` can run here, else why not (WordNet or the paraphraser missing).

    Checks only local resources when ``HF_HUB_OFFLINE=1`` (nothing is downloaded); for the
    paraphraser it loads the config and tokenizer, not the weights.
    """
    if cfg.kind == "synonym_replacement":
        try:
            wordnet_synonym_source()
        except DataUnavailableError as err:
            return str(err)
    elif cfg.kind == "paraphrase":
        from transformers import AutoConfig, AutoTokenizer

        from clsr.data.hub.model_registry import resolve_model_path

        try:
            path = resolve_model_path(cfg.paraphrase_model)
            AutoConfig.from_pretrained(path, local_files_only=_offline())
            AutoTokenizer.from_pretrained(path, local_files_only=_offline())
        except Exception as err:
            return str(paraphraser_unavailable(cfg.paraphrase_model, err))
    return None
