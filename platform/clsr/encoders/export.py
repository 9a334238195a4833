"""Trained encoders in formats users load, and clsr's loader for them (``platform eval --model``).

**Transformer encoders** become a sentence-transformers folder that ``SentenceTransformer(folder)``
loads offline, without clsr and without ``trust_remote_code``, and that embeds like the platform's
evaluation (:func:`clsr.encoders.embed.transformer_embedder`): same truncation (min(model_max_length, 512)
tokens), eval mode, no normalisation. The pooler maps to built-in modules only:

==========================  ===========================================================================
clsr pooling                sentence-transformers modules after ``Transformer``
==========================  ===========================================================================
avg / mean                  ``Pooling(mean)``
cls_before_pooler           ``Pooling(cls)``
cls, mlp_only_train         ``Pooling(cls)`` (the MLP is used in training only)
cls                         ``Pooling(cls)`` + ``Dense(tanh)`` holding the pooler's MLP weights
avg_first_last              ``WeightedLayerPooling`` (layers 1..L, weights 1, 0, …, 0, 1) + ``Pooling(mean)``
avg_first_last_emb          ``WeightedLayerPooling`` (layers 0..L, weights 1, 0, …, 0, 1) + ``Pooling(mean)``
avg_top2                    ``WeightedLayerPooling`` (layers L-1..L, weights 1, 1) + ``Pooling(mean)``
==========================  ===========================================================================

(the weighted average of two layers with weights 1 and 1 and exact zeros elsewhere is bit-for-bit the
platform's ``(a + b) / 2``). The folder also holds ``clsr_model.json`` (the trial's ``model`` section,
so clsr rebuilds the exact :class:`~clsr.encoders.transformer.TransformerEncoder`) and a README.md.

**TextCNN encoders** (GCLSR) have no sentence-transformers equivalent (OOV words get fresh random
vectors, no padding mask): :func:`save_textcnn` writes the conv banks (``textcnn.pt``), the word table
the trial used (``word_vectors.npy`` + ``word_table.json``, plus ``tokenizer/`` for WordPiece) and
``clsr_model.json``; :func:`load_textcnn` loads them back into something that embeds sentences.

:func:`load_model` is what ``platform eval --model`` calls: an exported folder (either kind), an MLflow
URI (``runs:/<run_id>/model``, ``models:/<name>/<version>``), a bare run id, or as before a hub id, a
Hugging Face folder or ``minilm``.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import clsr
from clsr.data.hub.st_modules import sentence_transformers_folder

FORMAT_FILE = "clsr_model.json"
FORMAT_VERSION = 1
TRANSFORMER_FORMAT = "clsr-sentence-transformer"
TEXTCNN_FORMAT = "clsr-textcnn"
TEXTCNN_WEIGHTS = "textcnn.pt"
WORD_VECTORS = "word_vectors.npy"
WORD_TABLE = "word_table.json"
TOKENIZER_DIR = "tokenizer"

_LAYER_AVERAGES = ("avg_first_last", "avg_first_last_emb", "avg_top2")
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")


class ModelLoadError(RuntimeError):
    """A model source that cannot be loaded (the CLI prints the message and exits with status 2)."""


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def eval_max_length(tokenizer: Any) -> int:
    """The truncation length of the platform's evaluation: min(model_max_length, 512)."""
    return min(getattr(tokenizer, "model_max_length", 512), 512)


# ------------------------------------------------------------------------------ transformer: export


def _st_modules() -> Any:
    from sentence_transformers.sentence_transformer import modules  # the v6 home of the modules

    return modules


def _layer_weights(pooling: str, layers: int) -> tuple[int, torch.Tensor]:
    """(layer_start, weights) of the ``WeightedLayerPooling`` that equals ``pooling``; hidden states
    are numbered 0 (embedding output) to ``layers`` (the last layer)."""
    start = {"avg_first_last": 1, "avg_first_last_emb": 0, "avg_top2": layers - 1}[pooling]
    weights = torch.zeros(layers + 1 - start)
    weights[0] += 1
    weights[-1] += 1  # one layer (L = 1 for avg_first_last): weight 2, (h + h) / 2 = h
    return start, weights


