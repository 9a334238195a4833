"""A user's own evaluation sets (``eval.custom``, ``platform eval --custom``): STS-style pairs, retrieval
and classification from files, scored on MiniLM and checked against values computed here with SciPy and
scikit-learn from sentence-transformers' own ``encode``; in a trial's final metrics; refused by
``study validate`` when a file lacks a column."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from clsr.cli import main
from clsr.config.trial import TrialConfig
from clsr.data.hub.model_registry import resolve_model_path
from clsr.data.sts import load_sts
from clsr.data.transfer import load_transfer
from clsr.train.loop import fit
from clsr.train.session import LocalSession
from tests.support.stores import sqlite_uri

SEED = 1111
KFOLD_GRID = [2.0**t for t in range(-1, 6)]  # SentEval: TREC and MRPC
NESTED_GRID = [2.0**t for t in range(-2, 4)]  # SentEval: MR, CR, SUBJ, MPQA


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_model_path("minilm"), device="cpu")


def encode(model, texts) -> np.ndarray:
    return model.encode(list(texts), batch_size=128, convert_to_numpy=True)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def write_sts(folder: Path, data_dir: Path, rows: int = 300) -> tuple[Path, dict]:
    """STS-B dev pairs as a CSV whose columns are named as a user's might be (mapped in the task)."""
    import pandas as pd

    dev = load_sts("stsb", "dev", data_dir)
    frame = pd.DataFrame(
        {"left": dev.sentences1[:rows], "right": dev.sentences2[:rows], "gold": dev.scores[:rows]}
    )
    path = folder / "pairs.csv"
    frame.to_csv(path, index=False)
    return path, {
        "type": "sts",
        "path": str(path),
        "columns": {"sentence1": "left", "sentence2": "right", "score": "gold"},
    }


def write_retrieval(folder: Path, data_dir: Path) -> tuple[Path, Path, list[str], list[list[int]], list[str]]:
    """Queries (Parquet, a list of relevant ids each) and a corpus (JSON Lines): STS-B dev's first sides
    query its second sides; high-scoring pairs also count the next pair's second side as relevant."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dev = load_sts("stsb", "dev", data_dir)
    seen, pairs = set(), []  # distinct sentences: no tied similarities, whose order metrics may break apart
    for s1, s2, score in zip(dev.sentences1, dev.sentences2, dev.scores, strict=True):
        if s1 not in seen and s2 not in seen and s1 != s2 and len(pairs) < 200:
            seen |= {s1, s2}
            pairs.append((s1, s2, score))
    corpus = [s2 for _, s2, _ in pairs]
    queries, relevant = [], []
    for i in range(0, len(pairs), 4):
        queries.append(pairs[i][0])
        relevant.append([i, i + 1] if pairs[i][2] >= 4 else [i])
    ids = [f"doc-{i}" for i in range(len(corpus))]
    queries_path, corpus_path = folder / "queries.parquet", folder / "corpus.jsonl"
    pq.write_table(
        pa.Table.from_pylist(
            [{"q": q, "relevant": [ids[j] for j in rel]} for q, rel in zip(queries, relevant, strict=True)]
        ),
        queries_path,
    )
    corpus_path.write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, corpus, strict=True))
    )
    return queries_path, corpus_path, queries, relevant, corpus


def write_classification(folder: Path, data_dir: Path, split: bool) -> tuple[Path, list[str], np.ndarray]:
    """400 MR sentences, balanced, with labels as words; a ``split`` column of train/test rows if asked."""
    import pandas as pd

    mr = load_transfer("mr", data_dir).splits["all"]
    labels = np.asarray(mr.labels)
    rows = np.concatenate([np.flatnonzero(labels == 0)[:200], np.flatnonzero(labels == 1)[:200]])
    rows = np.random.default_rng(0).permutation(rows)
    texts = [mr.sentences[i] for i in rows]
    frame = pd.DataFrame({"text": texts, "label": np.where(labels[rows] == 1, "pos", "neg")})
    if split:
        frame["split"] = ["test" if i % 4 == 0 else "train" for i in range(len(frame))]
    path = folder / ("labelled_split.tsv" if split else "labelled.tsv")
    frame.to_csv(path, sep="\t", index=False)
    return path, texts, frame


def expected_retrieval(similarity: np.ndarray, relevant: list[list[int]]) -> dict[str, float]:
    """MAP and nDCG@10 by scikit-learn; MRR@10 and Acc@k from the first relevant rank."""
    from sklearn.metrics import average_precision_score, ndcg_score

    truth = np.zeros_like(similarity)
    for q, rel in enumerate(relevant):
        truth[q, rel] = 1
    first = [
        int(np.min(np.argsort(np.argsort(-row))[rel])) + 1
        for row, rel in zip(similarity, relevant, strict=True)
    ]
    return {
        "map": 100 * np.mean([average_precision_score(t, s) for t, s in zip(truth, similarity, strict=True)]),
        "ndcg10": 100
        * np.mean([ndcg_score(t[None], s[None], k=10) for t, s in zip(truth, similarity, strict=True)]),
        "mrr10": 100 * np.mean([1 / r if r <= 10 else 0 for r in first]),
        "acc1": 100 * np.mean([r <= 1 for r in first]),
        "acc5": 100 * np.mean([r <= 5 for r in first]),
        "acc10": 100 * np.mean([r <= 10 for r in first]),
    }


def senteval_fit(X: np.ndarray, y, grid: list[float]):
    """SentEval's scikit-learn selection: C by shuffled stratified 10-fold CV (liblinear), the mean fold
    accuracy rounded to 2 decimals × 100, the first best C among ties, refitted on all of X."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    search = GridSearchCV(
        LogisticRegression(solver="liblinear", random_state=SEED),
        {"C": grid},
        cv=StratifiedKFold(10, shuffle=True, random_state=SEED),
    ).fit(X, y)
    best = int(np.argmax(np.round(100 * search.cv_results_["mean_test_score"], 2)))
    return LogisticRegression(C=grid[best], solver="liblinear", random_state=SEED).fit(X, y)


