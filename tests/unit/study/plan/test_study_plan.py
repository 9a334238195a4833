"""A study's plan, built once (``clsr.study.plan.study_plan``): for shipped studies (a grid, a staged one, a
sampled one with its confirmation) its points, unavailable points, trials, configurations, waves and
fingerprint equal what the separate functions compute, and ``study run`` builds it once and takes it
as given: each trial document is built once, and the record and the waves get the plan's."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from clsr.study.plan import probe, projection, study_plan  # noqa: F401 (imported before any is patched)
from clsr.study.plan import resolve as plan_module
from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_documents, load_study
from clsr.study.plan.resolve import StudyDocuments, count_trials, experiments, grid_points, resolve_trial
from clsr.study.plan.study_plan import check_points, plan_study
from clsr.study.run import runner  # noqa: F401
from clsr.study.run.experiment import expand_trials
from clsr.study.run.tune_point import point_of
from clsr.study.spec.schema import StudyError
from tests.support.hub import hub_model_ids, stub_datasets_cache, stub_hub_cache

REPO_ROOT = Path(__file__).resolve().parents[4]
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


def sampled_study(tmp_path: Path, documents: bool = False, **changes):
    doc = copy.deepcopy(SAMPLED) | changes
    path = tmp_path / "sampled.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_documents(path) if documents else load_study(path)


def shipped(name: str, smoke: bool = False, documents: bool = False):
    """The shipped study (with the documents validation resolved: ``documents``)."""
    loaded = load_documents(REPO_ROOT / "studies" / name, smoke=smoke)
    return loaded if documents else loaded.study


STUDIES = {
    "grid": lambda tmp_path, **kw: shipped("smoke.yaml", **kw),
    "staged": lambda tmp_path, **kw: shipped("rcl_ablations.yaml", smoke=True, **kw),
    "staged, unavailable offline": lambda tmp_path, **kw: shipped("rcl_ablations.yaml", **kw),
    "sampled": sampled_study,
    "sampled, unavailable offline": lambda tmp_path, **kw: shipped("simcse_tuning.yaml", **kw),
}


def afresh(study):
    """A resolve that builds each trial anew (``resolve_trial``), not through the documents validation
    kept with the study: what the plan's figures are checked against."""
    return lambda ablation, overrides, seed: resolve_trial(study, ablation, overrides, seed)


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
    points, unavailable = check_points(study, resolve=afresh(study))  # not through the kept documents
    assert list(plan.points) == points
    assert list(plan.unavailable) == unavailable
    assert [replace(t, config=None) for t in plan.trials] == expand_trials(study, points)
    assert list(plan.waves) == experiments(study)
    assert plan.fingerprint == fingerprint(study)
    for trial in plan.trials:
        if study.ablations[trial.ablation].needs:  # resolved once its upstream trials' outputs exist
            assert trial.config is None
        else:
            assert trial.config == resolve_trial(study, trial.ablation, trial.overrides, trial.seed)
    waved = [t for _, _, wave in plan.waves for t in plan.wave_trials(wave)]
    assert sorted(map(str, waved)) == sorted(map(str, plan.trials))
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
        def __init__(self, timeout, link=None):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    def start_record(client, uri, study, text, current, new, command_pid=None):
        calls.append(("start_record", current))
        return "parent", "storage", Lease()

    def run_waves(plan, *args):
        calls.append(("run_waves", plan))
        raise _Stop

    monkeypatch.setattr(runner, "resolve_tracking_uri", lambda uri: "sqlite:///nowhere.db")
    monkeypatch.setattr(runner, "check_reachable", lambda uri: None)
    monkeypatch.setattr(
        runner, "check_storage", lambda study, console=None, py_modules=(): calls.append("check_storage")
    )
    monkeypatch.setattr(runner, "PatientClient", lambda uri: object())
    monkeypatch.setattr(runner, "Interrupts", Interrupts)
    monkeypatch.setattr(runner, "start_record", start_record)
    monkeypatch.setattr(runner, "run_waves", run_waves)


