"""SentEval transfer tasks: logistic regression on frozen embeddings (methods.md §8.2).

Classifier (``classifier=``), each one of SentEval's settings:

* ``senteval_pytorch`` (default; SimCSE's ``usepytorch=True``, ``nhid=0``): SentEval's
  ``PyTorchClassifier`` — one seeded ``nn.Linear`` on float32 features, softmax cross-entropy, L2
  penalty as the optimizer's ``weight_decay`` chosen from {1e-5, 1e-4, 1e-3, 1e-2}. "test" mode:
  Adam, batch 64, tenacity 5, epoch_size 4, max_epoch 200; "fast" = SimCSE's "fasttest": RMSprop,
  batch 128, tenacity 3, epoch_size 2. Training runs in rounds of ``epoch_size`` shuffled passes,
  scores the validation rows after each round, keeps the best-scoring model, and stops at the
  (tenacity + 1)-th round without improvement (SentEval never resets that count) or after max_epoch.
  Validation rows: the fold being scored (inner CV, k-fold CV), SST-2's dev set, else (refits) a
  seeded 5 % of the training rows (SentEval's ``validation_split=0.05``). The cross-entropy is the
  batch mean: SentEval sets ``loss_fn.size_average = False`` after building the loss, which PyTorch
  ≥ 0.4.1 (SimCSE ran 1.7) ignores, so the numbers SimCSE reports come from the mean.
* ``liblinear`` (SentEval's ``usepytorch=False`` as it ran in 2017-2020): scikit-learn
  ``LogisticRegression(C, solver="liblinear")`` with its default tol and max_iter, one-vs-rest for
  TREC's six classes; C from {2^-2, …, 2^3} (nested CV, SST-2) or {2^-1, …, 2^5} (TREC, MRPC).
* ``lbfgs``: the same C grids with today's scikit-learn default (L-BFGS, multinomial), kept because it
  is fast; not a setting any paper reports.

Schemes (SentEval's ``tools/validation.py``, seed 1111):

* Features are the frozen sentence embeddings as returned by the encoder: no standardisation, no
  normalisation (SentEval does none). MRPC uses ``[|u - v|, u * v]`` of its two sentences.
* MR, CR, SUBJ, MPQA (``InnerKFoldClassifier``): outer stratified 10-fold CV (shuffled, seed 1111);
  inside each outer training fold an inner stratified 10-fold CV (same seed) picks the penalty;
  refit on the outer training fold with it and score the outer test fold. Reported: the mean of the
  ten test accuracies.
* TREC, MRPC (``KFoldClassifier``): stratified 10-fold CV on the training set picks the penalty;
  refit on the whole training set; score the fixed test set (MRPC also F1 of class 1).
* SST-2 (``SplitClassifier``): the penalty with the best dev accuracy, trained on train; score test.
* As in SentEval: rows are ordered by (token count, label) before the folds are drawn (SentEval sorts
  to reduce padding, which fixes which rows land in which fold), the mean CV accuracy is rounded to
  two decimals before the arg-max (ties go to the first grid value), and accuracies are ×100.
* Every fit runs with one thread, and fits are spread over ``n_jobs`` processes, so the scores do
  not depend on ``n_jobs``.
* PyTorch fits that share a training size, a validation scheme and a penalty run as one stacked
  linear layer (written here: SentEval and PyTorch fit one classifier at a time). SentEval reseeds
  every classifier, so such fits draw the same shuffles and take their optimizer steps in lockstep;
  each keeps its own validation rows, best state and early stop. On the CPU its predictions equal
  those of its fit run alone, and do not depend on ``n_jobs`` (tested; a stack is at most
  ``STACK_FITS`` fits, cut the same way in every path). On one CPU thread that was 3-5× faster than a
  loop of fits with autograd, before the step was formed by hand (``clsr.eval.stacked_steps``). On a
  GPU (``device``) a fit's last bits may depend on its stack's size.

``mode="fast"`` (SimCSE's "fasttest", for training-time or smoke runs): 5 folds everywhere, the
fasttest PyTorch settings above, the same penalty grids. ``max_examples`` caps every split at a
seeded stratified subsample (CI smoke runs). Each distinct sentence of a task is embedded once.
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

from clsr.data.sources import resolve_data_dir
from clsr.data.tasks import split_eval_tasks
from clsr.data.transfer import CV_TASKS, TransferData, TransferSplit, load_transfer
from clsr.eval.tables import paper_table
from clsr.eval.transfer_fits import MAX_ITER, SEED, FitSettings, Job, Runner, TorchSettings

if TYPE_CHECKING:  # not imported at run time: joblib workers import this module and need no torch
    from clsr.encoders.embed import Embedder

CLASSIFIERS = ("senteval_pytorch", "liblinear", "lbfgs")
# What a task's classifier fits cost relative to each other (thousands of row-fits in "test" mode:
# fits × training rows, MRPC's features twice as wide); how ranks share the final evaluation.
FIT_COST = {"mr": 3550, "cr": 1257, "subj": 3330, "mpqa": 3531, "sst2": 269, "trec": 202, "mrpc": 302}


def shares(tasks: Sequence[str], ranks: int) -> list[list[str]]:
    """``tasks`` split over ``ranks`` by their fit cost: the costliest first, each to the rank with the
    least so far (ties: the lower rank); each share keeps the tasks' order."""
    load = [0] * ranks
    share_of: dict[str, int] = {}
    for task in sorted(tasks, key=lambda t: -FIT_COST.get(t, 1000)):
        rank = min(range(ranks), key=lambda r: load[r])
        share_of[task], load[rank] = rank, load[rank] + FIT_COST.get(task, 1000)
    return [[t for t in tasks if share_of[t] == r] for r in range(ranks)]


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
    torch: TorchSettings


