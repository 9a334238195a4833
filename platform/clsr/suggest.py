"""'Did you mean' for a key a study file misspells: the field names a pydantic model allows at the
error's location, and the closest of them by ``difflib``."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold directly (``X``, ``X | None``, ``X | Y``)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _items_of(annotation: Any) -> Any:
    """The value type of a ``dict[..., V]`` or ``list[V]`` an annotation may hold, else None."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    for candidate in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(candidate)
        if origin is dict:
            return typing.get_args(candidate)[1]
        if origin is list:
            return typing.get_args(candidate)[0]
    return None


def allowed_keys(root: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The field names allowed inside ``loc`` (the path to the unknown key, without the key)."""
    annotation: Any = root
    for part in loc:
        models = _models_in(annotation)
        owner = next((m for m in models if part in m.model_fields), None)
        if owner is not None:
            annotation = owner.model_fields[part].annotation
        elif len(models) > 1 and any(
            part == getattr(m.model_fields.get("type"), "default", None) for m in models
        ):
            annotation = next(m for m in models if m.model_fields["type"].default == part)  # a union's tag
        elif (items := _items_of(annotation)) is not None:
            annotation = items  # a dict key or a list index
        else:
            return []
    return sorted({name for model in _models_in(annotation) for name in model.model_fields})


def did_you_mean(root: type[BaseModel] | None, loc: Sequence[str | int]) -> str:
    """`` did you mean 'lr'?`` (or a list of what is allowed there), or ``""`` when nothing is known."""
    if root is None or not loc:
        return ""
    return closest(str(loc[-1]), allowed_keys(root, loc[:-1]))


def closest(key: str, allowed: Sequence[str]) -> str:
    """`` did you mean 'x'?`` for the closest of ``allowed``, else the list, else ``""``."""
    if not allowed:
        return ""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; allowed here: {', '.join(allowed)}"
