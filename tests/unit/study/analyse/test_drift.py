"""Issue 55: a verdict whose trials ran in several environments says so (the report's note), and what a
colleague planted in an ``env.*`` param reaches the terminal escaped."""

from __future__ import annotations

from clsr.study.analyse.drift import drift, drift_lines, mixed
from clsr.study.analyse.rows import Row, verdict_drift, verdicts
from clsr.study.analyse.runs import Trial
from clsr.tracking import escape


def trial(seed: int, value: float, **env: str) -> Trial:
    params = {f"env.{k}": v for k, v in ({"torch": "2.8.0", "gpu": "none"} | env).items()}
    return Trial(f"r{seed}", "t", "0.05", seed, "finished", {"test_sts_avg": value}, {}, 0, params)


def row(trials: list[Trial], paper: dict[str, float]) -> Row:
    r = Row("0.05", {}, paper, [t.seed for t in trials], {t.seed: t for t in trials})
    r.verdicts = verdicts(r, ["test_sts_avg"], 0.5)
    return r


def test_a_verdict_pooling_two_environments_says_so_and_one_environment_says_nothing():
    mixed_row = row(
        [trial(1, 76.0), trial(2, 76.4, torch="2.9.0", gpu="NVIDIA H200")], {"test_sts_avg": 76.3}
    )
    same = row([trial(1, 76.0), trial(2, 76.4)], {"test_sts_avg": 76.3})
    unpublished = row([trial(1, 76.0), trial(2, 76.4, torch="2.9.0")], {})  # no verdict: no note
    assert mixed_row.verdicts and same.verdicts and not unpublished.verdicts
    assert verdict_drift([mixed_row, same, unpublished]) == [
        "0.05: its verdict pools trials that ran in 2 environments: gpu NVIDIA H200, none; torch 2.8.0, 2.9.0"
    ]


def test_trials_without_an_environment_are_not_an_environment_of_their_own():
    old = Trial("r", "t", "0.05", 3, "finished", {}, {}, 0, {"method.name": "simcse_unsup"})
    assert mixed([trial(1, 76.0), old]) is None


def test_a_planted_control_sequence_is_shown_not_obeyed():
    lines = drift_lines(drift([trial(1, 76.0)], [trial(1, 76.0, torch="2.9.0\x1b]52;c;AAAA\x07")]))
    shown = escape.terminal("\n".join(lines))
    assert "\x1b" not in shown and "\x07" not in shown
    assert "torch 2.8.0 (A) / 2.9.0\\x1b]52;c;AAAA\\x07 (B)" in shown
