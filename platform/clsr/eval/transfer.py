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

if TYPE_CHECKING:  # not imported at run time: joblib workers import this module and need no torch
    from clsr.encoders.embed import Embedder

SEED = 1111
# PyTorch fits stepped together at most (fixed: a fit's stack must not depend on n_jobs). With the step
# formed by hand a step costs about 0.2 ms of fixed work plus about 23 µs a fit on one CPU thread, and
# 32 was the fastest of the stack sizes measured (1, 8, 16, 32, 48, 64), at 384-d and test mode's batch
# 64 only: tuned for MiniLM (benchmarks/results/2026-12-02-cpu2).
STACK_FITS = 32
MAX_ITER = 2000  # L-BFGS on raw (unnormalised) embeddings with C up to 32 needs more than the default 100
CLASSIFIERS = ("senteval_pytorch", "liblinear", "lbfgs")
L2_GRID = tuple(10.0**t for t in range(-5, -1))  # SentEval's PyTorch weight decays, every scheme
C_GRID = tuple(2.0**t for t in range(-2, 4))  # SentEval's scikit-learn C: nested CV and SST-2
KFOLD_C_GRID = tuple(2.0**t for t in range(-1, 6))  # SentEval's scikit-learn C: TREC and MRPC
VALIDATION_SPLIT = 0.05  # SentEval's refits hold out this share of the training rows for early stopping
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
class TorchSettings:
    """SentEval's ``classifier`` dict for ``nhid=0`` (``max_epoch`` is SentEval's default)."""

    optim: str  # "adam" or "rmsprop", PyTorch's default hyperparameters (SentEval passes none)
    batch_size: int
    tenacity: int  # rounds without a better validation score tolerated (the next one stops)
    epoch_size: int  # passes over the training rows per round
    max_epoch: int = 200


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


@dataclass(frozen=True)
class Job:
    """One classifier fit: train on ``train``, predict every index array in ``evaluate``."""

    train: np.ndarray
    evaluate: Sequence[np.ndarray]
    reg: float  # C (scikit-learn) or weight decay (PyTorch)
    valid: np.ndarray | None = None  # PyTorch early-stopping rows; None: a seeded 5 % of ``train``


@dataclass(frozen=True)
class FitSettings:
    """What every fit of one task shares."""

    classifier: str
    torch: TorchSettings
    n_classes: int
    seed: int = SEED


def _sklearn_fit_predict(X: np.ndarray, y: np.ndarray, job: Job, fit: FitSettings) -> tuple[list, bool]:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # counted and reported by evaluate_transfer
        if fit.classifier == "liblinear":  # scikit-learn's defaults of SentEval's era: tol 1e-4, max_iter 100
            base = LogisticRegression(C=job.reg, solver="liblinear", random_state=fit.seed)
            # today's liblinear wrapper is binary only; SentEval's ran one-vs-rest inside liblinear
            clf = OneVsRestClassifier(base) if fit.n_classes > 2 else base
        else:
            clf = LogisticRegression(C=job.reg, random_state=fit.seed, max_iter=MAX_ITER)
        clf.fit(X[job.train], y[job.train])
    fitted = getattr(clf, "estimators_", [clf])
    converged = all(np.all(m.n_iter_ < m.max_iter) for m in fitted)
    return [clf.predict(X[rows]) for rows in job.evaluate], converged


def _torch_fit_predict(X, y: np.ndarray, job: Job, fit: FitSettings) -> tuple[list, bool]:
    """SentEval's ``PyTorchClassifier.fit`` with ``nhid=0``; ``X`` is a float32 tensor of every row."""
    return _torch_fit_group(X, y, [job], fit)[0]


def lockstep_key(job: Job) -> tuple[int, bool, float]:
    """Fits that step in lockstep: SentEval reseeds numpy for every classifier, so fits with the same
    training size and validation scheme draw the same shuffles, and with the same penalty take the
    same optimizer (one stacked optimizer then does each fit's element-wise update)."""
    return len(job.train), job.valid is None, job.reg


