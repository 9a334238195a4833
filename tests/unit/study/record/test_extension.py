"""``platform study extend``'s parts: a run's logged values typed by the space and kept only inside it
(an edited, narrowed space), the warm start read from a real MLflow store of hand-made child runs (seeds
averaged, superseded and unfinished runs left out, several objectives as lists), the rounds recorded on
the parent run, each round's own sampler seed, an Optuna searcher given the finished trials, and the
command's refusals in one line."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.cli.study_extend import refusal
from clsr.study.plan.load import load_study
from clsr.study.record.extension import (
    ExtensionRound,
    WarmStart,
    current_rounds,
    extension_rounds,
    record_extension,
    typed_inside,
    warm_start,
)
from clsr.study.spec.space import Distribution, contains
from tests.support.stores import sqlite_uri

SPACE = {"trainer.lr": {"loguniform": [1e-5, 1e-3]}, "trainer.batch_size": {"choice": [8, 16]}}
STUDY = {
    "name": "ext",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16, "max_steps": 20}},
    "seeds": [1, 2],
    "search": {"algorithm": "optuna", "num_samples": 2},
    "ablations": {
        "lr": {"space": SPACE},
        "other": {"space": SPACE},
        "best": {"confirm": {"of": "other", "top_k": 1}},
    },
}


def study_of(tmp_path: Path, space: dict | None = None, **top):
    doc = copy.deepcopy(STUDY) | top
    if space is not None:
        doc["ablations"]["lr"]["space"] = space
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_study(path)


@pytest.mark.parametrize(
    ("dist", "value", "inside"),
    [
        ({"choice": [8, 16]}, 16, True),
        ({"choice": [8, 16]}, 32, False),
        ({"choice": [True, False]}, 1, False),  # 1 == True, but not the option
        ({"randint": [1, 4]}, 4, True),  # inclusive upper bound, as study files give it
        ({"randint": [1, 4]}, 5, False),
        ({"uniform": [0.1, 0.5]}, 0.5, True),
        ({"uniform": [0.1, 0.5]}, 0.05, False),
        ({"loguniform": [1e-5, 1e-4]}, 2e-4, False),
        ({"loguniform": [1e-5, 1e-4]}, float("nan"), False),
    ],
)
def test_a_value_lies_in_the_space_as_it_is_now(dist, value, inside):
    assert contains(Distribution(**dist), value) is inside


def test_logged_params_are_typed_and_kept_only_inside_the_space():
    space = {k: Distribution(**d) for k, d in SPACE.items()}
    assert typed_inside(space, {"trainer.lr": "3e-05", "trainer.batch_size": "16"}) == {
        "trainer.lr": 3e-05,
        "trainer.batch_size": 16,
    }
    assert typed_inside(space, {"trainer.lr": "0.01", "trainer.batch_size": "16"}) is None  # outside
    assert typed_inside(space, {"trainer.lr": "3e-05", "trainer.batch_size": "32"}) is None  # no such choice
    assert typed_inside(space, {"trainer.lr": "3e-05"}) is None  # missing


@pytest.fixture
def store(tmp_path):
    """A real MLflow sqlite store with a parent run; ``add`` makes a finished child run of it."""
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    parent = client.create_run(client.create_experiment("ext")).info.run_id

    def add(seed, lr, bs, value, status="finished", ablation="lr", **tags):
        tags = {"mlflow.parentRunId": parent, "clsr.ablation": ablation, "clsr.status": status,
                "clsr.seed": str(seed), **tags}  # fmt: skip
        run = client.create_run(client.get_run(parent).info.experiment_id, tags=tags).info.run_id
        client.log_param(run, "trainer.lr", str(lr))
        client.log_param(run, "trainer.batch_size", str(bs))
        for metric, number in (value if isinstance(value, dict) else {"best_dev_stsb": value}).items():
            client.log_metric(run, metric, number)
        client.set_terminated(run)

    return client, parent, add


def runs(client, parent):
    from clsr.tracking.study_runs import children

    return children(client, parent)


def test_the_warm_start_averages_seeds_and_leaves_out_what_the_sampler_must_not_see(tmp_path, store):
    client, parent, add = store
    add(1, 2e-5, 8, 0.6)
    add(2, 2e-5, 8, 0.8)  # the same configuration's second seed: one point, their mean
    add(1, 5e-4, 16, 0.7)
    add(1, 5e-3, 16, 0.9)  # a value an edit took out of the space: counted, not given
    add(2, 5e-4, 16, 0.5, status="failed")  # not finished
    add(1, 3e-5, 8, 0.9, **{"clsr.superseded": "v2"})  # an earlier search's
    add(1, 3e-5, 8, 0.9, ablation="other")  # another ablation
    add(1, 4e-5, 8, 0.1, **{"clsr.pruned": "ttest p=0.05"})  # seed pruning told Optuna it was pruned
    warm = warm_start(study_of(tmp_path), "lr", runs(client, parent))
    given = sorted(zip([c["trainer.lr"] for c in warm.configurations], warm.rewards, strict=True))
    assert given == [(2e-5, pytest.approx(0.7)), (5e-4, pytest.approx(0.7))]
    assert {c["trainer.batch_size"] for c in warm.configurations} == {8, 16}  # typed: ints, not "8"
    assert (warm.runs_inside, warm.runs_outside) == (3, 1)


def test_several_objectives_are_given_as_lists(tmp_path, store):
    client, parent, add = store
    add(1, 2e-5, 8, {"best_dev_stsb": 0.6, "test_sts_avg": 0.5})
    add(1, 4e-5, 8, {"best_dev_stsb": 0.7})  # one objective missing: nothing to tell Optuna
    study = study_of(tmp_path, metric=["best_dev_stsb", "test_sts_avg"])
    warm = warm_start(study, "lr", runs(client, parent))
    assert warm.rewards == [[0.6, 0.5]] and warm.runs_inside == 1


def test_rounds_are_recorded_on_the_parent_run_and_numbered_per_ablation(store):
    client, parent, _ = store
    assert extension_rounds(client, parent) == []
    first = record_extension(client, parent, "lr", 2, attempt=2)
    assert record_extension(client, parent, "lr", 2, attempt=2) == first  # once per attempt
    record_extension(client, parent, "other", 1, attempt=3)
    third = record_extension(client, parent, "lr", 5, attempt=4)
    assert extension_rounds(client, parent) == [
        ExtensionRound("lr", 2, 1, 2),
        ExtensionRound("other", 1, 1, 3),
        ExtensionRound("lr", 5, 2, 4),
    ]
    assert third.experiment("lr") == "lr-x2"
    # an edited resume at attempt 3 searched lr again: only the later round extends that search
    assert current_rounds(extension_rounds(client, parent), "lr", {"lr": 3}) == [third]


def test_each_round_draws_with_its_own_seed():
    seeds = {ExtensionRound("lr", 2, k, k + 1).sampler_seed(1) for k in (1, 2, 3)}
    assert len(seeds) == 3 and 1 not in seeds
    assert ExtensionRound("lr", 2, 1, 2).sampler_seed(1) == ExtensionRound("lr", 9, 1, 5).sampler_seed(1)


def test_optuna_is_given_the_finished_configurations_as_completed_trials(tmp_path):
    from ray import tune

    from clsr.study.run.experiment import param_space
    from clsr.study.run.search import search_alg
    from clsr.study.run.tune_compat import optuna_trials

    study = study_of(tmp_path, seeds=[1])
    warm = WarmStart([{"trainer.lr": 2e-5, "trainer.batch_size": 8}], [0.7], 1, 0)
    searcher = search_alg(study, "lr", ExtensionRound("lr", 2, 1, 2), warm)
    searcher.set_search_properties("best_dev_stsb", "max", param_space(study, "lr"))
    (trial,) = optuna_trials(searcher)
    assert trial.state.name == "COMPLETE" and trial.value == 0.7
    assert trial.params == {"point/overrides/trainer.lr": 2e-5, "point/overrides/trainer.batch_size": 8}
    assert isinstance(param_space(study, "lr")["point"]["overrides"]["trainer.lr"], tune.search.sample.Float)


def test_random_search_extends_with_another_seed_and_not_the_given_points(tmp_path):
    from clsr.study.run.search import search_alg

    study = study_of(tmp_path, search={"algorithm": "random", "num_samples": 2,
                                       "points_to_evaluate": [{"trainer.lr": 3e-5}]})  # fmt: skip
    first, extended = search_alg(study, "lr"), search_alg(study, "lr", ExtensionRound("lr", 2, 1, 2))
    assert first._points_to_evaluate and not extended._points_to_evaluate


def args_of(study: str, ablation: str = "lr", samples: int = 2) -> argparse.Namespace:
    return argparse.Namespace(action="extend", study=study, ablation=ablation, samples=samples)


def test_the_command_refuses_in_one_line_before_anything_starts(tmp_path, monkeypatch, capsys):
    from clsr.cli import main

    study = study_of(tmp_path, tracking_uri=sqlite_uri(tmp_path / "mlflow.db"))
    path = str(tmp_path / "study.yaml")
    capsys.readouterr()  # MLflow's own lines as it made the store
    assert main(["study", "extend", path, "--ablation", "lr", "--samples", "0"]) == 2
    assert capsys.readouterr().err.strip() == f"{path}: --samples: 0; give 1 to 100,000"
    problems = {
        "unknown": refusal(args_of(path, "nope"), study),
        "grid": refusal(args_of(path, "best"), study),
        "no record": refusal(args_of(path), study),
    }
    assert problems["unknown"] == f"{path}: --ablation: no ablation 'nope' (allowed: lr, other, best)"
    assert problems["grid"].startswith(f"{path}: --ablation: 'best' is a listed (grid) ablation")
    assert "(allowed: lr, other)" in problems["grid"]
    assert (
        problems["no record"] == f"{path}: study 'ext' has no record to extend; `platform study run` it first"
    )
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    from clsr.tracking.study_runs import start_parent_run

    start_parent_run(client, "ext", str(tmp_path / "runs"), None)  # RUNNING: not finished
    unfinished = refusal(args_of(path), study)
    assert "is RUNNING, not finished: `platform study resume` it first" in unfinished
    assert all("\n" not in p for p in [*problems.values(), unfinished])
    assert refusal(argparse.Namespace(action="resume"), study) is None


def test_an_extension_narrows_its_search_instead_of_starting_it_again(store):
    """An attempt that edited a sampled ablation's space searches it again (``<ablation>-v<attempt>``),
    unless that attempt extended the ablation: then its finished runs are the extension's warm start."""
    from clsr.study.plan.fingerprint import STUDY_ENTRY
    from clsr.study.record.attempts import search_versions

    client, parent, _ = store
    client.log_dict(parent, {"lr[space] seed=1": "a", STUDY_ENTRY: "s"}, "fingerprint.json")
    client.log_dict(parent, {"lr[space] seed=1": "b", STUDY_ENTRY: "s"}, "fingerprint-v2.json")
    assert search_versions(client, parent) == {"lr": 2}
    record_extension(client, parent, "lr", 2, attempt=2)
    assert search_versions(client, parent) == {}


