"""The methods a study may name, each loaded by name from the module that defines it, as a plug-in is.

The configuration sits below the methods (their hooks take a ``TrialConfig``), yet checking a trial's
``method`` section needs the method's own ``Config``: so the registry names each method's module and
class, and imports it only when a trial asks for it, the way packaging's entry points load plug-ins.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

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


class MethodRegistry(Mapping[str, Any]):
    """Method names to their classes (``clsr.methods.base.Method`` subclasses), imported on lookup."""

    def __init__(self, targets: Mapping[str, str]):
        self._targets = dict(targets)

    def __getitem__(self, name: str) -> Any:
        module, _, attribute = self._targets[name].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


METHODS = MethodRegistry(BUILT_IN)


def get_method(name: str) -> Any:
    """The class of method ``name``; ValueError naming every allowed method for an unknown one."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(sorted(METHODS))}")
    return METHODS[name]
