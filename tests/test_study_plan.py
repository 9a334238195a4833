"""A study's plan, built once (``clsr.study.study_plan``): for shipped studies (a grid, a staged one, a
sampled one with its confirmation) its points, unavailable points, trials, configurations, waves and
fingerprint equal what the separate functions compute, and ``study run`` builds it once and takes it
as given: each trial document is built once, and the record and the waves get the plan's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from clsr.study import runner, study_plan
from clsr.study.fingerprint import fingerprint
from clsr.study.load import load_study
from clsr.study.plan import experiments, grid_points, resolve_trial
from clsr.study.runner import expand_trials, plan_points
from clsr.study.schema import StudyError
from clsr.study.study_plan import plan_study

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLED = {
    "name": "sampled",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16, "max_steps": 20}},
    "seeds": [1, 2],
    "search": {"algorithm": "optuna", "num_samples": 4},
    "ablations": {
        "lr": {"space": {"trainer.lr": {"loguniform": [1e-5, 1e-4]}}},
        "confirm": {
            "confirm": {"of": "lr", "top_k": 2},
            "seeds": [7, 8, 9],
            "points": [{"label": "paper", "set": {"trainer.lr": 3e-5}, "paper": 76.3}],
            "reference": "paper",
        },
    },
}


def sampled_study(tmp_path: Path, **changes):
    doc = copy.deepcopy(SAMPLED) | changes
    path = tmp_path / "sampled.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_study(path)


def shipped(name: str, smoke: bool = False):
    return load_study(REPO_ROOT / "studies" / name, smoke=smoke)


STUDIES = {
    "grid": lambda tmp_path: shipped("smoke.yaml"),
    "staged": lambda tmp_path: shipped("rcl_ablations.yaml", smoke=True),
    "staged, unavailable offline": lambda tmp_path: shipped("rcl_ablations.yaml"),
    "sampled": sampled_study,
    "sampled, unavailable offline": lambda tmp_path: shipped("simcse_tuning.yaml"),
}


def expected_documents(study) -> int:
    """Trial documents a plan builds: each grid point × seed, and a base per seed of a sampled or
    confirm ablation."""
    return sum(
        len(study.seeds_of(name)) * ((0 if a.space else len(grid_points(a))) + bool(a.space or a.confirm))
        for name, a in study.ablations.items()
    )


@pytest.mark.parametrize("which", list(STUDIES))
def test_the_plan_equals_what_the_separate_functions_compute(which, tmp_path):
    study = STUDIES[which](tmp_path)
    plan = plan_study(study)
    points, unavailable = plan_points(study)
    assert list(plan.points) == points
    assert list(plan.unavailable) == unavailable
    assert [t.entry() for t in plan.trials] == expand_trials(study, points)
    assert list(plan.waves) == experiments(study)
    assert plan.fingerprint == fingerprint(study)
    for trial in plan.trials:
        if study.ablations[trial.ablation].needs:  # resolved once its upstream trials' outputs exist
            assert trial.config is None
        else:
            assert trial.config == resolve_trial(study, trial.ablation, trial.overrides, trial.seed)
    waved = [t for _, _, wave in plan.waves for t in plan.wave_trials(wave)]
    assert sorted(map(str, waved)) == sorted(str(t.entry()) for t in plan.trials)
    if "unavailable" in which:
        assert plan.unavailable and not plan.trials
    else:
        assert plan.trials and not plan.unavailable


def test_a_staged_plan_has_its_waves_and_lazy_trials():
    """Later waves hold the ablations that need upstream outputs; their trials have no configuration
    yet (``runner.ready_trials`` resolves them once the outputs exist), the first wave's have one."""
    study = shipped("rcl_ablations.yaml", smoke=True)
    plan = plan_study(study)
    first, *later = [wave for _, _, wave in plan.waves]
    assert later and all(study.ablations[a].needs for wave in later for a in wave)
    assert all(t.config is not None for t in plan.trials if t.ablation in first)
    assert all(t.config is None for wave in later for t in plan.trials if t.ablation in wave)
    assert all(t.key == f"{t.ablation}[{t.label}] seed={t.seed}" for t in plan.trials)


class _Stop(Exception):
    pass


def _stub_run(monkeypatch, calls: list):
    """``_run_study`` with no tracking server, storage, record or Ray: what it hands on is recorded."""

    class Lease:
        token, generation = "t", 1

        def start(self):
            calls.append("lease")

        def release(self):
            pass

    class Interrupts:
        def __init__(self, timeout):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    def start_record(client, uri, study, text, current, new):
        calls.append(("start_record", current))
        return "parent", "storage", Lease()

    def run_waves(plan, *args):
        calls.append(("run_waves", plan))
        raise _Stop

    monkeypatch.setattr(runner, "resolve_tracking_uri", lambda uri: "sqlite:///nowhere.db")
    monkeypatch.setattr(runner, "check_reachable", lambda uri: None)
    monkeypatch.setattr(runner, "check_storage", lambda study: calls.append("check_storage"))
    monkeypatch.setattr(runner, "PatientClient", lambda uri: object())
    monkeypatch.setattr(runner, "Interrupts", Interrupts)
    monkeypatch.setattr(runner, "start_record", start_record)
    monkeypatch.setattr(runner, "tell", lambda **_: None)
    monkeypatch.setattr(runner, "_run_waves", run_waves)


