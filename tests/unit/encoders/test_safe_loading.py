"""What the platform loads and logs: checkpoints load as tensors only, are written atomically with a
SHA-256 manifest that must be there when they are read, upstream checkpoints named by MLflow tags stay
under the study's storage (plain locations only: no query, user, password or port), a trial's run is
found again whatever its id holds, and credentials never reach logs or errors."""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from clsr.config.model import ModelConfig
from clsr.encoders import checkpoint_files
from clsr.encoders.checkpoint_files import MANIFEST, UntrustedCheckpoint
from clsr.encoders.trained import load_trained_encoder
from clsr.tracking import study_runs
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import (
    CHECKPOINT_TAG,
    check_reachable,
    children,
    close_run,
    finished_outputs,
    open_child_run,
    start_parent_run,
    trial_run,
    under_root,
)
from clsr.train.checkpoint import load_checkpoint, save_checkpoint
from tests.support.stores import sqlite_uri

MODEL = ModelConfig(name="minilm", pooling="avg", max_seq_length=16)


class Payload:
    """Unpickling this runs ``Path.touch(target)``: what a crafted checkpoint would do on a worker."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (pathlib.Path.touch, (self.target,))


def crafted(path: Path, target: Path) -> Path:
    torch.save({"model": {"weight": torch.zeros(2)}, "extra": Payload(target)}, path)
    return path


def test_the_crafted_file_would_run_its_payload_without_weights_only(tmp_path):
    """The control: the payload is live, so the refusals below are what keeps it from running."""
    target = tmp_path / "pwned"
    torch.load(crafted(tmp_path / "evil.pt", target), weights_only=False)
    assert target.exists()


@pytest.mark.parametrize(
    ("form", "refusal"),
    [
        ("file", "not trusted"),  # a weights file of one's own: no manifest needed, torch.load refuses it
        ("folder", "no SHA-256 recorded"),  # the trainer's folder without its manifest
        ("best", "no SHA-256 recorded"),
        ("folder with manifest", "not trusted"),  # whoever wrote the file can write its manifest too
    ],
)
def test_a_crafted_checkpoint_is_refused_by_load_trained_encoder(tmp_path, form, refusal):
    target = tmp_path / "pwned"
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    name = {"best": "best_model.pt", "file": "encoder.pt"}.get(form, "state.pt")
    path = crafted(folder / name, target)
    if form == "folder with manifest":
        checkpoint_files.write_manifest(folder, {name: checkpoint_files.sha256(path)})
    source = str(path) if form == "file" else str(folder)
    with pytest.raises((UntrustedCheckpoint, ValueError)) as refused:
        load_trained_encoder(source, MODEL, weights="best" if form == "best" else "last")
    message = str(refused.value)
    assert "\n" not in message and refusal in message and name in message
    assert not target.exists()


def test_a_crafted_checkpoint_is_refused_by_the_trainers_restore(tmp_path, monkeypatch):
    target = tmp_path / "pwned"
    model, optimizer, scheduler = tiny_training()
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    crafted(folder / "state.pt", target)
    with pytest.raises(ValueError, match="no SHA-256 recorded"):
        load_checkpoint(folder, model, optimizer, scheduler, {}, SimpleNamespace(rank=0), 0)
    # whoever wrote the file can write its manifest too: torch.load refuses it then
    checkpoint_files.write_manifest(folder, {"state.pt": checkpoint_files.sha256(folder / "state.pt")})
    with pytest.raises(UntrustedCheckpoint, match="holds more than tensors"):
        load_checkpoint(folder, model, optimizer, scheduler, {}, SimpleNamespace(rank=0), 0)
    assert not target.exists()

    # the state loads, the best weights are crafted: refused by the manifest, which does not list them,
    # and without the manifest by the check that it is there
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real = save_checkpoint(model, optimizer, scheduler, {"step": 1}, None)
    crafted(real / "best_model.pt", target)
    with pytest.raises(ValueError, match="best_model.pt is not listed in"):
        load_checkpoint(real, model, optimizer, scheduler, {}, SimpleNamespace(rank=0), 0)
    (real / MANIFEST).unlink()
    with pytest.raises(ValueError, match="no SHA-256 recorded"):
        load_checkpoint(real, model, optimizer, scheduler, {}, SimpleNamespace(rank=0), 0)
    assert not target.exists()


def tiny_training(
    steps: int = 2,
) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    for _ in range(steps):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


STATE = {"step": 2, "best_score": -math.inf, "best_step": 0, "lowest_loss": math.inf, "stalled_steps": 1}


def test_a_checkpoint_loads_as_tensors_only_and_round_trips_exactly(tmp_path):
    model, optimizer, scheduler = tiny_training()
    best = {k: v.clone() * 2 for k, v in model.state_dict().items()}
    folder = save_checkpoint(model, optimizer, scheduler, dict(STATE), best)
    try:
        assert sorted(p.name for p in folder.iterdir()) == ["best_model.pt", MANIFEST, "state.pt"]
        hashes = json.loads((folder / MANIFEST).read_text())["sha256"]
        assert hashes == {
            name: checkpoint_files.sha256(folder / name) for name in ("state.pt", "best_model.pt")
        }
        saved = torch.load(folder / "state.pt", weights_only=True)  # no allow-listed types needed
        assert torch.equal(saved["rng"]["cpu"], torch.get_rng_state())

        rng_then = torch.get_rng_state()
        torch.rand(10)  # the restore puts the generator back where it was
        fresh_model, fresh_optimizer, fresh_scheduler = tiny_training(steps=0)
        state: dict = {}
        got_best = load_checkpoint(
            folder, fresh_model, fresh_optimizer, fresh_scheduler, state, SimpleNamespace(rank=0), 0
        )
        assert torch.equal(torch.get_rng_state(), rng_then)
        assert state == STATE
        for name, value in model.state_dict().items():
            assert torch.equal(fresh_model.state_dict()[name], value)
            assert torch.equal(got_best[name], best[name])
        assert fresh_scheduler.state_dict() == scheduler.state_dict()
        theirs, ours = optimizer.state_dict(), fresh_optimizer.state_dict()
        assert theirs["param_groups"] == ours["param_groups"]
        for index, slots in theirs["state"].items():
            for key, value in slots.items():
                assert torch.equal(ours["state"][index][key], value), (index, key)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", ["state.pt", "best_model.pt"])
def test_a_file_changed_after_it_was_written_is_refused(tmp_path, name):
    model, optimizer, scheduler = tiny_training()
    folder = save_checkpoint(model, optimizer, scheduler, dict(STATE), model.state_dict())
    moved = tmp_path / "checkpoint"
    folder.rename(moved)
    data = bytearray((moved / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (moved / name).write_bytes(bytes(data))
    expected = f"checkpoint file {moved / name} does not match its recorded SHA-256"
    with pytest.raises(ValueError, match="changed or truncated after it was written") as refused:
        load_checkpoint(moved, *tiny_training(0), {}, SimpleNamespace(rank=0), 0)
    assert str(refused.value).startswith(expected)
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        checkpoint_files.load_tensors(moved / name)

    (moved / name).write_bytes(bytes(data[:-100]))  # truncated
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        checkpoint_files.load_tensors(moved / name)


def test_load_trained_encoder_checks_the_manifest(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    hashes = {"state.pt": checkpoint_files.save_tensors({"model": {"w": torch.ones(3)}}, folder / "state.pt")}
    checkpoint_files.write_manifest(folder, hashes)
    (folder / "state.pt").write_bytes((folder / "state.pt").read_bytes() + b"\0")
    with pytest.raises(ValueError, match="state.pt does not match its recorded SHA-256"):
        load_trained_encoder(str(folder), MODEL)


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_failed_write_leaves_no_temporary_folder(tmp_path, monkeypatch, failing_call):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model, optimizer, scheduler = tiny_training()
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == failing_call:
            real_save(obj, f, *args, **kwargs)  # half written, then the disk fills up
            raise OSError(28, "No space left on device")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(model, optimizer, scheduler, dict(STATE), model.state_dict())
    assert len(calls) == failing_call
    private = tmp_path / f"clsr-{os.getuid()}"  # the user's private folder (rule 1) holds the staging
    assert [p for p in tmp_path.iterdir() if p != private] == []
    assert not any(private.glob("staging/*"))  # the write's staging folder went with it


def test_an_atomic_write_keeps_the_old_file_when_the_new_one_fails(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(b"old")

    def fail(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        checkpoint_files.write_atomic(path, fail)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["state.pt"]


def test_a_checkpoint_without_its_manifest_is_refused(tmp_path):
    """The trainer writes a manifest with every checkpoint: without it (deleted, or some other tool's
    manifest.json) nothing says the files are the ones written, so the trainer's restore, a later stage's
    load and ``load_tensors`` refuse the folder and say what to do."""
    model, optimizer, scheduler = tiny_training()
    folder = save_checkpoint(model, optimizer, scheduler, dict(STATE), model.state_dict())
    moved = tmp_path / "checkpoint"
    folder.rename(moved)
    for manifest in (None, '{"files": ["state.pt"]}'):
        (moved / MANIFEST).unlink(missing_ok=True)
        if manifest:
            (moved / MANIFEST).write_text(manifest)
        with pytest.raises(ValueError, match="no SHA-256 recorded") as refused:
            load_checkpoint(moved, *tiny_training(0), {}, SimpleNamespace(rank=0), 0)
        message = str(refused.value)
        assert "\n" not in message and str(moved / "state.pt") in message and "complete checkpoint" in message
        with pytest.raises(ValueError, match="no SHA-256 recorded"):
            load_trained_encoder(str(moved), MODEL, weights="best")
        with pytest.raises(ValueError, match="no SHA-256 recorded"):
            load_trained_encoder(str(moved / "state.pt"), MODEL)  # the trainer's file, named directly
        with pytest.raises(ValueError, match="no SHA-256 recorded"):
            checkpoint_files.load_tensors(moved / "best_model.pt")


def test_a_weights_file_of_your_own_loads_without_a_manifest(tmp_path):
    """A ``.pt`` file named directly (a model trained elsewhere) has no manifest: it still loads, as
    tensors and plain data only, unless it has one of the trainer's own names."""
    torch.save({"w": torch.arange(3)}, tmp_path / "mine.pt")
    loaded = checkpoint_files.load_tensors(tmp_path / "mine.pt", manifest_required=False)
    assert torch.equal(loaded["w"], torch.arange(3))


