"""A finished study keeps of each finished trial's checkpoint what a later study loads: ``state.pt`` with
the weights and counters only, ``best_model.pt`` as it was, a manifest that matches them at every moment
(``clsr.study.record.retention``); unfinished trials and ``keep_checkpoints: true`` keep theirs whole."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pyarrow.fs
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from clsr.config.model import ModelConfig
from clsr.encoders import checkpoint_files
from clsr.encoders.checkpoint_files import MANIFEST
from clsr.encoders.trained import load_trained_encoder
from clsr.encoders.transformer import TransformerEncoder
from clsr.study.plan.resolve import checkpoint_lines, trained_parameters
from clsr.study.record import retention
from clsr.study.record.retention import RESUME_ONLY, SWAP, shrink_checkpoint, shrink_finished_checkpoints
from clsr.study.spec.schema import Study
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from clsr.tracking.tags import CHECKPOINT_TAG
from clsr.train.checkpoint import save_checkpoint, trained_state
from tests.support.stores import sqlite_uri

REPO_ROOT = Path(__file__).resolve().parents[4]
STATE = {"step": 2, "best_score": 71.5, "best_step": 1, "lowest_loss": math.inf, "stalled_steps": 1}
FILES = ["best_model.pt", MANIFEST, "state.pt"]


@pytest.fixture
def trained(tiny_bert, tmp_path, monkeypatch):
    """A checkpoint folder of a tiny BERT encoder written by the trainer's ``save_checkpoint`` after two
    AdamW steps (best weights: those after the first), its model config, last and best weights."""
    cfg = ModelConfig(name=tiny_bert, pooling="avg", max_seq_length=16)
    torch.manual_seed(0)
    model = TransformerEncoder(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    best = None
    for _ in range(2):
        sum((p * torch.randn_like(p)).sum() for p in model.parameters()).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        best = best or {k: v.clone() for k, v in trained_state(model).items()}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the trainer's staging folder
    folder = tmp_path / "storage" / "train-0" / "checkpoint_000000"
    folder.parent.mkdir(parents=True)
    shutil.move(save_checkpoint(model, optimizer, scheduler, dict(STATE), best), folder)
    last = {k: v.clone() for k, v in trained_state(model).items()}
    return folder, cfg, last, best


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def weight_bytes(weights: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def assert_shrunk(folder: Path, cfg: ModelConfig, last: dict, best: dict) -> None:
    """Two weights files and a manifest that matches them; both load, with the trial's weights."""
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == FILES  # no temporary file left
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["sha256"] == {
        n: checkpoint_files.sha256(folder / n) for n in ("state.pt", "best_model.pt")
    }
    assert manifest["shrunk"] == ["state.pt"]
    state = checkpoint_files.load_tensors(folder / "state.pt")
    assert not set(RESUME_ONLY) & set(state)
    assert {k: state[k] for k in STATE} == STATE  # the counters stay
    assert_same(state["model"], last)
    # what a later study loads (clsr.encoders.trained): the last and the best weights
    assert_same(load_trained_encoder(str(folder), cfg, "last").state_dict(), last)
    assert_same(load_trained_encoder(str(folder), cfg, "best").state_dict(), best)
    # at most twice the trained weights: the counters and torch.save's framing add a few kB per file
    files = {n: (folder / n).stat().st_size for n in ("state.pt", "best_model.pt")}
    assert files["state.pt"] <= files["best_model.pt"] + 4096
    assert sum(files.values()) <= 2 * weight_bytes(last) * 1.01 + 16384


def test_a_finished_checkpoint_keeps_its_weights_and_counters_only(trained):
    folder, cfg, last, best = trained
    whole = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert "optimizer" in checkpoint_files.load_tensors(folder / "state.pt")
    assert_same(load_trained_encoder(str(folder), cfg, "last").state_dict(), last)  # the whole one loads too

    before, after = shrink_checkpoint(str(folder))

    assert before == whole and after == sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert after < before / 1.8  # Adam's two moments were as large as the weights twice over
    assert_shrunk(folder, cfg, last, best)

    files = snapshot(folder)  # a second shrink changes nothing
    assert shrink_checkpoint(str(folder)) == (after, after)
    assert snapshot(folder) == files


def test_through_a_remote_filesystem(trained, tmp_path):
    """The same steps through a pyarrow filesystem that is not the local one (an object store's path:
    downloaded, shrunk here, uploaded, moved by the filesystem)."""
    folder, cfg, last, best = trained
    remote = pyarrow.fs.SubTreeFileSystem(str(tmp_path / "storage"), pyarrow.fs.LocalFileSystem())
    assert remote.type_name != "local"
    before, after = shrink_checkpoint("train-0/checkpoint_000000", filesystem=remote)
    assert after < before / 1.8
    assert_shrunk(folder, cfg, last, best)
    files = snapshot(folder)
    assert shrink_checkpoint("train-0/checkpoint_000000", filesystem=remote) == (after, after)
    assert snapshot(folder) == files


