"""The base of every study-file model: an unknown key is a problem (a typo is not silently ignored), fields
may be given by alias, and NaN and infinity are refused; and the one limit on counts the sections share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_TRIALS = 100_000  # a study with more trials is refused before any grid is expanded


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)
