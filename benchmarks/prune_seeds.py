"""What seed pruning (``search.prune_seeds``) saves on a small search: the same random search run twice
through ``platform study run``, without and with pruning, each on its own MLflow store; trials,
trial-seconds (the sum of the trial runs' MLflow durations) and the best configuration of each.

The search: a tiny random BERT (the tests' ``save_tiny_bert``), unsupervised SimCSE, ``loss_avg``
minimised, four configurations fixed by ``points_to_evaluate`` (so both searches run the same ones):
two learning rates that train and two in a planted bad region (a rate too small to move the weights),
three seeds each, two trials at a time.

    CLSR_DATA_DIR=... python benchmarks/prune_seeds.py [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' tiny model

LRS = [5.0e-3, 2.0e-3, 1.0e-12, 1.0e-11]
SEEDS = [1, 2, 3]
PRUNE = {"test": "ttest", "p": 0.2, "min_seeds": 2}


def study(folder: Path, model: str, prune: bool) -> Path:
    search = {
        "algorithm": "random",
        "num_samples": len(LRS),
        "points_to_evaluate": [{"trainer.lr": x} for x in LRS],
    }
    doc = {
        "name": "prune" if prune else "full",
        "method": "simcse_unsup",
        "base": {
            "model": {"name": model, "max_seq_length": 16, "pooling": "avg"},
            "data": {"train": "wiki1m", "max_rows": 48},
            "trainer": {"batch_size": 8, "max_steps": 6, "eval_steps": 6, "log_every": 3},
            "eval": {"dev_tasks": ["stsb"], "tasks": ["sts16"], "alignment_uniformity": False,
                     "sts_max_pairs": 200, "log_model": False},
        },
        "ablations": {"lr": {"space": {"trainer.lr": {"choice": LRS}}}},
        "seeds": SEEDS,
        "metric": "loss_avg",
        "mode": "min",
        "search": search | ({"prune_seeds": PRUNE} if prune else {}),
        "concurrency": 2,
        "resources": {"workers_per_trial": 0, "cpus_per_worker": 1},
        "system_metrics_interval_s": None,
        "storage_path": str(folder / "runs"),
    }  # fmt: skip
    path = folder / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(folder: Path, model: str, prune: bool) -> dict:
    from mlflow import MlflowClient

    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT / "platform")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clsr.cli", "study", "run", str(study(folder, model, prune))],
        cwd=folder, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("prune" if prune else "full")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    scores, pruned = defaultdict(list), set()
    for r in runs:
        lr = float(r.data.params["trainer.lr"])
        scores[lr].append(r.data.metrics["loss_avg"])
        if "clsr.pruned" in r.data.tags:
            pruned.add(lr)
    full = {lr: float(np.mean(v)) for lr, v in scores.items() if lr not in pruned}
    best = min(full, key=full.get)
    summary = next((line for line in done.stdout.splitlines() if "seed pruning stopped" in line), "")
    return {
        "trials": len(runs),
        "trial_s": sum((r.info.end_time - r.info.start_time) / 1000 for r in runs),
        "wall_s": wall,
        "best": f"trainer.lr={best:g} (loss_avg {full[best]:.4f} over {len(scores[best])} seeds)",
        "pruned": ", ".join(f"{lr:g} ({len(scores[lr])} seeds)" for lr in sorted(pruned)) or "none",
        "summary": summary.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/2026-12-06-cpu/prune_seeds.md"))
    args = parser.parse_args()
    from tests.support.models import save_tiny_bert

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = save_tiny_bert(folder / "tiny-bert", dropout=0.0)
        results = {name: run(folder / name, model, name == "pruned") for name in ("full", "pruned")}
    load = os.getloadavg()[0]
    lines = [
        "# What seed pruning saves on a small search (issue 56, item 1)",
        "",
        f"`python benchmarks/prune_seeds.py`, {time.strftime('%Y-%m-%d')}, CPU only, 2 cores shared with other "
        f"jobs (load average {load:.1f} at the end). The same random search without and with "
        "`search.prune_seeds: {test: ttest, p: 0.2, min_seeds: 2}`: a tiny random BERT, unsupervised SimCSE, 6 steps per trial, "
        f"`loss_avg` minimised; {len(LRS)} configurations fixed by `points_to_evaluate` (learning rates "
        f"{', '.join(f'{x:g}' for x in LRS)}: the last two a planted bad region that cannot move the "
        f"weights) x {len(SEEDS)} seeds, two trials at a time.",
        "",
        "| search | trials | trial-seconds | wall s | best configuration | pruned (seeds run) |",
        "|---|---|---|---|---|---|",
        *[
            f"| {name} | {r['trials']} | {r['trial_s']:.0f} | {r['wall_s']:.0f} | {r['best']} | {r['pruned']} |"
            for name, r in results.items()
        ],
        "",
        f"The pruned search's driver line: `{results['pruned']['summary']}`",
    ]
    print("\n".join(lines))
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
