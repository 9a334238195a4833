"""Tune, then confirm: a confirm ablation's points are the best configurations of a sampled ablation,
read back from a real MLflow store of hand-made child runs (ranked by the mean over seeds, ties by
label, values typed by the space's distributions), its refusals, its trial counts, and one study run
end to end through the ``platform`` command (a search over seeds and two objectives, confirmation,
report)."""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.study.plan.fingerprint import fingerprint
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import ablation_trials, count_trials, point_label, stages
from clsr.study.run.confirm import confirm_points, rank_configurations, wave_points
from clsr.study.spec.schema import StudyError
from clsr.study.spec.space import Distribution, typed_value
from tests.support.stores import sqlite_uri

SPACE = {
    "trainer.lr": {"loguniform": [1e-5, 1e-4]},
    "trainer.batch_size": {"choice": [8, 16]},
    "eval.alignment_uniformity": {"choice": [True, False]},
}
STUDY = {
    "name": "tc",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16, "max_steps": 20}},
    "seeds": [1, 2],
    "search": {"algorithm": "optuna", "num_samples": 4},
    "ablations": {
        "lr": {"space": SPACE},
        "confirm": {
            "confirm": {"of": "lr", "top_k": 2},
            "seeds": [7, 8, 9],
            "points": [{"label": "paper", "set": {"trainer.lr": 3e-5}, "paper": 76.3}],
            "reference": "paper",
        },
    },
}


def study_of(tmp_path: Path, doc: dict | None = None, **ablations):
    doc = copy.deepcopy(doc or STUDY)
    doc["ablations"] = {**doc["ablations"], **ablations}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_study(path)


@pytest.fixture
def store(tmp_path):
    """A real MLflow sqlite store with a parent run; ``add`` makes a child run of it."""
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    parent = client.create_run(client.create_experiment("tc")).info.run_id

    def add(ablation, seed, value, lr, bs, au, status="finished", **params):
        config = {"trainer.lr": str(lr), "trainer.batch_size": str(bs), "eval.alignment_uniformity": str(au)}
        tags = {
            "mlflow.parentRunId": parent, "clsr.ablation": ablation, "clsr.status": status,
            "clsr.seed": str(seed), "clsr.point": f"anything {seed}",  # a tag: never read as a value
        }  # fmt: skip
        run = client.create_run(client.get_run(parent).info.experiment_id, tags=tags).info.run_id
        for key, text in {**config, **params}.items():
            client.log_param(run, key, text)
        if value is not None:
            client.log_metric(run, "best_dev_stsb", value)
        client.set_terminated(run)

    return client, parent, add


def fill(add):
    """Three configurations x two seeds (a and c tie at 0.75), plus runs that must not count."""
    a, b, c = (1e-05, 8, True), (2e-05, 16, False), (5e-05, 8, False)
    for seed, va, vb, vc in ((1, 0.7, 0.9, 0.8), (2, 0.8, 0.5, 0.7)):
        add("lr", seed, va, *a)
        add("lr", seed, vb, *b)
        add("lr", seed, vc, *c)
    add("lr", 1, 0.99, 9e-05, 16, True, status="failed")  # not finished
    add("other", 1, 0.99, 9e-05, 16, True)  # another ablation
    add("lr", 2, 0.99, 9e-05, 32, True)  # 32 is no choice: left out with a note
    return a, b, c


def label(lr, bs, au):
    return point_label({"trainer.lr": lr, "trainer.batch_size": bs, "eval.alignment_uniformity": au})


def test_configurations_ranked_by_the_mean_over_seeds_ties_by_label(tmp_path, store):
    client, parent, add = store
    a, b, c = fill(add)
    study = study_of(tmp_path)
    ranked, notes = rank_configurations(
        study, "lr", client.search_runs([client.get_run(parent).info.experiment_id])
    )
    means = {label(*a): statistics.fmean([0.7, 0.8]), label(*b): statistics.fmean([0.9, 0.5]),
             label(*c): statistics.fmean([0.8, 0.7])}  # fmt: skip
    tied = sorted([label(*a), label(*c)])
    assert [r["label"] for r in ranked] == [*tied, label(*b)]
    assert {r["label"]: r["mean"] for r in ranked} == pytest.approx(means)
    assert [r["seeds"] for r in ranked] == [2, 2, 2]
    assert len(notes) == 1 and "32" in notes[0] and "left out" in notes[0]
    first = next(r for r in ranked if r["label"] == label(*a))["overrides"]
    assert first == {"trainer.lr": 1e-05, "trainer.batch_size": 8, "eval.alignment_uniformity": True}
    assert type(first["trainer.batch_size"]) is int and first["eval.alignment_uniformity"] is True