@pytest.mark.parametrize("which", ["grid", "staged", "sampled"])
def test_study_run_plans_once_and_takes_the_plan_as_given(which, tmp_path, monkeypatch):
    """From ``load_study`` (validation) to the waves, each trial document is built once: the plan
    reads the documents validation resolved."""
    reference = STUDIES[which](tmp_path)
    expected_fingerprint = fingerprint(reference)
    expected_trials = expand_trials(reference, check_points(reference)[0])
    counted = {"trial_document": 0, "study_grids": 0}
    built: set = set()

    def counting(name, real):
        def wrapper(*args, **kwargs):
            counted[name] += 1
            if name == "trial_document":
                built.add(repr(args[1:]))
            return real(*args, **kwargs)

        return wrapper

    def refused(*args, **kwargs):
        raise AssertionError("the plan's documents and points are taken as given")

    monkeypatch.setattr(plan_module, "trial_document", counting("trial_document", plan_module.trial_document))
    monkeypatch.setattr(plan_module, "study_grids", counting("study_grids", plan_module.study_grids))
    documents = STUDIES[which](tmp_path, documents=True)  # validated with the counters in place
    study = documents.study
    for module in ("clsr.study.plan.fingerprint", "clsr.study.plan.sources", "clsr.study.run.experiment"):
        for builder in ("grid_points", "study_grids"):  # whichever the module builds points with
            monkeypatch.setattr(f"{module}.{builder}", refused, raising=False)
    for module in ("clsr.study.run.waves", "clsr.study.run.shared", "clsr.study.plan.resolve"):
        monkeypatch.setattr(f"{module}.resolve_trial", refused)
    calls: list = []
    _stub_run(monkeypatch, calls)
    with pytest.raises(_Stop):
        runner._run_study(study, "", resume=False, allow_changes=False, new=False, documents=documents)
    assert counted == {
        "trial_document": expected_documents(study) + 1,  # and the study's base (validation checks it)
        "study_grids": 1,  # every ablation's points, built once
    }
    assert len(built) == counted["trial_document"]
    (check, (_, current), lease, (_, plan)) = calls
    assert (check, lease) == ("check_storage", "lease")
    assert current is plan.fingerprint and current == expected_fingerprint
    assert plan.documents is documents
    assert [replace(t, config=None) for t in plan.trials] == expected_trials


def test_unavailable_points_are_refused_before_storage_and_record(tmp_path, monkeypatch):
    base = {"model": {"name": "no-such-org/no-such-model"}, "trainer": {"max_steps": 20}}
    study = sampled_study(tmp_path, base=base)
    calls: list = []
    _stub_run(monkeypatch, calls)
    with pytest.raises(StudyError) as refused:
        runner._run_study(study, "", resume=False, allow_changes=False, new=False)
    assert calls == []
    assert refused.value.problems[-1].startswith("fix the above, or set skip_unavailable: true")
    assert refused.value.problems[:-1] == check_points(study)[1]


def test_skipped_points_are_said_before_storage_is_checked(tmp_path, monkeypatch, capsys):
    base = {"model": {"name": "no-such-org/no-such-model"}, "trainer": {"max_steps": 20}}
    study = sampled_study(tmp_path, base=base, skip_unavailable=True)
    calls: list = []
    _stub_run(monkeypatch, calls)
    monkeypatch.setattr(
        runner,
        "check_storage",
        lambda study, console=None, py_modules=(): calls.append(capsys.readouterr().out),
    )
    with pytest.raises(_Stop):
        runner._run_study(study, "", resume=False, allow_changes=False, new=False)
    said = calls[0].splitlines()
    assert said == [
        f"skipped (not available here): {line.splitlines()[0]}" for line in check_points(study)[1]
    ]
    assert len(said) == 2 and calls[-1][1].trials == ()


