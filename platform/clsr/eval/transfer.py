"""SentEval transfer tasks with scikit-learn logistic regression (methods.md §8.2, ``usepytorch=False``).

Protocol (SentEval's ``tools/validation.py`` with ``usepytorch=False``, ``kfold=10``, seed 1111):

* Features are the frozen sentence embeddings as returned by the encoder: no standardisation, no
  normalisation (SentEval does none). MRPC uses ``[|u - v|, u * v]`` of its two sentences.
* MR, CR, SUBJ, MPQA (``InnerKFoldClassifier``): outer stratified 10-fold CV (shuffled, seed 1111);
  inside each outer training fold an inner stratified 10-fold CV (same seed) picks C from
  {2^-2, …, 2^3}; refit on the outer training fold with that C and score the outer test fold.
  Reported: the mean of the ten test accuracies.
* TREC, MRPC (``KFoldClassifier``): stratified 10-fold CV on the training set picks C from
  {2^-1, …, 2^5}; refit on the whole training set; score the fixed test set (MRPC also F1 of class 1).
* SST-2 (``SplitClassifier``): C from {2^-2, …, 2^3} by dev accuracy, trained on train; score test.
* As in SentEval: rows are ordered by (token count, label) before the folds are drawn (SentEval sorts
  to reduce padding, which fixes which rows land in which fold), the mean CV accuracy is rounded to
  two decimals before the arg-max (ties go to the smallest C), and accuracies are ×100.
* Classifier: ``LogisticRegression(C, random_state=seed, max_iter=MAX_ITER)``, i.e. today's
  scikit-learn default solver (L-BFGS, multinomial for TREC); SentEval ran with the 2017 default
  (liblinear, one-vs-rest), so the second decimal can differ. Every fit runs with single-threaded
  BLAS, and fits are spread over ``n_jobs`` processes, so the scores do not depend on ``n_jobs``.

``mode="fast"`` (for training-time or smoke runs) uses 5 folds everywhere and three or four C values;
``max_examples`` caps every split at a seeded stratified subsample (CI smoke runs). Each distinct
sentence of a task is embedded once (one call of the embedder per task).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from clsr.data.faq import FAQ_TASKS
from clsr.data.sources import resolve_data_dir
from clsr.data.sts import STS_TASKS
from clsr.data.transfer import CV_TASKS, TRANSFER_TASKS, TransferData, TransferSplit, load_transfer
from clsr.eval.tables import paper_table

if TYPE_CHECKING:  # not imported at run time: joblib workers import this module and need no torch
    from clsr.eval.embed import Embedder

SEED = 1111
MAX_ITER = 2000  # L-BFGS on raw (unnormalised) embeddings with C up to 32 needs more than the default 100
TASK_GROUPS = {"sts": STS_TASKS, "transfer": TRANSFER_TASKS, "faq": FAQ_TASKS}
DISPLAY_NAMES = {
    "mr": "MR",
    "cr": "CR",
    "subj": "SUBJ",
    "mpqa": "MPQA",
    "sst2": "SST",
    "trec": "TREC",
    "mrpc": "MRPC",
}


@dataclass(frozen=True)
class Mode:
    folds: int  # outer and inner folds (MR/CR/SUBJ/MPQA), CV folds (TREC/MRPC)
    c_grid: tuple[float, ...]  # MR/CR/SUBJ/MPQA and SST-2 (SentEval: 2^-2 … 2^3)
    kfold_c_grid: tuple[float, ...]  # TREC and MRPC (SentEval: 2^-1 … 2^5)


MODES: dict[str, Mode] = {
    "test": Mode(10, tuple(2.0**t for t in range(-2, 4)), tuple(2.0**t for t in range(-1, 6))),
    "fast": Mode(5, (2.0**-1, 2.0**1, 2.0**3), (2.0**-1, 2.0**1, 2.0**3, 2.0**5)),
}


def split_eval_tasks(tasks: str | Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Groups (``sts``, ``transfer``, ``faq``) and task names → (STS tasks, transfer tasks, FAQ entries).

    STS and transfer groups are expanded; FAQ entries are kept as given (``faq`` stays ``faq``, for
    :func:`clsr.eval.faq.evaluate_faq` skips group members whose data is missing). Each list is
    de-duplicated. A string is read as a comma-separated list. Unknown names raise ValueError with
    every allowed name.
    """
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    sts: list[str] = []
    transfer: list[str] = []
    faq: list[str] = []
    for task in tasks:
        name = task.strip()
        members = (name,) if name == "faq" else TASK_GROUPS.get(name, (name,))
        for member in members:
            buckets = ((sts, STS_TASKS), (transfer, TRANSFER_TASKS), (faq, ("faq", *FAQ_TASKS)))
            bucket = next((b for b, known in buckets if member in known), None)
            if bucket is None:
                allowed = ", ".join([*TASK_GROUPS, *STS_TASKS, *TRANSFER_TASKS, *FAQ_TASKS])
                raise ValueError(f"unknown evaluation task {task!r}; allowed: {allowed}")
            if member not in bucket:
                bucket.append(member)
    return sts, transfer, faq


