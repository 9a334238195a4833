"""Adaptive seeds: the decision against SciPy's t interval and statsmodels' TOST on hand-made values,
the schema's refusals and validate's note, the runner's rounds over a real MLflow sqlite store (``_fit``
replaced by one that logs finished child runs), and the report's rows planning the seeds found."""

from __future__ import annotations

import copy
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats
from statsmodels.stats.weightstats import DescrStatsW

from clsr.study.analyse.rows import ablation_report
from clsr.study.analyse.runs import load_trials
from clsr.study.control.stop_request import STOP_TAG
from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import count_trials, seed_notes
from clsr.study.run import waves
from clsr.study.run.adaptive import half_width, needs_seed
from clsr.study.run.trial import StudyContext
from clsr.study.spec.ablation import AdaptiveSeeds
from clsr.study.spec.schema import StudyError
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from tests.support.stores import sqlite_uri

SPEC = AdaptiveSeeds(min=3, max=5, until_ci=0.5)
NAME = "adaptive_t"
STUDY = {
    "name": NAME,
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "ablations": {
        "pooling": {
            "points": [
                {"label": "cls", "set": {"model.pooling": "cls"}},
                {"label": "avg", "set": {"model.pooling": "avg"}},
            ],
            "seeds": {"min": 3, "max": 5, "until_ci": 0.5},
        },
    },
}
# seed -> best_dev_stsb: cls is tight after 3 seeds, avg stays wide through 5
VALUES = {
    "cls": {1: 81.0, 2: 81.1, 3: 81.05, 4: 81.0, 5: 81.0},
    "avg": {1: 80.0, 2: 84.0, 3: 82.0, 4: 86.0, 5: 78.0},
}


def scipy_half(values: list[float]) -> float:
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    return (high - low) / 2


def tost_p(values: list[float], paper: float, tol: float) -> float:
    return DescrStatsW(np.asarray(values)).ttost_mean(paper - tol, paper + tol)[0]


# --- the decision --------------------------------------------------------------------------------


def test_half_width_is_scipys_t_interval():
    values = [80.0, 81.2, 80.5, 79.9]
    assert half_width(values) == pytest.approx(scipy_half(values))
    assert half_width([80.0]) == math.inf


def test_wide_ci_gets_a_seed_narrow_stops():
    wide, narrow = [80.0, 84.0, 82.0], [81.0, 81.1, 81.05]
    assert scipy_half(wide) > 0.5 and scipy_half(narrow) < 0.5
    assert needs_seed(wide, None, 0.5, SPEC)
    assert not needs_seed(narrow, None, 0.5, SPEC)


def test_reproduced_and_narrow_stops_inconclusive_continues():
    narrow = [81.0, 81.1, 81.05]
    assert tost_p(narrow, 81.0, 0.5) < 0.05  # reproduced
    assert not needs_seed(narrow, 81.0, 0.5, SPEC)
    # CI narrow enough for until_ci 2.0, but the mean sits on the band's edge: TOST cannot tell
    edge = [81.0, 81.6, 81.3]
    assert scipy_half(edge) < 2.0 and tost_p(edge, 80.8, 0.5) >= 0.05
    low, high = DescrStatsW(np.asarray(edge)).tconfint_mean()
    assert low <= 80.8 + 0.5  # not wholly outside the band: inconclusive
    loose = AdaptiveSeeds(min=3, max=5, until_ci=2.0)
    assert needs_seed(edge, 80.8, 0.5, loose)
    assert not needs_seed(edge, None, 0.5, loose)


def test_bounds_min_and_max():
    assert needs_seed([81.0, 81.0], None, 0.5, SPEC)  # n < min
    assert not needs_seed([80.0, 84.0, 82.0, 86.0, 78.0], None, 0.5, SPEC)  # n == max, still wide
    assert SPEC.pool == [1, 2, 3, 4, 5]


# --- the schema ----------------------------------------------------------------------------------


def load(tmp_path, doc: dict):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_study(path)


def test_seeds_of_is_the_planned_minimum_and_validate_notes_the_bounds(tmp_path):
    study = load(tmp_path, STUDY)
    assert study.seeds_of("pooling") == [1, 2, 3]
    assert study.adaptive_of("pooling") == SPEC
    assert count_trials(study) == (6, 6)
    assert seed_notes(study) == [
        "ablations.pooling: adaptive seeds: 6 to 10 trials (rows whose CI is wider than ±0.5 or verdict "
        "inconclusive get more seeds)"
    ]
    changed = copy.deepcopy(STUDY)
    changed["ablations"]["pooling"]["seeds"]["until_ci"] = 0.3
    assert fingerprint(load(tmp_path, changed)) != fingerprint(study)


def test_the_size_limit_counts_every_row_at_its_max_seeds(tmp_path, monkeypatch):
    from clsr.study.plan import load as load_module

    monkeypatch.setattr(load_module, "MAX_TRIALS", 8)  # 6 trials planned, up to 10 with every seed added
    with pytest.raises(StudyError, match=r"ablations: 10 trials \(pooling: 10\); a study may have at most 8"):
        load(tmp_path, STUDY)
    monkeypatch.setattr(load_module, "MAX_TRIALS", 10)
    assert load(tmp_path, STUDY).adaptive_of("pooling") == SPEC


@pytest.mark.parametrize(
    "seeds, field",
    [({"min": 4, "max": 3, "until_ci": 0.5}, "max"), ({"min": 1, "max": 3, "until_ci": 0.5}, "min"),
     ({"min": 3, "max": 5, "until_ci": 0}, "until_ci")],
)  # fmt: skip
def test_bad_adaptive_spec(tmp_path, seeds, field):
    doc = copy.deepcopy(STUDY)
    doc["ablations"]["pooling"]["seeds"] = seeds
    with pytest.raises(StudyError, match=field):
        load(tmp_path, doc)


