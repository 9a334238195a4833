"""``cluster.local.yaml``: `ray up` on servers you already have (Ray's ``local`` provider, over SSH).

Offline (fast, no marker): Ray's own validation of the file (``prepare_config`` + ``validate_config``,
private Ray API as in tests/unit/cluster/test_cluster_config.py), our checks of what Ray does not look at (keys
inside ``provider``, addresses, token authentication, the single MLflow server), and the install
commands run against stubs (``python3``, ``pip``, ``nvidia-smi``) to check which torch index each
driver gets and that the project is installed after torch.

End to end (``e2e`` and ``cluster``): a throw-away Debian sshd on 127.0.0.1 plays a one-server lab;
`ray up` a test copy of the file against it (twice: the second run must replace the first MLflow
server), run the smoke study on the head with `ray exec`, check that its driver joined the cluster, read
the study back from the head's MLflow server over HTTP (401 without the platform's login, which the
head derived from the Ray token), and `ray down`, after which neither Ray nor the
MLflow server may be left (about 3.5 minutes on 2 cores, the study 2 of them). The sshd sets HOME to a temporary folder for every session (``SetEnv``), so
everything the file puts in ``~`` on a server (the synced repository, ~/.bashrc, the venv link, the
token, the MLflow store) lands in the test's tmp dir; the `ray` commands run with HOME set to another
temporary folder, "your machine", whose ~/.ray/auth_token `ray get-auth-token --generate` makes.

`ray up`, `ray exec` and `ray down` start and stop Ray processes; `ray stop` (run by the file's start
commands and by `ray down`) stops every Ray process of the machine. Run this test under the machine's
Ray lock: ``flock /tmp/ray-machine.lock python -m pytest tests/cluster/test_ray_up_local.py``.
"""

from __future__ import annotations

import contextlib
import copy
import getpass
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from ray.autoscaler._private.util import prepare_config, validate_config

from clsr.cluster.ports import free_port, free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_LOCAL_YAML = REPO_ROOT / "cluster.local.yaml"
SSHD = Path("/usr/sbin/sshd")
TOKEN_FILE = "~/.ray/clsr_auth_token"  # where the file puts the cluster's token on every server
TOKEN_ENV = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/clsr_auth_token"
TORCH_INDEX = "https://download.pytorch.org/whl/"

# Provider keys the local node provider and the autoscaler read (ray/autoscaler/_private/local/*.py,
# ray/autoscaler/_private/constants.py); Ray's schema allows any key here.
LOCAL_PROVIDER_KEYS = frozenset(
    {
        "type",
        "head_ip",
        "worker_ips",
        "external_head_ip",
        "coordinator_address",
        "use_internal_ips",
        "disable_node_updaters",
        "foreground_node_launch",
        "worker_liveness_check",
    }
)
UNSPECIFIED_HOSTS = {"0.0.0.0", "::", "[::]", "*", ""}
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


def load_cluster_config(path: Path = CLUSTER_LOCAL_YAML) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def cfg() -> dict[str, Any]:
    return load_cluster_config()


def _all_commands(cfg: dict[str, Any]) -> list[str]:
    return [cmd for key in COMMAND_LISTS for cmd in cfg.get(key) or []]


def _one(commands: list[str], needle: str) -> str:
    found = [cmd for cmd in commands if needle in cmd]
    assert len(found) == 1, f"expected one command with {needle!r}, found {found}"
    return found[0]


def _program_words(cmd: str, program: str) -> list[str]:
    try:
        return shlex.split(cmd[cmd.index(program) :])
    except ValueError:  # the program runs inside a quoted script (bash -c '...'): split that script
        return _program_words(next(w for w in shlex.split(cmd) if program in w), program)


def _option(cmd: str, program: str, name: str) -> str | None:
    """The value of ``name`` in the ``program`` part of a shell command (``--x v`` or ``--x=v``)."""
    words = _program_words(cmd, program)
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


# ---- Ray's own validation, and what it does not check -----------------------------------------