def test_mode_min_reverses_the_ranking(tmp_path, store):
    client, parent, add = store
    a, b, c = fill(add)
    doc = {**copy.deepcopy(STUDY), "mode": "min"}
    ranked, _ = rank_configurations(study_of(tmp_path, doc), "lr", runs(client, parent))
    assert [r["label"] for r in ranked][0] == label(*b)


def test_several_objectives_rank_by_pareto_front_then_the_first_metric(tmp_path, store):
    client, parent, add = store
    doc = {**copy.deepcopy(STUDY), "metric": ["best_dev_stsb", "uniform"], "mode": ["max", "min"]}
    study = study_of(tmp_path, doc)
    # (lr, batch, au) -> (best_dev_stsb, uniformity), one seed each; a run without uniformity is left out
    configs = {(1e-5, 8, True): (0.80, -2.0), (2e-5, 8, True): (0.90, -1.0), (3e-5, 8, True): (0.70, -2.5),
               (4e-5, 8, True): (0.75, -1.5), (5e-5, 8, True): (0.60, -1.2)}  # fmt: skip
    experiment = client.get_run(parent).info.experiment_id
    for (lr, bs, au), (stsb, uniformity) in configs.items():
        add("lr", 1, stsb, lr, bs, au)
        run = client.search_runs([experiment], f"params.`trainer.lr` = '{lr}'")[0].info.run_id
        client.log_metric(run, "uniform", uniformity)
    add("lr", 1, 0.99, 6e-5, 8, True)  # best_dev_stsb only: no uniform
    # by hand: front 0 is every point no other beats on both (higher stsb, lower uniformity); peel, repeat
    left, fronts = dict(configs), []
    while left:
        front = [c for c, (s, u) in left.items()
                 if not any(s2 >= s and u2 <= u and (s2, u2) != (s, u) for s2, u2 in left.values())]  # fmt: skip
        fronts.append(sorted(front, key=lambda c: -left[c][0]))
        left = {c: v for c, v in left.items() if c not in front}
    expected = [label(*c) for front in fronts for c in front]
    ranked, _ = rank_configurations(study, "lr", runs(client, parent))
    assert [r["label"] for r in ranked] == expected
    assert len(fronts) > 1 and expected[0] == label(2e-5, 8, True)
    assert [r["mean"] for r in ranked] == pytest.approx([configs[c][0] for f in fronts for c in f])


def runs(client, parent):
    return client.search_runs([client.get_run(parent).info.experiment_id])


def test_top_k_points_and_the_runner_adds_them_over_the_confirm_seeds(tmp_path, store):
    from clsr.study.plan.resolve import grid_points
    from clsr.study.run.experiment import expand_trials
    from clsr.study.run.waves import confirm_trials

    client, parent, add = store
    fill(add)
    study = study_of(tmp_path)
    points, lines = confirm_points(study, "confirm", runs(client, parent))
    best = rank_configurations(study, "lr", runs(client, parent))[0][:2]
    assert [p.label for p in points] == [f"top1: {best[0]['label']}", f"top2: {best[1]['label']}"]
    assert [p.overrides for p in points] == [r["overrides"] for r in best]
    assert all(p.paper == {} and p.ablation == "confirm" for p in points)
    explicit = expand_trials(study, [p.of("confirm") for p in grid_points(study.ablations["confirm"])])
    trials, blocked = confirm_trials(study, client, parent, ["confirm"], explicit)
    assert blocked == [] and len(trials) == (2 + 1) * 3
    assert sorted({t.seed for t in trials}) == [7, 8, 9]
    assert confirm_points(study, "confirm", runs(client, parent)) == (points, lines)  # deterministic


def test_fewer_configurations_than_top_k_are_confirmed_with_a_line(tmp_path, store):
    client, parent, add = store
    add("lr", 1, 0.5, 1e-05, 8, True)
    study = study_of(tmp_path)
    points, lines = confirm_points(study, "confirm", runs(client, parent))
    assert len(points) == 1 and lines == [
        "ablations.confirm: lr has 1 finished configuration(s), fewer than top_k 2: confirming those"
    ]


