"""Same-process A/B of the encoder's dropout: PyTorch's nn.Dropout against clsr's UniformDropout.

One PlatformStep (simcse_sup, MiniLM, batch 64, length 32, fp32, the default packed attention); ten
rounds, each timing the same three batches with one dropout and then the other (the order alternating
round by round), so the machine's drift falls on both alike. Run from the repository root:
    python benchmarks/results/2026-12-02-cpu2/dropout_ab.py
"""

import statistics
import sys
import time

import torch

sys.path.insert(0, "platform")
from clsr.bench.train import DATASETS, PlatformStep, trial_config  # noqa: E402
from clsr.data.catalog import load_rows  # noqa: E402
from clsr.encoders.dropout_masks import UniformDropout  # noqa: E402

torch.set_num_threads(2)
rows = load_rows(DATASETS["simcse_sup"], None, max_rows=64 * 40, seed=0)
trial = trial_config("simcse_sup", "minilm", 64, 32, "fp32")
torch.manual_seed(0)
step = PlatformStep(trial, rows, torch.device("cpu"), 40)
batches = step.batches(step.rows, 40)
places = [
    (module, name, child)
    for module in step.model.modules()
    for name, child in module.named_children()
    if isinstance(child, UniformDropout)
]


def use(uniform: bool) -> None:
    for module, name, child in places:
        setattr(module, name, child if uniform else torch.nn.Dropout(child.p))


for batch in batches[:2]:
    step(batch)
seconds: dict[bool, list[float]] = {False: [], True: []}
for index in range(10):
    chunk = batches[2 + 3 * index : 5 + 3 * index]
    for uniform in (False, True) if index % 2 == 0 else (True, False):
        use(uniform)
        started = time.perf_counter()
        for batch in chunk:
            step(batch)
        seconds[uniform].append((time.perf_counter() - started) / len(chunk))
ratios = [a / b for a, b in zip(seconds[False], seconds[True], strict=True)]
print(f"{len(places)} dropout modules")
print("nn.Dropout s/step     ", " ".join(f"{s:.3f}" for s in seconds[False]))
print("UniformDropout s/step ", " ".join(f"{s:.3f}" for s in seconds[True]))
print("ratio per round       ", " ".join(f"{r:.3f}" for r in ratios), f"median {statistics.median(ratios):.3f}")
