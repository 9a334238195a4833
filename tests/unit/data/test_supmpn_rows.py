"""SupMPN data: premise groups, Table 1 statistics, the row builder, the catalogue set and Table A1's
positive augmentations (random deletion, WordNet synonyms on a tiny WordNet, a tiny T5 paraphraser)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from clsr.augment.positives import (
    PARAPHRASE_PREFIX,
    Paraphraser,
    PositiveAugmentation,
    make_positive_augmenter,
    positive_augmentation_available,
    random_deletion,
    synonym_replacement,
)
from clsr.cli import main
from clsr.data.catalog import dataset_columns, load_rows
from clsr.data.corpora import NLIPair, load_nli_pairs
from clsr.data.sources import DataUnavailableError
from clsr.data.supmpn_rows import (
    PremiseGroup,
    build_supmpn_rows,
    format_table1,
    group_by_premise,
    supmpn_columns,
    table1_statistics,
)


def _pairs(premise: str, entailments: list[str], contradictions: list[str], neutrals: list[str] = ()):
    return [
        *(NLIPair(premise, h, "entailment") for h in entailments),
        *(NLIPair(premise, h, "contradiction") for h in contradictions),
        *(NLIPair(premise, h, "neutral") for h in neutrals),
    ]


GUITAR, DOGS, CHILD, RAIN, SNOW = (
    "A man plays guitar.",
    "Two dogs run.",
    "A child eats.",
    "Rain falls.",
    "Snow falls.",
)
PAIRS = [
    *_pairs(
        GUITAR, ["A man plays music.", "Someone plays an instrument."], ["A woman sleeps."], ["He is sad."]
    ),
    *_pairs(DOGS, ["Animals run."], ["Cats sleep.", "Dogs sit.", "Nobody runs."]),
    *_pairs(CHILD, ["A kid eats.", "A kid eats.", "A young person eats."], ["A child sleeps."]),
    *_pairs(RAIN, [], ["It is sunny."]),
    *_pairs(SNOW, ["It snows."], [], ["It is cold."]),
]
OWN = {
    GUITAR: {GUITAR, "A man plays music.", "Someone plays an instrument.", "A woman sleeps."},
    DOGS: {DOGS, "Animals run.", "Cats sleep.", "Dogs sit.", "Nobody runs."},
    CHILD: {CHILD, "A kid eats.", "A young person eats.", "A child sleeps."},
    SNOW: {SNOW, "It snows."},
}


# --- grouping and rows ------------------------------------------------------------------------------


def test_group_by_premise_dedupes_and_ignores_neutrals() -> None:
    groups = group_by_premise(PAIRS + [NLIPair("Only neutral.", "Maybe.", "neutral")])
    assert list(groups) == [GUITAR, DOGS, CHILD, RAIN, SNOW]
    assert groups[CHILD] == PremiseGroup(CHILD, ("A kid eats.", "A young person eats."), ("A child sleeps.",))
    assert groups[GUITAR].contradictions == ("A woman sleeps.",)
    assert groups[RAIN].entailments == () and groups[SNOW].contradictions == ()


def test_rows_anchor_fill_own_contradictions_first_and_sampled_from_others() -> None:
    rows = build_supmpn_rows(PAIRS, positives=3, negatives=2, seed=0)
    assert [tuple(r) for r in rows] == [supmpn_columns(3, 2)] * 3
    assert [r["anchor"] for r in rows] == [GUITAR, DOGS, CHILD]  # RAIN: no entailment, SNOW: no contradiction
    guitar, dogs, child = rows
    assert [guitar[f"positive_{k}"] for k in (1, 2, 3)] == [
        "A man plays music.",
        "Someone plays an instrument.",
        GUITAR,
    ]
    assert [dogs[f"positive_{k}"] for k in (1, 2, 3)] == ["Animals run.", DOGS, DOGS]
    assert [child[f"positive_{k}"] for k in (1, 2, 3)] == ["A kid eats.", "A young person eats.", CHILD]
    # own contradictions first (the first Q when there are more), then other rows' hypotheses
    assert (dogs["negative_1"], dogs["negative_2"]) == ("Cats sleep.", "Dogs sit.")
    assert guitar["negative_1"] == "A woman sleeps." and child["negative_1"] == "A child sleeps."
    others = {GUITAR: OWN[DOGS] | OWN[CHILD], CHILD: OWN[GUITAR] | OWN[DOGS]}
    for row in (guitar, child):
        sampled = row["negative_2"]
        assert sampled in others[row["anchor"]] - {DOGS, GUITAR, CHILD}  # a hypothesis, never an anchor
        assert sampled not in OWN[row["anchor"]]


def test_rows_are_seeded() -> None:
    by_seed = {seed: build_supmpn_rows(PAIRS, positives=2, negatives=4, seed=seed) for seed in range(8)}
    assert all(build_supmpn_rows(PAIRS, positives=2, negatives=4, seed=s) == r for s, r in by_seed.items())
    assert len({str(rows) for rows in by_seed.values()}) > 1
    own_contradictions = {GUITAR: 1, DOGS: 3, CHILD: 1}
    for rows in by_seed.values():
        for row in rows:
            negatives = [row[f"negative_{k}"] for k in range(1, 5)]
            assert len(set(negatives)) == 4  # never the same text twice in a row
            assert not set(negatives[own_contradictions[row["anchor"]] :]) & OWN[row["anchor"]]


def test_rows_fewer_slots_than_available_take_the_first() -> None:
    (dogs,) = [r for r in build_supmpn_rows(PAIRS, positives=1, negatives=1) if r["anchor"] == DOGS]
    assert dogs == {"anchor": DOGS, "positive_1": "Animals run.", "negative_1": "Cats sleep."}
    assert len(build_supmpn_rows(PAIRS, positives=1, negatives=0)[0]) == 2


def test_rows_without_contradiction_optional() -> None:
    rows = build_supmpn_rows(PAIRS, positives=2, negatives=2, require_contradiction=False)
    (snow,) = [r for r in rows if r["anchor"] == SNOW]
    assert snow["positive_1"] == "It snows." and snow["positive_2"] == SNOW
    assert {snow["negative_1"], snow["negative_2"]} <= OWN[GUITAR] | OWN[DOGS] | OWN[CHILD]


def test_rows_entailment_and_augmented_fill() -> None:
    groups = group_by_premise(PAIRS)
    rows = build_supmpn_rows(groups, positives=4, negatives=1, positive_fill="entailment")
    assert [rows[0][f"positive_{k}"] for k in range(1, 5)] == [
        "A man plays music.",
        "Someone plays an instrument.",
        "A man plays music.",
        "Someone plays an instrument.",
    ]

    class Tagger:
        def __init__(self) -> None:
            self.prepared: list[str] = []

        def prepare(self, texts: list[str]) -> None:
            self.prepared = list(texts)

        def __call__(self, text: str, rng: random.Random) -> str:
            return f"{text} #{rng.randrange(10**6)}"

    tagger = Tagger()
    rows = build_supmpn_rows(groups, positives=4, negatives=1, seed=3, augment=tagger)
    guitar, dogs = rows[0], rows[1]
    assert (
        guitar["positive_1"] == "A man plays music."
        and guitar["positive_2"] == "Someone plays an instrument."
    )
    assert guitar["positive_3"].startswith("A man plays music. #")  # cycling through own entailments
    assert guitar["positive_4"].startswith("Someone plays an instrument. #")
    fills = [dogs[f"positive_{k}"] for k in (2, 3, 4)]
    assert all(f.startswith("Animals run. #") for f in fills) and len(set(fills)) == 3  # fresh draw per slot
    assert tagger.prepared == [
        "A man plays music.",
        "Someone plays an instrument.",
        "Animals run.",
        "A kid eats.",
        "A young person eats.",
    ]
    # augmentation draws never change the sampled negatives, and are seeded
    plain = build_supmpn_rows(groups, positives=4, negatives=3, seed=3)
    again = build_supmpn_rows(groups, positives=4, negatives=3, seed=3, augment=tagger)
    assert [[r[f"negative_{k}"] for k in (1, 2, 3)] for r in plain] == [
        [r[f"negative_{k}"] for k in (1, 2, 3)] for r in again
    ]
    assert again == build_supmpn_rows(groups, positives=4, negatives=3, seed=3, augment=tagger)


def test_rows_too_few_other_hypotheses() -> None:
    with pytest.raises(ValueError, match="sampled negatives"):
        build_supmpn_rows(PAIRS, positives=1, negatives=9)
    with pytest.raises(ValueError, match="positive_fill"):
        build_supmpn_rows(PAIRS, positive_fill="copies")  # type: ignore[arg-type]


# --- Table 1 --------------------------------------------------------------------------------------


def _write_xnli(root: Path) -> int:
    """A hand-made NLI file in the XNLI layout (0 = entailment, 1 = neutral, 2 = contradiction)."""
    spec = {  # premise: (entailments, contradictions, neutrals)
        "A": (1, 1, 1),  # exactly one
        "B": (2, 3, 0),  # 2–4 of each
        "C": (3, 3, 1),  # 2–4 of each, balanced k = 3
        "D": (5, 6, 2),  # ≥5 of each
        "E": (1, 2, 0),  # mixed
        "F": (2, 0, 1),  # no contradiction
        "G": (0, 1, 0),  # no entailment
        "H": (0, 0, 2),  # neutral only
        "J": (4, 5, 0),  # mixed: E in 2–4 but C = 5
    }
    lines = ["id\tpremise\thypothesis\tlabel"]
    for premise, counts in spec.items():
        for label, count in enumerate((counts[0], counts[2], counts[1])):
            lines += [
                f"0\tPremise {premise}.\tHypothesis {premise}{label}{i}.\t{label}" for i in range(count)
            ]
    lines += ["0\tPremise I.\tSame.\t0", "0\tPremise I.\tSame.\t0", "0\tPremise I.\tOther.\t2"]  # duplicate E
    lines += ["0\tPremise I.\tNo label.\t-"]
    folder = root / "nli" / "xnli_en_devtest"
    folder.mkdir(parents=True)
    (folder / "xnli_test_en.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines) - 2  # header and the unlabelled row are not pairs


def test_table1_statistics_on_a_small_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n_pairs = _write_xnli(tmp_path)
    pairs = load_nli_pairs(tmp_path)
    stats = table1_statistics(pairs)
    assert (stats.pairs, stats.premises) == (n_pairs, 10)
    assert (stats.exactly_one, stats.two_to_four, stats.five_or_more) == (2, 2, 1)
    assert (stats.mixed, stats.no_contradiction, stats.no_entailment, stats.neutral_only) == (2, 1, 1, 1)
    assert stats.balanced == {1: 2, 3: 1} and stats.with_both == 7
    assert len(build_supmpn_rows(pairs, positives=5, negatives=5)) == stats.with_both
    table = format_table1(stats)
    assert "| exactly 1 E and 1 C | 2 | 139,299 |" in table
    assert "| ≥5 E and ≥5 C | 1 | 7,956 |" in table
    assert "| premises | 2 | 0 | 1 |" in table

    assert main(["data", "nli-stats", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert table in out and str(tmp_path) in out


# --- catalogue set on the local data --------------------------------------------------------------


def test_nli_supmpn_catalogue_set(data_dir: Path) -> None:
    rows = load_rows("nli_supmpn", data_dir)
    assert len(rows) == 31_373  # local premises with ≥1 entailment and ≥1 contradiction
    assert dataset_columns("nli_supmpn") == supmpn_columns(5, 5) and tuple(rows[0]) == supmpn_columns(5, 5)
    for row in rows[::500]:
        positives = {row[f"positive_{k}"] for k in range(1, 6)}
        negatives = [row[f"negative_{k}"] for k in range(1, 6)]
        assert len(set(negatives)) == 5 and not set(negatives) & (positives | {row["anchor"]})


# --- RD / SR -----------------------------------------------------------------------------------------

SENTENCE = "A man in a red shirt is playing an old guitar on the busy street near the park at night ."


def test_random_deletion_counts_and_keeps_a_word() -> None:
    words = SENTENCE.split()
    assert len(words) == 21  # 20 words and a lone full stop
    out = random_deletion(SENTENCE, random.Random(0))
    kept = out.split()
    assert len(kept) == 19 and kept[-1] == "."  # int(0.1 · 20) = 2 words deleted, never the '.'
    it = iter(words)
    assert all(word in it for word in kept)  # order kept
    assert out == random_deletion(SENTENCE, random.Random(0))
    assert len({random_deletion(SENTENCE, random.Random(s)) for s in range(10)}) > 1
    assert random_deletion("Short sentence", random.Random(0)).split() in (["Short"], ["sentence"])  # min 1
    assert random_deletion("Hello .", random.Random(0)) == "Hello ."
    for seed in range(20):
        assert len(random_deletion("one two three", random.Random(seed), p=0.99).split()) == 1
    assert len(random_deletion(" ".join(["w"] * 300), random.Random(0)).split()) == 290  # at most 10


SYNONYMS = {"man": ["male", "adult male"], "guitar": ["axe"], "street": ["road"], "old": ["aged"]}


def test_synonym_replacement_with_an_injected_table() -> None:
    lookup = lambda word: SYNONYMS.get(word, [])  # noqa: E731
    out = synonym_replacement(SENTENCE, random.Random(1), synonyms=lookup)
    assert out == synonym_replacement(SENTENCE, random.Random(1), synonyms=lookup)
    # int(0.2 · 20) = 4 wanted, and exactly 4 words have synonyms: all of them are replaced
    man = "adult male" if "adult male" in out else "male"
    assert out == f"A {man} in a red shirt is playing an aged axe on the busy road near the park at night ."
    one = synonym_replacement("The Street, at night.", random.Random(0), synonyms=lookup)
    assert one == "The Road, at night."  # capital and punctuation kept, stop words never replaced
    few = synonym_replacement(SENTENCE, random.Random(2), p=0.1, synonyms=lookup)
    assert sum(word not in few.split() for word in SYNONYMS) == 2  # int(0.1 · 20) replaced
    assert (
        len({synonym_replacement(SENTENCE, random.Random(s), p=0.1, synonyms=lookup) for s in range(10)}) > 1
    )


def _tiny_wordnet(root: Path) -> None:
    """A 3-synset WordNet database in nltk's format (byte offsets in data.*, lemma index in index.*)."""
    lexnames = ["adj.all", "noun.animal", "noun.artifact", "verb.motion"]
    synsets = {  # file suffix → (pos letter, [(lexname index, lemmas, gloss)])
        "noun": (
            "n",
            [(2, ["car", "auto", "automobile"], "a motor vehicle"), (1, ["dog", "domestic_dog"], "a canine")],
        ),
        "verb": ("v", [(3, ["run", "scamper"], "move fast")]),
        "adj": ("a", []),
        "adv": ("r", []),
    }
    root.mkdir(parents=True)
    (root / "lexnames").write_text("".join(f"{i:02d}\t{n}\t{1 + (i > 0)}\n" for i, n in enumerate(lexnames)))
    for name in ("index.sense", "adj.exc", "adv.exc", "noun.exc", "verb.exc"):
        (root / name).write_text("")
    for suffix, (pos, entries) in synsets.items():
        data = "  1 Tiny test WordNet 3.0 Copyright 2006 by Princeton University.\n"
        index: dict[str, list[int]] = {}
        for lex, lemmas, gloss in entries:
            offset = len(data.encode())
            words = " ".join(f"{lemma} 0" for lemma in lemmas)
            data += f"{offset:08d} {lex:02d} {pos} {len(lemmas):02x} {words} 000 | {gloss}  \n"
            for lemma in lemmas:
                index.setdefault(lemma, []).append(offset)
        (root / f"data.{suffix}").write_text(data)
        (root / f"index.{suffix}").write_text(
            "  1 Tiny test index\n"
            + "".join(
                f"{lemma} {pos} {len(offs)} 0 {len(offs)} 0 {' '.join(f'{o:08d}' for o in offs)}  \n"
                for lemma, offs in sorted(index.items())
            )
        )


