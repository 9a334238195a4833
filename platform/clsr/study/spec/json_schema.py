"""The JSON Schema of a study file, generated from the pydantic models (``platform study schema``), so an
editor completes and checks keys as the user types (``# yaml-language-server: $schema=…`` at the top of
a study file) and the schema cannot drift from what ``study validate`` accepts.

``base`` is a partial trial (``TrialConfig`` with nothing required: the method's paper defaults fill the
rest); the method's own hyperparameters differ per method and are described, not enumerated. The schema
is a convenience for editors: ``platform study validate`` stays the check (dotted grid keys, cross-field
rules and the sources are beyond JSON Schema).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from clsr.config.methods import FORMS
from clsr.config.trial import TrialConfig
from clsr.methods import METHODS
from clsr.study.spec.schema import Study

SCHEMA_FILE = "schema.json"  # beside the shipped studies: studies/schema.json
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _section_defs(trial: dict[str, Any]) -> set[str]:
    """The definitions a trial's sections point at directly (``model``'s two kinds, ``data``, …)."""
    refs = json.dumps(trial["properties"])
    return {name for name in trial.get("$defs", {}) if f'"#/$defs/{name}"' in refs}


def study_schema() -> dict[str, Any]:
    schema = copy.deepcopy(Study.model_json_schema())
    trial = copy.deepcopy(TrialConfig.model_json_schema())
    trial.pop("required", None)  # base is partial: the method's paper defaults fill the rest
    for name in _section_defs(
        trial
    ):  # and so is each section (an entry inside one, e.g. a custom task, is not)
        trial["$defs"][name].pop("required", None)
    defs = schema.setdefault("$defs", {})
    for name, definition in trial.pop("$defs", {}).items():
        if name in defs and defs[name] != definition:
            raise ValueError(f"study and trial schemas both define {name!r} differently")
        defs[name] = definition
    trial["properties"]["method"] = {
        "type": "object",
        "description": "the method's own hyperparameters (temperature, …): see the method's page; "
        "platform study validate checks them",
        "properties": {"name": method_reference()},
    }
    trial["title"] = "base: the trial every point starts from (model, data, trainer, method, eval)"
    schema["properties"]["base"] = trial
    schema["properties"]["method"] = {**schema["properties"]["method"], **method_reference()}
    return {"$schema": DRAFT, "title": "clsr study file", **schema}


def method_reference() -> dict[str, Any]:
    """A built-in name (offered by editors), or ``./file.py:Class``, ``package.module:Class``, an installed
    entry point's name: any string, which ``platform study validate`` checks."""
    return {"anyOf": [{"enum": sorted(METHODS)}, {"type": "string"}], "description": FORMS}


def schema_text() -> str:
    return json.dumps(study_schema(), indent=2, sort_keys=True) + "\n"