def test_identical_trials_and_shared_inputs_are_found_from_the_plans_configurations(monkeypatch):
    """``merge_identical`` and ``shared_inputs`` read the plan's configurations (nothing resolved again)
    and find what they find by resolving each trial."""
    from clsr.study.plan.distinct import merge_identical
    from clsr.study.run.shared import shared_inputs

    supmpn = load_study(REPO_ROOT / "studies" / "supmpn_ablations.yaml", overrides=[("model.name", "minilm")])
    gclsr = shipped("gclsr_ablations.yaml", smoke=True)
    supmpn_plan, gclsr_plan = plan_study(supmpn), plan_study(gclsr)
    supmpn_trials = list(supmpn_plan.trials)
    gclsr_trials = gclsr_plan.wave_trials(gclsr_plan.waves[0][2])
    bare = [replace(t, config=None) for t in supmpn_trials]  # what they find resolving each trial
    merged = merge_identical(supmpn, bare)
    wanted = shared_inputs(gclsr, [replace(t, config=None) for t in gclsr_trials])
    assert len(merged) < len(supmpn_trials) and wanted
    monkeypatch.setattr("clsr.study.plan.resolve.resolve_trial", _refused)
    monkeypatch.setattr("clsr.study.run.shared.resolve_trial", _refused)
    assert [replace(t, config=None) for t in merge_identical(supmpn, supmpn_trials)] == merged
    assert shared_inputs(gclsr, gclsr_trials) == wanted


def test_a_trial_the_plan_does_not_hold_is_resolved():
    """A staged trial has no configuration in the plan; the others carry theirs to the waves."""
    plan = plan_study(shipped("rcl_ablations.yaml", smoke=True))
    staged = next(t for t in plan.trials if t.config is None)
    assert plan.study.ablations[staged.ablation].needs
    held = next(t for t in plan.trials if t.config is not None)
    assert any(t is held for t in plan.wave_trials([held.ablation]))


def _refused(*args, **kwargs):
    raise AssertionError("the plan's configurations are taken as given")


# --- the commands that need no full plan: study validate and study plan resolve each trial once -------

EVERY_STUDY = sorted((REPO_ROOT / "studies").glob("*.yaml"))


@pytest.fixture(scope="module")
def every_source_here(tmp_path_factory):
    """The shipped studies' hub models and data sets, as if downloaded (``test_yaml_safety``'s
    stand-ins), and the data folder with ParaNMT's (empty) release file: every point runnable here."""
    from clsr.data.pair_sources import PARANMT_FILE
    from clsr.data.sources import resolve_data_dir

    models = stub_hub_cache(tmp_path_factory.mktemp("hub"), hub_model_ids(EVERY_STUDY))
    datasets = stub_datasets_cache(tmp_path_factory.mktemp("datasets"))
    data = tmp_path_factory.mktemp("data")
    for child in resolve_data_dir().iterdir():
        (data / child.name).symlink_to(child)
    (data / PARANMT_FILE).parent.mkdir()
    (data / PARANMT_FILE).touch()
    return {"HF_HUB_CACHE": models, "HF_DATASETS_CACHE": datasets, "CLSR_DATA_DIR": data}


def _smoke_variants():
    for path in EVERY_STUDY:
        yield pytest.param(path, False, id=path.name)
        if "smoke" in yaml.safe_load(path.read_text()):
            yield pytest.param(path, True, id=f"{path.name}, smoke")


@pytest.mark.parametrize(("path", "smoke"), list(_smoke_variants()))
def test_the_counts_from_the_kept_documents_equal_a_fresh_count(path, smoke, monkeypatch, every_source_here):
    """``study validate``'s counts come from the documents validation kept; resolving every trial
    afresh counts the same (unavailable points too: a method may want what is not here)."""
    for name, value in every_source_here.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    documents = load_documents(path, smoke=smoke)
    study = documents.study
    counted = count_trials(study, resolve=afresh(study))
    assert documents.counts() == counted
    assert plan_study(study, documents).documents is documents  # the plan reads the same documents
    assert documents.counts() == counted


