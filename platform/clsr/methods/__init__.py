"""Method registry: names used in study files map to the plug-in classes."""

from __future__ import annotations

from clsr.methods.base import Method
from clsr.methods.gclsr import GCLSR
from clsr.methods.mnrl import MNRL
from clsr.methods.rcl import RCL, RCLEntropy
from clsr.methods.selfccl import SelfCCL
from clsr.methods.simcse_sup import SimCSESup
from clsr.methods.simcse_unsup import SimCSEUnsup
from clsr.methods.supmpn import SupMPN

METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (SimCSEUnsup, SimCSESup, MNRL, GCLSR, SupMPN, SelfCCL, RCLEntropy, RCL)
}


def get_method(name: str) -> type[Method]:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(sorted(METHODS))}")
    return METHODS[name]
