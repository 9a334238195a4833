"""What ``trainer.deterministic: true`` refuses: settings whose numbers could differ between two runs of
the same trial, or between a resumed trial and one never interrupted, on the same machine.

Checked here (each refusal is one line naming the field and what is allowed):

* ``trainer.compile_mode`` max-autotune(-no-cudagraphs): Inductor picks its matrix kernels by timing
  them, and the fastest can differ from one run to the next (``default`` and ``reduce-overhead`` run
  with Inductor's deterministic mode instead);
* ``data.train`` a hub data set whose ``data.revision`` is not a commit: a branch or tag can move between
  a run and its rerun or resume.

A method's own refusals come through ``Method.trial_problems`` (GCLSR's text-level EDA draws from a
generator no checkpoint keeps). Checked and fine: data order (seeded per epoch), dropout and every
other draw from the global generators (reseeded per step: ``clsr.train.determinism``), data.max_rows
and evaluation subsets (seeded), fp16 loss scaling (in the checkpoint), GradCache (replays its chunks'
random states), several workers (each rank's generators reseeded per step), FlashAttention-2 (its
deterministic backward is switched on).
"""

from __future__ import annotations

import re

AUTOTUNED = ("max-autotune", "max-autotune-no-cudagraphs")
COMMIT = re.compile(r"[0-9a-f]{40}")


def nondeterministic_settings(
    compile_mode: str | None, hub_train: str | None, revision: str | None
) -> list[str]:
    """One line per setting that ``trainer.deterministic: true`` cannot hold to: ``compile_mode`` (None:
    not compiled), ``hub_train`` (``data.train`` where it names a hub data set, else None) and
    ``data.revision``. Plain values, not the trial: ``clsr.config.trial`` validates with this."""
    problems = []
    if compile_mode in AUTOTUNED:
        problems.append(
            f"trainer.compile_mode {compile_mode!r} picks kernels by timing them, which can differ "
            f"between runs: with trainer.deterministic: true use default or reduce-overhead (allowed: "
            f"default, reduce-overhead), or trainer.compile: false"
        )
    if hub_train is not None and not COMMIT.fullmatch(revision or ""):
        problems.append(
            f"data.revision {revision!r}: with trainer.deterministic: true the hub data set "
            f"{hub_train!r} is read at a commit (allowed: 40 hex digits), as a branch or tag can "
            f"move between a run and its rerun or resume"
        )
    return problems
