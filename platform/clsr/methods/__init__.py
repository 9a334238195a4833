"""The methods: one module each, named in study files through the registry (``clsr.config.methods``)."""

from __future__ import annotations

from typing import cast

from clsr.config import methods as registry
from clsr.methods.base import Method

METHODS = registry.METHODS


def get_method(name: str) -> type[Method]:
    return cast(type[Method], registry.get_method(name))
