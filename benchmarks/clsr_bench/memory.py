"""Peak memory of one training step with and without GradCache (``trainer.gradcache_chunk_rows``).

Every configuration runs in a fresh child process (``python -m clsr_bench.memory``, spec on stdin,
figures as JSON on stdout) so that peaks of one do not hide those of another. The child builds the
trainer's model, optimiser and batch, then takes one step (``clsr_bench.train.PlatformStep``): on CUDA
it reports ``torch.cuda.max_memory_allocated`` during the step, on the CPU the growth of the process's
peak RSS over the step (``VmHWM`` on Linux: ``ru_maxrss`` survives ``exec``, so a child started by a
large process would report its parent's peak). The first step also allocates the gradients and AdamW's
state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clsr_bench import format_table

DATASETS = {"simcse_unsup": "wiki1m", "simcse_sup": "nli_triplets"}
MIB = 2**20


def peak_rss() -> int:
    """This process's peak resident set size in bytes."""
    import resource

    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One step of one configuration, measured in this (fresh) process."""
    import torch

    from clsr_bench import resolve_device, synchronize
    from clsr_bench.train import PlatformStep, trial_config

    device = resolve_device(spec["device"])
    trial = trial_config(
        spec["method"],
        spec["model"],
        spec["batch"],
        spec["length"],
        spec["precision"],
        chunk_rows=spec["chunk"],
        data=DATASETS[spec["method"]],
    )
    torch.manual_seed(0)
    step = PlatformStep(trial, spec["rows"], device)
    indices = list(range(spec["batch"]))
    synchronize(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        before = peak_rss()
    started = time.perf_counter()
    step(indices)
    synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss()
    return {
        "peak_mib": peak / MIB,
        "step_mib": (peak - before) / MIB,
        "before_mib": before / MIB,
        "step_s": seconds,
    }


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``child(spec)`` in a fresh interpreter; an error (e.g. out of memory) becomes ``error``."""
    import clsr

    # the child imports this clsr_bench and this clsr: neither need be installed (clsr_bench never is)
    here = [str(Path(module.__file__).resolve().parents[1]) for module in (sys.modules[__package__], clsr)]
    path = os.pathsep.join([*here, *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "clsr_bench.memory"], input=json.dumps(spec), capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": "out of memory" if "out of memory" in proc.stderr.lower() else last[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_memory(
    batches: Sequence[int] = (64, 256, 512),
    chunk: int = 16,
    method: str = "simcse_sup",
    model: str = "minilm",
    length: int = 32,
    precision: str = "auto",
    device: str = "auto",
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Peak memory of one step for each batch size, plain and with GradCache chunks of ``chunk`` rows."""
    from clsr.data.catalog import load_rows
    from clsr_bench import resolve_device, resolve_precision

    if method not in DATASETS:
        raise ValueError(f"--method must be one of {', '.join(DATASETS)}")
    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    rows = load_rows(DATASETS[method], data_dir, max_rows=max(batches), seed=0)  # read here, not per child
    results = []
    for batch in batches:
        for rows_per_chunk in (None, chunk):
            spec = {
                "method": method,
                "model": model,
                "batch": batch,
                "length": length,
                "precision": precision,
                "device": str(dev),
                "chunk": rows_per_chunk,
                "rows": rows[:batch],
            }
            results.append({"batch": batch, "gradcache_chunk_rows": rows_per_chunk, **measure(spec)})
    return {
        "benchmark": "memory",
        "method": method,
        "data": DATASETS[method],
        "model": model,
        "length": length,
        "precision": precision,
        "device": str(dev),
        "measure": "torch.cuda.max_memory_allocated" if dev.type == "cuda" else "peak RSS (VmHWM)",
        "results": results,
    }


def format_memory(f: dict[str, Any]) -> str:
    table = format_table(
        ["batch", "GradCache chunk", "peak MiB", "step growth MiB", "before step MiB", "step s", "error"],
        [
            [
                r["batch"],
                r["gradcache_chunk_rows"] or "off",
                r.get("peak_mib"),
                r.get("step_mib"),
                r.get("before_mib"),
                r.get("step_s"),
                r.get("error"),
            ]
            for r in f["results"]
        ],
    )
    return "\n".join(
        [
            f"peak memory of one training step: {f['method']} on {f['data']}, {f['model']}, length "
            f"{f['length']}, {f['precision']} on {f['device']}; {f['measure']}, each in a fresh process",
            "",
            table,
            "",
            "step growth: the peak during the step minus the memory held before it (model, batch); it "
            "includes the gradients and AdamW's state the first step allocates.",
        ]
    )


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.stdin.read()))))
