"""The study-file reference (``docs/reference.md``), generated from the pydantic models so that it cannot
drift from what ``study validate`` accepts: every key of a study, of ``base``'s sections and of each
method's own section, with its type, default and description. ``platform study reference`` writes it; a
test keeps the committed page equal to the generated one."""

from __future__ import annotations

import re
import sys
from typing import Any

from pydantic import BaseModel

from clsr.config.custom_task import CustomTask
from clsr.config.model import ModelConfig, TextCNNConfig
from clsr.config.trial import DataConfig, EvalConfig, TrainerConfig
from clsr.methods import METHODS, get_method
from clsr.study.spec.ablation import Ablation, AdaptiveSeeds, Confirm, Need
from clsr.study.spec.budget import Budget
from clsr.study.spec.notify import Notify
from clsr.study.spec.schema import Study
from clsr.study.spec.space import Point
from clsr.study.spec.tuning import PruneSeeds, ReportOptions, Resources, Scheduler, Search

HEADER = """# Study file reference

Generated from the pydantic models (`platform study reference --out docs/reference.md`); the JSON
Schema for editors comes from the same models (`studies/schema.json`, see [Study files](studies.md)).
A `base` section holds only what differs from the method's paper defaults; a grid or point names a
field as `section.key` (e.g. `trainer.lr`, `method.temperature`).
"""

SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    ("Study (top level)", Study, ""),
    ("ablations.&lt;name&gt;", Ablation, ""),
    ("ablations.&lt;name&gt;.points[]", Point, ""),
    ("ablations.&lt;name&gt;.needs.&lt;key&gt;", Need, ""),
    ("ablations.&lt;name&gt;.confirm", Confirm, ""),
    ("ablations.&lt;name&gt;.seeds (adaptive)", AdaptiveSeeds, ""),
    ("search", Search, ""),
    ("search.prune_seeds", PruneSeeds, ""),
    ("report", ReportOptions, ""),
    ("scheduler", Scheduler, ""),
    ("resources", Resources, ""),
    ("budget", Budget, ""),
    ("notify", Notify, ""),
    ("model (transformer)", ModelConfig, "model."),
    ("model (textcnn: GCLSR)", TextCNNConfig, "model."),
    ("data", DataConfig, "data."),
    ("trainer", TrainerConfig, "trainer."),
    ("eval", EvalConfig, "eval."),
    ("eval.custom.&lt;name&gt;", CustomTask, ""),
]


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    text = re.sub(r"Annotated\[(\w+), [^\]]*\]", r"\1", text)  # validators: not part of the type
    text = re.sub(r"typing\.|clsr\.[\w.]+\.|<class '([^']+)'>", lambda m: m.group(1) or "", text)
    text = text.replace("NoneType", "None").replace("Literal", "one of ")
    return text.replace("|", "&#124;")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section below)"
    return f"`{value!r}`".replace("|", "&#124;")


def _describe(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "&#124;")


def table(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        rows.append(
            f"| `{prefix}{key}` | {_type(field.annotation)} | {_default(field)} | {_describe(field.description)} |"
        )
    return rows


def reference_markdown() -> str:
    parts = [HEADER]
    for title, model, prefix in SECTIONS:
        doc = _describe(model.__doc__)
        parts += [f"## {title}", "", *([doc, ""] if doc else []), *table(model, prefix), ""]
    parts += ["## method: each method's own keys", ""]
    for name in sorted(METHODS):
        method = get_method(name)
        summary = _describe((sys.modules[method.__module__].__doc__ or "").split("\n\n")[0])
        parts += [f"### `method: {name}`", "", summary, ""]
        parts += [*table(method.Config, "method."), ""]
    return "\n".join(parts).rstrip() + "\n"