def test_ray_accepts_cluster_local_yaml(cfg):
    prepared = prepare_config(copy.deepcopy(cfg))
    validate_config(prepared)
    # The local provider turns the file into one node type, every listed worker started by `ray up`.
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert node_type["min_workers"] == node_type["max_workers"] == len(cfg["provider"]["worker_ips"])
    # prepare_config merged the setup commands the way `ray up` does.
    assert prepared["head_setup_commands"][: len(cfg["setup_commands"])] == cfg["setup_commands"]
    assert prepared["worker_setup_commands"][: len(cfg["setup_commands"])] == cfg["setup_commands"]


def test_ray_rejects_a_typo_in_auth_but_not_in_provider(cfg):
    """Why the provider check below exists: Ray's schema checks `auth` but lets any provider key through."""
    bad = copy.deepcopy(cfg)
    bad["auth"]["ssh_proxy_comand"] = "nc %h 22"
    with pytest.raises(jsonschema.ValidationError, match="ssh_proxy_comand"):
        validate_config(prepare_config(bad))
    bad = copy.deepcopy(cfg)
    bad["provider"]["worker_ip"] = bad["provider"].pop("worker_ips")
    bad["provider"]["worker_ips"] = []
    validate_config(prepare_config(bad))


def test_provider_is_local_with_known_keys_only(cfg):
    provider = cfg["provider"]
    assert provider["type"] == "local"
    assert set(provider) <= LOCAL_PROVIDER_KEYS, sorted(set(provider) - LOCAL_PROVIDER_KEYS)
    assert isinstance(provider["head_ip"], str) and provider["head_ip"]
    assert isinstance(provider["worker_ips"], list)
    assert provider["head_ip"] not in provider["worker_ips"]
    # The local provider refuses node types of its own (ray/autoscaler/_private/local/config.py).
    assert "available_node_types" not in cfg and "head_node_type" not in cfg
    assert cfg["auth"]["ssh_user"] and cfg["auth"]["ssh_private_key"]


# ---- addresses ----------------------------------------------------------------------------------


def test_no_command_binds_all_interfaces(cfg):
    for cmd in _all_commands(cfg):
        for host in ("0.0.0.0", "::", "[::]"):
            assert not re.search(rf"(^|[\s=\"']){re.escape(host)}([\s:\"']|$)", cmd), cmd
        for name in ("--host", "--dashboard-host", "--node-ip-address"):
            for program in ("mlflow server", "ray start"):
                if program in cmd and (value := _option(cmd, program, name)) is not None:
                    assert value not in UNSPECIFIED_HOSTS, cmd


def test_dashboard_listens_on_loopback(cfg):
    start = _one(cfg["head_start_ray_commands"], "ray start --head")
    assert _option(start, "ray start", "--dashboard-host") == "127.0.0.1"
    assert _option(start, "ray start", "--node-ip-address") == "$CLSR_HEAD_IP"
    assert _option(start, "ray start", "--autoscaling-config") == "~/ray_bootstrap_config.yaml"
    # The launcher exports your machine's usage-stats setting into the head's start commands.
    assert start.index("RAY_USAGE_STATS_ENABLED=0") < start.index("ray start")


def test_head_runs_autoscaler_v1(cfg):
    """With the local provider, Ray 2.60's v2 autoscaler (the launcher's default) marks the head
    terminated in the cluster state file when a second `ray up` stops its raylet, and nothing marks it
    running again: `ray exec`/`ray down` run where the head's state file lives then find no head (seen
    here, where the test's head is this machine). v1 re-records the head when it starts."""
    start = _one(cfg["head_start_ray_commands"], "ray start --head")
    assert start.index("RAY_enable_autoscaler_v2=0") < start.index("ray start")