def _pooling_modules(encoder: nn.Module) -> list[nn.Module]:
    modules = _st_modules()
    pooler, dim = encoder.pooler, encoder.dim
    if pooler.name in ("avg", "mean"):
        return [modules.Pooling(dim, pooling_mode="mean")]
    if pooler.name in _LAYER_AVERAGES:
        layers = encoder.backbone.config.num_hidden_layers
        start, weights = _layer_weights(pooler.name, layers)
        average = modules.WeightedLayerPooling(
            dim, num_hidden_layers=layers, layer_start=start, layer_weights=nn.Parameter(weights)
        )
        return [average, modules.Pooling(dim, pooling_mode="mean")]
    chain: list[nn.Module] = [modules.Pooling(dim, pooling_mode="cls")]
    if _mlp_at_test_time(pooler):
        linear = pooler.mlp[0]
        chain.append(
            modules.Dense(
                dim,
                dim,
                bias=True,
                activation_function=nn.Tanh(),
                init_weight=linear.weight.detach().float().cpu().clone(),
                init_bias=linear.bias.detach().float().cpu().clone(),
            )
        )
    return chain


def _mlp_at_test_time(pooler: nn.Module) -> bool:
    return pooler.mlp is not None and not pooler.mlp_only_train


def _accepts_pooling_flag(backbone: nn.Module) -> bool:
    import inspect

    return "add_pooling_layer" in inspect.signature(type(backbone).__init__).parameters


def save_sentence_transformer(
    model: nn.Module,
    tokenizer: Any,
    model_cfg: Any,
    folder: Path,
    *,
    method: str | None = None,
    scores: Mapping[str, float] | None = None,
) -> Path:
    """Write ``model`` (a :class:`~clsr.encoders.transformer.TransformerEncoder`) as a
    sentence-transformers folder that embeds like the platform's evaluation (see the module doc).

    ``tokenizer``: the trial's tokenizer; ``model_cfg``: the trial's ``model`` section (saved in
    ``clsr_model.json``); ``method`` and ``scores`` (e.g. the trial's final metrics) go into the
    README.md model card when given. Returns ``folder``.
    """
    modules = _st_modules()
    from sentence_transformers import SentenceTransformer

    encoder = _unwrap(model)
    folder = Path(folder)
    pooling = encoder.pooler.name
    max_length = eval_max_length(tokenizer)
    with tempfile.TemporaryDirectory(prefix="clsr-backbone-") as staging:
        encoder.backbone.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        pooler_flag = {"add_pooling_layer": False} if _accepts_pooling_flag(encoder.backbone) else {}
        transformer = modules.Transformer(staging, max_seq_length=max_length, model_kwargs=pooler_flag)
        if pooling in _LAYER_AVERAGES:  # the Transformer module then hands on all_layer_embeddings
            transformer.model.config.output_hidden_states = True
        st_model = SentenceTransformer(modules=[transformer, *_pooling_modules(encoder)], device="cpu")
        st_model.save(str(folder), create_model_card=False)
    if pooler_flag:  # BERT's unused pretrained pooler is not in the weights: do not let users build one
        _update_json(folder / "sentence_bert_config.json", {"model_kwargs": pooler_flag})
    chain = [type(m).__name__ for m in st_model]
    meta = {
        "format": TRANSFORMER_FORMAT,
        "format_version": FORMAT_VERSION,
        "clsr_version": clsr.__version__,
        "method": method,
        "model": model_cfg.model_dump(mode="json"),
        "pooling": pooling,
        "mlp_at_test_time": _mlp_at_test_time(encoder.pooler),
        "eval_max_length": max_length,
        "sentence_transformers_modules": chain,
    }
    scores = _numbers(scores)
    if scores:
        meta["scores"] = scores
    (folder / FORMAT_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(_transformer_card(meta, encoder.dim, scores))
    return folder


def _update_json(path: Path, values: dict[str, Any]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(data | values, indent=4) + "\n")


def _numbers(scores: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric entries of ``scores`` as plain floats (JSON-ready; numpy scalars included)."""
    return {
        name: float(value)
        for name, value in (scores or {}).items()
        if isinstance(value, numbers.Real) and not isinstance(value, bool)
    }


def _scores_table(scores: Mapping[str, float] | None) -> str:
    if not scores:
        return ""
    rows = [f"| {name} | {value:.4g} |" for name, value in sorted(scores.items())]
    return "\n## Scores of the trial\n\n| metric | value |\n|---|---|\n" + "\n".join(rows) + "\n"


def _method_note(meta: dict[str, Any]) -> str:
    return f" ({meta['method']})" if meta.get("method") else ""


def _transformer_card(meta: dict[str, Any], dim: int, scores: Mapping[str, float] | None) -> str:
    cfg = meta["model"]
    mlp = " + the trained dense/tanh MLP" if meta["mlp_at_test_time"] else ""
    return f"""---
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags: [sentence-transformers, sentence-similarity, feature-extraction, clsr]
---

# Sentence encoder trained with clsr{_method_note(meta)}

* base model: `{cfg["name"]}`, pooling: `{meta["pooling"]}`{mlp}; {dim}-dimensional embeddings
* modules: {" → ".join(meta["sentence_transformers_modules"])}; inputs truncated at
  {meta["eval_max_length"]} tokens, embeddings not normalised (compare them with cosine similarity)
* the vectors equal those the platform scored (float rounding aside; on a GPU the platform evaluates
  under bf16 autocast, sentence-transformers in float32)

## Load it

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/folder")  # offline; clsr is not needed
embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])
```

From the trial's MLflow run (artifacts `model/`):

```python
import mlflow

