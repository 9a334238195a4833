"""SentEval's classifier fits on frozen features (``clsr.eval.transfer``'s module doc has the protocol): one
fit, a stack of PyTorch fits stepped in lockstep, and the runner that spreads stacks over processes or
puts them on a GPU. Imports no torch at module level: joblib workers import this module."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEED = 1111
# PyTorch fits stepped together at most (fixed: a fit's stack must not depend on n_jobs). With the step
# formed by hand a step costs about 0.2 ms of fixed work plus about 23 µs a fit on one CPU thread, and
# 32 was the fastest of the stack sizes measured (1, 8, 16, 32, 48, 64), at 384-d and test mode's batch
# 64 only: tuned for MiniLM (benchmarks/results/2026-12-02-cpu2).
STACK_FITS = 32
MAX_ITER = 2000  # L-BFGS on raw (unnormalised) embeddings with C up to 32 needs more than the default 100
L2_GRID = tuple(10.0**t for t in range(-5, -1))  # SentEval's PyTorch weight decays, every scheme
C_GRID = tuple(2.0**t for t in range(-2, 4))  # SentEval's scikit-learn C: nested CV and SST-2
KFOLD_C_GRID = tuple(2.0**t for t in range(-1, 6))  # SentEval's scikit-learn C: TREC and MRPC
VALIDATION_SPLIT = 0.05  # SentEval's refits hold out this share of the training rows for early stopping


@dataclass(frozen=True)
class TorchSettings:
    """SentEval's ``classifier`` dict for ``nhid=0`` (``max_epoch`` is SentEval's default)."""

    optim: str  # "adam" or "rmsprop", PyTorch's default hyperparameters (SentEval passes none)
    batch_size: int
    tenacity: int  # rounds without a better validation score tolerated (the next one stops)
    epoch_size: int  # passes over the training rows per round
    max_epoch: int = 200


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


class Runner:
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