def test_the_counts_of_a_plan_with_unavailable_points_count_them_too(tmp_path):
    base = {"model": {"name": "no-such-org/no-such-model"}, "trainer": {"max_steps": 20}}
    study = sampled_study(tmp_path, base=base, skip_unavailable=True)
    plan = plan_study(study)
    counted = count_trials(study, resolve=afresh(study))
    assert plan.unavailable and not plan.trials
    assert plan.documents.counts() == counted == (8 + 9, 8 + 9)


def _count_documents(monkeypatch) -> dict:
    """Each trial document a ``StudyDocuments`` builds, counted; resolving a trial any other way
    (``resolve_trial``, ``trial_identity``) fails."""
    import json

    built: dict = {}
    real = plan_module.trial_document

    def counting(study, ablation, overrides, seed, *rest):
        key = (ablation, json.dumps(overrides, sort_keys=True, default=repr), seed)
        built[key] = built.get(key, 0) + 1
        return real(study, ablation, overrides, seed, *rest)

    monkeypatch.setattr(plan_module, "trial_document", counting)
    monkeypatch.setattr("clsr.study.plan.resolve.resolve_trial", _refused)
    monkeypatch.setattr("clsr.study.plan.resolve.trial_identity", _refused)
    monkeypatch.setattr("clsr.study.plan.distinct.trial_identity", _refused)
    return built


def _sampled_file(tmp_path: Path) -> Path:
    sampled_study(tmp_path)  # writes it
    return tmp_path / "sampled.yaml"


VALIDATED = {
    "grid": lambda tmp_path: REPO_ROOT / "studies" / "smoke.yaml",
    "staged": lambda tmp_path: REPO_ROOT / "studies" / "rcl_ablations.yaml",
    "sampled": _sampled_file,
}


@pytest.mark.parametrize("which", list(VALIDATED))
def test_study_validate_builds_each_trial_document_once(which, tmp_path, monkeypatch, capsys):
    """Validation, the source checks and the counts share one ``StudyDocuments``: every grid point ×
    seed (a sampled ablation's base at its first seed), and the study's base, built once."""
    from clsr.cli import main

    path = VALIDATED[which](tmp_path)
    argv = ["--smoke"] if which == "staged" else []
    study = load_study(path, smoke=bool(argv))
    trials, distinct = count_trials(study)
    expected = sum(
        len(study.seeds_of(name)) * len(grid_points(a)) if not a.space else 1
        for name, a in study.ablations.items()
    )
    built = _count_documents(monkeypatch)
    assert main(["study", "validate", str(path), *argv]) == 0
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0] == f"ok  {path}: {trials} trial{'s' if trials != 1 else ''} ({distinct} distinct)"
    )
    assert set(built.values()) == {1} and len(built) == expected + 1  # + the study's base


def test_study_plan_prices_and_sizes_from_documents_resolved_once(monkeypatch):
    """``project`` and ``checkpoint_lines`` given a ``StudyDocuments`` find what they find with each
    trial resolved afresh, and build each trial document once (the sampled-free GCLSR smoke study)."""
    from clsr.study.plan.projection import Measured, UnitCosts, project
    from clsr.study.plan.resolve import checkpoint_lines

    study = shipped("gclsr_ablations.yaml", smoke=True)
    measured = Measured("x", UnitCosts(1.0, 0.0, 0.1, 1.0, 0.1, 1.0, 1, "1 x cpu"))
    quiet = {"progress": lambda _: None}
    expected = (
        project(study, measured, 1, "h100", **quiet, resolve=afresh(study)),
        checkpoint_lines(study, resolve=afresh(study)),
    )
    built = _count_documents(monkeypatch)
    documents = StudyDocuments(study)
    found = (
        project(study, measured, 1, "h100", **quiet, grids=documents.grids, resolve=documents.config),
        checkpoint_lines(study, documents.grids, documents.config),
    )
    assert found == expected
    assert set(built.values()) == {1}
    assert len(built) == sum(len(study.seeds_of(n)) * len(grid_points(a)) for n, a in study.ablations.items())


