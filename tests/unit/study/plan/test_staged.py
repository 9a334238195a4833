"""Staged studies: ``needs:`` in the schema, waves, filling from upstream checkpoints, skipping trials
whose upstream failed, one shared build per entropy-model set, and loading a trained encoder."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from clsr.config.model import ModelConfig
from clsr.encoders.checkpoint_files import save_tensors, write_manifest
from clsr.encoders.trained import is_checkpoint, load_trained_encoder
from clsr.encoders.transformer import TransformerEncoder
from clsr.study.plan.load import study_from_dict
from clsr.study.plan.resolve import experiments, grid_points, resolve_trial, stages, trial_document
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.run.experiment import expand_trials
from clsr.study.run.shared import shared_inputs
from clsr.study.run.waves import ready_trials
from clsr.study.spec.schema import StudyError
from clsr.tracking.study_runs import (
    CHECKPOINT_TAG,
    close_run,
    finished_outputs,
    open_child_run,
    record_skipped,
    start_parent_run,
)
from tests.support.stores import sqlite_uri

SMALL = {
    "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
    "data": {"train": "nli_triplets", "max_rows": 24},
    "trainer": {"batch_size": 4, "max_steps": 1, "eval_steps": 1},
}
RAW: dict[str, Any] = {
    "name": "staged",
    "method": "rcl",
    "base": SMALL,
    "seeds": [1, 2],
    "ablations": {
        "entropy": {"method": "rcl_entropy", "grid": {"method.phi": [0.01, 0.02]}},
        "regulators": {
            "needs": {"method.entropy_models": {"ablation": "entropy", "by": "method.phi"}},
            "points": [
                {"label": "0", "set": {"method.phis": []}},
                {"label": "2", "set": {"method.phis": [0.01]}},
                {"label": "4", "set": {"method.phis": [0.01, 0.02]}},
            ],
        },
        "dropout": {"grid": {"model.attention_dropout": [0.1]}, "base": {"method": {"phis": []}}},
    },
}


def study(**changes: Any):
    raw = copy.deepcopy(RAW)
    for name, body in changes.items():
        raw["ablations"][name] = body
    return study_from_dict(raw, "staged.yaml", Path("."))


def problems(**changes: Any) -> list[str]:
    with pytest.raises(StudyError) as caught:
        study(**changes)
    return caught.value.problems


def test_waves_put_upstream_ablations_first_and_validation_fills_placeholders():
    s = study()
    assert stages(s) == [["entropy", "dropout"], ["regulators"]]
    assert [(name, waves) for name, _, waves in experiments(s)] == [
        ("grid", ["entropy", "dropout"]),
        ("grid-stage2", ["regulators"]),
    ]
    trial = resolve_trial(s, "regulators", {"method.phis": [0.02]}, 2)
    assert trial.method["entropy_models"] == {
        0.01: "<checkpoint of entropy[method.phi=0.01] seed 2>",
        0.02: "<checkpoint of entropy[method.phi=0.02] seed 2>",
    }


def test_bad_needs_are_reported_with_field_and_allowed_values():
    regulators = copy.deepcopy(RAW["ablations"]["regulators"])
    regulators["needs"]["method.entropy_models"] |= {"ablation": "entropi"}
    assert problems(regulators=regulators) == [
        "ablations.regulators.needs.method.entropy_models.ablation: no such other ablation "
        "(given: 'entropi'; allowed: ['entropy', 'dropout'])"
    ]
    regulators["needs"]["method.entropy_models"] |= {"ablation": "entropy", "by": "method.psi"}
    assert problems(regulators=regulators) == [
        "ablations.regulators.needs.method.entropy_models.by: not set by every point of 'entropy' "
        "(given: 'method.psi'; allowed: ['method.phi'])"
    ]
    single = {"ablation": "entropy"}  # a single checkpoint, but the upstream has two points
    got = problems(regulators=regulators | {"needs": {"method.scoring_model": single}})
    assert "'entropy' has 2 points; name one with point: (allowed: ['method.phi=0.01'" in got[0]
    entropy = RAW["ablations"]["entropy"] | {"seeds": [1]}
    got = problems(entropy=entropy)
    assert got == [
        "ablations.regulators.needs.method.entropy_models.seed: 'entropy' runs seeds [1], not [2]; give it "
        "those seeds or use one of its seeds for every trial (seed: 1)"
    ]
    cycle = RAW["ablations"]["entropy"] | {"needs": {"model.name": {"ablation": "dropout"}}}
    dropout = RAW["ablations"]["dropout"] | {
        "needs": {"model.name": {"ablation": "entropy", "point": "method.phi=0.01"}}
    }
    assert "form a cycle" in problems(entropy=cycle, dropout=dropout)[0]
    sets_it = copy.deepcopy(RAW["ablations"]["regulators"])
    sets_it["points"][0]["set"]["method.entropy_models"] = {0.01: "x"}
    assert problems(regulators=sets_it) == [
        "ablations.regulators.needs.method.entropy_models: the ablation's points set "
        "method.entropy_models too; leave it to needs"
    ]


def test_a_phi_list_the_upstream_cannot_fill_fails_validation():
    regulators = copy.deepcopy(RAW["ablations"]["regulators"])
    regulators["points"].append({"label": "6", "set": {"method.phis": [0.01, 0.02, 0.03]}})
    got = problems(regulators=regulators)
    assert got[0].startswith("ablations.regulators[6].method: ") and "no checkpoint for φ = [0.03]" in got[0]


def test_fixed_upstream_seed_and_trials_whose_upstream_failed_are_held_back():
    s = study(entropy=RAW["ablations"]["entropy"] | {"seeds": [1]}, regulators=_fixed_seed_regulators())
    outputs = {("entropy", "method.phi=0.01", 1): "/ckpt/a"}  # φ = 0.02 failed
    trials = expand_trials(s, [p.of("regulators") for p in grid_points(s.ablations["regulators"])])
    assert [(t.label, t.seed) for t in trials] == [
        ("0", 1),
        ("0", 2),
        ("2", 1),
        ("2", 2),
        ("4", 1),
        ("4", 2),
    ]
    ready, blocked = ready_trials(s, trials, outputs)
    assert [(t.label, t.seed) for t in ready] == [("0", 1), ("0", 2), ("2", 1), ("2", 2)]
    assert {reason for _, reason in blocked} == {
        "upstream trials without a checkpoint: ablations.entropy[method.phi=0.02] seed 1"
    }
    trial = resolve_trial(s, "regulators", ready[3].overrides, 2, outputs)
    assert trial.method["entropy_models"] == {0.01: "/ckpt/a"}  # seed 2 trials use seed 1's models
    assert ready[3].config == trial  # resolved once its upstream outputs exist


def _fixed_seed_regulators() -> dict[str, Any]:
    regulators = copy.deepcopy(RAW["ablations"]["regulators"])
    regulators["needs"]["method.entropy_models"]["seed"] = 1
    return regulators


def test_entropy_models_are_embedded_once_per_seed_for_all_regulator_trials():
    s = study()
    outputs = {
        ("entropy", f"method.phi={phi}", seed): f"/ckpt/{phi}-{seed}"
        for phi in (0.01, 0.02)
        for seed in (1, 2)
    }
    trials = expand_trials(s, [p.of("regulators") for p in grid_points(s.ablations["regulators"])])
    wanted = shared_inputs(s, trials, outputs)
    assert len(wanted) == 2  # one per seed; the '0' point (Eq. 1 alone) needs none
    for config in wanted.values():
        seed = config.trainer.seed
        assert config.method["entropy_models"] == {0.01: f"/ckpt/0.01-{seed}", 0.02: f"/ckpt/0.02-{seed}"}


def test_outputs_are_read_back_from_mlflow_and_skipped_trials_are_recorded(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "staged", str(tmp_path), None)
    for phi, status in ((0.01, "finished"), (0.02, "failed")):
        tags = {"clsr.ablation": "entropy", "clsr.point": f"method.phi={phi}", "clsr.seed": 1}
        run = open_child_run(uri, parent, f"t{phi}", "x", tags, {})
        client.set_tag(run, CHECKPOINT_TAG, f"s3://bucket/{phi}")
        close_run(uri, run, status)
    record_skipped(uri, parent, "regulators", "4", 1, "upstream trials without a checkpoint: ...")
    assert finished_outputs(client, parent) == {("entropy", "method.phi=0.01", 1): "s3://bucket/0.01"}
    skipped = [
        r
        for r in client.search_runs([client.get_run(parent).info.experiment_id])
        if r.info.run_name == "regulators 4 · seed 1"
    ]
    assert skipped[0].data.tags["clsr.status"] == "skipped"
    assert skipped[0].data.tags["clsr.error"].startswith("upstream trials without a checkpoint")


def write_checkpoint(folder: Path, last: dict, best: dict) -> Path:
    """A trainer checkpoint folder as the loop writes it: ``state.pt`` (last weights and more),
    ``best_model.pt`` (the best-dev weights) and the manifest of their SHA-256."""
    folder.mkdir()
    hashes = {
        "state.pt": save_tensors({"model": last, "optimizer": {}, "step": 3}, folder / "state.pt"),
        "best_model.pt": save_tensors(best, folder / "best_model.pt"),
    }
    write_manifest(folder, hashes)
    return folder


def test_a_trained_encoder_loads_from_a_checkpoint_folder_file_or_uri(tmp_path):
    cfg = ModelConfig(name="minilm", pooling="avg", max_seq_length=16)
    trained = TransformerEncoder(cfg)
    with torch.no_grad():
        trained.backbone.embeddings.word_embeddings.weight.mul_(2)
    folder = write_checkpoint(
        tmp_path / "checkpoint_000003",
        trained.state_dict(),
        {k: v * 0 for k, v in trained.state_dict().items()},
    )

    assert is_checkpoint(str(folder)) and is_checkpoint("s3://b/c") and not is_checkpoint("minilm")
    expected = trained.backbone.embeddings.word_embeddings.weight
    copies_before = set(Path(tempfile.gettempdir()).glob("clsr-upstream-*"))
    for source in (str(folder), str(folder / "state.pt"), f"file://{folder}"):
        loaded = load_trained_encoder(source, cfg)
        assert torch.equal(loaded.backbone.embeddings.word_embeddings.weight, expected), source
    assert set(Path(tempfile.gettempdir()).glob("clsr-upstream-*")) == copies_before  # URI copy removed
    assert (
        load_trained_encoder(str(folder), cfg, "best").backbone.embeddings.word_embeddings.weight.abs().sum()
        == 0
    )
    (folder / "best_model.pt").unlink()
    with pytest.raises(FileNotFoundError, match="has no best_model.pt"):
        load_trained_encoder(str(folder), cfg, "best")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trained_encoder(str(tmp_path / "nowhere.pt"), cfg)


# --- match: a chain per fold (RCL Table 2: entropy models from their fold's Eq. 1 model) ---------------

FOLDS: dict[str, Any] = {
    "name": "per_fold",
    "method": "rcl",
    "base": SMALL,
    "seeds": [1],
    "ablations": {
        "eq1": {  # a one-value second key, so the upstream labels have two parts as a fold's do
            "grid": {"trainer.lr": [1e-5, 2e-5], "trainer.warmup_ratio": [0.0]},
            "base": {"method": {"phis": []}},
        },
        "entropy": {
            "method": "rcl_entropy",
            "needs": {"model.init_checkpoint": {"ablation": "eq1", "match": ["trainer.lr"]}},
            "grid": {"trainer.lr": [1e-5, 2e-5], "method.phi": [0.01, 0.02]},
        },
        "rcl": {
            "needs": {
                "method.entropy_models": {"ablation": "entropy", "by": "method.phi", "match": ["trainer.lr"]}
            },
            "grid": {"trainer.lr": [1e-5, 2e-5]},
            "base": {"method": {"phis": [0.01, 0.02]}},
        },
    },
}


def per_fold(**changes: Any):
    raw = copy.deepcopy(FOLDS)
    for name, body in changes.items():
        raw["ablations"][name] = body
    return study_from_dict(raw, "per_fold.yaml", Path("."))


def test_match_chains_each_point_to_the_upstream_points_that_share_its_keys():
    s = per_fold()
    assert stages(s) == [["eq1"], ["entropy"], ["rcl"]]
    # the ablation's base document (the study record's summary) has no point to match: it still resolves
    assert trial_document(s, "rcl", {}, 1)["method"]["entropy_models"]
    entropy = resolve_trial(s, "entropy", {"trainer.lr": 2e-5, "method.phi": 0.01}, 1)
    assert (
        entropy.model.init_checkpoint
        == "<checkpoint of eq1[trainer.lr=2e-05, trainer.warmup_ratio=0.0] seed 1>"
    )
    rcl = resolve_trial(s, "rcl", {"trainer.lr": 1e-5}, 1)
    assert rcl.method["entropy_models"] == {
        0.01: "<checkpoint of entropy[trainer.lr=1e-05, method.phi=0.01] seed 1>",
        0.02: "<checkpoint of entropy[trainer.lr=1e-05, method.phi=0.02] seed 1>",
    }
    outputs = {("entropy", "trainer.lr=1e-05, method.phi=0.01", 1): "/ckpt/a"}  # the other fold's are missing
    trials = [TrialSpec("rcl", f"trainer.lr={lr}", {"trainer.lr": lr}, {}, 1) for lr in (1e-5, 2e-5)]
    ready, blocked = ready_trials(s, trials, outputs)
    assert ready == [] and [reason for _, reason in blocked] == [
        "upstream trials without a checkpoint: ablations.entropy[trainer.lr=1e-05, method.phi=0.02] seed 1",
        "upstream trials without a checkpoint: ablations.entropy[trainer.lr=2e-05, method.phi=0.01] seed 1, "
        "ablations.entropy[trainer.lr=2e-05, method.phi=0.02] seed 1",
    ]


def test_bad_match_keys_are_refused_with_the_keys_allowed():
    entropy = copy.deepcopy(FOLDS["ablations"]["entropy"])
    entropy["needs"]["model.init_checkpoint"]["match"] = ["method.phi"]
    with pytest.raises(StudyError) as caught:
        per_fold(entropy=entropy)
    assert caught.value.problems[0] == (
        "ablations.entropy.needs.model.init_checkpoint.match: ['method.phi'] not set by every point of "
        "'eq1' (allowed: ['trainer.lr', 'trainer.warmup_ratio'])"
    )
    entropy["needs"]["model.init_checkpoint"]["match"] = ["trainer.lr"]
    entropy["grid"]["trainer.lr"] = [1e-5, 3e-5]
    with pytest.raises(StudyError) as caught:
        per_fold(entropy=entropy)
    assert caught.value.problems[0].startswith(
        "ablations.entropy.needs.model.init_checkpoint.match: no point of 'eq1' has {'trainer.lr': 3e-05}"
    )


def test_a_trial_starts_from_an_upstream_checkpoint_with_model_init_checkpoint(tmp_path):
    from clsr.methods import get_method

    cfg = ModelConfig(name="minilm", pooling="avg", max_seq_length=16)
    trained = TransformerEncoder(cfg)
    with torch.no_grad():
        trained.backbone.embeddings.word_embeddings.weight.mul_(3)
    folder = write_checkpoint(
        tmp_path / "checkpoint_000002",
        {k: v * 0 for k, v in trained.state_dict().items()},
        trained.state_dict(),
    )
    rcl = get_method("rcl")
    method = rcl(rcl.Config(phis=[]))
    start = cfg.model_copy(update={"init_checkpoint": str(folder)})
    weights = method.build_model(start).backbone.embeddings.word_embeddings.weight
    assert torch.equal(weights, trained.backbone.embeddings.word_embeddings.weight)  # best by default
    last = method.build_model(start.model_copy(update={"init_weights": "last"}))
    assert last.backbone.embeddings.word_embeddings.weight.abs().sum() == 0
    fresh = method.build_model(cfg).backbone.embeddings.word_embeddings.weight
    assert torch.allclose(fresh * 3, weights)