def test_head_ip_comes_from_the_config_on_the_head(cfg):
    """Head commands get no RAY_HEAD_IP from the launcher: the head reads head_ip from the config
    `ray up` copied to it; workers get RAY_HEAD_IP."""
    head = _one(cfg["head_setup_commands"], "export CLSR_HEAD_IP=")
    assert "ray_bootstrap_config.yaml" in head and '["provider"]["head_ip"]' in head
    workers = _one(cfg["worker_setup_commands"], "export CLSR_HEAD_IP=")
    assert "${RAY_HEAD_IP}" in workers
    worker_start = _one(cfg["worker_start_ray_commands"], "ray start")
    assert _option(worker_start, "ray start", "--address") == "$RAY_HEAD_IP:$CLSR_RAY_PORT"


# ---- Ray token authentication ---------------------------------------------------------------------


def test_token_auth_on_in_head_and_worker_start_commands(cfg):
    for key, needle in (
        ("head_start_ray_commands", "ray start --head"),
        ("worker_start_ray_commands", "ray start"),
    ):
        start = _one(cfg[key], needle)
        assert start.index(TOKEN_ENV) < start.index("ray start"), start
    # ...and in every shell on every node (drivers, `ray attach`, `ray status`).
    assert f"echo 'export {TOKEN_ENV} #clsr' >> ~/.bashrc" in cfg["setup_commands"]


def test_the_same_token_reaches_every_node(cfg):
    # `ray get-auth-token --generate` writes ~/.ray/auth_token on your machine; the head gets it from
    # there, and the workers get the head's file mounts (the launcher rewrites them for the head).
    assert cfg["file_mounts"][TOKEN_FILE] == "~/.ray/auth_token"
    assert cfg["file_mounts"]["~/clsr"] == "."
    assert ".gitignore" in cfg["rsync_filter"], "keeps .venv and local runs out of the sync"
    chmod = _one(cfg["setup_commands"], "chmod")
    assert f"chmod 600 {TOKEN_FILE}" in chmod


# ---- install ------------------------------------------------------------------------------------


def test_setup_creates_a_venv_installs_torch_then_the_project(cfg):
    setup = cfg["setup_commands"]
    venv = next(i for i, cmd in enumerate(setup) if re.search(r"-m venv (--clear )?~/clsr-venv", cmd))
    activate = setup.index("echo '. ~/clsr-venv/bin/activate #clsr' >> ~/.bashrc")
    torch = next(i for i, cmd in enumerate(setup) if re.search(r"pip install \"torch==[\d.]+\"", cmd))
    project = setup.index("pip install -e ~/clsr")
    assert venv < activate < torch < project
    pinned = re.search(r"torch==([\d.]+)", setup[torch])[1]
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    torch_req = next(Requirement(r) for r in pyproject["project"]["dependencies"] if r.startswith("torch"))
    assert torch_req.specifier.contains(pinned), "pip install -e would replace the pinned torch"
    assert '--index-url "$index"' in setup[torch]


def _tool_dir(tmp_path: Path) -> Path:
    """A PATH of the few real tools the setup commands use, so a GPU machine's own nvidia-smi, pip or
    python3 cannot leak into the stub run."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bash", "sh", "sed", "awk", "head", "touch", "chmod", "mkdir", "cat", "cp", "grep", "env"):
        if found := shutil.which(name):
            (tools / name).symlink_to(found)
    return tools


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _stubbed_server(tmp_path: Path, driver_cuda: str | None) -> tuple[Path, str]:
    """A server's home (with the synced token) and a PATH of stubs: ``python3 -m venv DIR`` copies a
    fake venv whose ``pip`` logs its arguments to $PIP_LOG and whose ``python`` has torch once pip
    installed it; ``nvidia-smi`` prints the header of a driver supporting ``driver_cuda``."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "clsr_auth_token").write_text("token")
    template = tmp_path / "venv-template"
    (template / "bin").mkdir(parents=True)
    (template / "bin" / "activate").write_text(
        'export VIRTUAL_ENV="$HOME/clsr-venv" PATH="$HOME/clsr-venv/bin:$PATH"\n'
    )
    _stub(template / "bin" / "python", 'case "$*" in *"import torch"*) grep -qs torch== "$PIP_LOG";; esac\n')
    _stub(template / "bin" / "pip", 'echo "$*" >> "$PIP_LOG"\n')
    stubs = tmp_path / "stubs"
    _stub(stubs / "python3", f'[ "$1 $2" = "-m venv" ] && cp -r {template} "${{@: -1}}"\n')
    if driver_cuda:
        _stub(stubs / "nvidia-smi", f"echo '{NVIDIA_SMI_HEADER.format(cuda=driver_cuda)}'\n")
    return home, f"{stubs}:{_tool_dir(tmp_path)}"


