"""``platform study promote``: the best finished trial's logged model registered in a real sqlite-backed
MLflow Model Registry, its version's tags read back, loaded again through ``models:/<name>/<version>``;
and the one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.config.model import ModelConfig
from clsr.encoders.embed import transformer_embedder
from clsr.encoders.export import load_model, make_embedder, save_sentence_transformer
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from clsr.study.analyse.promote import PromoteRefused, promote
from clsr.study.plan.fingerprint import trial_key
from clsr.study.plan.load import load_study
from clsr.tracking.study_runs import start_parent_run
from tests.support.stores import sqlite_uri
from tests.unit.study.analyse.test_results import child

NAME = "prom"
STUDY = {
    "name": NAME,
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}},
    "seeds": [1, 2],
    "metric": "best_dev_stsb",
    "ablations": {
        "temperature": {"grid": {"method.temperature": [0.05, 0.1]}},
        "again": {"grid": {"method.temperature": [0.05]}},  # the same label, other runs: ambiguous
        "pooling": {"points": [{"label": "avg", "set": {"model.pooling": "avg"}}]},
    },
}
T05, T01 = "method.temperature=0.05", "method.temperature=0.1"
# (ablation, label, seed) -> best_dev_stsb; the best trial is temperature[0.1] seed 2
TRIALS = {
    ("temperature", T05, 1): 80.0,
    ("temperature", T05, 2): 81.0,
    ("temperature", T01, 1): 79.0,
    ("temperature", T01, 2): 83.5,
    ("again", T05, 1): 82.0,
}
SENTENCES = ["A man is playing a guitar.", "Two dogs run through a snowy field."]


@pytest.fixture
def store(tmp_path, monkeypatch, tiny_bert):
    """A study record whose best trial logged a tiny exported model as ``model/``, like the trainer."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    study_file = tmp_path / "prom.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    client = MlflowClient(uri)
    parent = start_parent_run(client, NAME, str(tmp_path / "runs"), None)
    keys = {trial_key(a, p, s): f"{a}-{p}-{s}-hash" for a, p, s in TRIALS}
    client.log_dict(parent, keys, "fingerprint.json")
    runs = {k: child(client, uri, parent, *k, {}, {"best_dev_stsb": v}) for k, v in TRIALS.items()}
    failed = child(client, uri, parent, "pooling", "avg", 1, {}, {"best_dev_stsb": 99.0})
    client.set_tag(failed, "clsr.status", "failed")  # a better number that did not finish: never promoted
    cfg = ModelConfig(name=tiny_bert, pooling="avg")
    encoder = TransformerEncoder(cfg).eval()
    tokenizer = load_tokenizer(tiny_bert)
    save_sentence_transformer(encoder, tokenizer, cfg, tmp_path / "export")
    for key in (("temperature", T01, 2), ("temperature", T05, 2)):
        client.log_artifacts(runs[key], str(tmp_path / "export"), "model")  # what Evaluator.log_model does
    expected = transformer_embedder(encoder, tokenizer)(SENTENCES)
    return {"uri": uri, "file": study_file, "runs": runs, "client": client, "expected": expected}


def test_promotes_the_best_finished_trial_and_loads_it_through_models_uri(store, capsys, data_dir):
    assert main(["study", "promote", str(store["file"])]) == 0
    assert f"registered models:/{NAME}/1: temperature[{T01}] seed 2" in capsys.readouterr().out
    registry = MlflowClient(store["uri"], registry_uri=store["uri"])
    version = registry.get_model_version(NAME, "1")
    best = store["runs"][("temperature", T01, 2)]
    assert version.run_id == best and version.source == f"runs:/{best}/model"
    assert version.tags == {
        "study": NAME,
        "ablation": "temperature",
        "point": T01,
        "seed": "2",
        "seeds": "1,2",
        "fingerprint": f"temperature-{T01}-2-hash",
        "metric": "best_dev_stsb",
        "metric_value": "83.5",
        "run_id": best,
    }
    loaded, pipeline = load_model(f"models:/{NAME}/1")
    np.testing.assert_allclose(make_embedder(loaded, pipeline)(SENTENCES), store["expected"], atol=1e-6)
    # SICK-R dev (500 pairs): the cheapest STS split
    assert main(["eval", "--model", f"models:/{NAME}/1", "--tasks", "sickr", "--split", "dev"]) == 0
    assert f"models:/{NAME}/1 (avg pooling)" in capsys.readouterr().out


def test_a_point_of_one_ablation_becomes_a_second_version(store):
    study = load_study(store["file"])
    promote(study, store["uri"], ablation="temperature", point=T05, name="other")
    second = promote(study, store["uri"], ablation="temperature", point=T05, name="other")
    assert str(second.version.version) == "2" and second.tags["seed"] == "2" and second.tags["seeds"] == "1,2"
    assert second.version.run_id == store["runs"][("temperature", T05, 2)]


def test_refusals_are_one_line(store, capsys):
    study = load_study(store["file"])
    with pytest.raises(PromoteRefused, match="ablations again, temperature: give --ablation"):
        promote(study, store["uri"], point=T05)
    with pytest.raises(PromoteRefused, match="no finished trial of ablation 'pooling'"):
        promote(study, store["uri"], ablation="pooling")
    with pytest.raises(PromoteRefused, match="logged no model/ artifact"):
        promote(study, store["uri"], ablation="again")
    with pytest.raises(PromoteRefused, match="has no such ablation; it has temperature, again, pooling"):
        promote(study, store["uri"], ablation="nope")
    assert main(["study", "promote", str(store["file"]), "--point", "0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--point '0.3'" in err


def test_models_uri_resolves_in_the_given_store_whatever_this_process_set_before(
    store, tmp_path, monkeypatch
):
    """MLflow's own models:/ download asks the process-wide registry (the global tracking URI another part
    of the process set: a test, a notebook, `eval --mlflow`), not the store this command was given."""
    import mlflow

    promote(load_study(store["file"]), store["uri"], ablation="temperature", point=T05, name="elsewhere")
    mlflow.set_tracking_uri(sqlite_uri(tmp_path / "another.db"))  # set earlier, elsewhere
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])  # this command's store
    try:
        loaded, pipeline = load_model("models:/elsewhere/1")
    finally:
        mlflow.set_tracking_uri(None)  # no global left for the tests after this one
    assert make_embedder(loaded, pipeline)(SENTENCES).shape == store["expected"].shape