class StopsAtMove:
    """A filesystem that stops (as a killed driver would) at its ``n``-th move: 1 is the manifest that
    accepts both hashes (step 2), 2 the new file's rename (step 3)."""

    def __init__(self, n: int):
        self.fs, self.n = pyarrow.fs.LocalFileSystem(), n

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def move(self, source: str, target: str) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt
        self.fs.move(source, target)


@pytest.mark.parametrize("stop_at", [1, 2])
def test_a_shrink_stopped_halfway_leaves_a_checkpoint_that_loads_and_the_next_finishes_it(trained, stop_at):
    folder, cfg, last, best = trained
    with pytest.raises(KeyboardInterrupt):
        shrink_checkpoint(str(folder), filesystem=StopsAtMove(stop_at))
    manifest = json.loads((folder / MANIFEST).read_text())["sha256"]["state.pt"]
    assert isinstance(manifest, str if stop_at == 1 else list)
    assert (folder / SWAP).exists()
    assert "optimizer" in checkpoint_files.load_tensors(folder / "state.pt")  # the whole one, accepted
    assert_same(load_trained_encoder(str(folder), cfg, "last").state_dict(), last)

    shrink_checkpoint(str(folder))
    assert_shrunk(folder, cfg, last, best)


def test_a_reader_that_read_the_manifest_before_the_swap_accepts_the_new_file(trained):
    """The reader's manifest is from before step 2, the file it opens from after step 3: it reads the
    manifest again and finds the new hash there."""
    folder, _, last, _ = trained
    path = folder / "state.pt"
    recorded = checkpoint_files._listed(path, required=True)
    shrink_checkpoint(str(folder))
    with open(path, "rb") as f:
        checkpoint_files._check(path, f, recorded)  # no error
        assert_same(torch.load(f, weights_only=True)["model"], last)