# --- upstream checkpoints named by MLflow tags stay under the study's storage ---


def test_under_root_for_local_folders(tmp_path):
    root = tmp_path / "storage" / "study-1"
    (root / "trial" / "checkpoint_000001").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert under_root(str(root / "trial" / "checkpoint_000001"), str(root))
    assert under_root(str(root), str(root))
    assert under_root(str(root / "trial" / ".." / "trial"), str(root) + "/")
    assert under_root((root / "trial").as_uri(), str(root))  # file:// is a local path
    assert not under_root(str(outside), str(root))
    assert not under_root(str(root) + "-other/x", str(root))  # a sibling sharing the name's prefix
    assert not under_root(str(root / ".." / "study-2" / "x"), str(root))
    assert not under_root(str(root / "trial" / ".." / ".." / ".." / "elsewhere"), str(root))
    assert not under_root("s3://bucket/x", str(root))

    (root / "link").symlink_to(outside, target_is_directory=True)
    assert not under_root(str(root / "link" / "x"), str(root))  # a symlink out of the storage
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    assert under_root(str(tmp_path / "alias" / "trial"), str(root))  # a symlink into it


ROOT = "s3://bucket/studies/study-1"
BUCKET = "s3://lab-bucket/runs"


@pytest.mark.parametrize(
    ("location", "root", "inside"),
    [
        ("s3://bucket/studies/study-1/trial/checkpoint_000001", ROOT, True),
        ("s3://bucket/studies/study-1", ROOT + "/", True),
        ("S3://bucket/studies/study-1/x", ROOT, True),
        ("gcs://b/p/x", "gs://b/p", True),  # pyarrow calls gs:// gcs://
        ("s3://bucket/studies/study-2/checkpoint", ROOT, False),  # same bucket, other prefix
        ("s3://bucket/studies/study-1-x/checkpoint", ROOT, False),
        ("s3://other/studies/study-1/checkpoint", ROOT, False),
        ("gs://bucket/studies/study-1/checkpoint", ROOT, False),
        ("s3://bucket/studies/study-1/../study-2/checkpoint", ROOT, False),
        ("s3://bucket/../bucket/studies/study-1/x", ROOT, False),  # .. above the bucket
        # object-store keys are literal: "a/../studies/study-1/x" lies under "a/", not under the root
        ("s3://bucket/a/../studies/study-1/x", ROOT, False),
        ("s3://bucket/a/%2E%2E/studies/study-1/x", ROOT, False),  # pyarrow decodes %2E%2E to ..
        ("s3://bucket/studies/study-1/./x", ROOT, False),
        ("s3://bucket/studies//study-1/x", ROOT, False),
        ("/studies/study-1/x", ROOT, False),
        # a tag that would make pyarrow talk to another host, or log in as someone else: refused
        (f"{BUCKET}/x/checkpoint_000003?endpoint_override=evil:9000&scheme=http", BUCKET, False),
        (f"{BUCKET}/x?region=eu", BUCKET, False),
        (f"{BUCKET}/x?", BUCKET, False),
        (f"{BUCKET}/x#fragment", BUCKET, False),
        ("s3://AKIA:secret@lab-bucket/runs/x", BUCKET, False),
        ("s3://@lab-bucket/runs/x", BUCKET, False),
        ("s3://lab-bucket:9000/runs/x", BUCKET, False),
        ("s3://evil:9000\\@lab-bucket/runs/x", BUCKET, False),
        (f"{BUCKET}/x\n?endpoint_override=evil:9000", BUCKET, False),
        # the root comes from the trusted study file: its own options (a MinIO endpoint) are allowed
        (f"{BUCKET}/x", f"{BUCKET}?endpoint_override=minio:9000&scheme=http", True),
        (f"{BUCKET}/x?endpoint_override=minio:9000", f"{BUCKET}?endpoint_override=minio:9000", False),
    ],
)
def test_under_root_for_uris(location, root, inside):
    assert under_root(location, root) is inside