def test_an_extension_that_needed_no_edit_does_not_narrow_a_later_edit(store):
    """Only an extension that edited its file narrows the edit a later resume records for it (its driver
    killed before it recorded that edit); one that ran the file as recorded leaves a later edit a new search."""
    from clsr.study.plan.fingerprint import STUDY_ENTRY
    from clsr.study.record.attempts import pending_extensions, search_versions

    client, parent, _ = store
    client.log_dict(parent, {"lr[space] seed=1": "a", STUDY_ENTRY: "s"}, "fingerprint.json")
    record_extension(client, parent, "lr", 2, attempt=2)  # the file as recorded: no fingerprint-v2
    assert pending_extensions(client, parent) == frozenset()
    client.log_dict(parent, {"lr[space] seed=1": "b", STUDY_ENTRY: "s"}, "fingerprint-v3.json")
    assert search_versions(client, parent) == {"lr": 3}


def test_a_driver_killed_between_its_extension_and_its_edit_is_resumed_as_the_extension(
    tmp_path, monkeypatch
):
    """``study extend --allow-changes`` of a narrowed space records two things: the extension and the
    edit. A driver killed after the first (simulated: the second write raises) leaves a record whose
    ``study resume --allow-changes`` continues that extension, the search narrowed: no new ``lr-v<N>``
    search beside the old one, the old search's runs kept."""
    import subprocess

    from clsr.study.plan.fingerprint import fingerprint
    from clsr.study.record import parent as record
    from clsr.study.record.extension import ExtendRequest

    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    top = {"tracking_uri": uri, "storage_path": str(tmp_path / "runs")}
    study = study_of(tmp_path, **top)
    parent_run_id, _, lease = record.start_record(client, uri, study, "name: ext", fingerprint(study))
    lease.release()
    client.set_terminated(parent_run_id)  # the search finished
    tags = {"mlflow.parentRunId": parent_run_id, "clsr.ablation": "lr", "clsr.trial_id": "lr[s1] seed=1"}
    sampled = client.create_run(client.get_run(parent_run_id).info.experiment_id, tags=tags).info.run_id
    client.set_terminated(sampled)
    narrowed = study_of(tmp_path, space={**SPACE, "trainer.lr": {"loguniform": [1e-5, 1e-4]}}, **top)
    current = fingerprint(narrowed)

    writes = []

    def killed_at_second(real):
        def write(*args, **kwargs):
            writes.append(real.__name__)
            if len(writes) == 2:
                raise KeyboardInterrupt("the driver is killed")
            return real(*args, **kwargs)

        return write

    for name in ("record_edit", "record_extension"):
        monkeypatch.setattr(record, name, killed_at_second(getattr(record, name)))
    gone = subprocess.Popen(["true"])
    gone.wait()  # the killed driver's pid: its lease is free at once
    with pytest.raises(KeyboardInterrupt):
        record.take_over(client, uri, narrowed, "", current, True, lambda: gone.pid, ExtendRequest("lr", 2))
    assert writes[0] == "record_extension"  # the extension first: the edit alone reads as a new search
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(record.StudyChanged, match="lr, being extended, keeps its finished trials"):
        record.take_over(client, uri, narrowed, "", current, allow_changes=False)  # `study resume`

    _, _, resumed, _, searches = record.take_over(client, uri, narrowed, "", current, allow_changes=True)
    resumed.release()
    assert searches == {}  # the search continues narrowed, no lr-v3 beside it
    assert "clsr.superseded" not in client.get_run(sampled).data.tags
    rounds = extension_rounds(client, parent_run_id)
    assert rounds == [ExtensionRound("lr", 2, 1, 2)] and current_rounds(rounds, "lr", searches) == rounds