def _fresh_wordnet(monkeypatch: pytest.MonkeyPatch, search_path: Path) -> None:
    """Point nltk (for this test only) at ``search_path`` with a fresh, unloaded WordNet loader."""
    import nltk
    from nltk.corpus.reader import CorpusReader, WordNetCorpusReader
    from nltk.corpus.util import LazyCorpusLoader

    monkeypatch.setattr(nltk.data, "path", [str(search_path)])
    omw = LazyCorpusLoader("omw-1.4", CorpusReader, r".*/wn-data-.*\.tab", encoding="utf8")
    monkeypatch.setattr(nltk.corpus, "wordnet", LazyCorpusLoader("wordnet", WordNetCorpusReader, omw))


def test_synonym_replacement_on_a_tiny_wordnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tiny_wordnet(tmp_path / "corpora" / "wordnet")
    _fresh_wordnet(monkeypatch, tmp_path)
    cfg = PositiveAugmentation(kind="synonym_replacement", synonym_rate=1.0)
    assert positive_augmentation_available(cfg) is None
    augment = make_positive_augmenter(cfg)
    out = augment("The dog saw a car and cars .", random.Random(0))
    words = out.split()
    assert words[:2] == ["The", "domestic"] and words[2:5] == ["dog", "saw", "a"]
    assert words[5] in ("auto", "automobile")
    assert words[7] in ("car", "auto", "automobile")  # 'cars' → 'car' by nltk's morphy
    assert out == augment("The dog saw a car and cars .", random.Random(0))
    one = make_positive_augmenter(PositiveAugmentation(kind="synonym_replacement"))  # 20 % → 1 word
    assert {one("Dogs run", random.Random(seed)) for seed in range(20)} == {
        "Dog run",
        "Domestic dog run",
        "Dogs scamper",
    }