folder = mlflow.artifacts.download_artifacts("runs:/<run_id>/model")
```

With clsr: `platform eval --model runs:/<run_id>/model --tasks sts` (or the folder), or
`clsr.encoders.export.load_model(...)`, which rebuilds the exact encoder from `clsr_model.json`.
{_scores_table(scores)}"""


# ------------------------------------------------------------------------------ TextCNN: export / load


def save_textcnn(
    encoder: nn.Module,
    table: Any,
    model_cfg: Any,
    folder: Path,
    *,
    method: str | None = "gclsr",
    scores: Mapping[str, float] | None = None,
) -> Path:
    """Write a :class:`~clsr.encoders.textcnn.TextCNNEncoder` and its word table to ``folder``.

    Files: ``textcnn.pt`` (the conv banks), ``word_vectors.npy`` (the vectors the encoder looks up,
    rows PAD, OOV, then one per word), ``word_table.json`` (the words, tokenisation, max_words),
    ``tokenizer/`` (WordPiece only), ``clsr_model.json`` (the trial's ``model`` section), README.md.
    """
    encoder = _unwrap(encoder)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    banks = {k: v.detach().cpu() for k, v in encoder.state_dict().items() if not k.startswith("words.")}
    torch.save(banks, folder / TEXTCNN_WEIGHTS)
    np.save(folder / WORD_VECTORS, encoder.words.weight.detach().float().cpu().numpy())
    tokenizer = table.tokenizer
    if tokenizer.kind == "wordpiece":
        tokenizer.hf_tokenizer.save_pretrained(folder / TOKENIZER_DIR)
    words = {
        "words": list(table.words),
        "tokenization": tokenizer.kind,
        "tokenizer_source": tokenizer.model_name,
        "max_words": table.max_words,
        "oov_words": table.oov_words,
        "source": table.source,
    }
    (folder / WORD_TABLE).write_text(json.dumps(words) + "\n")
    meta = {
        "format": TEXTCNN_FORMAT,
        "format_version": FORMAT_VERSION,
        "clsr_version": clsr.__version__,
        "method": method,
        "model": model_cfg.model_dump(mode="json"),
        "dim": encoder.dim,
    }
    scores = _numbers(scores)
    if scores:
        meta["scores"] = scores
    (folder / FORMAT_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(_textcnn_card(meta, len(table.words), scores))
    return folder


def _textcnn_card(meta: dict[str, Any], words: int, scores: Mapping[str, float] | None) -> str:
    cfg = meta["model"]
    return f"""# TextCNN sentence encoder trained with clsr{_method_note(meta)}

* word vectors: `{cfg["vectors"]}` ({words} words kept: the training and evaluation vocabulary),
  {cfg["max_words"]} words per sentence; region sizes {cfg["region_sizes"]} × {cfg["filters"]} filters,
  {meta["dim"]}-dimensional embeddings (max-over-time pooling)
* out-of-vocabulary words get random vectors, drawn from a generator seeded per call, as in the
  platform's evaluation; this is not a sentence-transformers model

## Load it (needs clsr)

```python
from clsr.encoders.export import load_textcnn