def test_platform_eval_scores_custom_sts_retrieval_and_classification_as_computed_independently(
    tmp_path, monkeypatch, capsys, data_dir, minilm
):
    from mlflow.tracking import MlflowClient
    from scipy.stats import spearmanr

    sts_path, sts_task = write_sts(tmp_path, data_dir)
    queries_path, corpus_path, queries, relevant, corpus = write_retrieval(tmp_path, data_dir)
    labelled, texts, frame = write_classification(tmp_path, data_dir, split=True)
    tasks = {
        "my_sts": sts_task,
        "my_search": {
            "type": "retrieval",
            "path": str(queries_path),
            "corpus": str(corpus_path),
            "columns": {"query": "q"},
        },
        "my_labels": {"type": "classification", "path": str(labelled)},
    }
    tasks_file = tmp_path / "tasks.yaml"
    tasks_file.write_text(yaml.safe_dump(tasks))
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    code = main(
        [
            "eval",
            "--model",
            "minilm",
            "--custom",
            str(tasks_file),
            "--transfer-classifier",
            "liblinear",
            "--mlflow",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("eval").experiment_id])[0]
    metrics = run.data.metrics

    frame_sts = __import__("pandas").read_csv(sts_path)
    cos = np.diag(cosine(encode(minilm, frame_sts["left"]), encode(minilm, frame_sts["right"])))
    assert metrics["test_my_sts"] == pytest.approx(
        100 * spearmanr(cos, frame_sts["gold"]).statistic, abs=1e-3
    )

    expected = expected_retrieval(cosine(encode(minilm, queries), encode(minilm, corpus)), relevant)
    for name, value in expected.items():
        assert metrics[f"test_my_search_{name}"] == pytest.approx(value, abs=1e-3), name
    assert metrics["test_my_search"] == metrics["test_my_search_map"]

    train, test = frame["split"] == "train", frame["split"] == "test"
    features = encode(minilm, texts)
    search = senteval_fit(features[train.to_numpy()], frame["label"][train], KFOLD_GRID)
    accuracy = 100 * search.score(features[test.to_numpy()], frame["label"][test])
    assert metrics["test_my_labels"] == pytest.approx(accuracy, abs=0.01)

    assert "your evaluation sets" in out and "my_search_ndcg10" in out
    assert run.data.params["custom.my_search"] == f"retrieval: {queries_path} + {corpus_path}"
    assert "custom_table.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_classification_without_a_split_column_is_nested_cross_validation(tmp_path, data_dir, minilm):
    from sklearn.model_selection import StratifiedKFold

    from clsr.config.custom_task import CustomTask
    from clsr.encoders.export import load_model, make_embedder
    from clsr.eval.custom import ClassifierSettings, evaluate_custom

    labelled, texts, frame = write_classification(tmp_path, data_dir, split=False)
    encoder, pipeline = load_model("minilm")
    task = CustomTask(type="classification", path=str(labelled))
    settings = ClassifierSettings(classifier="liblinear")
    score = evaluate_custom(make_embedder(encoder, pipeline), {"mr_part": task}, settings)["test_mr_part"]

    features, labels = encode(minilm, texts), (frame["label"] == "pos").to_numpy().astype(int)
    outer = StratifiedKFold(10, shuffle=True, random_state=SEED).split(features, labels)
    folds = [
        100 * senteval_fit(features[tr], labels[tr], NESTED_GRID).score(features[te], labels[te])
        for tr, te in outer
    ]
    assert score == pytest.approx(np.mean(folds), abs=0.02)