def _run_setup(
    cfg: dict[str, Any], home: Path, path: str, extra_env: dict[str, str]
) -> subprocess.CompletedProcess:
    """Run the setup commands one by one as the launcher does: a fresh bash that sources ~/.bashrc."""
    env = {"HOME": str(home), "PATH": path, "PIP_LOG": str(home / "pip.log"), **extra_env}
    script = "".join(
        f"bash -c {shlex.quote(f'source ~/.bashrc 2>/dev/null; ({cmd})')} || exit $?\n"
        for cmd in cfg["setup_commands"]
    )
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


NVIDIA_SMI_HEADER = (
    "| NVIDIA-SMI 570.86.10              Driver Version: 570.86.10      CUDA Version: {cuda}     |"
)


@pytest.mark.parametrize(
    ("driver_cuda", "override", "index"),
    [
        ("12.8", None, "cu128"),
        ("12.9", None, "cu128"),
        ("12.6", None, "cu126"),
        ("13.0", None, "cu130"),
        ("13.2", None, "cu130"),
        (None, None, "cpu"),
        ("12.8", "https://download.pytorch.org/whl/rocm6.4", "rocm6.4"),
    ],
    ids=["cuda12.8", "cuda12.9", "cuda12.6", "cuda13.0", "cuda13.2", "no-driver", "override"],
)
def test_install_commands_pick_the_torch_index_of_the_driver(cfg, tmp_path, driver_cuda, override, index):
    """The real setup commands against stubs: torch comes from the index of the driver's CUDA, then
    the project; a second run (a later `ray up`) keeps one copy of our ~/.bashrc lines and does not
    reinstall torch."""
    home, path = _stubbed_server(tmp_path, driver_cuda)
    extra = {"CLSR_TORCH_INDEX": override} if override else {}

    first = _run_setup(cfg, home, path, extra)
    assert first.returncode == 0, first.stdout + first.stderr
    pip = (home / "pip.log").read_text().splitlines()
    assert pip == [
        f"install torch==2.13.0 --index-url {override or TORCH_INDEX + index}",
        f"install -e {home}/clsr",
    ]

    second = _run_setup(cfg, home, path, extra)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (home / "pip.log").read_text().splitlines() == [*pip, f"install -e {home}/clsr"]
    bashrc = (home / ".bashrc").read_text().splitlines()
    assert len(bashrc) == len(set(bashrc)) == sum(line.endswith("#clsr") for line in bashrc)
    shell = subprocess.run(
        [
            "bash",
            "-c",
            'source ~/.bashrc; echo "$RAY_AUTH_MODE $RAY_AUTH_TOKEN_PATH $VIRTUAL_ENV $CLSR_RAY_PORT"',
        ],
        env={"HOME": str(home), "PATH": path},
        capture_output=True,
        text=True,
    )
    assert shell.stdout.split() == ["token", f"{home}/.ray/clsr_auth_token", f"{home}/clsr-venv", "6379"]
    assert stat.S_IMODE((home / ".ray" / "clsr_auth_token").stat().st_mode) == 0o600


def test_install_commands_refuse_a_driver_too_old(cfg, tmp_path):
    home, path = _stubbed_server(tmp_path, "12.2")
    result = _run_setup(cfg, home, path, {})
    assert result.returncode != 0
    assert "CLSR_TORCH_INDEX" in result.stderr and "1202" in result.stderr
    assert "torch" not in (home / "pip.log").read_text() if (home / "pip.log").exists() else True


# ---- MLflow and the environment on the nodes -----------------------------------------------------


