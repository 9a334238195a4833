"""Benchmark: what recording a trial's data identities costs (issue 55, item 2; ``clsr.train.data_record``).

    CLSR_DATA_DIR=../shared/data python benchmarks/data_identity.py

Times ``data_params`` (the identities a trial's process logs) for the smoke study's trial as it runs in
CI (its 512 training rows, STS-B dev/test and STS16 capped at 300 pairs), for one trial scoring every
built-in STS set and transfer task read whole from the data folder, and the hashing alone of 10^6
Wikipedia-sized training rows (wiki1m's size; those rows are in memory already, only hashed).
"""

from __future__ import annotations

import statistics
import time

from clsr.config.trial import TrialConfig
from clsr.data.identity.digest import rows_digest
from clsr.data.training import training_rows
from clsr.train.data_record import data_params


def trial(tasks: list[str], max_pairs: int | None) -> TrialConfig:
    return TrialConfig.model_validate(
        {
            "method": {"name": "simcse_unsup"},
            "model": {"name": "minilm"},
            "data": {"train": "wiki1m", "max_rows": 512},
            "trainer": {"seed": 1},
            "eval": {"tasks": tasks, "alignment_uniformity": True, "sts_max_pairs": max_pairs},
        }
    )


def seconds(work, repeat: int = 5) -> float:
    """The median wall time of ``work()`` over ``repeat`` runs (the first one warms the file cache)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    smoke = trial(["sts16", "stsb"], 300)
    rows = training_rows(smoke)
    print(
        f"smoke trial (512 rows, 3 STS sets of 300 pairs): {seconds(lambda: data_params(smoke, rows)):.3f} s"
    )
    full = trial(["sts", "transfer"], None)
    print(f"every STS set and transfer task, whole: {seconds(lambda: data_params(full, rows), 3):.3f} s")
    wiki = [
        {"text": f"sentence {i} " + "of a Wikipedia article, about as long as wiki1m's mean. " * 2}
        for i in range(10**6)
    ]
    print(
        f"hashing 10^6 training rows (~{len(wiki[0]['text'])} characters each): {seconds(lambda: rows_digest(wiki), 1):.2f} s"
    )


if __name__ == "__main__":
    main()