def _torch_fit_group(X, y: np.ndarray, jobs: list[Job], fit: FitSettings) -> list[tuple[list, bool]]:
    """SentEval's ``PyTorchClassifier.fit`` (``nhid=0``) for fits of one :func:`lockstep_key`, stepped
    together: one stacked linear layer ``[fits, classes, dim]`` instead of a Python loop per fit
    (written here: SentEval and PyTorch fit one classifier at a time). Each fit keeps its own
    validation rows, best state and early stop; a stopped fit leaves the stack. The steps' gradients
    and updates are formed by hand, bit for bit autograd's and ``torch.optim``'s
    (:mod:`clsr.eval.stacked_steps`)."""
    import torch

    from clsr.eval.stacked_steps import StackedOptimizer, gradients

    s = fit.torch
    rng = np.random.RandomState(fit.seed)  # SentEval reseeds numpy's global RNG for every classifier
    trains, valids = [job.train for job in jobs], [job.valid for job in jobs]
    if jobs[0].valid is None:  # SentEval's validation_split: the first 5 % of a seeded permutation
        order = rng.permutation(len(trains[0]))
        cut = int(VALIDATION_SPLIT * len(order))
        # our choice: under 20 rows SentEval's 5 % is empty (it would divide by zero); use train
        trains, valids = zip(
            *[(t[order[cut:]], t[order[:cut]]) if cut else (t[order], t[order]) for t in trains], strict=True
        )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's generator
        torch.manual_seed(fit.seed)
        init = torch.nn.Linear(X.shape[1], fit.n_classes)
    count, device = len(jobs), X.device
    weight = init.weight.detach().to(device).expand(count, -1, -1).clone()
    bias = init.bias.detach().to(device).expand(count, -1).clone()
    optimizer = StackedOptimizer(s.optim, weight, bias, weight_decay=jobs[0].reg)
    labels = torch.from_numpy(y).to(device)
    train_rows = torch.from_numpy(np.stack(trains)).to(device)  # [fits, rows]
    valid_rows = [torch.from_numpy(rows).to(device) for rows in valids]
    # one buffer for every batch's gathered rows: a fresh multi-MB tensor per step is a new mmap that
    # page-faults on every touch (bit-identical, 7 % off a CPU task's fits)
    gathered = torch.empty(count * s.batch_size, X.shape[1], dtype=X.dtype, device=device)
    live = list(range(count))  # the fits still training, in stack order
    best, best_state, misses = [-1] * count, [None] * count, [0] * count
    stopped = [False] * count
    epoch = 0
    while epoch <= s.max_epoch and live:
        for _ in range(s.epoch_size):
            shuffled = torch.from_numpy(rng.permutation(train_rows.shape[1])).to(device)
            for batch in shuffled.split(s.batch_size):
                rows = train_rows.index_select(1, batch)  # index_select: 5× advanced indexing's speed
                flat = rows.view(-1)
                inputs = torch.index_select(X, 0, flat, out=gathered[: flat.numel()]).view(*rows.shape, -1)
                targets = labels.index_select(0, flat).view(rows.shape)
                # each fit's batch-mean cross-entropy, as SentEval's loss
                optimizer.step(gradients(inputs, targets, optimizer.weight, optimizer.bias))
        epoch += s.epoch_size
        keep = []
        with torch.no_grad():
            for slot, f in enumerate(live):
                rows = valid_rows[f]
                w, b = optimizer.weight[slot], optimizer.bias[slot]
                logits = torch.nn.functional.linear(X[rows], w, b)
                correct = int((logits.argmax(1) == labels[rows]).sum())
                if correct > best[f]:
                    best[f], best_state[f] = correct, (w.clone(), b.clone())
                elif misses[f] >= s.tenacity:  # SentEval counts every round without improvement
                    stopped[f] = True
                    continue
                else:
                    misses[f] += 1
                keep.append(slot)
        if len(keep) < len(live):
            _keep_fits(optimizer, keep)
            live = [live[slot] for slot in keep]
            train_rows = train_rows[keep]
    results = []
    with torch.no_grad():
        for f, job in enumerate(jobs):
            w, b = best_state[f]
            preds = [
                torch.nn.functional.linear(X[torch.from_numpy(r).to(device)], w, b).argmax(1).cpu().numpy()
                for r in job.evaluate
            ]
            results.append((preds, stopped[f]))
    return results


def _keep_fits(optimizer, keep: list[int]) -> None:
    """The stack and its optimizer's moments cut to the fits ``keep`` (stack slots)."""
    import torch

    optimizer.keep(torch.tensor(keep, dtype=torch.long, device=optimizer.weight.device))


def fit_predict(X, y: np.ndarray, job: Job, fit: FitSettings) -> tuple[list[np.ndarray], bool]:
    """Predictions for each index array of ``job.evaluate`` and whether the fit ended before its
    cap (iterations for scikit-learn, ``max_epoch`` for PyTorch). ``X``: float64 array, or for
    ``senteval_pytorch`` a float32 tensor (SentEval casts the features to float32)."""
    if fit.classifier == "senteval_pytorch":
        return _torch_fit_predict(X, y, job, fit)
    return _sklearn_fit_predict(X, y, job, fit)


