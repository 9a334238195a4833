"""The public method contract: every name of ``clsr.__all__`` imports from ``clsr`` and is the object its
defining module holds, and importing ``clsr`` alone loads none of them (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import clsr
from clsr.config.methods import get_method
from clsr.config.trial import TrialConfig
from clsr.data import batching
from clsr.methods import base, losses
from clsr.runtime.distributed import gather_with_grad

EXPECTED = {
    "__version__": clsr.__version__,
    "Method": base.Method,
    "MethodConfig": base.MethodConfig,
    "TrialConfig": TrialConfig,
    "get_method": get_method,
    "cos_sim": losses.cos_sim,
    "in_batch_cross_entropy": losses.in_batch_cross_entropy,
    "full_precision": losses.full_precision,
    "gather_with_grad": gather_with_grad,
    "TextViewBatcher": batching.TextViewBatcher,
    "shuffled_batches": batching.shuffled_batches,
    "no_duplicate_batches": batching.no_duplicate_batches,
    "text_batches": batching.text_batches,
}


def test_all_lists_exactly_the_public_names():
    assert sorted(clsr.__all__) == sorted(EXPECTED)
    assert len(set(clsr.__all__)) == len(clsr.__all__)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_public_name_is_the_defining_modules_object(name):
    assert getattr(clsr, name) is EXPECTED[name]
    assert name in dir(clsr)


def test_star_import_gives_the_public_names():
    namespace: dict[str, object] = {}
    exec("from clsr import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(EXPECTED)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Metod'"):
        clsr.Metod  # noqa: B018


def test_import_clsr_is_cheap():
    code = "import sys, clsr; print(sorted(m for m in ('torch', 'clsr.methods.base') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
