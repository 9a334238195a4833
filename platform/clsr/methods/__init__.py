"""The methods: one module each, named in study files through the registry (``clsr.config.methods``)."""

from __future__ import annotations

from typing import cast

from clsr.config import methods as registry
from clsr.config.trial import TrialConfig
from clsr.methods.base import Method

METHODS = registry.METHODS


def get_method(name: str) -> type[Method]:
    return cast(type[Method], registry.get_method(name))


def build_method(trial: TrialConfig) -> Method:
    """The trial's method, configured by its ``method`` section (no model built yet)."""
    method_cls = get_method(trial.method["name"])
    return method_cls(method_cls.Config(**trial.method))
