"""Drift: the environment, code and data differences between the trials a comparison or a verdict puts
together. Each trial's run records where it ran (``env.*``, ``clsr.tracking.environment``) and the hashes
of the data it read (``data.<name>.sha256``); they are read through ``clsr.tracking.record_reader``
(never raising on a colleague's values) and named here, so that "B is 0.8 points better" comes with
"B ran torch 2.9 on an H200, A torch 2.8 on an H100; the data hashes agree". The lines are plain text:
each renderer escapes them for where it writes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from clsr.study.analyse.runs import Trial
from clsr.tracking.record_reader import identity_params

ENV = "env."
CODE_KEYS = ("env.clsr", "env.git_commit", "env.git_dirty")
SHORT_HASH = 12  # a differing data hash is shown by its first characters


def identities(trials: Iterable[Trial]) -> dict[str, list[str]]:
    """Identity param -> the distinct values the trials logged, sorted."""
    seen: dict[str, set[str]] = {}
    for trial in trials:
        for key, value in identity_params(trial.params).items():
            seen.setdefault(key, set()).add(value)
    return {k: sorted(v) for k, v in sorted(seen.items())}


@dataclass(frozen=True)
class Drift:
    """What differs between two sets of trials: (param, A's values, B's values) per kind."""

    environment: list[tuple[str, list[str], list[str]]]
    code: list[tuple[str, list[str], list[str]]]
    data: list[tuple[str, list[str], list[str]]]
    data_agree: int  # data hashes both logged, with one and the same value
    logged: tuple[bool, bool]  # whether A's, B's trials recorded their environment at all


def drift(a: Iterable[Trial], b: Iterable[Trial]) -> Drift:
    ia, ib = identities(a), identities(b)
    differ = [
        (k, ia.get(k, ["-"]), ib.get(k, ["-"]))
        for k in sorted(ia.keys() | ib.keys())
        if ia.get(k) != ib.get(k)
    ]
    env = [d for d in differ if d[0].startswith(ENV)]
    agree = sum(
        1 for k in ia.keys() & ib.keys() if not k.startswith(ENV) and ia[k] == ib[k] and len(ia[k]) == 1
    )
    return Drift(
        environment=[d for d in env if d[0] not in CODE_KEYS],
        code=[d for d in env if d[0] in CODE_KEYS],
        data=[d for d in differ if not d[0].startswith(ENV)],
        data_agree=agree,
        logged=(any(k.startswith(ENV) for k in ia), any(k.startswith(ENV) for k in ib)),
    )


def _values(key: str, values: list[str]) -> str:
    shown = [v[:SHORT_HASH] if key.endswith("sha256") else v for v in values]
    return ", ".join(shown)


def _named(changes: list[tuple[str, list[str], list[str]]]) -> str:
    return "; ".join(
        f"{k.removeprefix(ENV)} {_values(k, va)} (A) / {_values(k, vb)} (B)" for k, va, vb in changes
    )


def drift_lines(d: Drift) -> list[str]:
    """The comparison's drift, one line per kind: environment, code, data."""
    if not any(d.logged):
        return ["environment: not recorded by either record's runs (a clsr before issue 55)"]
    lines = []
    if not all(d.logged):
        side = "A" if not d.logged[0] else "B"
        lines.append(f"environment: not recorded by {side}'s runs (a clsr before issue 55)")
    else:
        lines.append(
            f"environment differs: {_named(d.environment)}" if d.environment else "environment: the same"
        )
        lines.append(f"code differs: {_named(d.code)}" if d.code else "code: the same")
    if d.data:
        lines.append(f"data hashes differ: {_named(d.data)}")
    elif d.data_agree:
        lines.append(f"data hashes agree ({d.data_agree} logged by both)")
    else:
        lines.append("data hashes: none logged by both records")
    return lines


def environments(trials: Iterable[Trial]) -> list[dict[str, str]]:
    """The distinct environments (``env.*`` params) the trials ran in; trials that recorded none left out."""
    found: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for trial in trials:
        env = {k: v for k, v in identity_params(trial.params).items() if k.startswith(ENV)}
        if env:
            found.setdefault(tuple(sorted(env.items())), env)
    return list(found.values())


def mixed(trials: Iterable[Trial]) -> str | None:
    """None when the trials ran in one environment, else what differs between theirs, e.g.
    ``2 environments: torch 2.8.0, 2.9.0; gpu NVIDIA H100, none``."""
    envs = environments(trials)
    if len(envs) < 2:
        return None
    keys = sorted({k for env in envs for k in env})
    parts = []
    for key in keys:
        values = sorted({env.get(key, "-") for env in envs})
        if len(values) > 1:
            parts.append(f"{key.removeprefix(ENV)} {', '.join(values)}")
    return f"{len(envs)} environments: {'; '.join(parts)}"
