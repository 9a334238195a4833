"""``platform method new NAME``: a commented method file and a study that runs it beside SimCSE."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NAME = re.compile(r"[a-z][a-z0-9_]*")

METHOD_TEMPLATE = '''"""{title}: your method (docs/methods/your-own.md). Edit the loss; `platform study run {name}.yaml`.

It starts as unsupervised SimCSE's InfoNCE (``{name}_loss``): replace the loss and its equation with
yours, keeping the equation next to the code that computes it.
"""

from __future__ import annotations

import torch

# The public contract: import from `clsr` only (its internals may change between versions).
from clsr import Method, MethodConfig, cos_sim, in_batch_cross_entropy
from pydantic import Field


class {cls}Config(MethodConfig):
    """Your hyperparameters, with their defaults: a study sets them as `method.<field>`."""

    name: str = "{name}"
    temperature: float = Field(0.05, gt=0, description="τ: the softmax temperature")


def {name}_loss(views: torch.Tensor, temperature: float) -> torch.Tensor:
    """``views``: (N, 2, d), the two views ``h_i``, ``h_i^+`` of each of the global batch's N rows:

        ℓ = (1/N) Σ_i -log [ exp(sim(h_i, h_i^+)/τ) / Σ_{{j=1..N}} exp(sim(h_i, h_j^+)/τ) ]

    with sim the cosine. Test it against NumPy (docs/methods/your-own.md)."""
    logits = cos_sim(views[:, 0], views[:, 1]) / temperature  # [i, j] = sim(h_i, h_j^+)/τ
    return in_batch_cross_entropy(logits)  # row i's positive is column i


class {cls}(Method):
    name = "{name}"
    Config = {cls}Config

    def views(self) -> tuple[str, ...]:
        # The data columns each row contributes, in order: here the `text` column twice (two dropout
        # passes). A pair data set would give ("anchor", "positive"), a triplet adds "negative".
        return ("text", "text")

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        # embeddings: (rows of the global batch, views, dim), float32; other workers' rows included.
        return {name}_loss(embeddings, self.cfg.temperature)
'''

STUDY_TEMPLATE = """# {name} beside unsupervised SimCSE, 2 seeds each: `platform study run {name}.yaml`, then
# `platform study report {name}.yaml`. Smoke-sized (MiniLM, 512 sentences, 8 steps, 300 STS pairs a
# split, about 2 minutes on a laptop's CPU): for a real run drop base.model, data.max_rows,
# trainer.max_steps and eval.sts_max_pairs (SimCSE's paper settings then apply) and add seeds.
name: {name}
description: {name} vs unsupervised SimCSE on the same data and seeds.
method: simcse_unsup          # the paper defaults both points start from
base:
  model: {{name: minilm, pooling: avg, mlp_only_train: false, max_seq_length: 32}}
  data: {{train: wiki1m, max_rows: 512}}
  trainer: {{batch_size: 16, max_steps: 8, eval_steps: 4, log_every: 2}}
  eval: {{tasks: [sts16, stsb], sts_max_pairs: 300}}
ablations:
  {name}:
    description: the same trial with SimCSE's loss and with {name}'s
    points:
    - {{label: simcse_unsup, set: {{method.name: simcse_unsup}}}}
    - {{label: {name}, set: {{method.name: ./{name}.py:{cls}}}}}
    reference: simcse_unsup   # the report tests {name} against it (paired over seeds)
seeds: [1, 2]
metric: best_dev_stsb
mode: max
# trials in the driver's Ray workers, two at once: about 2 minutes on a 2-core laptop; on a GPU
# cluster, one Ray Train worker with a GPU per trial: {{workers_per_trial: 1, gpus_per_worker: 1}}
resources: {{workers_per_trial: 0, cpus_per_worker: 1}}
concurrency: 2
storage_path: runs
"""


def add_parsers(commands) -> None:
    """``platform method`` and its actions."""
    method = commands.add_parser("method", help="start a method of your own").add_subparsers(
        dest="action", required=True
    )
    new = method.add_parser(
        "new", help="write NAME.py (a commented method) and NAME.yaml (a study of it beside simcse_unsup)"
    )
    new.add_argument("name", help="the method's name: lower case letters, digits and _ (e.g. my_loss)")
    new.add_argument("--dir", type=Path, default=Path("."), help="the folder to write them in (default: .)")


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def scaffold(name: str, folder: Path) -> list[Path]:
    """Write ``folder/name.py`` and ``folder/name.yaml``; ValueError for a bad name or an existing file."""
    if not NAME.fullmatch(name):
        raise ValueError(f"method name {name!r}: lower case letters, digits and _, starting with a letter")
    files = {folder / f"{name}.py": METHOD_TEMPLATE, folder / f"{name}.yaml": STUDY_TEMPLATE}
    if existing := [str(path) for path in files if path.exists()]:
        raise ValueError(f"not overwriting {', '.join(existing)}: choose another name or --dir")
    folder.mkdir(parents=True, exist_ok=True)
    values = {"name": name, "cls": class_name(name), "title": class_name(name)}
    for path, template in files.items():
        path.write_text(template.format(**values), encoding="utf-8")
    return list(files)


def cmd_method(args: argparse.Namespace) -> int:
    try:
        written = scaffold(args.name, args.dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("wrote " + " and ".join(str(p) for p in written))
    print(
        f"next: edit the loss, then `platform study validate {written[1]}` and `platform study run {written[1]}`"
    )
    return 0
