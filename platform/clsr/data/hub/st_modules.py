"""What a sentence-transformers model's own modules are (``modules.json`` and its ``Pooling`` config),
read from its files without loading it: ``platform eval`` embeds such a model through its own modules,
and ``model.pooling: auto`` trains with its own pooling.

Only the small JSON files are read (a local folder, a short name, or a hub repo: from the cache offline,
else ``hf_hub_download`` of those files alone), never weights.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

# sentence-transformers' Pooling modes → clsr's pooler over the bare transformer (same vectors)
CLSR_POOLING = {"cls": "cls_before_pooler", "mean": "avg"}
_MODE_KEYS = {  # the config keys of sentence-transformers < 5 (pooling_mode_<key>: true)
    "cls_token": "cls",
    "mean_tokens": "mean",
    "max_tokens": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "weightedmean_tokens": "weightedmean",
    "lasttoken": "lasttoken",
}


class NotSentenceTransformers(ValueError):
    """The model has no sentence-transformers modules clsr can train with."""


def sentence_transformers_folder(source: str) -> Path | None:
    """The local folder of ``source`` (a folder, a short name, or a hub id in the local cache or
    downloadable) when it is a sentence-transformers model (``modules.json``), else None."""
    from clsr.data.hub.model_registry import ModelUnavailableError, resolve_model_path

    try:
        local = Path(resolve_model_path(source))
    except ModelUnavailableError:
        return None
    if local.is_dir():
        return local if (local / "modules.json").is_file() else None
    try:  # a hub id: its module files only (offline: from the cache); the weights come with the model
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(source, "modules.json")).parent
    except Exception:  # not on the hub, not a sentence-transformers repo, or offline and not cached
        return None


def _module_file(source: str, folder: Path, relative: str) -> Path:
    path = folder / relative
    if path.is_file() or Path(source).expanduser().is_dir():
        return path
    from huggingface_hub import hf_hub_download  # a hub snapshot holds only what was downloaded

    return Path(hf_hub_download(source, relative))


def pooling_modes(config: dict) -> list[str]:
    """The Pooling module's modes (``pooling_mode: cls`` in sentence-transformers ≥ 5, else flags)."""
    mode = config.get("pooling_mode")
    if mode:
        return [mode] if isinstance(mode, str) else list(mode)
    return [name for key, name in _MODE_KEYS.items() if config.get(f"pooling_mode_{key}")]


@lru_cache(maxsize=64)
def own_modules(source: str) -> tuple[str, ...]:
    """``("Pooling(mean)", "Normalize")``-style names of the modules after the transformer."""
    folder = sentence_transformers_folder(source)
    if folder is None:
        from clsr.data.hub.model_registry import model_source_problem

        problem, unavailable = model_source_problem(source)
        raise NotSentenceTransformers(
            problem or unavailable or f"{source!r} is not a sentence-transformers model (no modules.json)"
        )
    modules = json.loads(_module_file(source, folder, "modules.json").read_text())
    names = []
    for module in modules[1:]:
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            config = json.loads(_module_file(source, folder, f"{module['path']}/config.json").read_text())
            kind = f"Pooling({'+'.join(pooling_modes(config))})"
        names.append(kind)
    return tuple(names)


def own_pooling(source: str) -> str:
    """clsr's pooling that gives ``source``'s own sentence vectors, up to its Normalize (cosine
    similarity, which every method and evaluation uses, does not change under it)."""
    modules = own_modules(source)
    pooling = [m for m in modules if m.startswith("Pooling(")]
    rest = [m for m in modules if not m.startswith("Pooling(") and m != "Normalize"]
    mode = pooling[0][len("Pooling(") : -1] if len(pooling) == 1 else None
    if mode not in CLSR_POOLING or rest:
        raise NotSentenceTransformers(
            f"{source!r} has modules {', '.join(modules)}; clsr trains with one Pooling(cls|mean) and an "
            f"optional Normalize only: set model.pooling to one of cls, cls_before_pooler, avg, …"
        )
    return CLSR_POOLING[mode]