def test_adaptive_refused_on_sampled_and_staged(tmp_path):
    adaptive = {"min": 3, "max": 5, "until_ci": 0.5}
    sampled = {**STUDY, "search": {"algorithm": "random", "num_samples": 2}, "ablations": {
        "lr": {"space": {"trainer.lr": {"loguniform": [1e-5, 1e-4]}}, "seeds": adaptive}}}  # fmt: skip
    with pytest.raises(StudyError, match=r"ablations.lr.seeds: .*sampled ablation \(space\)"):
        load(tmp_path, sampled)
    staged = copy.deepcopy(STUDY)
    staged["ablations"]["down"] = {
        "points": [{"label": "x", "set": {"trainer.batch_size": 8}}],
        "needs": {"model.name": {"ablation": "pooling", "point": "cls"}},
    }
    with pytest.raises(StudyError, match="ablations.pooling.seeds: .*another ablation needs"):
        load(tmp_path, staged)
    staged["ablations"]["pooling"]["seeds"] = [1, 2, 3]
    staged["ablations"]["down"]["seeds"] = adaptive
    with pytest.raises(StudyError, match="ablations.down.seeds: .*with needs"):
        load(tmp_path, staged)


# --- the runner's rounds over a real MLflow store -----------------------------------------------


def add_trial(uri: str, client: MlflowClient, parent: str, label: str, seed: int) -> None:
    tags = {"clsr.method": "simcse_unsup", "clsr.ablation": "pooling", "clsr.point": label, "clsr.seed": seed}
    run_id = open_child_run(uri, parent, f"pooling:{label}:{seed}", f"pooling/{label}/seed={seed}", tags, {})
    client.log_batch(
        run_id, metrics=[Metric("best_dev_stsb", VALUES[label][seed], int(time.time() * 1000), 1)]
    )
    close_run(uri, run_id, "finished", None)


def test_rounds_add_seeds_to_wide_rows_only_up_to_max(tmp_path, monkeypatch, capsys):
    study, ctx, client, parent, _ = _three_seeds(tmp_path, monkeypatch)
    uri = ctx.tracking_uri
    fits = []

    def fake_fit(study, ctx, ablation, name, interrupts, console=None):
        fits.append((name, sorted((t.label, t.seed) for t in ctx.trials)))
        for t in ctx.trials:
            add_trial(uri, client, parent, t.label, t.seed)

    monkeypatch.setattr(waves, "_fit", fake_fit)
    interrupts = SimpleNamespace(check=lambda: None, reason=None)
    waves.adaptive_rounds(study, ctx, ["pooling"], interrupts, client)
    assert fits == [("pooling-seeds2", [("avg", 4)]), ("pooling-seeds3", [("avg", 5)])]
    out = capsys.readouterr().out
    assert (
        "ablations.pooling: round 2 adds a seed to 1 row(s) (CI wider than ±0.5 or verdict inconclusive)"
        in out
    )

    rows = {r.label: r for r in ablation_report(study, "pooling", load_trials(client, parent)).rows}
    assert rows["avg"].seeds == [1, 2, 3, 4, 5] and rows["avg"].missing() == []
    assert rows["cls"].seeds == [1, 2, 3] and rows["cls"].missing() == []
    assert rows["avg"].stats["best_dev_stsb"].n == 5
    assert rows["avg"].trials_text() == "5/5 ok"


def _three_seeds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = load(tmp_path, STUDY)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, NAME, str(tmp_path / "runs"), "adaptive test")
    for label in ("cls", "avg"):
        for seed in study.seeds_of("pooling"):
            add_trial(uri, client, parent, label, seed)
    fits = []
    monkeypatch.setattr(waves, "_fit", lambda study, ctx, ablation, name, *a, **k: fits.append(name))
    monkeypatch.setattr(waves, "shared_inputs", lambda *a, **k: {})
    ctx = StudyContext(study, uri, parent, str(tmp_path / "runs"), [], {}, {})
    return study, ctx, client, parent, fits


def test_a_held_ablation_gets_no_seed_round(tmp_path, monkeypatch, capsys):
    study, ctx, client, parent, fits = _three_seeds(tmp_path, monkeypatch)
    client.set_tag(parent, STOP_TAG, "pooling")
    waves.adaptive_rounds(study, ctx, ["pooling"], SimpleNamespace(check=lambda: None, reason=None), client)
    assert fits == []
    assert "ablations.pooling: no further seed round (platform study stop: ablation(s) pooling)" in (
        capsys.readouterr().out
    )


def test_a_round_that_finished_none_of_its_trials_is_not_built_again(tmp_path, monkeypatch):
    study, ctx, client, parent, fits = _three_seeds(tmp_path, monkeypatch)  # _fit finishes no trial
    waves.adaptive_rounds(study, ctx, ["pooling"], SimpleNamespace(check=lambda: None, reason=None), client)
    assert fits == ["pooling-seeds2"]  # not pooling-seeds3 with the same trial keys


def test_a_resumed_round_that_restores_an_earlier_experiment_does_not_end_the_rounds(tmp_path, monkeypatch):
    study, ctx, client, parent, fits = _three_seeds(tmp_path, monkeypatch)
    # an earlier driver's pooling-seeds2 (other trials) is restored: the next round is still built
    monkeypatch.setattr(waves, "_restorable", lambda ctx, name: name == "pooling-seeds2")
    waves.adaptive_rounds(study, ctx, ["pooling"], SimpleNamespace(check=lambda: None, reason=None), client)
    assert fits == ["pooling-seeds2", "pooling-seeds3"]
