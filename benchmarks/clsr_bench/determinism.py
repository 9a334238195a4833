"""``trainer.deterministic: true`` held to its promise on this machine's device: the same trial run twice,
and a trial SIGKILLed after its first checkpoint and resumed from it against one never interrupted. Each
pair must end on bitwise-equal final checkpoints (model, optimiser, scheduler, random states, best
weights: ``torch.equal``), the same ``clsr.weights_sha256`` tag, and identical MLflow metric histories
(the timings, which no two runs share, aside).

The CPU test runs it in CI (tests/unit/train/test_determinism.py); ``benchmarks/gpu_study_check.sh``
runs it on a lent GPU: ``python -m clsr_bench.determinism --folder DIR --json OUT.json`` (exit 1 on a
difference). The trial is tiny: MiniLM (dropout on), six steps of supervised SimCSE, a dev evaluation
and a checkpoint every two steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# what a rerun may change: wall-clock figures, system metrics, the resume's own marker, and the bytes of
# checkpoints (each holds the points MLflow had not taken yet when it was written)
UNSHARED = re.compile(r"samples_per_s|trial_.*|system/.*|resumed_from_step|checkpoint_(s|wait_s|bytes)")
PAUSED = "paused"  # the file the killed run writes once its first checkpoint is in place


def tiny_trial(model: str = "minilm", steps: int = 6) -> Any:
    from clsr.config.trial import TrialConfig

    return TrialConfig.model_validate(
        {
            "model": {"name": model, "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 8 * steps},
            "trainer": {
                "batch_size": 8,
                "max_steps": steps,
                "eval_steps": 2,
                "log_every": 1,
                "lr": 1e-4,
                "deterministic": True,
            },  # fmt: skip
            "method": {"name": "simcse_sup"},
            "eval": {
                "dev_tasks": ["stsb"],
                "tasks": [],
                "sts_max_pairs": 20,
                "alignment_uniformity": False,
                "log_model": False,
            },  # fmt: skip
        }
    )


@dataclass
class Finished:
    """What a trial left: its last checkpoint's files and its MLflow run's metrics and tags."""

    state: dict[str, Any]
    best: dict[str, Any] | None
    histories: dict[str, list[tuple[int, float]]]
    tags: dict[str, str]


def new_run(uri: str, folder: Path) -> str:
    """A run named after ``folder`` in experiment ``determinism`` (its artifacts beside the folder)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name("determinism")
    artifacts = str(folder.parent.resolve() / "artifacts")
    experiment = found.experiment_id if found else client.create_experiment("determinism", artifacts)
    return client.create_run(experiment, run_name=folder.name).info.run_id


def train(trial: Any, checkpoints: Path, uri: str, run_id: str, resume_from: Path | None = None) -> Any:
    """``fit`` in this process with a local session (from ``resume_from``'s checkpoint when given)."""
    from clsr.tracking.run_logger import TrackingTarget
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    session = LocalSession(checkpoints)
    session.latest = resume_from
    fit(trial, session, tracking=TrackingTarget(uri, run_id))
    return session


def finished(session: Any, uri: str, run_id: str) -> Finished:
    from mlflow.tracking import MlflowClient

    from clsr.encoders import checkpoint_files

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    histories = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    best = session.latest / "best_model.pt"
    return Finished(
        state=checkpoint_files.load_tensors(session.latest / "state.pt"),
        best=checkpoint_files.load_tensors(best) if best.exists() else None,
        histories=histories,
        tags={k: v for k, v in run.data.tags.items() if k.startswith("clsr.")},
    )


def run_whole(trial: Any, folder: Path, uri: str) -> Finished:
    """The trial from start to end, never interrupted."""
    run_id = new_run(uri, folder)
    return finished(train(trial, folder / "checkpoints", uri, run_id), uri, run_id)


def run_killed_and_resumed(model: str, folder: Path, uri: str, limit_s: float = 600) -> Finished:
    """The trial in a child process, SIGKILLed once its first checkpoint is written (before the next
    step), then resumed in this process from that checkpoint into the same MLflow run."""
    run_id = new_run(uri, folder)
    command = [sys.executable, "-m", "clsr_bench.determinism", "--child", str(folder), uri, run_id, model]
    child = subprocess.Popen(command, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    marker, deadline = folder / PAUSED, time.monotonic() + limit_s
    while not marker.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise RuntimeError(f"the child trial ended (rc {child.returncode}) before its first checkpoint")
        time.sleep(0.1)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    checkpoint = Path(marker.read_text())
    session = train(tiny_trial(model), folder / "resumed", uri, run_id, resume_from=checkpoint)
    return finished(session, uri, run_id)


def _child(folder: Path, uri: str, run_id: str, model: str) -> None:
    """The run to be killed: it stops for good after its first checkpoint is in place."""
    from clsr.train.session import LocalSession

    class Paused(LocalSession):
        def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None = None) -> None:
            super().report(metrics, checkpoint_dir)
            if checkpoint_dir is not None:
                (folder / PAUSED).write_text(str(self.latest))
                time.sleep(3600)  # SIGKILL comes here

    from clsr.tracking.run_logger import TrackingTarget
    from clsr.train.loop import fit

    fit(tiny_trial(model), Paused(folder / "checkpoints"), tracking=TrackingTarget(uri, run_id))


def differences(a: Finished, b: Finished) -> list[str]:
    """Every way ``b`` differs from ``a`` (empty: bitwise equal, the same metrics)."""
    found = _unequal("state", a.state, b.state) + _unequal("best_model", a.best, b.best)
    keys = sorted(k for k in a.histories.keys() | b.histories.keys() if not UNSHARED.fullmatch(k))
    found += [f"metric {k}" for k in keys if a.histories.get(k) != b.histories.get(k)]
    if a.tags.get("clsr.weights_sha256") != b.tags.get("clsr.weights_sha256"):
        found.append("tag clsr.weights_sha256")
    return found


def _unequal(where: str, a: Any, b: Any) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a if not UNSHARED.fullmatch(str(k)) for d in _unequal(f"{where}.{k}", a[k], b[k])]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _unequal(f"{where}[{i}]", x, y)]
    if torch.is_tensor(a) and torch.is_tensor(b):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where]
    return [] if type(a) is type(b) and a == b else [where]


def check(folder: Path, uri: str, model: str = "minilm") -> dict[str, Any]:
    """Both checks; the differences found (none: deterministic) and what they cost."""
    started = time.perf_counter()
    first = run_whole(tiny_trial(model), folder / "first", uri)
    second = run_whole(tiny_trial(model), folder / "second", uri)
    resumed = run_killed_and_resumed(model, folder / "resumed", uri)
    return {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "twice": differences(first, second),
        "killed_and_resumed": differences(first, resumed),
        "resumed_from_step": resumed.histories.get("resumed_from_step"),
        "weights_sha256": first.tags.get("clsr.weights_sha256"),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clsr_bench.determinism", description=__doc__)
    parser.add_argument("--folder", type=Path, help="a fresh folder for checkpoints and the MLflow store")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        folder, uri, run_id, model = args.child
        _child(Path(folder), uri, run_id, model)
        return 0
    args.folder.mkdir(parents=True, exist_ok=True)
    result = check(args.folder, f"sqlite:///{args.folder.resolve() / 'mlflow.db'}", args.model)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if not (result["twice"] or result["killed_and_resumed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
