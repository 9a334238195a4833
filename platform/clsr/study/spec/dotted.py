"""Dotted keys (``trainer.lr``) over nested dicts: set them, parse command-line overrides."""

from __future__ import annotations

import copy
from typing import Any

from clsr.study.spec.yaml_safe import YAMLSafetyError, load_plain_value


def set_dotted(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Return a copy of ``doc`` with ``key`` set, creating intermediate sections as needed."""
    doc = copy.deepcopy(doc)
    node = doc
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"cannot set {key!r}: {part!r} holds a {type(child).__name__}, not a section")
        node = child
    node[leaf] = value
    return doc


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``override`` wins; neither input is modified."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_override(text: str) -> tuple[str, Any]:
    """``trainer.lr=3e-5`` → ("trainer.lr", 3e-05); the value is read as plain YAML (numbers, strings,
    lists, maps, null; no tags). A bad value raises a ValueError whose one-line message names the option."""
    if "=" not in text:
        raise ValueError(f"--set expects dotted.key=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ValueError(f"--set {text}: the key before '=' is empty")
    try:
        value = load_plain_value(raw) if raw.strip() else ""
    except YAMLSafetyError as err:
        raise ValueError(f"--set {text}: {err}") from None
    if isinstance(value, str) and _looks_numeric(value):
        value = float(value)
    return key.strip(), value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