def split_tasks(tasks: str | Iterable[str]) -> tuple[list[str], list[str]]:
    """(STS tasks, transfer tasks) as :func:`split_eval_tasks`; FAQ names raise (use that function)."""
    sts, transfer, faq = split_eval_tasks(tasks)
    if faq:
        raise ValueError(
            f"{', '.join(faq)}: FAQ retrieval is scored by clsr.eval.faq.evaluate_faq "
            "(split_eval_tasks returns the FAQ entries)"
        )
    return sts, transfer


def expand_transfer_tasks(tasks: str | Iterable[str]) -> list[str]:
    sts, transfer = split_tasks(tasks)
    if sts:
        raise ValueError(f"{', '.join(sts)}: STS tasks are scored by clsr.eval.sts.evaluate_sts")
    return transfer


@dataclass
class TransferScore:
    task: str
    acc: float  # test accuracy × 100 (MR/CR/SUBJ/MPQA: mean over the outer folds) — the reported number
    devacc: float  # validation accuracy × 100 of the chosen C (inner-CV / CV / dev)
    chosen_c: list[float]  # one C per outer fold (MR/CR/SUBJ/MPQA), else one value
    sizes: dict[str, int]  # rows per split actually used ("all" for the CV tasks)
    f1: float | None = None  # MRPC: test F1 × 100 of the paraphrase class
    mode: str = "test"
    embed_seconds: float = 0.0
    classify_seconds: float = 0.0
    fits: int = 0  # logistic regressions trained
    unconverged_fits: int = 0  # fits that hit MAX_ITER (a warning is raised when any did)


def stratified_subsample(labels: np.ndarray, n: int, seed: int = SEED) -> np.ndarray:
    """Sorted indices of a seeded subsample of ``n`` rows keeping the class proportions.

    Each class gets ⌊n·p⌋ rows, the remaining rows go to the largest remainders, at least one row per
    class when ``n`` allows. ``n >= len(labels)`` returns every index.
    """
    labels = np.asarray(labels)
    if n >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / len(labels)
    take = np.floor(exact).astype(int)
    if n >= len(classes):
        take = np.maximum(take, 1)
    for i in np.argsort(-(exact - np.floor(exact)), kind="stable"):
        if take.sum() >= n:
            break
        take[i] += take[i] < counts[i]
    while take.sum() > n:  # the at-least-one rule overshot: trim the largest classes
        take[np.argmax(take)] -= 1
    chosen = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)]
    return np.sort(np.concatenate(chosen))


def mrpc_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """SentEval's MRPC pair features: ``[|u - v|, u * v]`` (2·d columns)."""
    return np.concatenate([np.abs(u - v), u * v], axis=1)


