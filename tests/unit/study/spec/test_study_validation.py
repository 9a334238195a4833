"""Study files: every shipped YAML validates; bad files fail with the file and the dotted field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clsr.methods import METHODS
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points, resolve_trial
from clsr.study.spec.dotted import parse_override
from clsr.study.spec.schema import StudyError

REPO_ROOT = Path(__file__).resolve().parents[4]

DELETE = object()
GOOD = {
    "name": "t",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16}},
    "ablations": {"temp": {"grid": {"method.temperature": [0.05, 0.1]}, "paper": {"0.05": 82.5}}},
}


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def with_change(key: str, value) -> dict:
    import copy

    doc = copy.deepcopy(GOOD)
    node = doc
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return doc


# (change, the field the message must name, a fragment of the explanation)
BAD_STUDIES = [
    (("name", "bad name!"), "name", "pattern"),
    (("method", "simclr"), "method", f"allowed: {', '.join(sorted(METHODS))}"),
    (("unknown_key", 1), "unknown_key", "unknown key 'unknown_key'; allowed here: ablations, "),
    (("concurency", 2), "concurency", "unknown key 'concurency'; did you mean 'concurrency'?"),
    (("ablations", {}), "ablations", "at least 1"),
    (("ablations", {"lr-v2": GOOD["ablations"]["temp"]}), "ablations", "end in '-v<N>' or '-seeds<N>'"),
    (("ablations", {"grid-stage2": GOOD["ablations"]["temp"]}), "ablations", "'grid', 'grid-stage<N>'"),
    (("base.trainer.batch_size", "big"), "base.trainer.batch_size", "valid integer"),
    (("base.trainer.lr", -1.0), "base.trainer.lr", "greater than 0"),
    (("base.model.pooling", "max"), "base.model.pooling", "'cls', 'cls_before_pooler'"),
    (("base.trainer.optimzer", "sgd"), "base.trainer.optimzer", "did you mean 'optimizer'?"),
    (("base.model.poling", "avg"), "base.model.poling", "did you mean 'pooling'?"),
    (("base.method.temprature", 0.1), "base.method", "unknown key 'temprature'; did you mean 'temperature'?"),
    (("ablations.temp.grid", {"trainer.lr": []}), "ablations.temp.grid", "at least one value"),
    (("ablations.temp.grid", {"lr": [1e-5]}), "ablations.temp", "must start with one of model, data"),
    (
        ("ablations.temp.grid", {"method.temperature": [-1.0]}),
        "ablations.temp[method.temperature=-1.0]",
        "greater than 0",
    ),
    (("ablations.temp.grid", {"model.dropout": [1.5]}), "model.dropout", "less than 1"),
    (("seeds", [1, 1]), "seeds", "distinct"),
    (("seeds", []), "seeds", "at least 1"),
    (("metric", "accuracy"), "metric", "allowed: best_dev_stsb"),
    (("mode", "maximum"), "mode", "'max' or 'min'"),
    (("search", {"algorithm": "bayes"}), "search.algorithm", "'grid', 'random' or 'optuna'"),
    (("search", {"algorithm": "optuna"}), "ablation 'temp'", "needs a 'space'"),
    (("scheduler", {"type": "cosine"}), "scheduler.type", "'fifo', 'asha', 'hyperband', 'median' or 'pbt'"),
    (("resources", {"gpus_per_worker": 1.5}), "resources.gpus_per_worker", "whole number"),
    (
        ("resources", {"workers_per_trial": 2, "gpus_per_worker": 0.5}),
        "resources",
        "several DDP ranks on one GPU",
    ),
    (("resources", {"workers_per_trial": -1}), "resources.workers_per_trial", "greater than or equal to 0"),
    (("base.eval.tasks", ["sts17"]), "base.eval", "allowed: sts, transfer, faq, sts12"),
    (("base.trainer", {"warmup_ratio": 0.1, "warmup_steps": 10}), "base.trainer", "set one of warmup_steps"),
    (("ablations.temp.from", "search_spaces/nope.yaml"), "ablations.temp.from", "file not found"),
    (("method", DELETE), "method", "Field required"),
    (("base.model.type", "rnn"), "base.model", "model.type must be one of transformer, textcnn"),
    (
        ("base.model", {"type": "textcnn"}),
        "base",
        "trains a transformer encoder: set model.type: transformer",
    ),
    (("base.trainer", {"momentum_after_warmup": 0.8}), "base.trainer", "needs optimizer: sgd"),
    (
        ("base.eval", {"dev_tasks": []}),
        "ablations.temp[method.temperature=0.05]",
        "metric 'best_dev_stsb' needs eval.dev_tasks to include 'stsb'",
    ),
    (("metric", "dev_sickr"), "ablations.temp", "needs eval.dev_tasks to include 'sickr'"),
    (("base.trainer.length_group_size", 0), "base.trainer.length_group_size", "'auto', null or a positive"),
    (
        ("ablations.temp", {"points": [{"label": 'it\'s "hot"', "set": {"method.temperature": 0.5}}]}),
        'ablations.temp[it\'s "hot"]',
        "holds both ' and \", which MLflow's search cannot quote: set a label without one of them",
    ),
    (
        ("ablations.temp.grid", {"data.train": ['/data/o\'brien/"pairs".csv']}),
        'ablations.temp[data.train=/data/o\'brien/"pairs".csv]',
        "holds both ' and \"",
    ),
]


@pytest.mark.parametrize(
    ("change", "field", "fragment"), BAD_STUDIES, ids=[c[0][0] + str(i) for i, c in enumerate(BAD_STUDIES)]
)
def test_bad_study_names_the_file_and_field(tmp_path, change, field, fragment):
    path = write(tmp_path, with_change(*change))
    with pytest.raises(StudyError) as caught:
        load_study(path)
    message = str(caught.value)
    assert str(path) in message
    assert field in message, message
    assert fragment in message, message


def test_all_problems_are_reported_at_once(tmp_path):
    doc = with_change("base.trainer.lr", -1.0)
    doc["mode"] = "up"
    doc["seeds"] = [3, 3]
    with pytest.raises(StudyError) as caught:
        load_study(write(tmp_path, doc))
    assert len(caught.value.problems) == 3


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(StudyError, match="not valid YAML"):
        load_study(bad)
    with pytest.raises(StudyError, match="file not found"):
        load_study(tmp_path / "absent.yaml")


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "studies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_validates(path):
    study = load_study(path)
    for name, ablation in study.ablations.items():
        for point in grid_points(ablation) if not ablation.space else []:
            resolve_trial(study, name, point.overrides, study.seeds[0])


SHIPPED_VARIANTS = [
    (path, smoke)
    for path in sorted((REPO_ROOT / "studies").glob("*.yaml"))
    for smoke in (False, True)
    if not smoke or "smoke" in yaml.safe_load(path.read_text())
]


@pytest.mark.parametrize(
    ("path", "smoke"), SHIPPED_VARIANTS, ids=[p.name + (" --smoke" if s else "") for p, s in SHIPPED_VARIANTS]
)
def test_every_shipped_ablation_names_its_reference_row(path, smoke):
    """The report tests every row against ``reference:``; left implicit, a ``from:`` file or a smoke
    grid can silently move it, so every grid/points ablation names it (a sampled one has no rows)."""
    study = load_study(path, smoke=smoke)
    implicit = [name for name, a in study.ablations.items() if not a.space and a.reference is None]
    assert not implicit, f"{path.name}{' --smoke' if smoke else ''}: no explicit reference: in {implicit}"


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "search_spaces").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_search_space_validates_inside_a_study(tmp_path, path):
    body = yaml.safe_load(path.read_text())
    if "needs" in body:  # a later stage: it validates with its upstream ablations, in the studies using it
        users = [s for s in (REPO_ROOT / "studies").glob("*.yaml") if path.name in s.read_text()]
        assert users, f"{path.name} has needs: but no study uses it"
        for study_file in users:
            load_study(study_file)
        return
    algorithm = "optuna" if "space" in body else "grid"
    doc = {
        "name": "s",
        "method": path.parent.name if path.parent.name in ("gclsr", "supmpn") else "simcse_unsup",
        "ablations": {"a": {"from": str(path)}},
        "search": {"algorithm": algorithm},
    }
    load_study(write(tmp_path, doc))


def test_resolution_order_and_paper_numbers(tmp_path):
    study = load_study(
        write(tmp_path, GOOD), [parse_override("trainer.lr=1e-4"), parse_override("seeds=[7, 8]")]
    )
    points = grid_points(study.ablations["temp"])
    assert [p.paper for p in points] == [{"dev_stsb": 82.5}, {}]
    trial = resolve_trial(study, "temp", points[1].overrides, 8)
    assert trial.method == {
        "name": "simcse_unsup", "temperature": 0.1, "same_dropout_mask": False, "positive": "dropout",
        "positive_ratio": 0.1, "two_encoders": False,
    }  # fmt: skip
    assert trial.trainer.lr == 1e-4 and trial.trainer.seed == 8 and trial.trainer.batch_size == 16
    assert trial.model.mlp_only_train  # the method's paper default survives the study base
    assert study.seeds == [7, 8]


def test_an_ablation_may_use_another_method(tmp_path):
    doc = dict(
        GOOD, ablations={"sup": {"method": "simcse_sup", "grid": {"method.hard_negative_alpha": [2.0]}}}
    )
    study = load_study(write(tmp_path, doc))
    trial = resolve_trial(study, "sup", {"method.hard_negative_alpha": 2.0}, 1)
    assert trial.method["name"] == "simcse_sup" and trial.trainer.lr == 5e-5  # sup paper defaults


GCLSR = {"name": "g", "method": "gclsr", "ablations": {"gs": {"grid": {"method.group_size": [16, 48]}}}}


def test_gclsr_problems_name_the_point_and_the_rule(tmp_path):
    with pytest.raises(StudyError) as caught:
        load_study(write(tmp_path, GCLSR))
    assert "ablations.gs[method.group_size=48]" in str(caught.value)
    assert "must divide projector_dim 4096" in str(caught.value)
    doc = dict(GCLSR, ablations={"rs": {"grid": {"model.region_sizes": [[1, 80]]}}})
    with pytest.raises(StudyError, match="exceeds max_words 64"):
        load_study(write(tmp_path, doc))


def test_smoke_merges_its_section_and_needs_one(tmp_path):
    with pytest.raises(StudyError, match="--smoke needs a 'smoke:' section"):
        load_study(write(tmp_path, GOOD), smoke=True)
    doc = dict(GOOD, smoke={"seeds": [1], "base": {"trainer": {"max_steps": 2}}, "concurrency": 1})
    study = load_study(write(tmp_path, doc), smoke=True)
    assert study.name == "t-smoke" and study.seeds == [1] and study.concurrency == 1
    assert study.skip_unavailable
    assert study.base == {"model": {"name": "minilm"}, "trainer": {"batch_size": 16, "max_steps": 2}}
    assert load_study(write(tmp_path, doc)).name == "t"


def test_asha_needs_a_metric_of_every_evaluation_and_compile_a_transformer(tmp_path):
    doc = with_change("scheduler", {"type": "asha"}) | {"metric": "test_sts_avg"}
    with pytest.raises(StudyError, match="'test_sts_avg' is only known when a trial ends"):
        load_study(write(tmp_path, doc))
    load_study(write(tmp_path, with_change("metric", "test_sts_avg")))  # FIFO reads the last result
    gclsr = {
        "name": "g",
        "method": "gclsr",
        "base": {"model": {"type": "textcnn"}, "trainer": {"compile": True}},
    }
    gclsr["ablations"] = {"one": {"grid": {"trainer.lr": [0.01]}}}
    with pytest.raises(StudyError, match="trainer.compile applies to transformer encoders"):
        load_study(write(tmp_path, gclsr))


def test_a_grid_takes_several_objectives_with_scheduler_fifo_only(tmp_path):
    """Issue 56 item 6: the report's Pareto front of a grid's points; a scheduler would stop on one metric."""
    metrics = {"metric": ["best_dev_stsb", "test_sts_avg"], "mode": ["max", "max"]}
    study = load_study(write(tmp_path, {**GOOD, **metrics}))
    assert study.search.algorithm == "grid"
    assert study.objectives == [("best_dev_stsb", "max"), ("test_sts_avg", "max")]
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {**GOOD, **metrics, "scheduler": {"type": "asha"}}))
    (line,) = err.value.problems
    assert "scheduler asha stops trials on one metric; several objectives need scheduler fifo" in line
