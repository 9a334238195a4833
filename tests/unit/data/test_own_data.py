"""A user's own training data (files of each kind, a saved dataset) and models, read through HF
``datasets``; every model.name and data.train checked by ``study validate`` before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clsr.cli import main
from clsr.config.trial import TrialConfig
from clsr.data.external import source_columns
from clsr.data.training import training_rows
from clsr.train.loop import fit
from clsr.train.session import LocalSession
from tests.support.hub import stub_hub_cache
from tests.support.stores import sqlite_uri

REPO_ROOT = Path(__file__).resolve().parents[3]
PAIRS = [  # (sentence1, sentence2, hard_neg, label)
    ("A man plays a guitar.", "Someone makes music.", "The man sleeps.", "entailment"),
    ("Two dogs run in a field.", "Animals are outside.", "The dogs are asleep indoors.", "entailment"),
    ("A woman reads a book.", "A person is reading.", "Nobody is reading.", "contradiction"),
    ("Kids play football.", "Children play a game.", "The kids are at school.", "entailment"),
]
COLUMNS = ("sentence1", "sentence2", "hard_neg", "label")
MAPPING = {"anchor": "sentence1", "positive": "sentence2", "negative": "hard_neg"}


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))  # no Arrow files left in ~/.cache


def write_source(kind: str, folder: Path) -> Path:
    """The four pairs as a file (or folder) of ``kind``."""
    records = [dict(zip(COLUMNS, row, strict=True)) for row in PAIRS]
    if kind == "csv":
        import csv

        path = folder / "pairs.csv"
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS)
            writer.writeheader()
            writer.writerows(records)
    elif kind == "tsv":
        path = folder / "pairs.tsv"
        path.write_text("\n".join("\t".join(r) for r in [COLUMNS, *PAIRS]) + "\n")
    elif kind == "jsonl":
        path = folder / "pairs.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "pairs.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
    elif kind == "saved":
        import datasets

        path = folder / "saved"
        datasets.Dataset.from_list(records).save_to_disk(str(path))
    elif kind == "folder":
        path = folder / "shards"
        path.mkdir()
        for i, chunk in enumerate((records[:2], records[2:])):
            (path / f"part-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunk))
    else:
        raise ValueError(kind)
    return path


def trial(train: str, method: str = "simcse_sup", model: str = "minilm", **data) -> TrialConfig:
    return TrialConfig.model_validate(
        {
            "model": {"name": model, "pooling": "avg", "max_seq_length": 16},
            "data": {"train": train, **data},
            "trainer": {"batch_size": 2, "max_steps": 1, "eval_steps": 1, "lr": 1e-4},
            "method": {"name": method},
            "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False, "log_model": False},
        }
    )


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl", "parquet", "saved", "folder"])
def test_each_input_kind_yields_the_mapped_rows_and_trains_a_step(kind, tmp_path, tiny_bert):
    source = write_source(kind, tmp_path)
    assert source_columns(trial(str(source), columns=MAPPING).data) == list(COLUMNS)
    config = trial(str(source), model=tiny_bert, columns=MAPPING)
    rows = training_rows(config)
    assert [(r["anchor"], r["positive"], r["negative"]) for r in rows] == [p[:3] for p in PAIRS]
    assert rows[0]["label"] == "entailment"  # unmapped columns keep their names
    session = LocalSession(tmp_path / "ckpt")
    fit(config, session)
    assert session.reports[-1]["step"] == 1


def test_plain_text_one_sentence_a_line_trains_unsupervised_simcse(tmp_path, tiny_bert):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{p[0]}\n" for p in PAIRS))
    config = trial(str(corpus), method="simcse_unsup", model=tiny_bert)
    assert [r["text"] for r in training_rows(config)] == [p[0] for p in PAIRS]
    session = LocalSession(tmp_path / "ckpt")
    fit(config, session)
    assert session.reports[-1]["step"] == 1


def test_filter_keeps_the_rows_with_the_value_and_max_rows_samples_them(tmp_path):
    source = write_source("csv", tmp_path)
    rows = training_rows(trial(str(source), columns=MAPPING, filter={"label": "entailment"}))
    assert [r["anchor"] for r in rows] == [p[0] for p in PAIRS if p[3] == "entailment"]
    rows = training_rows(trial(str(source), columns=MAPPING, filter={"label": ["entailment"]}, max_rows=2))
    assert len(rows) == 2 and all(r["label"] == "entailment" for r in rows)


def test_a_relative_path_is_made_absolute_when_validated(tmp_path, monkeypatch):
    write_source("csv", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert trial("pairs.csv", columns=MAPPING).data.train == str(tmp_path / "pairs.csv")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train": "nli_triplet"}, r"not a catalogue set \(wiki1m, wiki_ordered, nli_for_simcse"),
        ({"train": "nli_triplets", "columns": {"anchor": "x"}}, "data.columns applies to a file"),
        ({"train": "wiki1m", "split": "validation"}, "data.split applies to a file"),
    ],
)
def test_bad_data_values_are_refused_by_the_config(data, message):
    with pytest.raises(ValueError, match=message):
        TrialConfig.model_validate({"data": data, "method": {"name": "simcse_sup"}})


def study_file(folder: Path, data: str, model: str = "minilm") -> Path:
    path = folder / "own.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: own
            method: simcse_sup
            base:
              model: {{name: {model}, pooling: avg}}
              data: {data}
            ablations:
              temp:
                grid: {{method.temperature: [0.05, 0.1]}}
            """
        )
    )
    return path


