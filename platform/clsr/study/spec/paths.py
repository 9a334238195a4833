"""Local paths in a study made absolute where the study is loaded (``platform`` runs in the user's
folder; Ray runs each trial in a folder of its own, so a relative ``data.train: pairs.csv`` read there
would not be found). Only values that name an existing file or folder change; the rest (catalogue names,
hub ids, short model names, missing files that ``study validate`` reports) stay as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from clsr.config.method_source import is_file_reference
from clsr.data.external import absolute_local as absolute

# dotted keys whose values may be local paths (eval.custom.<name>.path / .corpus by pattern)
PATH_KEYS = ("data.train", "data.data_dir", "model.name", "model.init_checkpoint")
CUSTOM_PATH = re.compile(r"^eval\.custom\.[^.]+\.(path|corpus)$")


def is_path_key(key: str) -> bool:
    return key in PATH_KEYS or bool(CUSTOM_PATH.match(key))


def absolute_in_sections(sections: dict[str, Any]) -> dict[str, Any]:
    """A base-style ``{section: {field: value}}`` document with its path values made absolute."""
    out = {name: dict(body) if isinstance(body, dict) else body for name, body in sections.items()}
    for key in PATH_KEYS:
        section, field = key.split(".")
        if isinstance(out.get(section), dict) and field in out[section]:
            out[section][field] = absolute(out[section][field])
    custom = out.get("eval", {}).get("custom") if isinstance(out.get("eval"), dict) else None
    if isinstance(custom, dict):
        out["eval"]["custom"] = {
            name: {k: absolute(v) if k in ("path", "corpus") else v for k, v in task.items()}
            if isinstance(task, dict)
            else task
            for name, task in custom.items()
        }
    return out


def absolute_in_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{dotted.key: value}`` overrides with path values made absolute."""
    return {key: absolute(value) if is_path_key(key) else value for key, value in overrides.items()}


def absolute_method_files(raw: dict[str, Any], study_dir: Path) -> dict[str, Any]:
    """A study's ``./file.py:Class`` method references made absolute: relative to the study file's folder,
    else to the working folder (as ``from:`` files are found), wherever a study names a method (top
    level, an ablation's ``method``, ``base.method.name``, a point's or a grid's ``method.name``)."""
    out = dict(raw)
    out["method"] = absolute_method(raw.get("method"), study_dir)
    if isinstance(raw.get("ablations"), dict):
        out["ablations"] = {
            name: _ablation_methods(body, study_dir) if isinstance(body, dict) else body
            for name, body in raw["ablations"].items()
        }
    return out if "method" in raw else {k: v for k, v in out.items() if k != "method"}


def _ablation_methods(body: dict[str, Any], study_dir: Path) -> dict[str, Any]:
    out = dict(body)
    if "method" in body:
        out["method"] = absolute_method(body["method"], study_dir)
    if isinstance(body.get("base"), dict) and isinstance(body["base"].get("method"), dict):
        section = body["base"]["method"]
        out["base"] = {
            **body["base"],
            "method": {**section, "name": absolute_method(section.get("name"), study_dir)},
        }
    if isinstance(body.get("grid"), dict) and isinstance(body["grid"].get("method.name"), list):
        names = [absolute_method(n, study_dir) for n in body["grid"]["method.name"]]
        out["grid"] = {**body["grid"], "method.name": names}
    if isinstance(body.get("points"), list):
        out["points"] = [_point_method(point, study_dir) for point in body["points"]]
    return out


def _point_method(point: Any, study_dir: Path) -> Any:
    if not (isinstance(point, dict) and isinstance(point.get("set"), dict) and "method.name" in point["set"]):
        return point
    return {
        **point,
        "set": {**point["set"], "method.name": absolute_method(point["set"]["method.name"], study_dir)},
    }


def absolute_method(reference: Any, study_dir: Path) -> Any:
    if not isinstance(reference, str) or ":" not in reference:
        return reference
    where, _, attribute = reference.rpartition(":")
    if not is_file_reference(where):
        return reference
    candidates = [study_dir / Path(where).expanduser(), Path.cwd() / Path(where).expanduser()]
    found = next((p for p in candidates if p.is_file()), candidates[0])
    return f"{found.resolve()}:{attribute}"
