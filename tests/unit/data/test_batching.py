"""Batch order and padding: what the trainer feeds a method."""

from __future__ import annotations

import contextlib
import os

import torch

from clsr.data.batching import TextViewBatcher, no_duplicate_batches, shuffled_batches


class WordTokenizer:
    pad_token_id = 0

    def __call__(self, texts, truncation=True, max_length=8, add_special_tokens=True):
        return {"input_ids": [[len(w) for w in t.split()][:max_length] for t in texts]}


def test_shuffled_batches_are_full_seeded_and_cover_each_row_once():
    batches = shuffled_batches(10, 3, epoch=0, seed=1)
    assert [len(b) for b in batches] == [3, 3, 3]
    assert len({i for b in batches for i in b}) == 9
    assert batches == shuffled_batches(10, 3, epoch=0, seed=1)
    assert batches != shuffled_batches(10, 3, epoch=1, seed=1)


def test_collate_lays_out_rows_then_views_and_pads_to_the_longest():
    rows = [{"text": "aa b"}, {"text": "ccc"}]
    batcher = TextViewBatcher(rows, ("text", "text"), WordTokenizer(), max_length=8)
    batch = batcher.collate([1, 0])
    assert batch["input_ids"].tolist() == [[3, 0], [3, 0], [2, 1], [2, 1]]
    assert batch["attention_mask"].tolist() == [[1, 0], [1, 0], [1, 1], [1, 1]]
    assert batch["num_rows"] == 2 and batch["input_ids"].dtype == torch.long


def reference_collate(rows, views, tokenizer, max_length, indices):
    """The batch built one sentence at a time (what collate did before its padded tables)."""
    sequences = [
        tokenizer([rows[i][v]], max_length=max_length)["input_ids"][0] for i in indices for v in views
    ]
    longest = max(len(s) for s in sequences)
    ids = [s + [tokenizer.pad_token_id] * (longest - len(s)) for s in sequences]
    return ids, [[1] * len(s) + [0] * (longest - len(s)) for s in sequences]


def test_collate_from_padded_tables_equals_building_the_batch_sentence_by_sentence(data_dir):
    from clsr.data.catalog import load_rows
    from clsr.encoders.transformer import load_tokenizer

    rows = load_rows("nli_triplets", data_dir, max_rows=200, seed=0)
    tokenizer = load_tokenizer("minilm")
    views = ("anchor", "positive", "negative")
    batcher = TextViewBatcher(rows, views, tokenizer, max_length=24)
    assert batcher.tokens["anchor"].dtype == torch.int32 and batcher.tokens["anchor"].shape[0] == 200
    for indices in ([5, 3, 199, 0], list(range(100, 164)), [7]):
        batch = batcher.collate(indices)
        ids, mask = reference_collate(rows, views, tokenizer, 24, indices)
        assert batch["input_ids"].tolist() == ids and batch["attention_mask"].tolist() == mask
        assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.long


def test_no_duplicate_batches_never_repeat_a_text_in_a_batch():
    rows = [{"anchor": f"s{i % 3}", "positive": f"p{i}"} for i in range(12)]
    for batch in no_duplicate_batches(rows, ("anchor", "positive"), batch_size=3, epoch=0, seed=0):
        anchors = [rows[i]["anchor"] for i in batch]
        assert len(set(anchors)) == 3


def test_tokenising_the_rows_uses_the_tokenizers_pool_and_puts_the_runners_setting_back(
    monkeypatch, data_dir
):
    """The study runner turns the fast tokenizer's thread pool off for Ray's processes; a trial's one
    tokenisation of its rows turns it on (with the trial's CPUs) and restores the runner's setting."""
    from clsr.data.catalog import load_rows
    from clsr.encoders.transformer import load_tokenizer

    seen = []

    class Recording(WordTokenizer):
        def __call__(self, texts, **kwargs):
            seen.append((os.environ.get("TOKENIZERS_PARALLELISM"), os.environ.get("RAYON_NUM_THREADS")))
            return super().__call__(texts, **kwargs)

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    TextViewBatcher([{"a": "x yy", "b": "zzz"}], ("a", "b"), Recording(), max_length=8)
    assert seen == [("true", "2"), ("true", "2")] and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    # the same ids with the pool as without it (MiniLM's fast tokenizer on real rows)
    rows = load_rows("nli_triplets", data_dir, max_rows=300, seed=0)
    pooled = TextViewBatcher(rows, ("anchor", "positive"), load_tokenizer("minilm"), max_length=24).tokens
    monkeypatch.setattr("clsr.data.batching.parallel_tokenisation", contextlib.nullcontext)
    single = TextViewBatcher(rows, ("anchor", "positive"), load_tokenizer("minilm"), max_length=24).tokens
    assert all(torch.equal(pooled[c], single[c]) for c in ("anchor", "positive"))


def test_large_columns_are_tokenised_once_and_read_back_from_the_datasets_cache(
    tmp_path, monkeypatch, data_dir, tiny_bert
):
    import clsr.data.token_cache as token_cache
    from clsr.data.training import load_rows
    from clsr.encoders.transformer import load_tokenizer

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    rows = load_rows("nli_triplets", data_dir, max_rows=400, seed=0)
    views = ("anchor", "positive", "negative")
    tokenizer = load_tokenizer("minilm")
    direct = TextViewBatcher(rows, views, tokenizer, max_length=24)  # 400 texts: below the threshold
    assert not (tmp_path / token_cache.CACHE_FOLDER).exists()

    monkeypatch.setattr(token_cache, "MIN_CACHED_TEXTS", 100)
    first = TextViewBatcher(rows, views, tokenizer, max_length=24)
    files = sorted((tmp_path / token_cache.CACHE_FOLDER).glob("*.arrow"))
    assert len(files) == 3  # one per column

    calls = []
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: calls.append(1))
    again = TextViewBatcher(rows, views, tokenizer, max_length=24)  # read back: the tokenizer is not called
    assert calls == []
    for batcher in (first, again):
        assert all(torch.equal(batcher.tokens[v], direct.tokens[v]) for v in views)
        assert all(torch.equal(batcher.lengths[v], direct.lengths[v]) for v in views)
    assert torch.equal(again.collate([3, 1])["input_ids"], direct.collate([3, 1])["input_ids"])

    # another length or other texts are another fingerprint
    texts = [r["anchor"] for r in rows]
    keys = {
        token_cache.fingerprint(texts, tokenizer, 24),
        token_cache.fingerprint(texts, tokenizer, 32),
        token_cache.fingerprint(texts[:-1] + [texts[-1] + "!"], tokenizer, 24),
        token_cache.fingerprint(texts, load_tokenizer(tiny_bert), 24),
    }
    assert len(keys) == 4
    assert token_cache.fingerprint(texts, WordTokenizer(), 24) is None  # not a fast tokenizer: never cached
