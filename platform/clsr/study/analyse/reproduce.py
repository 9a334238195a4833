"""A reproduction beside its original (``platform study reproduce``): each result metric bitwise equal,
within a tolerance, or different; the costs (times, throughput, utilisation, memory: what the machine
and its load decide) listed as not compared; a metric only one run has named, never a crash; the weights'
hash compared when both runs logged it; and the environment, code and data differences between the two
records (``clsr.study.analyse.drift``). The lines are plain text, escaped for the terminal by ``render``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clsr.study.analyse.drift import Drift, drift, drift_lines
from clsr.study.analyse.runs import Trial
from clsr.tracking.escape import terminal
from clsr.tracking.record_reader import finite

WEIGHTS_TAG = "clsr.weights_sha256"  # clsr.train.loop's: the trained weights' hash
COST_PREFIXES = ("trial_", "system/")  # the trial's accounting: clsr.train.clock, tracking.system_metrics
COST_SUFFIXES = ("_s", "_mb", "_bytes")
COST_PARTS = ("per_s", "utilization", "throughput")
EQUAL, CLOSE, DIFFERENT, ONLY_A, ONLY_B = (
    "bitwise equal",
    "within tolerance",
    "different",
    "only in the original",
    "only in the reproduction",
)
INCOMPLETE, NOTHING = "incomplete", "nothing to compare"  # exit 1, as for DIFFERENT
FAILED = (DIFFERENT, INCOMPLETE, NOTHING)


def is_cost(name: str) -> bool:
    """A metric that measures what the trial cost (time, throughput, utilisation, memory), not what it
    learned: never part of the verdict."""
    return (
        name.startswith(COST_PREFIXES) or name.endswith(COST_SUFFIXES) or any(p in name for p in COST_PARTS)
    )


@dataclass(frozen=True)
class MetricLine:
    name: str
    original: float | None
    reproduction: float | None
    verdict: str


@dataclass(frozen=True)
class Comparison:
    """The two runs side by side: ``metrics`` (the compared ones, by name), ``costs`` (not compared),
    ``weights`` (the hashes' verdict, None when either run lacks one), ``drift`` and the ``verdict``
    (one of ``FAILED``: the reproduction did not give the original's results)."""

    original: str
    reproduction: str
    metrics: list[MetricLine]
    costs: list[str]
    weights: str | None
    drift: Drift
    verdict: str


def _verdict(a: float | None, b: float | None, rtol: float, atol: float) -> str:
    if a is None or b is None:
        return ONLY_B if a is None else ONLY_A
    if a == b or (math.isnan(a) and math.isnan(b)) or str(a) == str(b):
        return EQUAL
    if finite(a) and finite(b) and abs(a - b) <= atol + rtol * abs(a):
        return CLOSE
    return DIFFERENT


def compare_runs(original: Trial, reproduction: Trial, rtol: float = 1e-6, atol: float = 1e-9) -> Comparison:
    """``reproduction`` against ``original``: the verdict is ``different`` when one compared metric (or
    the weights' hash) differs past the tolerance, ``incomplete`` when a result metric of the original
    is missing from the reproduction, ``within tolerance`` when one is not bitwise equal, ``nothing to
    compare`` when the two share no result metric nor a weights' hash, else ``bitwise equal``; a metric
    only the reproduction logged is listed, and left out of the verdict."""
    names = sorted(original.metrics.keys() | reproduction.metrics.keys())
    lines = [
        MetricLine(
            n, a := original.metrics.get(n), b := reproduction.metrics.get(n), _verdict(a, b, rtol, atol)
        )
        for n in names
        if not is_cost(n)
    ]
    hashes = original.tags.get(WEIGHTS_TAG), reproduction.tags.get(WEIGHTS_TAG)
    weights = None if None in hashes else (EQUAL if hashes[0] == hashes[1] else DIFFERENT)
    verdicts = {line.verdict for line in lines if line.verdict not in (ONLY_A, ONLY_B)}
    verdicts |= {weights} if weights else set()
    if verdicts - {EQUAL, CLOSE}:
        verdict = DIFFERENT
    elif any(line.verdict == ONLY_A for line in lines):
        verdict = INCOMPLETE
    elif CLOSE in verdicts:
        verdict = CLOSE
    else:
        verdict = EQUAL if verdicts else NOTHING
    return Comparison(
        original.run_id,
        reproduction.run_id,
        lines,
        [n for n in names if is_cost(n)],
        weights,
        drift([original], [reproduction]),
        verdict,
    )


def _number(value: float | None) -> str:
    return "-" if value is None else repr(value)


def render(c: Comparison) -> str:
    """The comparison for the terminal: the metrics side by side, the costs not compared, the drift
    (A: the original, B: the reproduction), the verdict."""
    width = max([len(m.name) for m in c.metrics] + [6])
    out = [
        f"A: the original run {c.original}",
        f"B: this reproduction {c.reproduction}",
        "",
        f"{'metric':<{width}}  {'original (A)':>22}  {'reproduction (B)':>22}  verdict",
    ]
    out += [
        f"{m.name:<{width}}  {_number(m.original):>22}  {_number(m.reproduction):>22}  {m.verdict}"
        for m in c.metrics
    ]
    if c.weights:
        out.append(f"trained weights (sha256): {c.weights}")
    if c.costs:
        out.append(f"not compared (cost): {', '.join(c.costs)}")
    missing = [m.name for m in c.metrics if m.verdict == ONLY_A]
    why = {
        INCOMPLETE: f" (missing from the reproduction: {', '.join(missing)})",
        NOTHING: " (no result metric nor weights' hash in both runs)",
    }.get(c.verdict, "")
    out += ["", *drift_lines(c.drift), "", f"reproduction: {c.verdict}{why}"]
    return terminal("\n".join(out))


MAX_LOCK_LINES = 5000  # an environment.txt longer than this is no pip freeze: the rest is not read


def distributions(text: str) -> dict[str, str]:
    """``environment.txt`` (``name==version`` per line, ``clsr.tracking.environment``) as name -> version;
    a line of another shape is skipped, never raised on."""
    found = {}
    for line in text.splitlines()[:MAX_LOCK_LINES]:
        name, sep, version = line.strip().partition("==")
        if sep and name and version:
            found[name.lower()[:200]] = version[:200]
    return found


def package_differences(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str, str]]:
    """(distribution, A's version, B's version) for each that differs; ``-``: not installed."""
    return [(n, a.get(n, "-"), b.get(n, "-")) for n in sorted(a.keys() | b.keys()) if a.get(n) != b.get(n)]


def package_line(changes: list[tuple[str, str, str]]) -> str:
    """One line: the installed distributions that differ, or that they agree."""
    if not changes:
        return "installed packages: the same"
    return "packages differ: " + "; ".join(f"{n} {va} (A) / {vb} (B)" for n, va, vb in changes)