def validate(capsys, path: Path) -> tuple[int, str, list[str]]:
    code = main(["study", "validate", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err.strip().splitlines()[1:]  # the problem lines under the header


def test_study_validate_accepts_a_mapped_file(tmp_path, capsys):
    source = write_source("csv", tmp_path)
    mapping = ", ".join(f"{k}: {v}" for k, v in MAPPING.items())
    code, out, _ = validate(capsys, study_file(tmp_path, f"{{train: {source}, columns: {{{mapping}}}}}"))
    assert code == 0 and out.startswith("ok  ")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (  # no mapping: the method's views are not columns of the file
            "{{train: {source}}}",
            [
                "ablations.temp[method.temperature=0.05], ablations.temp[method.temperature=0.1]: data.train '{source}': the method needs columns "
                "['anchor', 'positive', 'negative'] and the data provides ['sentence1', 'sentence2', 'hard_neg', "
                "'label'] (missing ['anchor', 'positive', 'negative']); with method.hard_negatives: false it "
                "needs only ['anchor', 'positive']; otherwise map them with data.columns, e.g. "
                "{{anchor: <a column of: sentence1, sentence2, hard_neg, label>}}"
            ],
        ),
        (  # the positive mapped again as the hard negative: validates today, trains nonsense
            "{{train: {source}, columns: {{anchor: sentence1, positive: sentence2, negative: sentence2}}}}",
            [
                "ablations.temp[method.temperature=0.05], ablations.temp[method.temperature=0.1]: data.train '{source}': data.columns maps "
                "column 'sentence2' to positive and negative: each role needs a column of its own"
            ],
        ),
        (  # a mapping to a column the file lacks
            "{{train: {source}, columns: {{anchor: premise, positive: sentence2, negative: hard_neg}}}}",
            [
                "ablations.temp[method.temperature=0.05], ablations.temp[method.temperature=0.1]: data.train '{source}': data.columns maps to columns "
                "the data lacks (anchor: premise); its columns: sentence1, sentence2, hard_neg, label"
            ],
        ),
        (
            "{{train: {folder}/missing.csv}}",
            [
                "ablations.temp[method.temperature=0.05], ablations.temp[method.temperature=0.1]: data.train '{folder}/missing.csv': no such file or "
                "folder (relative paths are read from the folder `platform study` runs in: {cwd})"
            ],
        ),
    ],
    ids=["unmapped", "one-column-two-roles", "bad-mapping", "missing-file"],
)
def test_study_validate_refuses_bad_data_with_file_field_and_what_to_do(tmp_path, capsys, data, expected):
    source = write_source("csv", tmp_path)
    path = study_file(tmp_path, data.format(source=source, folder=tmp_path))
    code, _, lines = validate(capsys, path)
    assert code == 1
    assert lines == [
        f"  {path}: " + e.format(source=source, folder=tmp_path, cwd=Path.cwd()) for e in expected
    ]


def test_an_unknown_model_name_is_refused_offline_before_anything_starts(tmp_path):
    """``platform study validate`` as its own process: the typo refused, nothing started or written."""
    path = study_file(tmp_path, "{train: nli_triplets}", model="bert-base-uncasd")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "clsr.cli", "study", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 1, done.stderr
    assert (
        "model.name 'bert-base-uncasd': a hub id that is not in the local Hugging Face cache" in done.stderr
    )
    assert "hf download bert-base-uncasd" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.yaml"]  # no MLflow store, no Ray folder
    print(f"refused in {seconds:.1f} s")  # README figure; speed is measured, never asserted