@pytest.mark.parametrize("which", ["grid", "staged", "sampled"])
def test_study_run_plans_once_and_takes_the_plan_as_given(which, tmp_path, monkeypatch):
    study = STUDIES[which](tmp_path)
    expected_fingerprint, expected_trials = fingerprint(study), expand_trials(study, plan_points(study)[0])
    counted = {"trial_document": 0, "grid_points": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            counted[name] += 1
            return real(*args, **kwargs)

        return wrapper

    def refused(*args, **kwargs):
        raise AssertionError("the plan's documents and points are taken as given")

    monkeypatch.setattr(study_plan, "trial_document", counting("trial_document", study_plan.trial_document))
    monkeypatch.setattr(study_plan, "grid_points", counting("grid_points", study_plan.grid_points))
    for module in ("clsr.study.fingerprint", "clsr.study.sources", "clsr.study.runner"):
        monkeypatch.setattr(f"{module}.grid_points", refused)
    for module in ("clsr.study.sources", "clsr.study.runner", "clsr.study.plan"):
        monkeypatch.setattr(f"{module}.resolve_trial", refused)
    monkeypatch.setattr("clsr.study.fingerprint.trial_document", refused)
    calls: list = []
    _stub_run(monkeypatch, calls)
    with pytest.raises(_Stop):
        runner._run_study(study, "", resume=False, allow_changes=False, new=False)
    assert counted == {
        "trial_document": expected_documents(study),
        "grid_points": sum(not a.space for a in study.ablations.values()),
    }
    (check, (_, current), lease, (_, plan)) = calls
    assert (check, lease) == ("check_storage", "lease")
    assert current is plan.fingerprint and current == expected_fingerprint
    assert [t.entry() for t in plan.trials] == expected_trials


def test_unavailable_points_are_refused_before_storage_and_record(tmp_path, monkeypatch):
    base = {"model": {"name": "no-such-org/no-such-model"}, "trainer": {"max_steps": 20}}
    study = sampled_study(tmp_path, base=base)
    calls: list = []
    _stub_run(monkeypatch, calls)
    with pytest.raises(StudyError) as refused:
        runner._run_study(study, "", resume=False, allow_changes=False, new=False)
    assert calls == []
    assert refused.value.problems[-1].startswith("fix the above, or set skip_unavailable: true")
    assert refused.value.problems[:-1] == plan_points(study)[1]


def test_skipped_points_are_said_before_storage_is_checked(tmp_path, monkeypatch, capsys):
    base = {"model": {"name": "no-such-org/no-such-model"}, "trainer": {"max_steps": 20}}
    study = sampled_study(tmp_path, base=base, skip_unavailable=True)
    calls: list = []
    _stub_run(monkeypatch, calls)
    monkeypatch.setattr(runner, "check_storage", lambda study: calls.append(capsys.readouterr().out))
    with pytest.raises(_Stop):
        runner._run_study(study, "", resume=False, allow_changes=False, new=False)
    said = calls[0].splitlines()
    assert said == [f"skipped (not available here): {line.splitlines()[0]}" for line in plan_points(study)[1]]
    assert len(said) == 2 and calls[-1][1].trials == ()


def test_identical_trials_and_shared_inputs_are_found_from_the_plans_configurations(monkeypatch):
    """``merge_identical`` and ``shared_inputs`` read the plan's configurations (nothing resolved again)
    and find what they find by resolving each trial."""
    from clsr.study.distinct import merge_identical
    from clsr.study.runner import shared_inputs

    supmpn = load_study(REPO_ROOT / "studies" / "supmpn_ablations.yaml", overrides=[("model.name", "minilm")])
    gclsr = shipped("gclsr_ablations.yaml", smoke=True)
    supmpn_plan, gclsr_plan = plan_study(supmpn), plan_study(gclsr)
    supmpn_trials = [t.entry() for t in supmpn_plan.trials]
    gclsr_trials = gclsr_plan.wave_trials(gclsr_plan.waves[0][2])
    merged, wanted = merge_identical(supmpn, supmpn_trials), shared_inputs(gclsr, gclsr_trials)
    assert len(merged) < len(supmpn_trials) and wanted
    monkeypatch.setattr("clsr.study.plan.resolve_trial", _refused)
    monkeypatch.setattr("clsr.study.runner.resolve_trial", _refused)
    assert merge_identical(supmpn, supmpn_trials, None, supmpn_plan.config_of) == merged
    assert shared_inputs(gclsr, gclsr_trials, None, gclsr_plan.config_of) == wanted


def test_a_trial_the_plan_does_not_hold_is_resolved():
    """A staged trial, a sampled ablation's base, a point the plan does not know: no configuration."""
    plan = plan_study(shipped("rcl_ablations.yaml", smoke=True))
    staged = next(t for t in plan.trials if t.config is None)
    assert plan.config_of(staged.entry()) is None
    held = next(t for t in plan.trials if t.config is not None)
    assert plan.config_of(held.entry()) is held.config
    assert plan.config_of({**held.entry(), "overrides": {"trainer.lr": 1e-3}}) is None
    assert plan.config_of({"ablation": held.ablation, "overrides": {}, "seed": held.seed}) is None


def _refused(*args, **kwargs):
    raise AssertionError("the plan's configurations are taken as given")