def test_an_extension_refuses_any_edit_outside_its_space_in_one_line(tmp_path, monkeypatch, capsys):
    """``study extend --allow-changes`` takes a narrowed space; search settings, seeds, a base or another
    ablation edited since the record would search other ablations again or run the extended one under new
    settings: refused before anything starts, naming the file and the field."""
    from clsr.cli import main
    from clsr.study.plan.fingerprint import fingerprint
    from clsr.study.record import parent as record

    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    top = {"tracking_uri": uri, "storage_path": str(tmp_path / "runs")}
    study = study_of(tmp_path, **top)
    path = str(tmp_path / "study.yaml")
    parent_run_id, _, lease = record.start_record(
        client, uri, study, Path(path).read_text(), fingerprint(study)
    )
    lease.release()
    client.set_terminated(parent_run_id)
    narrowed = {**SPACE, "trainer.lr": {"loguniform": [1e-5, 1e-4]}}
    edits = {
        "metric, mode, scheduler or search": {"search": {"algorithm": "optuna", "num_samples": 3}},
        "seeds (of ablations.lr)": {"seeds": [1, 2, 3]},
        "base (the study's or ablations.lr.base)": {"base": {**STUDY["base"], "trainer": {"max_steps": 30}}},
    }
    for field, edit in edits.items():
        problem = refusal(args_of(path), study_of(tmp_path, space=narrowed, **top, **edit))
        assert problem == (
            f"{path}: {field}: changed since the record; an extension takes an edit of ablations.lr.space only "
            f"(revert it, or `platform study resume --allow-changes` to run the edit: an edited search is "
            f"searched again)"
        )
    other = copy.deepcopy(STUDY["ablations"]) | {"other": {"space": narrowed}}
    assert refusal(args_of(path), study_of(tmp_path, ablations=other, **top)).startswith(
        f"{path}: ablations.other:"
    )
    assert refusal(args_of(path), study_of(tmp_path, space=narrowed, **top)) is None  # the space alone
    assert refusal(args_of(path), study_of(tmp_path, **top)) is None  # nothing edited
    capsys.readouterr()
    assert main(["study", "extend", path, "--ablation", "lr", "--samples", "100001"]) == 2
    assert capsys.readouterr().err.strip() == f"{path}: --samples: 100001; give 1 to 100,000"