def test_a_changed_file_is_left_as_it_is(trained):
    folder, *_ = trained
    data = bytearray((folder / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "state.pt").write_bytes(bytes(data))
    files = snapshot(folder)
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        shrink_checkpoint(str(folder))
    assert snapshot(folder) == files  # not given a fresh hash


# --- a study: only its finished trials, only once it finished, never with keep_checkpoints ---


def smoke_study(**changes) -> Study:
    study = Study.model_validate(yaml.safe_load((REPO_ROOT / "studies" / "smoke.yaml").read_text()))
    return study.model_copy(update=changes)


def recorded_study(tmp_path: Path, trained_folder: Path, study_status: str):
    """A study record whose trials are: finished (the trained checkpoint), interrupted, failed, and
    finished with a checkpoint tag outside the study's storage (each a copy of the same checkpoint)."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    storage = trained_folder.parents[1]
    outside = tmp_path / "elsewhere" / "checkpoint"
    shutil.copytree(trained_folder, outside)
    folders = {"finished": trained_folder, "outside": outside}
    for status in ("interrupted", "failed"):
        folders[status] = storage / f"train-{status}" / "checkpoint_000000"
        shutil.copytree(trained_folder, folders[status])
    parent = start_parent_run(client, "smoke", str(storage), None)
    for name, folder in folders.items():
        run = open_child_run(uri, parent, name, name, {"clsr.ablation": "a", "clsr.point": name}, {})
        client.set_tag(run, CHECKPOINT_TAG, str(folder))
        close_run(uri, run, "finished" if name == "outside" else name)
    client.set_tag(parent, "clsr.status", study_status)
    return client, parent, str(storage), folders


def test_a_finished_study_shrinks_its_finished_trials_only(trained, tmp_path):
    folder, cfg, last, best = trained
    client, parent, storage, folders = recorded_study(tmp_path, folder, "finished")
    kept = {name: snapshot(f) for name, f in folders.items() if name != "finished"}

    line = shrink_finished_checkpoints(smoke_study(), client, parent, storage)

    assert line.startswith("checkpoints of 1 finished trial(s): ") and "1 shrunk" in line
    assert "\n" not in line
    assert_shrunk(folder, cfg, last, best)
    assert {name: snapshot(folders[name]) for name in kept} == kept  # resumable, or not the study's
    files = snapshot(folder)
    assert "0 shrunk" in shrink_finished_checkpoints(smoke_study(), client, parent, storage)
    assert snapshot(folder) == files


def _finished_run(client, parent: str) -> str:
    from clsr.tracking.study_runs import children

    return next(r.info.run_id for r in children(client, parent) if r.data.tags["clsr.point"] == "finished")


def test_the_best_weights_are_kept_once_when_the_trials_run_holds_its_model(trained, tmp_path):
    """Issue 53 (disk): a finished trial whose MLflow run holds its model (``model/``, what ``platform eval``
    and users load) keeps no ``best_model.pt``; its manifest names the model, ``last`` still loads, and a
    reader of ``best`` is pointed at the model. Once more changes nothing."""
    folder, cfg, last, _ = trained
    client, parent, storage, _ = recorded_study(tmp_path, folder, "finished")
    run = _finished_run(client, parent)
    client.log_text(run, "weights", "model/model.safetensors")  # the model the trial logged
    best_size = (folder / "best_model.pt").stat().st_size

    line = shrink_finished_checkpoints(smoke_study(), client, parent, storage)

    assert "1 with their best weights kept once, as the run's MLflow model" in line
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == [MANIFEST, "state.pt"]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["sha256"] == {"state.pt": checkpoint_files.sha256(folder / "state.pt")}
    assert manifest["best_model"] == f"runs:/{run}/model"
    assert best_size > weight_bytes(last)  # what was freed: a whole copy of the weights
    assert_same(load_trained_encoder(str(folder), cfg, "last").state_dict(), last)
    with pytest.raises(FileNotFoundError, match=rf"as the MLflow model runs:/{run}/model \(`platform eval"):
        load_trained_encoder(str(folder), cfg, "best")
    files = snapshot(folder)
    assert "0 with their best weights kept once" in shrink_finished_checkpoints(
        smoke_study(), client, parent, storage
    )
    assert snapshot(folder) == files


def test_a_trial_a_later_stage_needs_keeps_its_best_weights(trained, tmp_path):
    """An ablation of the study ``needs:`` the trial's ablation: its checkpoint keeps ``best_model.pt`` (a
    later stage loads the weights, heads included), and so does a trial whose run holds no model."""
    from clsr.study.spec.ablation import Need

    folder, cfg, last, best = trained
    client, parent, storage, _ = recorded_study(tmp_path, folder, "finished")
    client.log_text(_finished_run(client, parent), "weights", "model/model.safetensors")
    study = smoke_study()
    downstream = study.ablations["temperature"].model_copy(update={"needs": {"model.name": Need(ablation="a")}})
    study = study.model_copy(update={"ablations": {"temperature": downstream}})
    line = shrink_finished_checkpoints(study, client, parent, storage)
    assert "0 with their best weights kept once" in line
    assert_shrunk(folder, cfg, last, best)


@pytest.mark.parametrize(("keep", "study_status"), [(True, "finished"), (False, "interrupted")])
def test_nothing_is_touched_with_keep_checkpoints_or_before_the_study_finished(
    trained, tmp_path, keep, study_status
):
    folder, *_ = trained
    client, parent, storage, folders = recorded_study(tmp_path, folder, study_status)
    files = {name: snapshot(f) for name, f in folders.items()}
    line = shrink_finished_checkpoints(smoke_study(keep_checkpoints=keep), client, parent, storage)
    assert line.startswith("checkpoints: kept whole")
    assert {name: snapshot(f) for name, f in folders.items()} == files


def test_a_checkpoint_that_cannot_be_shrunk_is_named_not_raised(trained, tmp_path, monkeypatch):
    folder, *_ = trained
    client, parent, storage, _ = recorded_study(tmp_path, folder, "finished")
    monkeypatch.setattr(retention, "shrink_checkpoint", lambda location: 1 / 0)
    line = shrink_finished_checkpoints(smoke_study(), client, parent, storage)
    assert "1 kept whole, could not be shrunk" in line and "ZeroDivisionError" in line


def test_keep_checkpoints_defaults_to_false():
    assert smoke_study().keep_checkpoints is False
    assert Study.model_fields["keep_checkpoints"].description


# --- study plan: the bytes per trial, from the parameter count ---


def test_the_parameter_count_gives_the_trained_weights(trained, tiny_bert):
    _, _, last, _ = trained
    assert 4 * trained_parameters(tiny_bert, "avg") == weight_bytes(last)
    assert trained_parameters(tiny_bert, "cls") == trained_parameters(tiny_bert, "avg") + 16 * 16 + 16


def test_study_plan_states_the_checkpoint_bytes_per_trial():
    # MiniLM-L6: 22.6 M parameters, 90.3 MB of fp32 weights (the smoke study's measured best_model.pt)
    (line,) = checkpoint_lines(smoke_study())
    assert "~361 MB while it trains" in line and "~181 MB once the study finished" in line
    assert "~361 MB for the study's 2 trial(s)" in line
    (kept,) = checkpoint_lines(smoke_study(keep_checkpoints=True))
    assert "~361 MB once the study finished (kept whole" in kept and "~722 MB for the study's" in kept