def test_none_finished_skips_the_confirm_trials_with_a_reason(tmp_path, store, capsys):
    from clsr.study.plan.resolve import grid_points
    from clsr.study.run.experiment import expand_trials
    from clsr.study.run.waves import confirm_trials

    client, parent, add = store
    add("lr", 1, 0.5, 1e-05, 8, True, status="failed")
    study = study_of(tmp_path)
    assert wave_points(study, client, parent, ["confirm"]) == ([], ["confirm"], [])
    explicit = expand_trials(study, [p.of("confirm") for p in grid_points(study.ablations["confirm"])])
    trials, blocked = confirm_trials(study, client, parent, ["confirm"], explicit)
    assert trials == [] and [t.seed for t, _ in blocked] == [7, 8, 9]
    assert {why for _, why in blocked} == {"lr has no finished configuration to confirm"}
    assert (
        "skipped: ablations.confirm: lr has no finished configuration to confirm" in capsys.readouterr().out
    )


def test_typed_values_are_exact():
    assert typed_value(Distribution(choice=[1, 2]), "2") == 2
    assert typed_value(Distribution(choice=[True, False]), "False") is False
    assert typed_value(Distribution(randint=[1, 9]), "4") == 4
    assert typed_value(Distribution(uniform=[0.0, 1.0]), "0.25") == 0.25
    with pytest.raises(ValueError, match="none of the choices"):
        typed_value(Distribution(choice=[1, 2]), "2.0")


@pytest.mark.parametrize(
    ("doc_change", "ablation", "fragment"),
    [
        ({}, {"confirm": {"of": "nope"}}, "ablations.c.confirm.of: names a sampled ablation"),
        (
            {},
            {"confirm": {"of": "lr", "top_k": 5}},
            "ablations.c.confirm.top_k: at most search.num_samples (4)",
        ),
        ({}, {"confirm": {"of": "lr"}, "grid": {"trainer.lr": [1e-5]}}, "confirm ablation takes points only"),
        ({}, {"confirm": {"of": "lr"}, "space": SPACE}, "confirm ablation takes points only"),
        ({}, {"confirm": {"of": "lr", "top_k": 0}}, "top_k"),
        (
            {"search": {"algorithm": "grid"}},
            {"confirm": {"of": "lr"}},
            "needs search.algorithm random or optuna",
        ),
    ],
)
def test_refusals_name_the_field(tmp_path, doc_change, ablation, fragment):
    doc = {**copy.deepcopy(STUDY), **doc_change}
    if doc_change:
        doc["ablations"] = {"lr": {"grid": {"trainer.lr": [1e-5]}}}
    with pytest.raises(StudyError, match="confirm|top_k") as err:
        study_of(tmp_path, doc, c=ablation)
    assert fragment in str(err.value)


def test_counted_trials_stages_and_fingerprint(tmp_path):
    study = study_of(tmp_path)
    assert ablation_trials(study, "confirm") == (2 + 1) * 3  # (top_k + explicit points) x seeds
    assert ablation_trials(study, "lr") == 4 * 2
    assert count_trials(study) == (8 + 9, 8 + 9)
    assert stages(study) == [["lr"], ["confirm"]]
    keys = fingerprint(study)
    assert {"confirm[confirm] seed=7", "confirm[paper] seed=7"} <= set(keys)
    edited = study_of(
        tmp_path, None, confirm={**STUDY["ablations"]["confirm"], "confirm": {"of": "lr", "top_k": 3}}
    )
    assert fingerprint(edited)["confirm[confirm] seed=7"] != keys["confirm[confirm] seed=7"]


def test_confirm_runs_after_the_search_as_a_grid_without_early_stopping(tmp_path):
    from clsr.study.plan.resolve import experiments
    from clsr.study.run.experiment import _scheduler

    doc = {**copy.deepcopy(STUDY), "scheduler": {"type": "asha"}}
    study = study_of(tmp_path, doc)
    assert experiments(study) == [("lr", "lr", ["lr"]), ("confirm", None, ["confirm"])]
    from clsr.study.plan.study_plan import TrialSpec

    trials = [TrialSpec("confirm", "paper", {}, {}, 7)]
    assert _scheduler(study, None, trials) is None and _scheduler(study, "lr") is not None