@pytest.mark.parametrize(
    ("location", "inside"),
    [
        ("file://{root}/trial", True),
        ("file://localhost{root}/trial", True),
        ("file://{root}/trial?endpoint_override=evil:9000", False),
        ("file://{root}/trial#x", False),
        ("file://evil{root}/trial", False),
        ("file://user:pw@localhost{root}/trial", False),
    ],
)
def test_under_root_for_file_uris(tmp_path, location, inside):
    root = tmp_path / "storage"
    (root / "trial").mkdir(parents=True)
    assert under_root(location.format(root=root), str(root)) is inside


def test_finished_outputs_drops_checkpoints_outside_the_study_storage(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    storage = tmp_path / "storage"
    (storage / "trial").mkdir(parents=True)
    parent = start_parent_run(client, "staged", str(storage), None)
    locations = {0.01: str(storage / "trial" / "checkpoint"), 0.02: "/tmp/attacker/checkpoint"}
    runs = {}
    for phi, location in locations.items():
        tags = {"clsr.ablation": "entropy", "clsr.point": f"method.phi={phi}", "clsr.seed": 1}
        runs[phi] = open_child_run(uri, parent, f"t{phi}", "x", tags, {})
        client.set_tag(runs[phi], CHECKPOINT_TAG, location)
        close_run(uri, runs[phi], "finished")

    assert len(finished_outputs(client, parent)) == 2  # no root: every tag (the runner's old behaviour)
    with pytest.warns(UserWarning) as caught:
        kept = finished_outputs(client, parent, storage_root=str(storage))
    assert kept == {("entropy", "method.phi=0.01", 1): locations[0.01]}
    (warning,) = caught
    assert runs[0.02] in str(warning.message) and "/tmp/attacker/checkpoint" in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a root holding every checkpoint: no warning
        assert len(finished_outputs(client, parent, storage_root="/")) == 2


# --- a trial's run is found again by its tags, whatever its id holds ---


@pytest.mark.parametrize(
    "trial_id",
    [
        "corpus[data.train=/data/o'brien/pairs.csv] seed=1",  # a quote from a resolved value
        'corpus[label "two"] seed=1',
        "corpus[C:\\data\\] seed=1",
        "corpus[data.train=s3://key:pw@bucket/x] seed=1",  # stored masked: looked up masked too
    ],
)
def test_a_trials_run_is_found_again_whatever_its_id_holds(tmp_path, trial_id):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "quotes", str(tmp_path / "runs"), None)
    run = open_child_run(uri, parent, trial_id, "x", {}, {})
    found = trial_run(client, parent, trial_id)
    assert found is not None and found.info.run_id == run
    assert open_child_run(uri, parent, trial_id, "x", {}, {}) == run  # a retry reopens it
    assert [r.info.run_id for r in children(client, parent)] == [run]
    with pytest.raises(ValueError, match="holds both"):
        trial_run(client, parent, 'corpus[it\'s "both"] seed=1')