model = load_textcnn("path/to/this/folder")
embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])
```

Or `platform eval --model runs:/<run_id>/model --tasks sts` (or the folder).
{_scores_table(scores)}"""


@dataclass
class TextCNNModel:
    """A loaded TextCNN: ``encode(sentences)`` (or calling it) gives the platform's evaluation vectors."""

    encoder: nn.Module
    table: Any
    config: Any

    def encode(self, sentences: Sequence[str], batch_size: int = 512) -> np.ndarray:
        from clsr.encoders.embed import textcnn_embedder

        return textcnn_embedder(self.encoder, self.table, batch_size=batch_size)(list(sentences))

    __call__ = encode

    @property
    def dim(self) -> int:
        return self.encoder.dim


def load_textcnn(folder: str | Path, device: str | torch.device = "cpu") -> TextCNNModel:
    """Load a folder written by :func:`save_textcnn` (a GCLSR trial's ``model/`` artifacts).

    ``load_textcnn(folder).encode(sentences)`` returns ``(len(sentences), dim)`` float32 vectors, the
    ones the platform scored for that trial (``.encoder`` and ``.table`` are the model's parts).
    """
    from clsr.config.model import TextCNNConfig
    from clsr.encoders.textcnn import TextCNNEncoder
    from clsr.encoders.word_vectors import WordTable, WordTokenizer

    folder = Path(folder)
    meta = _read_meta(folder)
    if meta.get("format") != TEXTCNN_FORMAT:
        raise ModelLoadError(f"{folder} holds a {meta.get('format')!r} model, not a TextCNN; use load_model")
    words = json.loads((folder / WORD_TABLE).read_text())
    kind = words["tokenization"]
    tokenizer = WordTokenizer(kind, str(folder / TOKENIZER_DIR) if kind == "wordpiece" else None)
    if kind == "wordpiece":
        tokenizer.hf_tokenizer  # noqa: B018  load now: the folder may be a temporary download
    vectors = np.load(folder / WORD_VECTORS)
    table = WordTable(
        words=words["words"],
        vectors=vectors,
        tokenizer=tokenizer,
        max_words=words["max_words"],
        oov_words=words["oov_words"],
        source=words["source"],
    )
    cfg = TextCNNConfig(**meta["model"])
    encoder = TextCNNEncoder(cfg, table)
    banks = torch.load(folder / TEXTCNN_WEIGHTS, map_location="cpu", weights_only=True)
    encoder.load_state_dict({"words.weight": torch.from_numpy(vectors), **banks})
    return TextCNNModel(encoder.to(device).eval(), table, cfg)


# ------------------------------------------------------------------------------ loading for clsr


def _read_meta(folder: Path) -> dict[str, Any]:
    path = folder / FORMAT_FILE
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no {FORMAT_FILE}: it is not a model exported by clsr")
    meta = json.loads(path.read_text())
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ModelLoadError(
            f"{folder} was written by a newer clsr (format version {meta['format_version']}); upgrade clsr"
        )
    return meta


def exported_folder(path: Path) -> Path | None:
    """``path`` or its ``model/`` subfolder (a downloaded run's artifacts) when it holds an export."""
    for candidate in (path, path / "model"):
        if (candidate / FORMAT_FILE).is_file():
            return candidate
    return None


def _dense_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of the folder's sentence-transformers ``Dense`` module (the pooler's MLP)."""
    from safetensors.torch import load_file

    for module in json.loads((folder / "modules.json").read_text()):
        if module["type"].endswith(".Dense"):
            path = folder / module["path"]
            if (path / "model.safetensors").is_file():
                return load_file(str(path / "model.safetensors"))
            return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{folder} has no Dense module, so no MLP to pool with")


def _normal_pooling(name: str) -> str:
    return "avg" if name == "mean" else name


def _load_transformer_folder(folder: Path, meta: dict[str, Any], pooling: str | None) -> tuple:
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder, load_tokenizer

    saved = ModelConfig(**meta["model"])
    exported = meta.get("pooling", saved.pooling)
    wanted = pooling or exported
    same = _normal_pooling(wanted) == _normal_pooling(exported)
    if wanted == "cls" and not same and not meta.get("mlp_at_test_time"):
        raise ModelLoadError(
            f"{folder} was exported with {exported!r} pooling and no trained MLP; 'cls' pooling would "
            f"use a random one: use cls_before_pooler"
        )
    cfg = saved.model_copy(
        update={
            "name": str(folder),
            "pooling": wanted,
            "mlp_only_train": saved.mlp_only_train if same else False,
            # the saved config.json already holds the trained dropout rates; DropHead acts in training only
            "dropout": None,
            "attention_dropout": None,
            "drophead": None,
        }
    )
    encoder = TransformerEncoder(cfg)
    if _mlp_at_test_time(encoder.pooler):
        weights = _dense_weights(folder)
        linear = encoder.pooler.mlp[0]
        linear.load_state_dict({"weight": weights["linear.weight"], "bias": weights["linear.bias"]})
    return encoder.eval(), load_tokenizer(str(folder))


def _load_folder(folder: Path, pooling: str | None) -> tuple[nn.Module, Any]:
    meta = _read_meta(folder)
    kind = meta.get("format")
    if kind == TRANSFORMER_FORMAT:
        return _load_transformer_folder(folder, meta, pooling)
    if kind == TEXTCNN_FORMAT:
        if pooling is not None:
            raise ModelLoadError(f"{folder} is a TextCNN (max-over-time pooling): leave --pooling out")
        model = load_textcnn(folder)
        return model.encoder, model.table
    raise ModelLoadError(f"{folder}/{FORMAT_FILE} names an unknown format {kind!r}")


@contextlib.contextmanager
def _downloaded(uri: str) -> Iterator[Path]:
    """``uri``'s artifacts in a temporary folder, removed (the folder too, not only the artifacts) on exit."""
    import mlflow

    from clsr.tracking.secrets import mask_uri
    from clsr.tracking.study_runs import resolve_tracking_uri

    target = tempfile.mkdtemp(prefix="clsr-model-")
    try:
        tracking = resolve_tracking_uri(None)
        source = _registered_source(uri, tracking) if uri.startswith("models:/") else uri
        path = mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=target, tracking_uri=tracking
        )
    except Exception as err:  # MlflowException, OSError: no such run, model or artifact
        shutil.rmtree(target, ignore_errors=True)
        message = (
            f"could not download {uri} from MLflow at {resolve_tracking_uri(None)} "
            f"({type(err).__name__}: {err}); set MLFLOW_TRACKING_URI to the store the run logged to"
        )
        raise ModelLoadError(mask_uri(message)) from None  # the chained error may show credentials
    try:
        yield Path(path)
    finally:
        shutil.rmtree(target, ignore_errors=True)


def _registered_source(uri: str, tracking: str) -> str:
    """Where the registered model version ``models:/<name>/<version>`` (or ``@alias``, a stage,
    ``latest``) keeps its files, looked up in the registry: ``$MLFLOW_REGISTRY_URI``, else the tracking
    store. Asked here with an explicit client because MLflow's models:/ download asks the process-wide
    registry URI, whatever tracking URI it is given (another part of a process may have set it)."""
    from mlflow.store.artifact.utils.models import get_model_name_and_version
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking, registry_uri=os.environ.get("MLFLOW_REGISTRY_URI") or tracking)
    name, version = get_model_name_and_version(client, uri)
    return client.get_model_version_download_uri(name, version)


def mlflow_uri(source: str) -> str | None:
    """The MLflow artifact URI ``source`` names (a ``runs:/``/``models:/`` URI or a bare run id)."""
    if source.startswith(_MLFLOW_SCHEMES):
        return source
    if _RUN_ID.fullmatch(source) and not Path(source).exists():
        return f"runs:/{source}/model"
    return None


def load_model(source: str, pooling: str | None = None) -> tuple[nn.Module, Any]:
    """``(encoder, pipeline)`` for ``source``; embed with :func:`make_embedder`.

    ``source``: a folder exported by clsr (a trial's ``model/`` artifacts: transformer or TextCNN), an
    MLflow URI (``runs:/<run_id>/model``, ``models:/<name>/<version>``; downloaded with
    ``mlflow.artifacts.download_artifacts`` from ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``),
    a bare run id (its ``model/`` artifacts), or a hub id, Hugging Face folder or short name such as
    ``minilm``. An exported model carries its pooling: ``pooling=None`` keeps it, another value
    overrides it (e.g. ``cls_before_pooler`` for a model trained with ``cls``); other sources pool
    with ``pooling`` (default ``mean``). The pipeline is the tokenizer, or the word table of a TextCNN.
    """
    uri = mlflow_uri(source)
    if uri is not None:
        with _downloaded(uri) as downloaded:
            folder = exported_folder(downloaded)
            if folder is None:
                raise ModelLoadError(f"{uri} holds no model exported by clsr (no {FORMAT_FILE})")
            return _load_folder(folder, pooling)
    path = Path(source).expanduser()
    folder = exported_folder(path) if path.is_dir() else None
    if folder is not None:
        return _load_folder(folder, pooling)
    if pooling is None and (st_folder := sentence_transformers_folder(source)) is not None:
        return _load_sentence_transformer(st_folder), None  # its own pooling, Dense and Normalize
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder, load_tokenizer

    encoder = TransformerEncoder(ModelConfig(name=source, pooling=pooling or "mean"))
    return encoder.eval(), load_tokenizer(source)


def _load_sentence_transformer(folder: Path) -> nn.Module:
    from sentence_transformers import SentenceTransformer

    if not (folder / "config.json").is_file() and not any(folder.glob("*_Transformer")):
        raise ModelLoadError(f"{folder} has modules.json but no transformer weights")
    return SentenceTransformer(str(folder), device="cpu").eval()


def st_modules_description(model: nn.Module) -> str:
    """How a sentence-transformers model pools, e.g. ``sentence-transformers modules: Pooling(cls),
    Dense(768->256, Tanh), Normalize`` (for the eval output and MLflow params)."""
    parts = []
    for module in list(model)[1:]:
        kind, config = type(module).__name__, getattr(module, "get_config_dict", dict)()
        if kind == "Pooling":
            mode = config.get("pooling_mode", "?")
            parts.append(f"Pooling({mode if isinstance(mode, str) else '+'.join(mode)})")
        elif kind == "Dense":
            activation = str(config.get("activation_function", "")).rsplit(".", 1)[-1]
            parts.append(f"Dense({config.get('in_features')}->{config.get('out_features')}, {activation})")
        else:
            parts.append(kind)
    return "sentence-transformers modules: " + ", ".join(parts)


def make_embedder(encoder: nn.Module, pipeline: Any, batch_size: int = 128, precision: str = "auto"):
    """The platform's evaluation embedder for what :func:`load_model` returned, on the encoder's device
    (move it first) in ``precision`` (transformers; TextCNN runs in float32)."""
    from clsr.encoders.embed import sentence_transformers_embedder, textcnn_embedder, transformer_embedder
    from clsr.encoders.textcnn import TextCNNEncoder

    if pipeline is None:  # a sentence-transformers model: its own tokenizer, truncation and modules
        return sentence_transformers_embedder(encoder, batch_size=batch_size, precision=precision)
    if isinstance(encoder, TextCNNEncoder):
        return textcnn_embedder(encoder, pipeline, batch_size=max(batch_size, 512))
    return transformer_embedder(encoder, pipeline, batch_size=batch_size, precision=precision)


def pooling_of(encoder: nn.Module) -> str:
    """How ``encoder`` pools, for printing: the pooler's name, or TextCNN's max-over-time."""
    if type(encoder).__name__ == "SentenceTransformer":
        return st_modules_description(encoder)
    pooler = getattr(encoder, "pooler", None)
    if pooler is None:
        return "textcnn max-over-time"
    return f"{pooler.name} + MLP" if pooler.name == "cls" and _mlp_at_test_time(pooler) else pooler.name