MODES: dict[str, Mode] = {  # SimCSE's evaluation.py: "test" and "fasttest"
    "test": Mode(10, TorchSettings("adam", batch_size=64, tenacity=5, epoch_size=4)),
    "fast": Mode(5, TorchSettings("rmsprop", batch_size=128, tenacity=3, epoch_size=2)),
}


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
    chosen_c: list[float]  # C or weight decay: one per outer fold (MR/CR/SUBJ/MPQA), else one value
    sizes: dict[str, int]  # rows per split actually used ("all" for the CV tasks)
    f1: float | None = None  # MRPC: test F1 × 100 of the paraphrase class
    mode: str = "test"
    classifier: str = "senteval_pytorch"
    embed_seconds: float = 0.0
    classify_seconds: float = 0.0
    fits: int = 0  # logistic regressions trained
    unconverged_fits: int = 0  # fits that hit their cap: max_iter (warned), PyTorch max_epoch


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


def capped_splits(data: TransferData, max_examples: int | None, seed: int = SEED) -> dict[str, TransferSplit]:
    """Each split of ``data`` as scored: a seeded stratified subsample of ``max_examples`` (None: whole)."""
    if max_examples is None:
        return dict(data.splits)
    return {n: _take(s, stratified_subsample(s.labels, max_examples, seed)) for n, s in data.splits.items()}


def _prepare(data: TransferData, max_examples: int | None, seed: int) -> dict[str, TransferSplit]:
    return {name: _take(s, _senteval_order(s)) for name, s in capped_splits(data, max_examples, seed).items()}


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


# ---------------------------------------------------- schemes (the fits: clsr.eval.transfer_fits)


