"""Benchmark: what recording a trial's environment costs (issue 55, item 1; ``clsr.tracking.environment``).

    python benchmarks/environment.py

Times ``capture`` (what a trial's rank 0 runs once: platform, CPU, torch builds, NVML, every installed
distribution, git state and diff) and its parts, median of a few runs, in a process that imported torch
already (as a trial has).
"""

from __future__ import annotations

import statistics
import time

import torch  # noqa: F401 (a trial's process has it imported: its import is not the capture's cost)

from clsr.tracking import environment


def seconds(work, repeat: int = 7) -> float:
    """The median wall time of ``work()`` over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    env = environment.capture("cpu")
    print(f"{len(env.distributions)} distributions, diff {len(env.diff.encode())} bytes, dirty={env.git_dirty}")
    for name, work in [
        ("capture (a CPU trial)", lambda: environment.capture("cpu")),
        ("capture (the driver: NVML asked)", lambda: environment.capture(None)),
        ("distributions", environment.distributions),
        ("git state and diff", environment.git_state),
        ("NVML driver", environment.nvml_driver),
    ]:
        print(f"| {name} | {seconds(work):.3f} |")


if __name__ == "__main__":
    main()
