"""Exported models: sentence-transformers folders embed like the platform, clsr loads them back (from a
folder or MLflow), GCLSR's TextCNN round trip, and `platform eval --model <folder>`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.config.model import ModelConfig, TextCNNConfig
from clsr.encoders.embed import transformer_embedder
from clsr.encoders.export import (
    ModelLoadError,
    TextCNNModel,
    load_model,
    load_textcnn,
    make_embedder,
    pooling_of,
    save_sentence_transformer,
)
from clsr.encoders.textcnn import TextCNNEncoder
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from clsr.encoders.word_vectors import OOV_ID, WordTable, WordTokenizer, build_word_table
from clsr.eval.sts import evaluate_sts, summary_metrics
from clsr.methods.gclsr import GCLSR, GCLSRConfig, GCLSRShared
from tests.support.stores import sqlite_uri

SENTENCES = [
    "A man is playing a guitar.",
    "Hello",
    "The quick brown fox jumps over the lazy dog near the bank of the river, twice, before lunch.",
    "A man is playing a guitar.",
    "Two dogs run through a snowy field while their owner watches from the fence.",
]


def _trained(cfg: ModelConfig) -> TransformerEncoder:
    """MiniLM with the given pooling, nudged away from the pretrained weights (as training would)."""
    torch.manual_seed(0)
    encoder = TransformerEncoder(cfg)
    with torch.no_grad():
        for p in encoder.backbone.encoder.layer[-1].parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return encoder


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("minilm")


@pytest.mark.parametrize(
    ("pooling", "mlp_only_train", "modules"),
    [
        ("avg", False, ["Transformer", "Pooling"]),
        ("cls_before_pooler", False, ["Transformer", "Pooling"]),
        ("cls", False, ["Transformer", "Pooling", "Dense"]),
        ("cls", True, ["Transformer", "Pooling"]),
        ("avg_first_last", False, ["Transformer", "WeightedLayerPooling", "Pooling"]),
        ("avg_first_last_emb", False, ["Transformer", "WeightedLayerPooling", "Pooling"]),
        ("avg_top2", False, ["Transformer", "WeightedLayerPooling", "Pooling"]),
    ],
)
def test_sentence_transformers_folder_embeds_like_the_platform(
    pooling, mlp_only_train, modules, tokenizer, tmp_path
):
    from sentence_transformers import SentenceTransformer

    cfg = ModelConfig(name="minilm", pooling=pooling, mlp_only_train=mlp_only_train)
    encoder = _trained(cfg)
    expected = transformer_embedder(encoder, tokenizer)(SENTENCES)
    save_sentence_transformer(encoder, tokenizer, cfg, tmp_path / "model", method="simcse_unsup")

    model = SentenceTransformer(str(tmp_path / "model"), device="cpu")  # no trust_remote_code needed
    assert [type(m).__name__ for m in model] == modules
    assert model.max_seq_length == 512
    np.testing.assert_allclose(model.encode(SENTENCES), expected, atol=1e-5, rtol=0)
    meta = json.loads((tmp_path / "model" / "clsr_model.json").read_text())
    assert meta["model"] == cfg.model_dump(mode="json") and meta["method"] == "simcse_unsup"
    assert "simcse_unsup" in (tmp_path / "model" / "README.md").read_text()


def test_clsr_rebuilds_the_exact_encoder_and_pooling_can_be_overridden(tokenizer, tmp_path):
    cfg = ModelConfig(name="minilm", pooling="cls")
    encoder = _trained(cfg)
    save_sentence_transformer(encoder, tokenizer, cfg, tmp_path / "model", scores={"test_sts16": 80.5})
    assert "| test_sts16 | 80.5 |" in (tmp_path / "model" / "README.md").read_text()

    loaded, pipeline = load_model(str(tmp_path / "model"))
    assert pooling_of(loaded) == "cls + MLP"
    np.testing.assert_allclose(
        make_embedder(loaded, pipeline)(SENTENCES),
        transformer_embedder(encoder, tokenizer)(SENTENCES),
        atol=1e-6,
    )
    # SimCSE's protocol for an unsupervised cls model: evaluate without the MLP
    before, _ = load_model(str(tmp_path / "model"), pooling="cls_before_pooler")
    encoder.pooler.mlp_only_train = True  # the in-memory model's [CLS] vector without the MLP
    np.testing.assert_allclose(
        make_embedder(before, pipeline)(SENTENCES),
        transformer_embedder(encoder, tokenizer)(SENTENCES),
        atol=1e-6,
    )


def test_cls_pooling_is_refused_without_an_exported_mlp(tokenizer, tmp_path):
    cfg = ModelConfig(name="minilm", pooling="avg")
    save_sentence_transformer(_trained(cfg), tokenizer, cfg, tmp_path / "model")
    with pytest.raises(ModelLoadError, match="use cls_before_pooler"):
        load_model(str(tmp_path / "model"), pooling="cls")


def test_load_from_an_mlflow_run(tokenizer, tmp_path, monkeypatch):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = ModelConfig(name="minilm", pooling="avg_first_last")
    encoder = _trained(cfg)
    save_sentence_transformer(encoder, tokenizer, cfg, tmp_path / "export")
    client = MlflowClient(uri)
    experiment = client.create_experiment("trials", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_artifacts(run_id, str(tmp_path / "export"), "model")  # what Evaluator.log_model does
    client.set_terminated(run_id)

    expected = transformer_embedder(encoder, tokenizer)(SENTENCES)
    for source in (f"runs:/{run_id}/model", run_id):
        loaded, pipeline = load_model(source)
        assert pooling_of(loaded) == "avg_first_last"
        np.testing.assert_allclose(make_embedder(loaded, pipeline)(SENTENCES), expected, atol=1e-6)
    with pytest.raises(ModelLoadError, match="could not download"):
        load_model(f"runs:/{'0' * 32}/model")


def _word_table() -> WordTable:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(7, 4)).astype(np.float32)
    vectors[OOV_ID] = 0
    words = ["a", "man", "is", "playing", "guitar"]
    return WordTable(words, vectors, WordTokenizer("words"), max_words=8, oov_words=0, source="test")


@pytest.mark.parametrize("tokenization", ["words", "wordpiece"])
def test_gclsr_textcnn_round_trip(tokenization, tmp_path):
    texts = SENTENCES[:3]
    # wordpiece: MiniLM's input embeddings, so the HF tokenizer has to travel with the export
    table = _word_table() if tokenization == "words" else build_word_table("minilm", texts[:1], max_words=8)
    cfg = TextCNNConfig(vectors=table.source, region_sizes=[1, 2, 3], filters=5, max_words=8)
    method = GCLSR(GCLSRConfig(projector_dim=16, predictor_hidden=8, group_size=None))
    shared = GCLSRShared(table, texts, *table.encode(texts))
    torch.manual_seed(0)
    model = method.build_model(cfg, shared)
    expected = method.make_embedder(model, shared)(SENTENCES)  # "guitar." words plus OOV ones

    method.export_model(model, shared, SimpleNamespace(model=cfg), tmp_path / "model")
    loaded = load_textcnn(tmp_path / "model")
    assert isinstance(loaded, TextCNNModel) and loaded.dim == 15
    np.testing.assert_array_equal(loaded.encode(SENTENCES), expected)
    encoder, pipeline = load_model(str(tmp_path / "model"))
    assert isinstance(encoder, TextCNNEncoder) and pooling_of(encoder) == "textcnn max-over-time"
    np.testing.assert_array_equal(make_embedder(encoder, pipeline)(SENTENCES), expected)
    with pytest.raises(ModelLoadError, match="leave --pooling out"):
        load_model(str(tmp_path / "model"), pooling="avg")


def test_platform_eval_scores_an_exported_folder_like_the_in_memory_model(
    tokenizer, tmp_path, monkeypatch, capsys, data_dir
):
    cfg = ModelConfig(name="minilm", pooling="cls")
    encoder = _trained(cfg)
    # SICK-R dev: 500 pairs, the cheapest STS split
    in_memory = summary_metrics(evaluate_sts(transformer_embedder(encoder, tokenizer), ["sickr"], "dev"))
    save_sentence_transformer(encoder, tokenizer, cfg, tmp_path / "model")

    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    args = ["eval", "--model", str(tmp_path / "model"), "--tasks", "sickr", "--split", "dev", "--mlflow"]
    assert main(args) == 0
    assert "(cls + MLP pooling)" in capsys.readouterr().out
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("eval").experiment_id])[0]
    assert run.data.metrics["dev_sickr"] == pytest.approx(in_memory["test_sickr"], abs=1e-6)
    assert run.data.params["pooling"] == "cls + MLP"
