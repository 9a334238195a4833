"""The report's Pareto front is Optuna's own, checked against a brute-force dominance test written here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from clsr.study.stats.pareto import near_front, pareto_front


def dominated(a: np.ndarray, b: np.ndarray, signs: np.ndarray) -> bool:
    """Whether ``b`` dominates ``a`` (signs: +1 maximise, -1 minimise)."""
    return bool(np.all(signs * b >= signs * a) and np.any(signs * b > signs * a))


@pytest.mark.parametrize("modes", [["max", "max"], ["max", "min"], ["min", "max", "max"]])
def test_the_front_holds_exactly_the_points_none_dominates(modes):
    rng = np.random.default_rng(len(modes) * 7 + (modes[1] == "min"))
    values = np.round(rng.normal(80, 3, size=(40, len(modes))), 1)  # rounding makes ties
    points = {f"c{i}": list(v) for i, v in enumerate(values)}
    signs = np.array([1 if m == "max" else -1 for m in modes])
    expected = [
        f"c{i}"
        for i, a in enumerate(values)
        if not any(dominated(a, b, signs) for j, b in enumerate(values) if j != i)
    ]
    assert pareto_front(points, modes) == expected and 0 < len(expected) < len(values)


def test_a_configuration_missing_an_objective_is_left_out():
    points = {"a": [80.0, 84.0], "b": [83.0, 80.0], "c": [79.0, math.nan], "d": [79.0, 82.0]}
    assert pareto_front(points, ["max", "max"]) == ["a", "b"]
    assert list(itertools.chain(pareto_front({"only": [1.0, 2.0]}, ["min", "min"]))) == ["only"]


def test_near_the_front_means_cis_overlapping_a_front_one_on_every_objective():
    """c overlaps a on both objectives; d overlaps a on the first only; e has no CI (one seed); nan ends
    never overlap."""
    nan = math.nan
    intervals = {
        "a": [(78.5, 83.5), (83.5, 88.5)],
        "b": [(81.5, 86.5), (80.5, 85.5)],
        "c": [(77.5, 82.5), (82.5, 87.5)],
        "d": [(79.0, 80.0), (70.0, 72.0)],
        "e": [(nan, nan), (nan, nan)],
    }
    assert near_front(intervals, ["a", "b"]) == ["c"]
    assert near_front(intervals, ["c"]) == ["a", "b"]  # d reaches c on the first objective only
    assert near_front(intervals, []) == []