def _folds(y: np.ndarray, rows: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffled stratified k-fold over ``rows`` (global indices in, global indices out)."""
    from sklearn.model_selection import StratifiedKFold

    with warnings.catch_warnings():  # tiny max_examples subsamples: some classes have < k members
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
        return [(rows[tr], rows[te]) for tr, te in splitter.split(np.zeros(len(rows)), y[rows])]


def _best(scores: list[float], grid: Sequence[float]) -> tuple[float, float]:
    i = int(np.argmax(scores))  # first maximum: the first grid value among ties, as SentEval
    return grid[i], scores[i]


def _nested_cv(run: Runner, folds: int, seed: int) -> dict:
    everything = np.arange(len(run.y))
    outer = _folds(run.y, everything, folds, seed)
    inner = [_folds(run.y, train, folds, seed) for train, _ in outer]
    # SentEval's PyTorch path early-stops on the very inner fold it scores
    jobs = [Job(tr, [te], reg, te) for split in inner for reg in run.grid for tr, te in split]
    preds = iter(run(jobs))
    chosen, dev = [], []
    for split in inner:
        scores = [
            round(100 * float(np.mean([run.accuracy(next(preds)[0], te) for _, te in split])), 2)
            for _ in run.grid
        ]
        reg, score = _best(scores, run.grid)
        chosen.append(reg)
        dev.append(score)
    final = run([Job(train, [test], reg) for (train, test), reg in zip(outer, chosen, strict=True)])
    tests = [round(100 * run.accuracy(p[0], test), 2) for p, (_, test) in zip(final, outer, strict=True)]
    return {
        "acc": round(float(np.mean(tests)), 2),
        "devacc": round(float(np.mean(dev)), 2),
        "chosen_c": chosen,
    }


def _kfold(run: Runner, train: np.ndarray, test: np.ndarray, folds: int, seed: int) -> dict:
    split = _folds(run.y, train, folds, seed)
    preds = iter(run([Job(tr, [te], reg, te) for reg in run.kfold_grid for tr, te in split]))
    scores = [
        round(100 * float(np.mean([run.accuracy(next(preds)[0], te) for _, te in split])), 2)
        for _ in run.kfold_grid
    ]
    reg, dev = _best(scores, run.kfold_grid)
    (yhat,) = run([Job(train, [test], reg)])[0]
    return {"acc": round(100 * run.accuracy(yhat, test), 2), "devacc": dev, "chosen_c": [reg], "yhat": yhat}


def _split(run: Runner, train: np.ndarray, dev: np.ndarray, test: np.ndarray) -> dict:
    # SentEval refits train with the chosen penalty (PyTorch: early-stopped on dev again); every
    # fit is deterministic, so the chosen penalty's own model is reused.
    results = run([Job(train, [dev, test], reg, dev) for reg in run.grid])
    scores = [round(100 * run.accuracy(dev_pred, dev), 2) for dev_pred, _ in results]
    i = int(np.argmax(scores))
    return {
        "acc": round(100 * run.accuracy(results[i][1], test), 2),
        "devacc": scores[i],
        "chosen_c": [run.grid[i]],
    }


def classify(
    task: str,
    features: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    mode: str = "test",
    classifier: str = "senteval_pytorch",
    seed: int = SEED,
    n_jobs: int = 1,
    n_classes: int | None = None,
    device: str | None = None,
) -> dict:
    """SentEval's scheme for ``task`` on given features (splits as :func:`load_transfer` names them):
    ``acc``, ``devacc``, ``chosen_c`` (C or weight decay), ``fits``, ``unconverged_fits``, MRPC ``f1``."""
    names = list(features)
    X = np.concatenate([features[n] for n in names])
    y = np.concatenate([labels[n] for n in names]).astype(np.int64)
    bounds = np.cumsum([0, *(len(labels[n]) for n in names)])
    rows = {n: np.arange(bounds[i], bounds[i + 1]) for i, n in enumerate(names)}
    fit = FitSettings(classifier, MODES[mode].torch, n_classes or int(y.max()) + 1, seed)
    run = Runner(X, y, fit, n_jobs, device)
    folds = MODES[mode].folds
    if task in CV_TASKS:
        result = _nested_cv(run, folds, seed)
    elif task == "sst2":
        result = _split(run, rows["train"], rows["dev"], rows["test"])
    else:
        result = _kfold(run, rows["train"], rows["test"], folds, seed)
    if task == "mrpc":
        from sklearn.metrics import f1_score

        result["f1"] = round(100 * float(f1_score(y[rows["test"]], result["yhat"])), 2)
    result.pop("yhat", None)
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
    classifier: str = "senteval_pytorch",
    device: str | None = None,
) -> dict[str, TransferScore]:
    """Score ``embed`` on the transfer tasks (``"transfer"`` = all seven) with SentEval's protocol.

    ``mode``: ``"test"`` (the paper protocol, 10 folds) or ``"fast"`` (SimCSE's "fasttest": 5 folds).
    ``classifier``: ``senteval_pytorch`` (SimCSE's setting), ``liblinear`` or ``lbfgs`` (module doc).
    ``max_examples``: cap each split at a seeded stratified subsample of this size (smoke runs).
    ``n_jobs``: classifier processes (default :func:`default_n_jobs`); scores do not depend on it.
    ``on_task`` is called with each score as soon as its task is done (progress output).
    ``device``: a CUDA device runs ``senteval_pytorch``'s fits there, in this process (``n_jobs`` unused);
    None or a CPU: one thread per fit over ``n_jobs`` processes.
    """
    if mode not in MODES:
        raise ValueError(f"unknown transfer mode {mode!r}; allowed: {', '.join(MODES)}")
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown transfer classifier {classifier!r}; allowed: {', '.join(CLASSIFIERS)}")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be at least 1 (given {max_examples})")
    names = expand_transfer_tasks(tasks)
    folder = resolve_data_dir(data_dir)  # explicit folder, else $CLSR_DATA_DIR, else the hub
    jobs = n_jobs if n_jobs is not None else default_n_jobs()
    scores: dict[str, TransferScore] = {}
    for task in names:
        data = load_transfer(task, folder)
        splits = _prepare(data, max_examples, seed)
        started = time.perf_counter()
        features = _embed_task(embed, splits)
        embedded = time.perf_counter()
        labels = {n: s.labels for n, s in splits.items()}
        result = classify(task, features, labels, mode, classifier, seed, jobs, data.num_classes, device)
        scores[task] = TransferScore(
            task=task,
            acc=result["acc"],
            devacc=result["devacc"],
            chosen_c=result["chosen_c"],
            sizes={n: len(s) for n, s in splits.items()},
            f1=result.get("f1"),
            mode=mode,
            classifier=classifier,
            embed_seconds=embedded - started,
            classify_seconds=time.perf_counter() - embedded,
            fits=result["fits"],
            unconverged_fits=result["unconverged_fits"],
        )
        if result["unconverged_fits"] and classifier != "senteval_pytorch":  # max_epoch is SentEval's norm
            cap = MAX_ITER if classifier == "lbfgs" else 100
            warnings.warn(
                f"{task}: {result['unconverged_fits']} of {result['fits']} logistic regressions stopped at "
                f"max_iter={cap} before converging",
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
