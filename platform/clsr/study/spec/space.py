"""What a sampled or listed ablation runs over: one sampled hyperparameter (``Distribution``), one explicit
point (``Point``), and a logged parameter read back to its distribution's type (``typed_value``)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, model_validator

from clsr.study.spec.strict import Strict


class Distribution(Strict):
    """One sampled hyperparameter for ``random``/``optuna`` search: exactly one of the fields."""

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
        given = [k for k, v in self.model_dump().items() if v is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of uniform, loguniform, randint, choice (given: {given or 'none'})"
            )
        bounds = self.uniform or self.loguniform or self.randint
        if bounds and bounds[0] >= bounds[1]:
            raise ValueError(f"lower bound must be below upper bound (given: {list(bounds)})")
        if self.loguniform and self.loguniform[0] <= 0:
            raise ValueError("loguniform bounds must be positive")
        if self.choice and any(isinstance(c, float) and not math.isfinite(c) for c in self.choice):
            raise ValueError(f"choice values must be finite numbers (given: {self.choice})")
        return self


class Point(Strict):
    label: str | None = None
    set: dict[str, Any] = Field(min_length=1, description="dotted.key: value overrides of this point")
    paper: float | dict[str, float] | None = Field(None, description="published number(s) for this point")


def typed_value(dist: Distribution, text: str) -> Any:
    """A parameter as MLflow logged it (``str`` of the value) back to its distribution's type: the
    ``choice`` option whose ``str()`` is the text (exactly), an int for randint, else a float.
    ValueError when it is none of them."""
    if dist.choice is not None:
        for option in dist.choice:
            if str(option) == text:
                return option
        raise ValueError(f"{text!r} is none of the choices {dist.choice}")
    return int(text) if dist.randint else float(text)


def contains(dist: Distribution, value: Any) -> bool:
    """Whether a typed value (``typed_value``) lies in the distribution as it is now: one of the choices,
    an int within randint's inclusive bounds, a number within uniform's or loguniform's. An edited
    space's finished trials are given to a sampler only when this holds (Optuna refuses the others)."""
    if dist.choice is not None:
        return any(type(option) is type(value) and option == value for option in dist.choice)
    if dist.randint is not None:
        return isinstance(value, int) and dist.randint[0] <= value <= dist.randint[1]
    low, high = dist.uniform or dist.loguniform
    return isinstance(value, int | float) and math.isfinite(value) and low <= value <= high
