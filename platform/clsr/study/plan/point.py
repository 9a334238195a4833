"""One point of a study, typed from the plan to the run: a grid's combination or an explicit point."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class GridPoint:
    """``label``: how the study names it; ``overrides``: dotted keys to the user's values; ``paper``: the
    paper's numbers for it (metric -> value); ``ablation``: set where the point is tied to its ablation (the
    plan's points, a confirmation's); ``members``: a report row's grid points (``average_over``'s folds)."""

    label: str
    overrides: dict[str, Any]
    paper: dict[str, float]
    ablation: str = ""
    members: tuple[str, ...] = ()

    def of(self, ablation: str) -> GridPoint:
        """This point tied to ``ablation``."""
        return replace(self, ablation=ablation)