def _senteval_order(split: TransferSplit) -> np.ndarray:
    """SentEval sorts each split by (token count, label) — MRPC by (len A, len B, label) — before
    embedding, and that order decides the folds. Python's sort is stable, as SentEval's."""
    labels = split.labels.tolist()
    if split.sentences2 is None:
        keys = [(len(s.split()), y) for s, y in zip(split.sentences, labels, strict=True)]
    else:
        keys = [
            (len(a.split()), len(b.split()), y)
            for a, b, y in zip(split.sentences, split.sentences2, labels, strict=True)
        ]
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def _take(split: TransferSplit, index: np.ndarray) -> TransferSplit:
    pick = index.tolist()
    return TransferSplit(
        split.task,
        split.split,
        [split.sentences[i] for i in pick],
        split.labels[index],
        None if split.sentences2 is None else [split.sentences2[i] for i in pick],
    )


def _prepare(data: TransferData, max_examples: int | None, seed: int) -> dict[str, TransferSplit]:
    prepared = {}
    for name, split in data.splits.items():
        if max_examples is not None:
            split = _take(split, stratified_subsample(split.labels, max_examples, seed))
        prepared[name] = _take(split, _senteval_order(split))
    return prepared


def _embed_task(embed: Embedder, splits: dict[str, TransferSplit]) -> dict[str, np.ndarray]:
    """One embedder call with every distinct sentence of the task; features per split (float64)."""
    texts = [s for split in splits.values() for s in (*split.sentences, *(split.sentences2 or ()))]
    unique = list(dict.fromkeys(texts))
    vectors = np.asarray(embed(unique), dtype=np.float64)
    if vectors.ndim != 2 or len(vectors) != len(unique):
        raise ValueError(f"the embedder returned shape {vectors.shape} for {len(unique)} sentences")
    row = {s: i for i, s in enumerate(unique)}
    features = {}
    for name, split in splits.items():
        u = vectors[[row[s] for s in split.sentences]]
        features[name] = (
            u if split.sentences2 is None else mrpc_features(u, vectors[[row[s] for s in split.sentences2]])
        )
    return features


# ---------------------------------------------------------------------------------------- fitting


def _fit_predict(
    X: np.ndarray, y: np.ndarray, train: np.ndarray, evaluate: Sequence[np.ndarray], c: float, seed: int
) -> tuple[list[np.ndarray], bool]:
    """Fit on rows ``train``: predictions for each index array in ``evaluate`` and whether L-BFGS
    converged within MAX_ITER iterations."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # counted and reported by evaluate_transfer
        clf = LogisticRegression(C=c, random_state=seed, max_iter=MAX_ITER)
        clf.fit(X[train], y[train])
    return [clf.predict(X[rows]) for rows in evaluate], bool(np.all(clf.n_iter_ < MAX_ITER))


Job = tuple[np.ndarray, Sequence[np.ndarray], float]  # (train rows, rows to predict, C)


def _fit_batch(
    X: np.ndarray, y: np.ndarray, jobs: list[Job], seed: int
) -> list[tuple[list[np.ndarray], bool]]:
    """Several fits with single-threaded BLAS, so that results do not depend on the thread count."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return [_fit_predict(X, y, train, evaluate, c, seed) for train, evaluate, c in jobs]


class _Runner:
    """Runs batches of independent fits, in this process (n_jobs=1) or over joblib worker processes."""

    def __init__(self, X: np.ndarray, y: np.ndarray, seed: int, n_jobs: int):
        self.X, self.y, self.seed, self.n_jobs = X, y, seed, n_jobs
        self.fits = 0
        self.unconverged = 0

    def __call__(self, jobs: list[Job]) -> list[list[np.ndarray]]:
        workers = min(self.n_jobs, len(jobs))
        if workers <= 1:
            results = _fit_batch(self.X, self.y, jobs, self.seed)
        else:
            from joblib import Parallel, delayed

            # a few chunks per worker: even load, little dispatch overhead; order is kept
            chunks = [jobs[i :: 4 * workers] for i in range(min(len(jobs), 4 * workers))]
            done = Parallel(n_jobs=workers)(
                delayed(_fit_batch)(self.X, self.y, chunk, self.seed) for chunk in chunks
            )
            results = [None] * len(jobs)
            for i, chunk_results in enumerate(done):
                results[i :: len(chunks)] = chunk_results
        self.fits += len(results)
        self.unconverged += sum(not converged for _, converged in results)
        return [preds for preds, _ in results]

    def accuracy(self, pred: np.ndarray, rows: np.ndarray) -> float:
        return float(np.mean(pred == self.y[rows]))


