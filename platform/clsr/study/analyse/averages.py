"""Published averages checked against their rows: where a paper prints an average (7 STS tasks, STS12-15,
7 transfer tasks) beside every number it averages, and the printed average is not their mean (GCLSR
Table 3's '+ PWVA' transfer average 83.35, mean 82.35; Table 7's momentum 0.99 STS12-15 average 66.24,
mean 66.31), the study file keeps the printed number and the report shows both, judging the row against
the recomputed mean.

A printed average counts as the mean when it is within one unit of the last decimal place its row is
printed to (the parts and the average are each rounded, by half a unit at most)."""

from __future__ import annotations

from dataclasses import dataclass

from clsr.data.sts import STS_TASKS
from clsr.data.transfer import TRANSFER_TASKS

AVERAGES: dict[str, tuple[str, ...]] = {
    "test_sts_avg": tuple(f"test_{t}" for t in STS_TASKS),
    "test_sts12_15_avg": tuple(f"test_{t}" for t in ("sts12", "sts13", "sts14", "sts15")),
    "test_transfer_avg": tuple(f"test_{t}" for t in TRANSFER_TASKS),
}


@dataclass(frozen=True)
class Printed:
    """A published average that is not the mean of its published parts."""

    metric: str
    printed: float
    mean: float
    parts: int

    def note(self, label: str) -> str:
        return (
            f"{label}: the paper prints {self.metric} {self.printed:.2f}, the mean of its row's {self.parts} "
            f"published numbers is {self.mean:.2f}; the row is judged against the mean"
        )


def decimals(value: float) -> int:
    """Decimal places of a number as written in a study file (68.7: 1; 83.35: 2)."""
    text = repr(float(value))
    return 0 if "e" in text else len(text.split(".")[1].rstrip("0"))


def checked(paper: dict[str, float]) -> tuple[dict[str, float], dict[str, Printed]]:
    """The paper numbers with each mismatched average replaced by the mean of its parts, and the
    printed averages so replaced (metric -> Printed)."""
    judged, printed = dict(paper), {}
    for metric, parts in AVERAGES.items():
        if metric not in paper or not all(p in paper for p in parts):
            continue
        values = [paper[p] for p in parts]
        mean = sum(values) / len(values)
        places = max(decimals(v) for v in [paper[metric], *values])
        if abs(mean - paper[metric]) > 10.0**-places + 1e-9:
            judged[metric] = round(mean, places)
            printed[metric] = Printed(metric, paper[metric], round(mean, places), len(parts))
    return judged, printed
