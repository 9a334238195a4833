"""The methods a study may name, each loaded by reference from the module that defines it, as a plug-in is.

A reference is one of:

* a built-in name (``simcse_unsup``, ...);
* ``./path/file.py:Class`` (a study makes it absolute, relative to the study file) or ``/abs/file.py:Class``;
* ``package.module:Class`` (an importable module);
* the name of an entry point in the group ``clsr.methods`` (an installed package's ``name = module:Class``).

The configuration sits below the methods (their hooks take a ``TrialConfig``), yet checking a trial's
``method`` section needs the method's own ``Config``: so the registry holds references, and imports one
only when a trial asks for it, the way packaging's entry points load plug-ins; the contract check looks the
base classes up by name for the same reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from clsr.config.method_source import (
    MethodError,
    MethodSource,
    is_file_reference,
    load_file,
    load_module,
    source_of,
)

ENTRY_POINTS = "clsr.methods"
BUILT_IN: dict[str, str] = {
    "simcse_unsup": "clsr.methods.simcse_unsup:SimCSEUnsup",
    "simcse_sup": "clsr.methods.simcse_sup:SimCSESup",
    "mnrl": "clsr.methods.mnrl:MNRL",
    "gclsr": "clsr.methods.gclsr:GCLSR",
    "supmpn": "clsr.methods.supmpn:SupMPN",
    "selfccl": "clsr.methods.selfccl:SelfCCL",
    "rcl_entropy": "clsr.methods.rcl:RCLEntropy",
    "rcl": "clsr.methods.rcl:RCL",
}
FORMS = "a built-in name, ./file.py:Class (beside the study), package.module:Class, or an entry point's name"


class MethodRegistry(Mapping[str, Any]):
    """Method references to their classes (``clsr.methods.base.Method`` subclasses), imported on lookup.
    Iterating gives the built-in names; a lookup takes any reference (KeyError: nothing of that name)."""

    def __init__(self, targets: Mapping[str, str]):
        self._targets = dict(targets)

    def __getitem__(self, name: str) -> Any:
        return load(name, self._targets)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


METHODS = MethodRegistry(BUILT_IN)


def get_method(name: str) -> Any:
    """The class of method ``name``; ValueError naming every allowed form for an unknown one, MethodError
    (a ValueError) naming the class and what it lacks for one that is not a method."""
    try:
        return METHODS[name]
    except KeyError:
        names = ", ".join(sorted(set(METHODS) | set(entry_points())))
        raise ValueError(f"unknown method {name!r}; allowed: {names}; or {FORMS}") from None


def method_source(name: str) -> MethodSource:
    """Where method ``name``'s class comes from (``MethodSource``): what the record and Ray's workers need."""
    cls = get_method(name)
    return source_of(importlib.import_module(cls.__module__), name in BUILT_IN)


def entry_points() -> dict[str, str]:
    """Entry point name -> ``module:Class`` of the group ``clsr.methods``, as installed."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def load(name: str, targets: Mapping[str, str] = BUILT_IN) -> Any:
    """The class a reference names, checked against the method contract."""
    if not isinstance(name, str):
        raise KeyError(name)
    builtin = name in targets
    target = targets.get(name) or (entry_points().get(name) if ":" not in name else name)
    if target is None:
        raise KeyError(name)
    where, _, attribute = target.rpartition(":")
    if is_file_reference(where):
        module = load_file(Path(where).expanduser().resolve())
    elif where.replace(".", "").replace("_", "").isalnum() and attribute:
        module = load_module(where)
    else:
        raise KeyError(name)
    cls = getattr(module, attribute, None)
    if cls is None:
        raise MethodError(f"{where} defines no class {attribute!r}")
    check_contract(cls, target)
    if not builtin and not hasattr(cls, "name"):
        cls.name = attribute  # messages name the method by its class
    return cls


def check_contract(cls: Any, target: str) -> None:
    """A ``Method`` subclass with a ``Config`` (a ``MethodConfig``), ``views`` and its loss, not abstract."""
    base = importlib.import_module("clsr.methods.base")
    where, _, attribute = target.rpartition(":")
    if not (inspect.isclass(cls) and issubclass(cls, base.Method)):
        raise MethodError(f"{attribute} ({where}) is not a method: make it subclass clsr.Method")
    config = getattr(cls, "Config", None)
    if not (inspect.isclass(config) and issubclass(config, base.MethodConfig)):
        raise MethodError(
            f"{attribute}.Config ({where}) must be a class that subclasses clsr.MethodConfig"
        )
    if missing := sorted(getattr(cls, "__abstractmethods__", ())):
        raise MethodError(f"{attribute} ({where}) does not implement {', '.join(missing)}")