@pytest.mark.e2e
@pytest.mark.minutes(3.0)
@pytest.mark.parallel
def test_search_over_seeds_and_two_objectives_then_confirm_through_the_platform_command(tmp_path):
    """Optuna's multi-objective study behind Tune's Repeater samples 2 learning rates x 2 seeds: each
    configuration runs once per seed, the report groups a configuration's seeds into one row and draws
    the Pareto front of the objectives' means. The confirm ablation reruns the best configuration (by
    front, then the first metric) and the paper's over 2 new seeds, and the report tests the best
    against the paper row. (One study for both: each study started costs about a minute of CI.)"""
    from collections import defaultdict

    from scipy import stats

    from clsr.study.analyse.rows import build_report
    from clsr.study.analyse.tables import fmt_p
    from tests.e2e.test_e2e import platform_cmd, runs_of
    from tests.e2e.test_resilience import run_in_process

    ablations = {
        "lr": {"space": {"trainer.lr": {"loguniform": [1.0e-5, 1.0e-3]}}},
        "confirm": {
            "confirm": {"of": "lr", "top_k": 1},
            "seeds": [5, 6],
            "points": [{"label": "paper", "set": {"trainer.lr": 3.0e-5}, "paper": 76.3}],
            "reference": "paper",
        },
    }
    trainer = {"max_steps": 2, "eval_steps": 2, "log_every": 1}
    objectives = ["best_dev_stsb", "test_sts16"]
    study_file, uri, output = run_in_process(
        tmp_path, "confirmed", trainer, ablations, seeds=[1, 2], metric=objectives, mode="max",
        search={"algorithm": "optuna", "sampler": "random", "num_samples": 2},
    )  # fmt: skip
    client, (parent,), children = runs_of(uri, "confirmed")
    of = {"lr": [], "confirm": []}
    for child in children:
        assert child.data.tags["clsr.status"] == "finished"
        assert child.data.params["trainer.seed"] == child.data.tags["clsr.seed"]
        of[child.data.tags["clsr.ablation"]].append(child)
    assert len(of["lr"]) == 4 and len(of["confirm"]) == 4
    seeds_of, values = defaultdict(list), defaultdict(list)  # per configuration: its seeds, its runs' values
    for run in of["lr"]:
        seeds_of[run.data.tags["clsr.point"]].append(int(run.data.tags["clsr.seed"]))
        values[run.data.params["trainer.lr"]].append([run.data.metrics[m] for m in objectives])
    assert sorted(map(sorted, seeds_of.values())) == [[1, 2], [1, 2]]  # each configuration over both seeds
    means = {
        lr: [statistics.fmean(column) for column in zip(*runs, strict=True)] for lr, runs in values.items()
    }
    (a, am), (b, bm) = means.items()
    dominates = lambda x, y: x != y and all(p >= q for p, q in zip(x, y, strict=True))  # noqa: E731
    front = [lr for lr, m, other in ((a, am, bm), (b, bm, am)) if not dominates(other, m)]
    best = min(front, key=lambda lr: (-means[lr][0], f"trainer.lr={float(lr)}"))  # front, first metric, label

    report = build_report(load_study(study_file), client, parent.info.run_id, uri)
    lr_rows = next(x for x in report.ablations if x.name == "lr")
    assert sorted(r.label for r in lr_rows.rows) == sorted(seeds_of)  # a row per configuration
    assert [r.trials_text() for r in lr_rows.rows] == ["2/2 ok", "2/2 ok"]
    by_label = {f"trainer.lr={float(lr)}": m for lr, m in means.items()}
    assert lr_rows.pareto.seeds == dict.fromkeys(by_label, 2)
    assert {k: pytest.approx(v) for k, v in by_label.items()} == lr_rows.pareto.values
    assert sorted(lr_rows.pareto.front) == sorted(f"trainer.lr={float(lr)}" for lr in front)
    points = {(r.data.tags["clsr.point"], int(r.data.tags["clsr.seed"])): r for r in of["confirm"]}
    top = f"top1: trainer.lr={float(best)}"
    assert sorted(points) == sorted([(top, 5), (top, 6), ("paper", 5), ("paper", 6)])
    assert {points[(top, s)].data.params["trainer.lr"] for s in (5, 6)} == {best}
    assert points[("paper", 5)].data.params["trainer.lr"] == "3e-05"
    confirm = next(a for a in report.ablations if a.name == "confirm")
    rows = {r.label: r for r in confirm.rows}
    assert set(rows) == {"paper", top} and rows["paper"].reference and rows["paper"].paper
    assert rows[top].seeds == [5, 6] and rows[top].trials_text() == "2/2 ok"
    metric = confirm.main_metric
    expected = stats.ttest_rel(
        [points[(top, s)].data.metrics[metric] for s in (5, 6)],
        [points[("paper", s)].data.metrics[metric] for s in (5, 6)],
    )
    assert rows[top].test.n == 2
    assert rows[top].test.p_value == pytest.approx(expected.pvalue, nan_ok=True)
    shown = platform_cmd(
        "study", "report", str(study_file), "--out", str(tmp_path / "r"), cwd=tmp_path, uri=uri
    )
    printed, _ = shown.communicate(timeout=300)
    assert shown.returncode == 0, printed[-3000:]
    markdown = (tmp_path / "r" / "report.md").read_text().splitlines()
    start = next(n for n, line in enumerate(markdown) if "reference row 'paper'" in line)
    cells: dict[str, list[str]] = {}  # the confirm ablation's main table: its first row per label
    for line in markdown[start:]:
        row = [x.strip() for x in line.split("|")]
        if len(row) > 12 and row[1] in ("paper", top):
            cells.setdefault(row[1], row)
    assert cells["paper"][2] == "reference" and cells["paper"][10] == "(reference)"
    assert cells["paper"][7] == "76.30" and cells[top][3] == "2/2 ok"
    assert cells[top][11] == fmt_p(expected.pvalue)  # the paired test of the best against the paper row

    # the space edited: --allow-changes searches again as Tune experiment lr-v2, and the confirm ablation
    # confirms the new search's best; the old runs stay in MLflow, superseded, out of the report
    doc = yaml.safe_load(study_file.read_text())
    doc["ablations"]["lr"]["space"]["trainer.lr"] = {"loguniform": [1.0e-4, 1.0e-3]}
    study_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    resumed = platform_cmd("study", "resume", str(study_file), "--allow-changes", cwd=tmp_path, uri=uri)
    printed, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, printed[-3000:]
    assert "ablations.lr (sampled) changed: searched again as Tune experiment lr-v2" in printed
    assert len(list(Path(load_study(study_file).storage_path).glob("confirmed-*/lr-v2/run_trial_*"))) == 4
    _, _, children = runs_of(uri, "confirmed")
    old = {r.info.run_id for r in of["lr"]} | {points[(top, s)].info.run_id for s in (5, 6)}
    assert {c.info.run_id for c in children if c.data.tags.get("clsr.superseded") == "v2"} == old
    new = [c for c in children if c.info.run_id not in old | {r.info.run_id for r in of["confirm"]}]
    assert (
        sorted(c.data.tags["clsr.ablation"] for c in new) == ["confirm"] * 2 + ["lr"] * 4
    )  # the paper's kept
    assert all(
        float(c.data.params["trainer.lr"]) >= 1.0e-4 for c in new if c.data.tags["clsr.ablation"] == "lr"
    )
    report = build_report(load_study(study_file), client, parent.info.run_id, uri)
    counted = {a.name: [r.trials_text() for r in a.rows] for a in report.ablations}
    assert counted == {"lr": ["2/2 ok"] * 2, "confirm": ["2/2 ok"] * 2}  # the new runs only


