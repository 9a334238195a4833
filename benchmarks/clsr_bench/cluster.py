"""A study on one Ray node and on the loopback cluster (same machine, same cores): trials per hour on
each, so the ratio is the platform's overhead on a cluster (Ray nodes, an MLflow server over HTTP and
PostgreSQL, checkpoints in S3); then, with ``--kill-node``, the time from SIGKILLing a worker node mid-trial
to that trial training again on another node from its checkpoint.

Each run is the real ``platform study run`` command, timed from its start to its exit; the single node is
a local Ray with the machine's CPUs (the worker nodes offer one each: give ``--workers`` the core count),
a SQLite MLflow store and a local
storage folder, which is what a user runs without a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clsr_bench import format_table

SNAPSHOT = "/checkpoint_manager_snapshot.json"  # Ray Train writes it once a checkpoint is registered


def _study_cmd(
    study: str, name: str, overrides: list[str], env: dict[str, str], cwd: Path
) -> subprocess.Popen:
    """``platform study run`` with its output in ``cwd/<name>.log`` (a pipe read only at the end could fill
    while the benchmark polls, and block the study)."""
    args = [sys.executable, "-m", "clsr.cli", "study", "run", study, "--new", "--set", f"name={name}"]
    for override in overrides:
        args += ["--set", override]
    with open(cwd / f"{name}.log", "w") as log:
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, started: float, log: Path, what: str) -> float:
    """Wait for a study command; its wall time, or its log's end when it failed."""
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}); {log} ends:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - started


def _trials(uri: str, name: str) -> int:
    from mlflow.tracking import MlflowClient

    from clsr.study.record.reader import study_parent
    from clsr.tracking.study_runs import children

    client = MlflowClient(uri)
    return len(children(client, study_parent(client, name).info.run_id))


def one_node(study: str, overrides: list[str], tmp: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "AWS_"))}
    uri = f"sqlite:///{tmp / 'one-node.db'}"
    env["MLFLOW_TRACKING_URI"] = uri
    started = time.perf_counter()
    proc = _study_cmd(study, "bench_one_node", [*overrides, f"storage_path={tmp / 'runs'}"], env, tmp)
    wall = _finish(proc, started, tmp / "bench_one_node.log", "the study on one node")
    return {"setup": f"1 node ({os.cpu_count()} CPUs), SQLite, local storage", "wall_s": wall,
            "trials": _trials(uri, "bench_one_node")}  # fmt: skip


def on_cluster(cluster, study: str, overrides: list[str], tmp: Path, name: str, kill: bool) -> dict[str, Any]:
    """The study on the loopback cluster; with ``kill``, SIGKILL the node of the first trial once every
    trial has a registered checkpoint, and measure how long until it trains again elsewhere."""
    from mlflow.tracking import MlflowClient

    env = {**os.environ, **cluster.env()}
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):  # this process's client logs in too
        os.environ[key] = env[key]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    started = time.perf_counter()
    proc = _study_cmd(study, name, [*overrides, f"storage_path=s3://clsr/{name}"], env, tmp)
    killed = None
    if kill:
        killed = _kill_when_checkpointed(cluster, client, name, proc)
    wall = _finish(proc, started, tmp / f"{name}.log", "the study on the loopback cluster")
    figures = {"setup": f"{len(cluster.state['nodes'])} worker nodes + head, MLflow/PostgreSQL, S3",
               "wall_s": wall, "trials": _trials(env["MLFLOW_TRACKING_URI"], name)}  # fmt: skip
    if killed is not None:
        run_id, killed_at, index = killed
        resumed = client.get_metric_history(run_id, "resumed_from_step")
        figures["recovery_s"] = resumed[0].timestamp / 1000 - killed_at if resumed else None
        figures["resumed_from_step"] = resumed[0].value if resumed else None
        cluster.start_node(index)
    return figures


def _kill_when_checkpointed(cluster, client, name: str, proc: subprocess.Popen) -> tuple[str, float, int]:
    while proc.poll() is None:
        experiment = client.get_experiment_by_name(name)
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        runs = [r for r in runs if r.data.tags.get("clsr.role") != "lease"]  # the parent's bookkeeping
        running = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.info.status == "RUNNING"]
        snapshots = [k for k in cluster.bucket_keys(f"{name}/") if k.endswith(SNAPSHOT)]
        nodes = [r.data.tags.get("clsr.node_id") for r in running]
        if (
            running and all(nodes) and len(snapshots) == len(running) == len(runs) - 1
        ):  # every trial, one parent
            index = cluster.worker_index(nodes[0])
            killed_at = time.time()
            cluster.kill_node(index)
            print(f"killed worker node {index} under trial {running[0].info.run_name}", flush=True)
            return running[0].info.run_id, killed_at, index
        time.sleep(0.5)
    raise RuntimeError("the study ended before every running trial had a checkpoint; nothing was killed")


def run_cluster_bench(study: str, overrides: list[str], workers: int, kill: bool) -> dict[str, Any]:
    from clsr_bench.loopback import LoopbackCluster

    study = str(Path(study).resolve())  # the study commands run in a temporary folder
    with tempfile.TemporaryDirectory(prefix="clsr-bench-cluster-") as folder:
        tmp = Path(folder)
        print(f"one node: platform study run {study} ...", flush=True)
        single = one_node(study, overrides, tmp)
        cluster = LoopbackCluster(tmp / "cluster")
        up_started = time.perf_counter()
        cluster.up(workers=workers)
        up_s = time.perf_counter() - up_started
        try:
            print(f"loopback cluster: platform study run {study} ...", flush=True)
            multi = on_cluster(cluster, study, overrides, tmp, "bench_cluster", kill=False)
            lost = on_cluster(cluster, study, overrides, tmp, "bench_node_lost", kill=True) if kill else None
        finally:
            cluster.down(log=lambda _: None)
    rows = [r for r in (single, multi, lost) if r is not None]
    for row in rows:
        row["trials_per_hour"] = row["trials"] / row["wall_s"] * 3600
    return {"benchmark": "cluster", "study": study, "workers": workers, "cluster_up_s": up_s,
            "runs": rows, "ratio": multi["trials_per_hour"] / single["trials_per_hour"]}  # fmt: skip


def format_cluster(f: dict[str, Any]) -> str:
    labels = ["one node", "loopback cluster", "cluster, a node killed"]
    table = format_table(
        ["run", "setup", "trials", "wall s", "trials/hour", "recovery s"],
        [[label, r["setup"], r["trials"], r["wall_s"], r["trials_per_hour"], r.get("recovery_s")]
         for label, r in zip(labels, f["runs"], strict=False)],
    )  # fmt: skip
    return "\n".join([
        f"study {f['study']}: one Ray node vs the loopback cluster ({f['workers']} worker nodes), same machine",
        "", table, "",
        f"cluster / one node: {f['ratio']:.2f}x trials per hour (cluster start-up, {f['cluster_up_s']:.0f} s, "
        f"not counted); recovery s: from SIGKILL of the trial's node to its first step on another node",
    ])  # fmt: skip
