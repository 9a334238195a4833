"""A study file's ``budget:``: the GPU-hours, wall time and failed trials a study may use before its
driver stops launching trials (``clsr.study.control.budget`` keeps the account while it runs)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from clsr.study.spec.strict import Strict

WALL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
WALL_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")


def wall_seconds(text: str) -> float:
    """``"12h"`` -> 43200.0: a positive number and one unit of s, m, h or d."""
    match = WALL_PATTERN.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            "should be a positive duration: a number and one unit of s, m, h, d (e.g. '12h', '90m')"
        )
    return float(match.group(1)) * WALL_UNITS[match.group(2)]


class Budget(Strict):
    """What the study may spend; the driver launches no trial that would take it past a limit."""

    gpu_hours: float | None = Field(
        None,
        gt=0,
        le=10**7,
        description="GPU-hours every trial of the study together may hold (their run time x GPUs per "
        "trial, over every run and resume): no trial is launched once the hours spent plus the next "
        "trial's projected hours would pass it; null: no limit",
    )
    wall: str | None = Field(
        None,
        description="wall time of one driver (a `run`, or each `resume`), e.g. '12h', '90m' (units s, m, "
        "h, d): no trial is launched once the time run plus the next trial's projected time would pass "
        "it; null: no limit",
    )
    max_failed_trials: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="stop launching trials once this many trials have failed (past their retries); "
        "null: no limit",
    )

    @field_validator("wall", mode="before")
    @classmethod
    def _duration(cls, wall: object) -> object:
        if wall is not None:
            wall_seconds(wall if isinstance(wall, str) else str(wall))
        return wall

    @property
    def wall_s(self) -> float | None:
        return None if self.wall is None else wall_seconds(self.wall)

    @property
    def limited(self) -> bool:
        return (self.gpu_hours, self.wall, self.max_failed_trials) != (None, None, None)
