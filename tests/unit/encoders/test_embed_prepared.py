"""An embedder prepares a sentence set once per tokenizer or word table (``clsr.encoders.embed._prepared``):
the dev set a trial scores at every evaluation is tokenised and padded once, with the same vectors."""

from __future__ import annotations

import gc
import pickle
import weakref
from dataclasses import dataclass

import numpy as np

from clsr.config.model import ModelConfig
from clsr.encoders import embed as embed_module
from clsr.encoders.embed import transformer_embedder
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from tests.support.models import save_tiny_bert

SENTENCES = ["a man plays a guitar", "two dogs run in a field", "hello", "a man plays a guitar"]


class CountingTokenizer:
    """The real tokenizer, counting how often it is asked to tokenise."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0
        self.model_max_length, self.pad = tokenizer.model_max_length, tokenizer.pad

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)


def test_the_same_sentences_are_tokenised_once_with_the_same_vectors(tmp_path):
    folder = save_tiny_bert(tmp_path / "tiny", dropout=0.0)
    encoder = TransformerEncoder(ModelConfig(name=folder, pooling="avg"))
    tokenizer = CountingTokenizer(load_tokenizer(folder))
    embed = transformer_embedder(encoder, tokenizer, batch_size=2)
    first = embed(SENTENCES)
    again = embed(list(SENTENCES))  # another list of the same sentences: a dev evaluation later on
    assert tokenizer.calls == 1
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[0], first[3])  # duplicates embedded once, returned twice
    fresh = transformer_embedder(encoder, load_tokenizer(folder), batch_size=2)(SENTENCES)
    np.testing.assert_allclose(first, fresh, rtol=1e-6, atol=1e-6)
    embed(SENTENCES[:2])  # another set is tokenised
    assert tokenizer.calls == 2


@dataclass
class Table:  # a dataclass with eq: unhashable, as clsr's WordTable
    name: str


def test_sets_are_kept_per_owner_by_identity_and_dropped_with_it():
    prepared = []

    def prepare():
        prepared.append(1)
        return len(prepared)

    table = Table("t")
    assert [embed_module._prepared(table, ("a",), prepare) for _ in range(3)] == [1, 1, 1]
    assert embed_module._prepared(Table("t"), ("a",), prepare) == 2  # an equal table is another owner
    for n in range(embed_module.PREPARED_SETS):  # the oldest set goes beyond PREPARED_SETS
        embed_module._prepared(table, (n,), prepare)
    assert embed_module._prepared(table, ("a",), prepare) == 3 + embed_module.PREPARED_SETS
    held = weakref.ref(getattr(table, embed_module.PREPARED_ATTR))  # the sets live on their owner
    del table
    gc.collect()
    assert held() is None


def test_two_owners_never_share_sets_and_a_copy_of_an_owner_carries_none():
    first, second = Table("t"), Table("t")
    assert embed_module._prepared(first, ("a",), lambda: "first") == "first"
    assert embed_module._prepared(second, ("a",), lambda: "second") == "second"
    assert embed_module._prepared(first, ("a",), lambda: "again") == "first"
    copy = pickle.loads(pickle.dumps(first))  # sent to a Ray worker, saved with a model
    assert copy == first and not getattr(copy, embed_module.PREPARED_ATTR).sets
    assert embed_module._prepared(copy, ("a",), lambda: "copy") == "copy"


def test_a_real_tokenizer_holds_its_own_sets(tmp_path):
    tokenizer = load_tokenizer(save_tiny_bert(tmp_path / "tiny"))
    assert embed_module._prepared(tokenizer, ("a",), lambda: 1) == 1
    assert embed_module._prepared(tokenizer, ("a",), lambda: 2) == 1
    assert isinstance(getattr(tokenizer, embed_module.PREPARED_ATTR), embed_module.PreparedSets)