def test_a_cached_hub_model_and_a_model_folder_validate_offline(tmp_path, capsys, monkeypatch, tiny_bert):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(stub_hub_cache(tmp_path / "hub", ["bert-base-uncased"])))
    assert validate(capsys, study_file(tmp_path, "{train: nli_triplets}", "bert-base-uncased"))[0] == 0
    assert validate(capsys, study_file(tmp_path, "{train: nli_triplets}", tiny_bert))[0] == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, lines = validate(capsys, study_file(tmp_path, "{train: nli_triplets}", str(empty)))
    assert (
        code == 1
        and "the folder lacks config.json and weights (model.safetensors or pytorch_model.bin)" in lines[0]
    )


def test_skip_unavailable_runs_the_rest_and_says_which_points_it_skips(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    path = study_file(tmp_path, "{train: nli_triplets}", "bert-base-uncased")
    path.write_text(path.read_text() + "skip_unavailable: true\n")
    code, out, _ = validate(capsys, path)
    assert code == 0
    assert (
        "skipped when run here: ablations.temp[method.temperature=0.05], ablations.temp[method.temperature=0.1]: model.name 'bert-base-uncased'"
        in out
    )


# --- models as their authors meant them ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_dense_normalize(tmp_path_factory) -> Path:
    """A sentence-transformers folder built from the MiniLM package: CLS pooling, a Dense(384→128, Tanh)
    and Normalize, saved as `SentenceTransformer.save` writes it. MiniLM's first layer only: the tests
    compare clsr with sentence-transformers on the same folder, and STS16 through six layers, twice, was
    most of their minute."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    from clsr.data.hub.model_registry import resolve_model_path

    torch.manual_seed(0)
    word = models.Transformer(resolve_model_path("minilm"), max_seq_length=128)
    word.auto_model.encoder.layer = word.auto_model.encoder.layer[:1]
    word.auto_model.config.num_hidden_layers = 1
    pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="cls")
    dense = models.Dense(384, 128, activation_function=torch.nn.Tanh())
    folder = tmp_path_factory.mktemp("st-cls") / "model"
    SentenceTransformer(modules=[word, pool, dense, models.Normalize()], device="cpu").save(str(folder))
    return folder


def test_a_sentence_transformers_folder_embeds_with_its_own_modules(cls_dense_normalize):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from clsr.encoders.export import load_model, make_embedder, pooling_of

    sentences = [p[0] for p in PAIRS] + ["A much longer sentence " * 20]
    encoder, pipeline = load_model(str(cls_dense_normalize))
    ours = make_embedder(encoder, pipeline, batch_size=2)(sentences)
    theirs = SentenceTransformer(str(cls_dense_normalize), device="cpu").encode(sentences)
    assert ours.shape == (5, 128)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert pooling_of(encoder) == (
        "sentence-transformers modules: Pooling(cls), Dense(384->128, Tanh), Normalize"
    )
    overridden, tokenizer = load_model(str(cls_dense_normalize), pooling="mean")  # --pooling overrides
    assert make_embedder(overridden, tokenizer)(sentences).shape == (5, 384)


def test_platform_eval_scores_it_as_sentence_transformers_does_and_records_the_pooling(
    cls_dense_normalize, tmp_path, monkeypatch, capsys, data_dir
):
    from mlflow.tracking import MlflowClient
    from sentence_transformers import SentenceTransformer

    from clsr.eval.sts import evaluate_sts

    model = SentenceTransformer(str(cls_dense_normalize), device="cpu")
    expected = evaluate_sts(lambda texts: model.encode(list(texts), batch_size=128), ["sts16"], "test")
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["eval", "--model", str(cls_dense_normalize), "--tasks", "sts16", "--mlflow"]) == 0
    out = capsys.readouterr().out
    assert "(sentence-transformers modules: Pooling(cls), Dense(384->128, Tanh), Normalize)" in out
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("eval").experiment_id])[0]
    assert run.data.metrics["test_sts16"] == pytest.approx(expected["sts16"].all, abs=1e-4)
    assert run.data.params["pooling"].startswith("sentence-transformers modules: Pooling(cls)")


@pytest.fixture(scope="module")
def cls_normalize(tmp_path_factory) -> Path:
    """A BGE-style folder from the MiniLM package: CLS pooling and Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    from clsr.data.hub.model_registry import resolve_model_path

    word = models.Transformer(resolve_model_path("minilm"), max_seq_length=128)
    pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="cls")
    folder = tmp_path_factory.mktemp("st-cls-only") / "model"
    SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu").save(str(folder))
    return folder