def _folds(y: np.ndarray, rows: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffled stratified k-fold over ``rows`` (global indices in, global indices out)."""
    from sklearn.model_selection import StratifiedKFold

    with warnings.catch_warnings():  # tiny max_examples subsamples: some classes have < k members
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
        return [(rows[tr], rows[te]) for tr, te in splitter.split(np.zeros(len(rows)), y[rows])]


def _best(scores: list[float], grid: Sequence[float]) -> tuple[float, float]:
    i = int(np.argmax(scores))  # first maximum: the smallest C among ties, as SentEval
    return grid[i], scores[i]


def _nested_cv(run: _Runner, mode: Mode, seed: int) -> dict:
    everything = np.arange(len(run.y))
    outer = _folds(run.y, everything, mode.folds, seed)
    inner = [_folds(run.y, train, mode.folds, seed) for train, _ in outer]
    jobs = [(tr, [te], c) for folds in inner for c in mode.c_grid for tr, te in folds]
    preds = iter(run(jobs))
    chosen, dev = [], []
    for folds in inner:
        scores = [
            round(100 * float(np.mean([run.accuracy(next(preds)[0], te) for _, te in folds])), 2)
            for _ in mode.c_grid
        ]
        c, score = _best(scores, mode.c_grid)
        chosen.append(c)
        dev.append(score)
    final = run([(train, [test], c) for (train, test), c in zip(outer, chosen, strict=True)])
    tests = [round(100 * run.accuracy(p[0], test), 2) for p, (_, test) in zip(final, outer, strict=True)]
    return {
        "acc": round(float(np.mean(tests)), 2),
        "devacc": round(float(np.mean(dev)), 2),
        "chosen_c": chosen,
    }


def _kfold(run: _Runner, train: np.ndarray, test: np.ndarray, mode: Mode, seed: int) -> dict:
    folds = _folds(run.y, train, mode.folds, seed)
    preds = iter(run([(tr, [te], c) for c in mode.kfold_c_grid for tr, te in folds]))
    scores = [
        round(100 * float(np.mean([run.accuracy(next(preds)[0], te) for _, te in folds])), 2)
        for _ in mode.kfold_c_grid
    ]
    c, dev = _best(scores, mode.kfold_c_grid)
    (yhat,) = run([(train, [test], c)])[0]
    return {"acc": round(100 * run.accuracy(yhat, test), 2), "devacc": dev, "chosen_c": [c], "yhat": yhat}


def _split(run: _Runner, train: np.ndarray, dev: np.ndarray, test: np.ndarray, mode: Mode) -> dict:
    # SentEval refits train with the chosen C; the fit is deterministic, so the C's own model is reused.
    results = run([(train, [dev, test], c) for c in mode.c_grid])
    scores = [round(100 * run.accuracy(dev_pred, dev), 2) for dev_pred, _ in results]
    i = int(np.argmax(scores))
    return {
        "acc": round(100 * run.accuracy(results[i][1], test), 2),
        "devacc": scores[i],
        "chosen_c": [mode.c_grid[i]],
    }


def _classify(
    task: str,
    features: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    mode: Mode,
    seed: int,
    n_jobs: int,
) -> dict:
    names = list(features)
    X = np.concatenate([features[n] for n in names])
    y = np.concatenate([labels[n] for n in names])
    bounds = np.cumsum([0, *(len(labels[n]) for n in names)])
    rows = {n: np.arange(bounds[i], bounds[i + 1]) for i, n in enumerate(names)}
    run = _Runner(X, y, seed, n_jobs)
    if task in CV_TASKS:
        result = _nested_cv(run, mode, seed)
    elif task == "sst2":
        result = _split(run, rows["train"], rows["dev"], rows["test"], mode)
    else:
        result = _kfold(run, rows["train"], rows["test"], mode, seed)
    if task == "mrpc":
        from sklearn.metrics import f1_score

        result["f1"] = round(100 * float(f1_score(y[rows["test"]], result["yhat"])), 2)
    return result | {"fits": run.fits, "unconverged_fits": run.unconverged}


def default_n_jobs() -> int:
    """Processes for the classifier fits: ``$OMP_NUM_THREADS`` when set (Ray sets it to the CPUs a
    worker was given), else the CPUs this process may use; at most 8."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        wanted = int(os.environ.get("OMP_NUM_THREADS", "")) or available
    except ValueError:
        wanted = available
    return max(1, min(8, wanted, available))


def evaluate_transfer(
    embed: Embedder,
    tasks: str | Iterable[str] = ("transfer",),
    data_dir: str | Path | None = None,
    mode: str = "test",
    seed: int = SEED,
    max_examples: int | None = None,
    n_jobs: int | None = None,
    on_task: Callable[[TransferScore], None] | None = None,
) -> dict[str, TransferScore]:
    """Score ``embed`` on the transfer tasks (``"transfer"`` = all seven) with SentEval's protocol.

    ``mode``: ``"test"`` (the paper protocol, 10 folds) or ``"fast"`` (5 folds, smaller C grids).
    ``max_examples``: cap each split at a seeded stratified subsample of this size (smoke runs).
    ``n_jobs``: classifier processes (default :func:`default_n_jobs`); scores do not depend on it.
    ``on_task`` is called with each score as soon as its task is done (progress output).
    """
    if mode not in MODES:
        raise ValueError(f"unknown transfer mode {mode!r}; allowed: {', '.join(MODES)}")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be at least 1 (given {max_examples})")
    names = expand_transfer_tasks(tasks)
    folder = resolve_data_dir(data_dir)  # explicit folder, else $CLSR_DATA_DIR, else the hub
    jobs = n_jobs if n_jobs is not None else default_n_jobs()
    scores: dict[str, TransferScore] = {}
    for task in names:
        splits = _prepare(load_transfer(task, folder), max_examples, seed)
        started = time.perf_counter()
        features = _embed_task(embed, splits)
        embedded = time.perf_counter()
        result = _classify(task, features, {n: s.labels for n, s in splits.items()}, MODES[mode], seed, jobs)
        scores[task] = TransferScore(
            task=task,
            acc=result["acc"],
            devacc=result["devacc"],
            chosen_c=result["chosen_c"],
            sizes={n: len(s) for n, s in splits.items()},
            f1=result.get("f1"),
            mode=mode,
            embed_seconds=embedded - started,
            classify_seconds=time.perf_counter() - embedded,
            fits=result["fits"],
            unconverged_fits=result["unconverged_fits"],
        )
        if result["unconverged_fits"]:
            warnings.warn(
                f"{task}: {result['unconverged_fits']} of {result['fits']} logistic regressions stopped at "
                f"max_iter={MAX_ITER} before converging",
                stacklevel=2,
            )
        if on_task is not None:
            on_task(scores[task])
    return scores


def transfer_summary_metrics(scores: dict[str, TransferScore], prefix: str = "test_") -> dict[str, float]:
    """Flat metric dict: accuracy per task, MRPC F1, and the plain mean accuracy of the tasks scored."""
    metrics = {f"{prefix}{task}": s.acc for task, s in scores.items()}
    metrics |= {f"{prefix}{task}_f1": s.f1 for task, s in scores.items() if s.f1 is not None}
    if len(scores) > 1:
        metrics[f"{prefix}transfer_avg"] = float(np.mean([s.acc for s in scores.values()]))
    return metrics


def format_transfer_table(scores: dict[str, TransferScore]) -> str:
    """The papers' layout: MR CR SUBJ MPQA SST TREC MRPC Avg. (accuracy; MRPC accuracy, not F1)."""
    return paper_table({DISPLAY_NAMES.get(t, t): s.acc for t, s in scores.items()})
