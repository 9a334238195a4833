"""Rule 4's parsers: the record's tags and params read without ever raising on what a colleague wrote.
A value that does not parse is skipped and named in one warning line (on stderr, control characters
shown as escapes); a metric that is NaN or infinite is never ranked. ``clsr.study.record.reader`` finds
the study's parent run.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

from clsr.tracking.escape import visible


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def skipped(run_id: str, kind: str, key: str, value: str, wanted: str, say: Callable[[str], None]) -> None:
    say(
        f"MLflow run {run_id}: {kind} {visible(key)[:100]}={visible(value)[:100]!r} is not {wanted}; "
        f"skipped"
    )


def tag_int(
    tags: dict[str, str], key: str, run_id: str = "?", say: Callable[[str], None] = _warn
) -> int | None:
    """The tag as an integer; None when absent or empty, and when it is no integer (named in a line)."""
    value = tags.get(key)
    if value in (None, ""):
        return None
    try:
        return int(str(value).strip(), 10)
    except ValueError:
        skipped(run_id, "tag", key, str(value), "an integer", say)
        return None


def tag_float(
    tags: dict[str, str], key: str, run_id: str = "?", say: Callable[[str], None] = _warn
) -> float | None:
    """The tag as a finite number; None when absent, and when it is none (named in a line)."""
    value = tags.get(key)
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        skipped(run_id, "tag", key, str(value), "a finite number", say)
        return None
    return number


def prefixed_floats(
    tags: dict[str, str], prefix: str, run_id: str = "?", say: Callable[[str], None] = _warn
) -> dict[str, float]:
    """``<prefix><name>`` tags as name -> number, those that are no finite number skipped and named."""
    out = {}
    for key in tags:
        if key.startswith(prefix) and (number := tag_float(tags, key, run_id, say)) is not None:
            out[key.removeprefix(prefix)] = number
    return out


def finite(value: object) -> bool:
    """A metric value that can be ranked: a real number, not NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_IDENTITY_CHARS = 200  # a longer value is no version or hash: cut, so one param cannot flood a line


def identity_params(params: dict[str, str]) -> dict[str, str]:
    """A run's identity params: its environment and code (``env.*``) and its data's hashes
    (``data.<name>.sha256``), as strings cut at ``MAX_IDENTITY_CHARS``; anything else left out. Never
    raises: a value that is no string (a hand-made record) is read as its ``str``."""
    return {str(k): str(v)[:MAX_IDENTITY_CHARS] for k, v in params.items() if is_identity(str(k))}


def is_identity(key: str) -> bool:
    """An environment, code or data-hash param: where and on what a trial ran, not what it was asked."""
    return key.startswith("env.") or (key.startswith("data.") and key.endswith("sha256"))