@pytest.mark.parametrize(("source", "expected"), [("minilm", "avg"), ("cls_normalize", "cls_before_pooler")])
def test_model_pooling_auto_trains_with_the_models_own_pooling(source, expected, request):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from clsr.config.model import ModelConfig
    from clsr.data.hub.model_registry import resolve_model_path
    from clsr.encoders.embed import transformer_embedder
    from clsr.encoders.transformer import TransformerEncoder, load_tokenizer

    name = str(request.getfixturevalue(source)) if source == "cls_normalize" else source
    config = ModelConfig(name=name, pooling="auto")
    assert config.pooling == expected and config.model_dump()["pooling"] == expected  # what MLflow records
    sentences = [p[0] for p in PAIRS] + [p[1] for p in PAIRS]
    encoder = TransformerEncoder(config).eval()
    ours = transformer_embedder(encoder, load_tokenizer(name))(sentences)
    theirs = SentenceTransformer(resolve_model_path(name), device="cpu").encode(sentences)
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)  # its Normalize: cosine is unchanged
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_model_pooling_auto_refuses_what_clsr_cannot_train_with(cls_dense_normalize, tiny_bert):
    from pydantic import ValidationError

    from clsr.config.model import ModelConfig

    with pytest.raises(
        ValidationError, match=r"model.pooling auto: .* has modules Pooling\(cls\), Dense, Normalize"
    ):
        ModelConfig(name=str(cls_dense_normalize), pooling="auto")
    with pytest.raises(ValidationError, match="is not a sentence-transformers model .no modules.json."):
        ModelConfig(name=tiny_bert, pooling="auto")


def test_study_validate_says_when_a_pooling_overrides_the_models_own(tmp_path, capsys):
    study = tmp_path / "pool.yaml"
    study.write_text(
        "name: pool\nmethod: simcse_sup\nbase:\n  model: {name: minilm}\n  data: {train: nli_triplets}\n"
        "ablations:\n  pool:\n    grid: {model.pooling: [cls, auto, avg]}\n"
    )
    assert main(["study", "validate", str(study)]) == 0
    out = capsys.readouterr().out
    assert f"ok  {study}: 3 trials (2 distinct)" in out  # auto is avg: one trial
    assert out.count("note:") == 2
    assert "model.attention auto: sdpa_packed on CPU trials (minilm: bert)" in out
    assert (
        "note: ablations.pool[model.pooling=cls]: model.name minilm is a sentence-transformers model "
        "(Pooling(mean), Normalize); model.pooling cls trains it with clsr's pooler instead "
        "(model.pooling: auto uses its own)"
    ) in out


def test_relative_paths_of_a_study_are_made_absolute_where_it_is_loaded(tmp_path, monkeypatch):
    """Ray runs each trial in a folder of its own: the study carries absolute paths to its workers, and
    grid labels (and the paper: keys that name them) stay as written."""
    from clsr.study.plan.load import load_study
    from clsr.study.plan.resolve import grid_points, resolve_trial

    write_source("csv", tmp_path)
    (tmp_path / "other.csv").write_text((tmp_path / "pairs.csv").read_text())
    study = tmp_path / "rel.yaml"
    study.write_text(
        textwrap.dedent(
            """\
            name: rel
            method: simcse_sup
            base:
              model: {name: minilm, pooling: avg}
              data: {train: pairs.csv, columns: {anchor: sentence1, positive: sentence2, negative: hard_neg}}
              eval:
                tasks: [mine]
                custom: {mine: {type: sts, path: pairs.csv, columns: {score: label}}}
            ablations:
              corpus:
                grid: {data.train: [pairs.csv, other.csv]}
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    loaded = load_study("rel.yaml")
    assert loaded.base["data"]["train"] == str(tmp_path / "pairs.csv")
    assert loaded.base["eval"]["custom"]["mine"]["path"] == str(tmp_path / "pairs.csv")
    points = grid_points(loaded.ablations["corpus"])
    assert [p.label for p in points] == [
        "data.train=pairs.csv",
        "data.train=other.csv",
    ]
    assert [p.overrides["data.train"] for p in points] == [
        str(tmp_path / "pairs.csv"),
        str(tmp_path / "other.csv"),
    ]
    monkeypatch.chdir(REPO_ROOT)  # a worker's folder: the dumped study still points at the files
    trial = resolve_trial(loaded, "corpus", points[1].overrides, 1)
    assert trial.data.train == str(tmp_path / "other.csv")


def test_the_readmes_study_validates_on_a_two_column_file(tmp_path, capsys, monkeypatch):
    """The README's example study, as written, on a file with only its two columns: no hard negative is
    asked for, so nothing tempts a user to map the positive again as one."""
    readme = (REPO_ROOT / "README.md").read_text()
    study = readme.split("## A study file", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pairs.csv").write_text("s1,s2\nA man plays a guitar.,Someone plays music.\n")
    (tmp_path / "readme.yaml").write_text(study)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(stub_hub_cache(tmp_path / "hub", ["bert-base-uncased"])))
    code, out, problems = validate(capsys, tmp_path / "readme.yaml")
    assert (code, problems) == (0, []) and out.startswith("ok  ")