@pytest.mark.parametrize("split", [True, False])
def test_custom_classification_fits_where_transfer_device_says(tmp_path, data_dir, monkeypatch, split):
    """``eval.transfer_device: auto`` puts a trial's custom classification fits on its GPU, as it does
    the transfer tasks': the device reaches SentEval's classifier for both schemes."""
    import clsr.eval.transfer as transfer
    from clsr.config.custom_task import CustomTask
    from clsr.eval.custom import ClassifierSettings, evaluate_custom

    labelled, _, _ = write_classification(tmp_path, data_dir, split=split)
    seen = []

    def classify(*args, device=None, **kwargs):
        seen.append(device)
        return {"acc": 50.0}

    monkeypatch.setattr(transfer, "classify", classify)
    task = CustomTask(type="classification", path=str(labelled))
    embed = lambda texts: np.zeros((len(texts), 4), dtype=np.float32)  # noqa: E731
    for settings in (ClassifierSettings(), ClassifierSettings(device="cuda:1")):
        assert evaluate_custom(embed, {"part": task}, settings) == {"test_part": 50.0}
    assert seen == [None, "cuda:1"]


def test_a_trial_scores_the_custom_tasks_eval_tasks_names(tmp_path, data_dir, tiny_bert):
    _, sts_task = write_sts(tmp_path, data_dir, rows=40)
    config = TrialConfig.model_validate(
        {
            "model": {"name": tiny_bert, "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 8},
            "trainer": {"batch_size": 4, "max_steps": 1, "eval_steps": 1, "lr": 1e-4},
            "method": {"name": "simcse_sup"},
            "eval": {
                "dev_tasks": [],
                "tasks": ["sts16", "my_sts"],
                "custom": {"my_sts": sts_task, "unused": sts_task},
                "alignment_uniformity": False,
                "log_model": False,
            },
        }
    )
    metrics = fit(config, LocalSession(tmp_path / "ckpt"))
    assert {"test_sts16", "test_my_sts"} <= set(metrics) and "test_unused" not in metrics
    assert -100 <= metrics["test_my_sts"] <= 100


@pytest.mark.parametrize(
    ("custom", "message"),
    [
        ({"stsb": {"type": "sts", "path": "x.csv"}}, "['stsb'] are built-in task names"),
        ({"My-Set": {"type": "sts", "path": "x.csv"}}, "lower-case letters, digits and _"),
        ({"mine": {"type": "retrieval", "path": "q.csv"}}, "a retrieval task needs one"),
        ({"mine": {"type": "sts", "path": "x.csv", "columns": {"query": "q"}}}, "unknown role(s) ['query']"),
    ],
)
def test_bad_custom_tasks_are_refused_by_the_config(custom, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=__import__("re").escape(message)):
        TrialConfig.model_validate(
            {"method": {"name": "simcse_sup"}, "eval": {"tasks": ["sts"], "custom": custom}}
        )


def test_study_validate_refuses_a_custom_file_without_the_columns_it_needs(tmp_path, capsys, data_dir):
    sts_path, _ = write_sts(tmp_path, data_dir, rows=10)
    study = tmp_path / "mine.yaml"
    study.write_text(
        textwrap.dedent(
            f"""\
            name: mine
            method: simcse_sup
            base:
              model: {{name: minilm, pooling: avg}}
              eval:
                tasks: [sts, my_sts, gone]
                custom:
                  my_sts: {{type: sts, path: {sts_path}, columns: {{sentence1: left, sentence2: right}}}}
                  gone: {{type: sts, path: {tmp_path / "missing.csv"}}}
            ablations:
              temp:
                grid: {{method.temperature: [0.05, 0.1]}}
            """
        )
    )
    assert main(["study", "validate", str(study)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"eval.custom.my_sts.path {str(sts_path)!r}: the task needs columns ['sentence1', 'sentence2', "
        "'score'] and the data provides ['sentence1', 'sentence2', 'gold'] (missing ['score']); map them "
        "with eval.custom.my_sts.columns, e.g. {score: <a column of: left, right, gold>}"
    ) in err
    assert f"eval.custom.gone.path {str(tmp_path / 'missing.csv')!r}: no such file or folder" in err