def test_one_mlflow_server_on_the_heads_lan_address(cfg):
    commands = [cmd for cmd in _all_commands(cfg) if "mlflow server" in cmd]
    assert len(commands) == 1, "one MLflow server for the cluster"
    server = commands[0]
    assert server in cfg["head_start_ray_commands"]
    assert _option(server, "mlflow server", "--host") == "$CLSR_HEAD_IP"
    assert _option(server, "mlflow server", "--port") == "$CLSR_MLFLOW_PORT"
    backend = _option(server, "mlflow server", "--backend-store-uri")
    assert backend == "${CLSR_MLFLOW_BACKEND_URI:-sqlite:///$HOME/clsr-mlflow/mlflow.db}"
    artifacts = _option(server, "mlflow server", "--artifacts-destination")
    assert artifacts == "${CLSR_MLFLOW_ARTIFACTS:-$HOME/clsr-mlflow/artifacts}"
    # detached in its own process group, recorded, and stopped by the next `ray up` before a new start
    assert "setsid --fork" in server and "echo $$ > ~/clsr-mlflow/server.pgid" in server
    starts = cfg["head_start_ray_commands"]
    stop = _one(starts, 'kill -TERM -- "-$g"')
    assert "~/clsr-mlflow/server.pgid" in stop and starts.index(stop) < starts.index(server)
    health = _one(starts, "/health")
    assert starts.index(server) < starts.index(health)
    assert "$CLSR_HEAD_IP:$CLSR_MLFLOW_PORT/health" in health


def test_every_node_exports_the_tracking_uri_and_the_head_the_ray_address(cfg):
    head = _one(cfg["head_setup_commands"], "MLFLOW_TRACKING_URI")
    assert "MLFLOW_TRACKING_URI=http://$CLSR_HEAD_IP:$CLSR_MLFLOW_PORT" in head
    assert "RAY_ADDRESS=$CLSR_HEAD_IP:$CLSR_RAY_PORT" in head
    workers = _one(cfg["worker_setup_commands"], "MLFLOW_TRACKING_URI")
    assert "MLFLOW_TRACKING_URI=http://$CLSR_HEAD_IP:$CLSR_MLFLOW_PORT" in workers
    assert "RAY_USAGE_STATS_ENABLED=0" in " ".join(cfg["setup_commands"])
    assert "MLFLOW_DISABLE_TELEMETRY=true" in " ".join(cfg["setup_commands"])


# ---- end to end: ray up / exec / down against a throw-away sshd -----------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_until(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) member in the process group: a zombie still answers ``killpg(pgid, 0)``."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


# A ProxyCommand for machines without nc: relays stdin/stdout to host:port.
PROXY_PY = """\
import os, socket, sys, threading
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := os.read(0, 65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := conn.recv(65536):
    os.write(1, data)
"""