def test_children_pages_through_every_run(tmp_path, monkeypatch):
    """A study may have 100,000 trials, more than one answer of MLflow's search holds."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "paged", str(tmp_path / "runs"), None)
    runs = {open_child_run(uri, parent, f"t{i}", "x", {}, {}) for i in range(5)}
    monkeypatch.setattr(study_runs, "SEARCH_PAGE_SIZE", 2)
    pages = []
    search = client.search_runs
    monkeypatch.setattr(client, "search_runs", lambda *a, **kw: pages.append(kw) or search(*a, **kw))
    assert {r.info.run_id for r in children(client, parent)} == runs
    assert [page["max_results"] for page in pages] == [2, 2, 2]


# --- credentials never reach logs or errors ---


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("http://user:secret@host:5000", "http://user:***@host:5000"),
        ("https://user:tok:en@host/path?x=1", "https://user:***@host/path?x=1"),
        ("postgresql://user:pw@host/db", "postgresql://user:***@host/db"),
        ("postgresql+psycopg2://u:p@ss@db:5432/mlflow", "postgresql+psycopg2://u:***@db:5432/mlflow"),
        ("mysql://root:@host/db", "mysql://root:@host/db"),  # an empty password: nothing to hide
        (
            "tracking_uri: http://alice:hunter2@mlflow:5000\nseeds: [1]",
            "tracking_uri: http://alice:***@mlflow:5000\nseeds: [1]",
        ),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&X-Amz-Date=2024&X-Amz-Signature=ab12",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Date=2024&X-Amz-Signature=***",
        ),
        ("http://h:5000/api?token=abc&run=1", "http://h:5000/api?token=***&run=1"),
        (
            "s3://b/p?access_key=AK&secret_key=SK&region=eu",
            "s3://b/p?access_key=***&secret_key=***&region=eu",
        ),
        ("https://h/x?password=a#frag", "https://h/x?password=***#frag"),
        (
            "'uri': 'http://u:t@h:1', 'other': 'http://v:s@g'",
            "'uri': 'http://u:***@h:1', 'other': 'http://v:***@g'",
        ),
        # a password holding '/', '#', '?' or spaces runs to the last '@' of its URI
        (
            "s3://AKIAIOSFODNN7EXAMPLE:wJalr/XUtnF+EMI/K7MDENG@bucket/x",
            "s3://AKIAIOSFODNN7EXAMPLE:***@bucket/x",
        ),
        ("postgresql://u:pa/ss#w?rd@host/db", "postgresql://u:***@host/db"),
        ("postgresql://u:p@ss/w#rd@host/db?sslmode=require", "postgresql://u:***@host/db?sslmode=require"),
        ("error: postgresql://u:pa ss word@host/db refused", "error: postgresql://u:***@host/db refused"),
        ("http://:tok/en@host", "http://:***@host"),
        ("http://host:5000/a@b", "http://host:***@b"),  # erring towards masking: port and path go
        # libpq's keyword form, and password= anywhere in a text
        ("host=db user=u password=secret dbname=x", "host=db user=u password=*** dbname=x"),
        ("host=db password='quoted secret' dbname=x", "host=db password=*** dbname=x"),
        ('host=db password="double quoted" dbname=x', "host=db password=*** dbname=x"),
        ('aws_secret_access_key = "wJalr/K7 MDENG"', "aws_secret_access_key = ***"),
        ("host=db password = 'it\\'s secret' dbname=x", "host=db password = *** dbname=x"),
        ("password='never closed", "password=***"),
        ('{"dsn": "password=hunter2"}', '{"dsn": "password=***"}'),
        (
            "OperationalError: FATAL: auth failed (password=hunter2 sslmode=require)",
            "OperationalError: FATAL: auth failed (password=*** sslmode=require)",
        ),
        ("PGPASSWORD=hunter2 psql -h db", "PGPASSWORD=*** psql -h db"),
        ("aws_secret_access_key=wJalr/XUtnF+EMI", "aws_secret_access_key=***"),
        ("https://h/x?password=a&b=2", "https://h/x?password=***&b=2"),
        # not secrets: kept as they are
        ("s3://bucket/a@b", "s3://bucket/a@b"),
        ("s3://bucket/a:b@c", "s3://bucket/a:b@c"),
        ("http://mlflow:5000 owned by bob@lab.org", "http://mlflow:5000 owned by bob@lab.org"),
        ("http://[::1]:5000 owned by bob@lab.org", "http://[::1]:5000 owned by bob@lab.org"),
        ("git+ssh://git@github.com:org/repo", "git+ssh://git@github.com:org/repo"),
        ("max_tokens=128 keyring=off", "max_tokens=128 keyring=off"),
        ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
        ("http://mlflow:5000", "http://mlflow:5000"),
        ("s3://bucket/study/checkpoint_000001", "s3://bucket/study/checkpoint_000001"),
        ("ratio 3:2 at noon", "ratio 3:2 at noon"),
        ("", ""),
    ],
)
def test_mask_uri(text, masked):
    assert mask_uri(text) == masked


def test_an_unreachable_tracking_server_is_named_without_its_password():
    with pytest.raises(ConnectionError) as refused:
        check_reachable("http://user:s3cr3t@127.0.0.1:9/")
    assert "s3cr3t" not in str(refused.value) and "http://user:***@127.0.0.1:9/" in str(refused.value)
    assert refused.value.__cause__ is None


def test_study_runs_store_no_credentials(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "s", "s3://key:SECRET@bucket/runs", None)
    params = {"tracking_uri": "http://u:SECRET@h:5000", "trainer": {"lr": 0.1}}
    run = open_child_run(uri, parent, "t", "x", {"note": "postgresql://u:SECRET@db/x"}, params)
    close_run(uri, run, "failed", "ConnectionError: http://u:SECRET@h:5000 refused")
    stored = [client.get_run(parent).data, client.get_run(run).data]
    assert not any(
        "SECRET" in str(v) for data in stored for v in [*data.tags.values(), *data.params.values()]
    )
    assert client.get_run(run).data.params["trainer.lr"] == "0.1"
