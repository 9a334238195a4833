"""What a trial cost (wall, CPU and GPU seconds) and where its wall time went: ``TrialClock``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class TrialClock:
    """What a trial cost: wall seconds, CPU seconds of every worker, and GPU seconds (GPUs held × wall);
    and where this attempt's wall time went (``phases``: what ``platform study plan`` projects from)."""

    def __init__(self) -> None:
        self.wall_started = time.perf_counter()
        self.cpu_started = time.process_time()
        self.training_cpu_s = 0.0
        self.eval_cpu_started = 0.0
        self.setup_s: float | None = None
        self.first_step = 0
        self.phase_s: dict[str, float] = {"dev_eval": 0.0, "checkpoint": 0.0, "test_eval": 0.0}
        self.phase_count: dict[str, int] = {"dev_eval": 0, "checkpoint": 0}
        self.last_phase_s = 0.0  # how long the last ``phase`` took
        self.other_ranks_eval_cpu_s = 0.0  # their shares of the final evaluation

    def setup_done(self, step: int) -> None:
        """Model, data and restored state are ready; this attempt trains from ``step``."""
        self.setup_s, self.first_step = time.perf_counter() - self.wall_started, step

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.last_phase_s = time.perf_counter() - began
            self.phase_s[name] += self.last_phase_s
            if name in self.phase_count:
                self.phase_count[name] += 1

    def phases(self, step: int) -> dict[str, float]:
        """This attempt's wall seconds by phase (rank 0's view): set-up, optimiser steps (what is left),
        dev evaluations, checkpoint writes and the test evaluation, with the counts that make per-unit
        costs. Call after the test evaluation."""
        if self.setup_s is None:
            return {}
        wall = time.perf_counter() - self.wall_started
        steps = step - self.first_step
        train = wall - self.setup_s - sum(self.phase_s.values())
        return {
            "trial_setup_s": self.setup_s,
            "trial_steps_s": max(train, 0.0) if steps else 0.0,
            "trial_steps_run": float(steps),
            "trial_dev_eval_s": self.phase_s["dev_eval"],
            "trial_dev_evaluations": float(self.phase_count["dev_eval"]),
            "trial_checkpoint_write_s": self.phase_s["checkpoint"],
            "trial_checkpoints_written": float(self.phase_count["checkpoint"]),
            "trial_test_eval_s": self.phase_s["test_eval"],
        }

    def stop_training(self, session) -> None:
        """Sum the workers' CPU seconds so far (a collective: every rank calls it)."""
        self.training_cpu_s = _sum_over_ranks(time.process_time() - self.cpu_started, session)
        self.eval_cpu_started = time.process_time()

    def add_other_ranks_eval_cpu(self, session) -> None:
        """Sum the other ranks' CPU seconds since training stopped (a collective: every rank calls it)."""
        mine = 0.0 if session.rank == 0 else time.process_time() - self.eval_cpu_started
        self.other_ranks_eval_cpu_s = _sum_over_ranks(mine, session)

    def cost(self, session) -> dict[str, float]:
        wall = time.perf_counter() - self.wall_started
        gpus = session.world_size * session.gpu_share if session.device.type == "cuda" else 0.0
        eval_cpu = time.process_time() - self.eval_cpu_started + self.other_ranks_eval_cpu_s
        return {
            "trial_wall_s": wall,
            "trial_cpu_s": self.training_cpu_s + eval_cpu,
            "trial_gpu_s": wall * gpus,
        }

    @staticmethod
    def device(session) -> str:
        if session.device.type == "cuda":
            return f"{session.world_size} x {torch.cuda.get_device_name(session.device)}"
        return f"{session.world_size} x cpu"


def _sum_over_ranks(value: float, session) -> float:
    """``value`` summed over the trial's ranks (a collective when there are several)."""
    total = torch.tensor([value], dtype=torch.float64)
    if session.world_size > 1 and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend()
        total = total.to(session.device if backend == "nccl" else torch.device("cpu"))
        torch.distributed.all_reduce(total)
    return float(total.item())