class ThrowAwaySshd:
    """Debian's sshd on 127.0.0.1:<free port>, accepting one generated key, with HOME set to a
    temporary folder for every session. Needs root (sshd changes to the user of each session)."""

    def __init__(self, folder: Path, server_home: Path):
        self.folder = folder
        self.home = server_home
        self.port = free_port()
        self.key = folder / "id_ed25519"
        self.pid_file = folder / "sshd.pid"
        self.log = folder / "sshd.log"

    def start(self) -> None:
        for key in (self.folder / "host_ed25519", self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copy(self.key.with_suffix(".pub"), self.folder / "authorized_keys")
        config = self.folder / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.folder / 'host_ed25519'}\n"
            f"AuthorizedKeysFile {self.folder / 'authorized_keys'}\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "StrictModes no\n"
            "UsePAM no\n"
            f"PidFile {self.pid_file}\n"
            # every session's HOME (sshd sets it after the user's passwd entry, then applies SetEnv)
            f"SetEnv HOME={self.home}\n"
        )
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        check = subprocess.run([str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            pytest.skip(f"sshd refuses the test's config: {check.stderr.strip()}")
        started = subprocess.run(
            [str(SSHD), "-f", str(config), "-E", str(self.log)], capture_output=True, text=True
        )
        if started.returncode != 0 or not _wait_until(lambda: _listening(self.port), 10):
            log = self.log.read_text() if self.log.exists() else ""
            pytest.skip(
                f"sshd could not start on 127.0.0.1:{self.port}: {started.stderr.strip()} {log[-500:]}"
            )

    def proxy_command(self) -> str:
        if shutil.which("nc"):
            return f"nc 127.0.0.1 {self.port}"
        script = self.folder / "proxy.py"
        script.write_text(PROXY_PY)
        return f"{sys.executable} {script} 127.0.0.1 {self.port}"

    def stop(self) -> None:
        if self.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGTERM)


@pytest.fixture
def sshd(tmp_path):
    if not SSHD.exists():
        pytest.skip(
            f"{SSHD} not found: apt-get install --no-install-recommends openssh-server openssh-client"
        )
    for tool in ("ssh", "ssh-keygen", "rsync"):
        if not shutil.which(tool):
            pytest.skip(
                f"`ray up` needs {tool}: apt-get install --no-install-recommends openssh-client rsync"
            )
    if os.geteuid() != 0:
        pytest.skip("the throw-away sshd must run as root (it switches to the session's user)")
    folder = tmp_path / "sshd"
    folder.mkdir()
    server_home = tmp_path / "server-home"
    server_home.mkdir()
    server = ThrowAwaySshd(folder, server_home)
    server.start()
    yield server
    server.stop()


def _test_copy(
    cfg: dict[str, Any], sshd: ThrowAwaySshd, ports: dict[str, int], data_dir: Path
) -> dict[str, Any]:
    """cluster.local.yaml, changed only where a test must."""
    test = copy.deepcopy(cfg)
    # its own state file (/tmp/ray/cluster-<name>.state) and SSH control path
    test["cluster_name"] = f"clsr-test-{os.getpid()}"
    test["provider"] = {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}  # one server
    test["auth"] = {
        "ssh_user": getpass.getuser(),
        "ssh_private_key": str(sshd.key),
        "ssh_proxy_command": sshd.proxy_command(),  # Ray's SSH options have no port
    }
    setup = []
    for cmd in test["setup_commands"]:
        if "-m venv" in cmd:
            # The venv this test runs in instead of a fresh one: creating it and pip installing torch and
            # the project takes minutes. The install commands run against stubs in the tests above.
            setup.append(f"ln -sfn {shlex.quote(sys.prefix)} ~/clsr-venv")
        elif "pip install" in cmd:
            continue
        elif "CLSR_RAY_PORT=" in cmd:  # free ports: no clash with other Ray clusters or MLflow servers
            setup.append(
                "echo 'export CLSR_RAY_PORT={ray} CLSR_DASHBOARD_PORT={dashboard} CLSR_MLFLOW_PORT={mlflow} #clsr'"
                " >> ~/.bashrc".format(**ports)
            )
        else:
            setup.append(cmd)
    assert len(setup) == len(test["setup_commands"]) - 2, "the install commands changed: update this test"
    # `ray up` reads and hashes every file under the mounted folder (.venv too: about 3 GB, 5 to 20 s per
    # `ray up`) before rsync leaves the excluded ones out; the test mounts what rsync would send instead
    test["file_mounts"]["~/clsr"] = str(_what_rsync_sends(sshd.home.parent / "synced"))
    # What the smoke study needs on the head (offline, local data).
    quiet = (
        f"CLSR_DATA_DIR={shlex.quote(str(data_dir))} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "
        "TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true"
    )
    setup.insert(1, f"echo 'export {quiet} #clsr' >> ~/.bashrc")
    test["setup_commands"] = setup
    return test


def _what_rsync_sends(folder: Path) -> Path:
    """The working tree as `ray up` syncs it (git's tracked and untracked files that .gitignore does not
    list, and .git), plus a .venv that the file's rsync_exclude must keep off the server."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (REPO_ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, folder / name)
    shutil.copytree(REPO_ROOT / ".git", folder / ".git", symlinks=True)
    (folder / ".venv" / "bin").mkdir(parents=True)
    (folder / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return folder


def _ray(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    ray = Path(sys.executable).with_name("ray")
    return subprocess.run(
        [str(ray), *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def _cluster_pids(ray_port: int) -> set[int]:
    """Processes of the test's Ray cluster: their command lines name its GCS port."""
    import psutil

    marks = (f"127.0.0.1:{ray_port}", f"--gcs_server_port={ray_port}", f"--gcs-server-port={ray_port}")
    pids = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if any(mark in cmdline for mark in marks) and proc.pid != os.getpid():
            pids.add(proc.pid)
    return pids


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.e2e
@pytest.mark.cluster
def test_ray_up_runs_the_smoke_study_and_ray_down_stops_everything(
    cfg, sshd, tmp_path, data_dir, monkeypatch
):
    import urllib.error
    import urllib.request

    import ray

    from clsr.cluster import mlflow_auth
    from tests.e2e.test_e2e import runs_of

    ray.shutdown()  # `ray up`/`ray down` run `ray stop`, which ends every Ray of this machine: ours too

    ports = dict(zip(("ray", "dashboard", "mlflow"), free_ports(3), strict=True))
    laptop = tmp_path / "laptop-home"
    (laptop / ".ray").mkdir(parents=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "MLFLOW_TRACKING"))
    }
    env |= {"HOME": str(laptop), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    test_cfg = _test_copy(cfg, sshd, ports, data_dir)
    config = tmp_path / "cluster.test.yaml"
    config.write_text(yaml.safe_dump(test_cfg, sort_keys=False))
    pgid_file = sshd.home / "clsr-mlflow" / "server.pgid"
    timings: dict[str, float] = {}
    ray_pids: set[int] = set()
    up_tried = down_done = False
    try:
        # Your machine: the cluster's token, as the README says.
        token = _ray("get-auth-token", "--generate", env=env, timeout=60)
        assert token.returncode == 0, token.stdout
        assert (laptop / ".ray" / "auth_token").read_text().strip()

        start = time.monotonic()
        up_tried = True
        up = _ray("up", "-y", "--no-config-cache", str(config), env=env, timeout=300)
        timings["ray up"] = time.monotonic() - start
        assert up.returncode == 0, up.stdout[-6000:]
        head_token = sshd.home / ".ray" / "clsr_auth_token"
        assert head_token.read_text() == (laptop / ".ray" / "auth_token").read_text()
        assert stat.S_IMODE(head_token.stat().st_mode) == 0o600
        assert (sshd.home / "clsr" / "studies" / "smoke.yaml").is_file()  # the repository, synced
        assert not (sshd.home / "clsr" / ".venv").exists()
        assert _listening(ports["mlflow"]) and _listening(ports["ray"]) and _listening(ports["dashboard"])
        ray_pids = _cluster_pids(ports["ray"])
        assert ray_pids, "no process of the test's Ray cluster found"

        # A second `ray up` restarts Ray and replaces the MLflow server it started before.
        first_pgid = int(pgid_file.read_text())
        assert _group_alive(first_pgid)
        start = time.monotonic()
        again = _ray("up", "-y", "--no-config-cache", str(config), env=env, timeout=300)
        timings["ray up again"] = time.monotonic() - start
        assert again.returncode == 0, again.stdout[-6000:]
        assert not _group_alive(first_pgid), "the first MLflow server was left running"
        assert int(pgid_file.read_text()) != first_pgid and _listening(ports["mlflow"])
        ray_pids |= _cluster_pids(ports["ray"])

        start = time.monotonic()
        # in-process trials (no Train worker group per trial, ~90 s less here): the worker-group path
        # runs in tests/e2e/test_e2e.py and on the loopback cluster (tests/cluster/test_cluster.py); one dev
        # evaluation and STS-B only, on 300 pairs (what is asserted here; the whole smoke study runs in
        # test_e2e.py)
        smoke = (
            "platform study run studies/smoke.yaml --set resources.workers_per_trial=0 "
            "--set trainer.max_steps=4 --set 'eval.tasks=[stsb]' --set eval.alignment_uniformity=false "
            "--set eval.sts_max_pairs=300"
        )
        study = _ray("exec", str(config), f"cd ~/clsr && {smoke}", env=env, timeout=420)
        timings["ray exec: smoke study"] = time.monotonic() - start
        assert study.returncode == 0, study.stdout[-6000:]
        assert "temperature | method.temperature=0.05" in study.stdout  # the summary table
        # The driver joined the cluster (RAY_ADDRESS on the head) instead of starting a Ray of its own:
        # the cluster lists it among its jobs (through the state API, with the token, on the head).
        jobs = _ray("exec", str(config), "ray list jobs --detail --format json", env=env, timeout=120)
        assert jobs.returncode == 0, jobs.stdout[-3000:]
        assert "study run studies/smoke.yaml" in jobs.stdout, jobs.stdout[-3000:]

        # The study, read back from the head's MLflow server over HTTP: with the platform's login only.
        uri = f"http://127.0.0.1:{ports['mlflow']}"
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        auth, login = sshd.home / "clsr-mlflow" / "auth", sshd.home / ".clsr-mlflow-login" / "password"
        for private in (auth / "basic_auth.ini", auth / "secret_key", auth / "basic_auth.db", login):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
        assert stat.S_IMODE(auth.stat().st_mode) == 0o700
        assert login.read_text() == mlflow_auth.derived_password(head_token)
        for key, value in mlflow_auth.login_env(login.read_text()).items():
            monkeypatch.setenv(key, value)
        client, parents, children = runs_of(uri, "smoke")
        assert len(parents) == 1 and parents[0].info.run_name == "smoke"
        assert parents[0].info.status == "FINISHED"
        assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"study.yaml"}
        assert len(children) == 2
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
        for child in children:
            assert child.info.status == "FINISHED" and child.data.tags["clsr.status"] == "finished"
            assert 60 < child.data.metrics["best_dev_stsb"] < 95 and 60 < child.data.metrics["test_stsb"] < 95
        # The default store: SQLite and artifacts on the head's disk.
        assert (sshd.home / "clsr-mlflow" / "mlflow.db").is_file()
        assert any((sshd.home / "clsr-mlflow" / "artifacts").rglob("study.yaml"))
        ray_pids |= _cluster_pids(ports["ray"])
        pgid = int(pgid_file.read_text())
        assert _group_alive(pgid)

        start = time.monotonic()
        down = _ray("down", "-y", str(config), env=env, timeout=180)
        down_done = True
        assert down.returncode == 0, down.stdout[-6000:]
        # `ray down` runs `ray stop` on the head; MLflow's watchdog sees Ray's GCS gone (15 s).
        gone = _wait_until(
            lambda: not any(_alive(p) for p in ray_pids) and not _group_alive(pgid), timeout=90, interval=1
        )
        timings["ray down, until all stopped"] = time.monotonic() - start
        assert gone, (
            f"left running: Ray {[p for p in ray_pids if _alive(p)]}, MLflow group alive: {_group_alive(pgid)}"
        )
        for name, port in ports.items():
            assert not _listening(port), f"{name} still listens on {port}"
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    finally:
        if up_tried and not down_done:
            with contextlib.suppress(subprocess.TimeoutExpired):  # what it left is killed below, by pid
                _ray("down", "-y", str(config), env=env, timeout=180)
        if pgid_file.exists():  # the MLflow server, by its recorded process group
            pgid = int(pgid_file.read_text())
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if _group_alive(pgid):
                    os.killpg(pgid, sig)
                    _wait_until(lambda: not _group_alive(pgid), timeout=10)  # noqa: B023
        for pid in ray_pids | _cluster_pids(ports["ray"]):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for suffix in ("state", "lock"):
            Path(f"/tmp/ray/cluster-{test_cfg['cluster_name']}.{suffix}").unlink(missing_ok=True)