def test_wordnet_missing_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh_wordnet(monkeypatch, tmp_path)  # empty search path: no WordNet
    cfg = PositiveAugmentation(kind="synonym_replacement")
    message = positive_augmentation_available(cfg)
    assert message and "nltk.downloader wordnet" in message and "random_deletion" in message
    with pytest.raises(DataUnavailableError, match="Table A1 'SR'"):
        make_positive_augmenter(cfg)


def test_positive_augmentation_config() -> None:
    assert make_positive_augmenter(PositiveAugmentation()) is None
    assert positive_augmentation_available(PositiveAugmentation(kind="random_deletion")) is None
    rd = make_positive_augmenter(PositiveAugmentation(kind="random_deletion", deletion_rate=0.5))
    assert len(rd(SENTENCE, random.Random(0)).split()) == 11  # 21 tokens − int(0.5 · 20) capped at 10
    with pytest.raises(ValueError):
        PositiveAugmentation(kind="back_translation")
    with pytest.raises(ValueError):
        PositiveAugmentation(deletion_rate=1.0)


# --- PP ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 1-layer T5 and a word-level tokenizer, saved like a hub checkpoint."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    words = [
        "paraphrase:",
        "a",
        "man",
        "is",
        "playing",
        "guitar",
        "the",
        "woman",
        "sleeps",
        "dog",
        "runs",
        "outside",
        ".",
    ]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(dict.fromkeys(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    path = tmp_path_factory.mktemp("tiny_t5")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(path)
    config = T5Config(
        vocab_size=len(vocab),
        d_model=16,
        d_ff=32,
        d_kv=8,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(path)
    return path


def test_paraphraser_on_a_tiny_t5(tiny_t5: Path) -> None:
    assert PARAPHRASE_PREFIX == "paraphrase: "
    assert (
        positive_augmentation_available(
            PositiveAugmentation(kind="paraphrase", paraphrase_model=str(tiny_t5))
        )
        is None
    )
    cfg = PositiveAugmentation(kind="paraphrase", paraphrase_model=str(tiny_t5), paraphrase_max_length=8)
    paraphraser = make_positive_augmenter(cfg)
    assert isinstance(paraphraser, Paraphraser) and paraphraser._model is None  # lazy
    text = "a man is playing guitar ."
    (candidates,) = paraphraser.paraphrases([text])
    assert candidates and all(isinstance(c, str) and c and c != text for c in candidates)
    draws = [paraphraser(text, random.Random(seed)) for seed in range(40)]
    assert draws == [paraphraser(text, random.Random(seed)) for seed in range(40)]  # seeded
    picked = [d != text for d in draws]
    assert [random.Random(seed).random() < 0.5 for seed in range(40)] == picked  # the 50 % selection
    assert all(d in candidates for d, p in zip(draws, picked, strict=True) if p)
    assert Paraphraser(str(tiny_t5), fraction=0.0)(text, random.Random(0)) == text

    groups = {"a woman sleeps .": PremiseGroup("a woman sleeps .", (text,), ("dog runs outside .",))}
    groups["the dog runs ."] = PremiseGroup("the dog runs .", ("dog runs outside .",), ("a woman sleeps .",))
    rows = build_supmpn_rows(groups, positives=5, negatives=1, augment=paraphraser)
    assert all(rows[0][f"positive_{k}"] in (text, *candidates) for k in range(2, 6))


def test_paraphraser_missing_model_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = "clsr-test/no-such-paraphraser"
    message = positive_augmentation_available(
        PositiveAugmentation(kind="paraphrase", paraphrase_model=missing)
    )
    assert message and missing in message and "hf download" in message and "random_deletion" in message
    paraphraser = Paraphraser(missing, fraction=1.0)  # constructing loads nothing
    with pytest.raises(DataUnavailableError, match=missing):
        paraphraser("a man is playing guitar .", random.Random(0))