def _is_cuda(device: str | None) -> bool:
    return device is not None and str(device).startswith("cuda")


def _fit_stacks(
    X: np.ndarray, y: np.ndarray, stacked: list[list[Job]], fit: FitSettings, device: str | None = None
) -> list[list[tuple[list, bool]]]:
    """Each stack's fits (see :func:`stacks`) with one thread, so that results do not depend on the
    thread count; PyTorch fits of a stack run as one, on ``device`` when given (default: the CPU)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        if fit.classifier != "senteval_pytorch":
            return [[fit_predict(X, y, job, fit) for job in stack] for stack in stacked]
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            features = torch.from_numpy(X.astype(np.float32)).to(device or "cpu")
            return [_torch_fit_group(features, y, stack, fit) for stack in stacked]
        finally:
            torch.set_num_threads(threads)


def stacks(jobs: Sequence[Job]) -> list[list[int]]:
    """Indices of ``jobs`` in the stacks they are fitted in: grouped by :func:`lockstep_key` (first-seen
    order), each group cut into the fewest stacks of at most ``STACK_FITS``, of near-equal size (58 fits:
    29 and 29, not 32 and 26). A fit's stack, hence its arithmetic, is then the same whether the fits run
    in one process, on a GPU, or spread over any number of workers."""
    groups: dict[tuple, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(lockstep_key(job), []).append(i)
    return [
        piece.tolist()
        for group in groups.values()
        for piece in np.array_split(np.array(group), -(-len(group) // STACK_FITS))
    ]


class _Runner:
    """Runs batches of independent fits, in this process (n_jobs=1) or over joblib worker processes."""

    def __init__(
        self, X: np.ndarray, y: np.ndarray, fit: FitSettings, n_jobs: int, device: str | None = None
    ):
        self.X, self.y, self.fit, self.n_jobs = X, y, fit, n_jobs
        torch_path = fit.classifier == "senteval_pytorch"
        # PyTorch fits on a GPU: every stack in this process (one CUDA context, no worker processes)
        self.device = device if torch_path and _is_cuda(device) else None
        self.grid = L2_GRID if torch_path else C_GRID  # nested CV and SST-2
        self.kfold_grid = L2_GRID if torch_path else KFOLD_C_GRID  # TREC and MRPC
        self.fits = 0
        self.unconverged = 0

    def __call__(self, jobs: list[Job]) -> list[list[np.ndarray]]:
        pieces = stacks(jobs)  # cut here, once: every path fits the same stacks
        workers = min(self.n_jobs, len(pieces))
        if self.device is not None or workers <= 1:
            parts = [pieces]
            done = [
                _fit_stacks(self.X, self.y, [[jobs[i] for i in p] for p in pieces], self.fit, self.device)
            ]
        else:
            from joblib import Parallel, delayed

            # a few parts per worker (even load, little dispatch overhead), each of whole stacks
            bounds = np.array_split(np.arange(len(pieces)), min(len(pieces), 4 * workers))
            parts = [[pieces[k] for k in part] for part in bounds]
            done = Parallel(n_jobs=workers)(
                delayed(_fit_stacks)(self.X, self.y, [[jobs[i] for i in p] for p in part], self.fit)
                for part in parts
            )
        results: list = [None] * len(jobs)
        for part, part_done in zip(parts, done, strict=True):
            for piece, piece_done in zip(part, part_done, strict=True):
                for i, result in zip(piece, piece_done, strict=True):
                    results[i] = result
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
    i = int(np.argmax(scores))  # first maximum: the first grid value among ties, as SentEval
    return grid[i], scores[i]


def _nested_cv(run: _Runner, folds: int, seed: int) -> dict:
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


def _kfold(run: _Runner, train: np.ndarray, test: np.ndarray, folds: int, seed: int) -> dict:
    split = _folds(run.y, train, folds, seed)
    preds = iter(run([Job(tr, [te], reg, te) for reg in run.kfold_grid for tr, te in split]))
    scores = [
        round(100 * float(np.mean([run.accuracy(next(preds)[0], te) for _, te in split])), 2)
        for _ in run.kfold_grid
    ]
    reg, dev = _best(scores, run.kfold_grid)
    (yhat,) = run([Job(train, [test], reg)])[0]
    return {"acc": round(100 * run.accuracy(yhat, test), 2), "devacc": dev, "chosen_c": [reg], "yhat": yhat}


def _split(run: _Runner, train: np.ndarray, dev: np.ndarray, test: np.ndarray) -> dict:
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
    run = _Runner(X, y, fit, n_jobs, device)
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