def test_a_confirm_ablation_without_points_is_checked_and_probed_through_its_base(tmp_path, monkeypatch):
    """Its points come from the search: validation checks its base trial's sources (a model that is not
    here is named), and `study plan --probe-ablation` probes the base instead of failing."""
    from clsr.study.plan.probe import probe_trial
    from clsr.study.plan.study_plan import check_points as plan_points

    doc = copy.deepcopy(STUDY)
    doc["ablations"]["confirm"] = {"confirm": {"of": "lr", "top_k": 2}, "seeds": [7]}
    study = study_of(tmp_path, doc)
    points, unavailable = plan_points(study)
    assert points == [] and unavailable == []
    label, trial = probe_trial(study, "confirm", steps=2)
    assert label == "confirm/base" and trial.trainer.max_steps == 2
    doc["ablations"]["confirm"]["base"] = {"model": {"name": "no-such-org/no-such-model"}}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, unavailable = plan_points(study_of(tmp_path, doc))
    assert len(unavailable) == 1 and unavailable[0].startswith("ablations.confirm[base]: ")


def test_an_edited_resume_searches_a_changed_search_again_and_keeps_grid_edits(tmp_path, monkeypatch, capsys):
    """Tune restores a search as it was sampled, so an edited space, seeds or search settings is a new
    search: ``--allow-changes`` marks the old search's runs and the runs confirming them superseded and
    names the attempt that starts the new search (its Tune experiment ``lr-vN``), which later resumes
    restore; a changed explicit point of the confirm ablation is an ordinary edit, the search kept."""
    from clsr.study.plan.fingerprint import changed_searches, compare
    from clsr.study.record import attempts
    from clsr.study.record import parent as record

    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    base = {**copy.deepcopy(STUDY), "storage_path": str(tmp_path / "runs"), "tracking_uri": uri}
    study = study_of(tmp_path, base)
    recorded = fingerprint(study)
    parent_run_id, _, lease = record.start_record(client, uri, study, "name: tc", recorded)
    lease.release()
    client.set_terminated(parent_run_id, status="KILLED")
    experiment = client.get_run(parent_run_id).info.experiment_id

    def child(ablation: str, key: str) -> str:
        tags = {"mlflow.parentRunId": parent_run_id, "clsr.ablation": ablation, "clsr.trial_id": key}
        run_id = client.create_run(experiment, tags=tags).info.run_id
        client.set_terminated(run_id)
        return run_id

    sampled = child("lr", "lr[sample 1a2b3_00000] seed=1")
    confirming = child("confirm", "confirm[trainer.lr=2e-05] seed=7")
    paper = child("confirm", "confirm[paper] seed=7")

    def superseded(*runs):
        return [client.get_run(r).data.tags.get("clsr.superseded") for r in runs]

    def take_over(doc):
        edited = study_of(tmp_path, doc)
        taken = record.take_over(client, uri, edited, "", fingerprint(edited), allow_changes=True)
        taken[2].release()
        client.set_terminated(parent_run_id, status="KILLED")
        return taken

    edits = {
        "space": lambda d: d["ablations"]["lr"]["space"].update({"trainer.lr": {"loguniform": [1e-6, 1e-4]}}),
        "seeds": lambda d: d.update(seeds=[1, 2, 3]),
        "search": lambda d: d["search"].update(num_samples=6),
    }
    for edit in edits.values():
        doc = copy.deepcopy(base)
        edit(doc)
        assert changed_searches(recorded, compare(recorded, fingerprint(study_of(tmp_path, doc)))) == ["lr"]
    doc = copy.deepcopy(base)
    edits["space"](doc)
    _, _, _, skip, searches = take_over(doc)  # attempt 2
    # the search's runs and the best point taken from it are superseded; the paper's point is kept
    assert searches == {"lr": 2} and superseded(sampled, confirming, paper) == ["v2", "v2", None]
    assert "confirm[trainer.lr=2e-05] seed=7" in skip  # never run again by the old confirm experiment
    assert attempts.superseded_at(client, parent_run_id) == {
        "lr[sample 1a2b3_00000] seed=1": 2,
        "confirm[trainer.lr=2e-05] seed=7": 2,
    }
    assert (
        "ablations.lr (sampled) changed: searched again as Tune experiment lr-v2; its earlier runs and the "
        "best points confirm took from it are marked superseded"
    ) in capsys.readouterr().out.replace("\n", " ")
    assert take_over(doc)[4] == {"lr": 2}  # attempt 3, the same file: the search of attempt 2 continues

    edits["seeds"](doc)
    assert take_over(doc)[4] == {"lr": 4}  # searched again
    doc["ablations"]["confirm"]["points"][0]["set"]["trainer.lr"] = 4.0e-5
    edited = study_of(tmp_path, doc)
    changes = compare(attempts.recorded_fingerprint(client, parent_run_id), fingerprint(edited))
    assert changes.changed == [f"confirm[paper] seed={seed}" for seed in (7, 8, 9)]
    _, _, _, skip, searches = take_over(doc)
    assert skip == frozenset(changes.changed) and searches == {"lr": 4}  # the search kept
    assert (
        superseded(paper) == ["v5"]
        and attempts.superseded_at(client, parent_run_id)["confirm[paper] seed=7"] == 5
    )


def test_a_configuration_seed_pruning_stopped_is_never_confirmed(tmp_path, store):
    """Its finished seeds are runs like any other; their clsr.pruned tag keeps it out of the ranking,
    even where its seeds so far average best."""
    from clsr.tracking.tags import PRUNED_TAG

    client, parent, add = store
    a, b, c = fill(add)
    add("lr", 1, 0.99, 7e-5, 8, False)
    pruned = client.search_runs([client.get_run(parent).info.experiment_id], "params.`trainer.lr` = '7e-05'")
    client.set_tag(pruned[0].info.run_id, PRUNED_TAG, "ttest p=0.01 < 0.1 after 2 of 3 seeds")
    ranked, _ = rank_configurations(study_of(tmp_path, STUDY), "lr", runs(client, parent))
    assert label(7e-5, 8, False) not in [r["label"] for r in ranked]
    assert len(ranked) == 3