# sha256 of each study's fingerprint (json, sorted keys) as computed by the code before the plan (088bcd8),
# on these files: a resume compares fingerprints, so the plan must hash every trial exactly as before.
GOLDEN_FINGERPRINTS = {
    ("smoke.yaml", False): "c0e43cb46a84cb10e72aa20ff2743ad2f9afd1f0faea26fc89cd0f83a17ccf53",
    ("rcl_ablations.yaml", True): "9fb215bd8dc58a73fb1df228b4aea0fb35bad459da063e285135dfacb563fbcd",
    ("simcse_tuning.yaml", False): "9522c17578d0f86539b46898cf2b1fbd35a845ee51024b411f9d6ccb1e7ae396",
    ("supmpn_ablations.yaml", True): "417460d2132a64e882d62f036c59960f31e12431585f555da20193a2f5ac4010",
}


@pytest.mark.parametrize(("name", "smoke"), list(GOLDEN_FINGERPRINTS), ids=lambda v: str(v))
def test_the_plans_fingerprint_is_the_one_recorded_before_the_plan(name, smoke):
    import hashlib
    import json

    prints = plan_study(shipped(name, smoke=smoke)).fingerprint
    digest = hashlib.sha256(json.dumps(prints, sort_keys=True).encode()).hexdigest()
    assert digest == GOLDEN_FINGERPRINTS[(name, smoke)]


def test_a_trials_configuration_is_found_by_its_overrides_not_by_an_equal_looking_value(tmp_path):
    """``1``, ``1.0`` and ``True`` compare equal in Python; as overrides they are other points."""
    study = sampled_study(
        tmp_path,
        search={"algorithm": "grid"},
        ablations={"steps": {"points": [
            {"label": "one step", "set": {"trainer.max_steps": 1}},
            {"label": "log each", "set": {"trainer.log_every": 1}},
        ]}},
    )  # fmt: skip
    plan = plan_study(study)
    trials = plan.wave_trials(["steps"])
    assert len(trials) == 2 * 2  # two points, two seeds
    for trial in trials:
        resolved = resolve_trial(study, "steps", trial.overrides, trial.seed)
        assert trial.config is not None and trial.config.model_dump() == resolved.model_dump()
        point_of(trial)["overrides"]["trainer.max_steps"] = 5  # Tune's copy: the plan stays as planned
    assert [t.overrides.get("trainer.max_steps") for t in plan.trials] == [1, 1, None, None]
    one = plan.documents.document("steps", {"trainer.max_steps": 1}, 1)
    assert plan.documents.document("steps", {"trainer.max_steps": 1.0}, 1) is not one
    assert plan.documents.document("steps", {"trainer.max_steps": 1}, 1) is one


def test_the_study_holds_no_cache_the_documents_are_returned_with_it(tmp_path):
    """One resolution cache: ``load_documents`` returns the documents validation resolved with its study,
    which holds none (two loads of one file are equal, a pickled study carries nothing else)."""
    import pickle

    path = REPO_ROOT / "studies" / "smoke.yaml"
    documents, again = load_documents(path), load_study(path)
    study = documents.study
    assert study == again and pickle.loads(pickle.dumps(study)) == study
    assert not study.__pydantic_private__.get("_documents")
    assert documents.config("temperature", {}, 42) is documents.config("temperature", {}, 42)
    assert plan_study(study, documents).documents is documents
    assert plan_study(again, documents).documents is not documents  # another study: its own


def test_a_value_that_is_not_text_is_named_by_validation(tmp_path):
    """Bytes that are not UTF-8 (``!!binary``) where a name belongs: the field is named, as before the
    documents were kept (their staleness check must not fail first)."""
    doc = copy.deepcopy(SAMPLED)
    path = tmp_path / "binary.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False).replace("name: minilm", "name: !!binary /w=="))
    with pytest.raises(StudyError) as refused:
        load_study(path)
    assert any("model.name" in line for line in refused.value.problems), refused.value.problems
