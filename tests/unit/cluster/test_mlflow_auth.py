"""MLflow's logins where the project deploys a tracking server (``clsr.cluster.mlflow_auth``), offline: the
auth folder and its modes, the config as MLflow itself reads it, the platform's password derived from
Ray's token, and the MLflow start of both cluster YAMLs: ``--app-name basic-auth``, secrets by file and
environment (never on a command line, which ``ps`` shows to every user), the login on every node.

Against real servers: tests/cluster/test_cluster.py (401 without the login, on the loopback cluster) and
tests/cluster/test_ray_up_local.py (`ray up` of cluster.local.yaml, the study logged with the login).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clsr.cluster import mlflow_auth

REPO_ROOT = Path(__file__).resolve().parents[3]
# each YAML: where its nodes keep Ray's token, and the head its MLflow auth folder
YAMLS = {
    "cluster.local.yaml": ("~/.ray/clsr_auth_token", "~/clsr-mlflow/auth"),
    "cluster.yaml": ("~/.clsr-ray-auth/auth_token", "~/mlflow/auth"),
}
LOGIN_DIR = "~/.clsr-mlflow-login"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _mlflows_config_reader():
    """MLflow's own ``read_auth_config``, loaded from its file: importing ``mlflow.server`` builds the
    server's app (3 s)."""
    import importlib.util

    import mlflow

    path = Path(mlflow.__file__).parent / "server" / "auth" / "config.py"
    spec = importlib.util.spec_from_file_location("mlflow_auth_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_auth_config


def test_server_config_is_private_and_read_by_mlflow_as_written(tmp_path, monkeypatch):
    read_auth_config = _mlflows_config_reader()
    folder = tmp_path / "auth"
    config = mlflow_auth.server_config(folder)
    assert _mode(folder) == 0o700
    assert _mode(config) == _mode(folder / mlflow_auth.SECRET_KEY) == 0o600
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(config))
    for key in ("MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        monkeypatch.delenv(key, raising=False)
    read = read_auth_config()
    assert read.default_permission == "READ"
    assert read.admin_username == "admin"
    assert read.admin_password == mlflow_auth.admin_password(folder)
    assert len(read.admin_password) >= 40  # token_urlsafe(32); MLflow asks for 12 characters or more
    assert read.database_uri == f"sqlite:///{folder.resolve() / 'basic_auth.db'}"
    assert read.authorization_function == "mlflow.server.auth:authenticate_request_basic_auth"
    assert read.auth_cache_ttl_seconds == mlflow_auth.AUTH_CACHE_TTL_S > 0  # scrypt once per login
    assert mlflow_auth.server_env(folder) == {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": (folder / "secret_key").read_text(),
    }


def test_server_config_is_made_once(tmp_path):
    """MLflow creates the admin from the config at its first start only: a new password would lock the
    admin out after a restart."""
    folder = tmp_path / "auth"
    mlflow_auth.server_config(folder)
    before = {name: (folder / name).read_text() for name in ("basic_auth.ini", "secret_key")}
    mlflow_auth.server_config(folder)
    assert {name: (folder / name).read_text() for name in before} == before


def test_a_secret_file_is_never_written_over_or_through_a_link(tmp_path):
    planted = tmp_path / "planted"
    (tmp_path / "secret").symlink_to(planted)
    with pytest.raises(FileExistsError):
        mlflow_auth.write_secret(tmp_path / "secret", "s3cret")
    assert not planted.exists()


def test_the_platforms_password_is_derived_from_the_ray_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("a" * 64 + "\n")
    path = mlflow_auth.write_login(token, tmp_path / "login")
    password = path.read_text()
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert password == mlflow_auth.derived_password(token) and len(password) == 64
    assert "a" * 16 not in password  # not the token: a password captured on the LAN opens no Ray cluster
    token.write_text("b" * 64)
    assert mlflow_auth.write_login(token, tmp_path / "login").read_text() != password  # a new token
    assert _mode(path) == 0o600
    token.write_text("\n")
    with pytest.raises(mlflow_auth.AuthError, match="empty"):
        mlflow_auth.derived_password(token)


def test_login_env_is_what_mlflows_client_reads(monkeypatch):
    from mlflow.utils.credentials import read_mlflow_creds

    for key, value in mlflow_auth.login_env("pw-of-twelve-chars").items():
        monkeypatch.setenv(key, value)
    assert read_mlflow_creds() == ("clsr", "pw-of-twelve-chars")


# ---- the cluster YAMLs ---------------------------------------------------------------------------


def _config(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / name).read_text())


def _command(commands: list[str], needle: str) -> str:
    found = [cmd for cmd in commands if needle in cmd]
    assert len(found) == 1, (needle, found)
    return found[0]


@pytest.mark.parametrize("name", YAMLS)
def test_mlflow_starts_with_logins_and_no_secret_on_its_command_line(name):
    cfg = _config(name)
    token, auth = YAMLS[name]
    starts = cfg["head_start_ray_commands"]
    server = _command(starts, "mlflow server")
    assert "mlflow server --app-name basic-auth " in server
    prepare = starts.index(f"python -m clsr.cluster.mlflow_auth server-config {auth}")
    assert prepare < starts.index(server)
    config = auth.replace("~", "$HOME", 1) + "/basic_auth.ini"
    assert re.search(rf"MLFLOW_AUTH_CONFIG_PATH={re.escape(config)}\s", server), server
    assert f"MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat {auth}/secret_key)" in server
    assert server.index("umask 077") < server.index("mlflow server")  # the auth database it creates
    # the server's own words: options and addresses only, nothing secret (or a way to pass one)
    words = shlex.split(server[server.index("mlflow server") :].split("&", 1)[0].split(">", 1)[0])
    assert not [w for w in words if re.search(r"password|secret|token|PASSWORD|SECRET|TOKEN", w)], words
    user = _command(starts, "platform-user")
    assert starts.index(_command(starts, "/health")) < starts.index(user)  # once the server answers
    assert user.split()[-2:] == [auth, LOGIN_DIR]


@pytest.mark.parametrize("name", YAMLS)
def test_every_node_gets_the_platforms_login_from_the_ray_token(name):
    cfg = _config(name)
    token, _ = YAMLS[name]
    setup = cfg["setup_commands"]
    login = setup.index(f"python -m clsr.cluster.mlflow_auth login {token} {LOGIN_DIR}")
    assert setup.index("pip install -e ~/clsr") < login  # runs the project's module
    export = _command(setup, "MLFLOW_TRACKING_PASSWORD")
    assert f"MLFLOW_TRACKING_PASSWORD=$(cat {LOGIN_DIR}/password 2>/dev/null) #clsr'" in export
    assert "MLFLOW_TRACKING_USERNAME=clsr " in export
    assert f"RAY_AUTH_TOKEN_PATH={token.replace('~', '$HOME', 1)}" in " ".join(setup)  # the same token


@pytest.mark.parametrize("name", YAMLS)
def test_a_nodes_shells_log_in_with_the_derived_password(name, tmp_path):
    """The YAML's own two lines, run as the launcher runs them: a node's shell exports the password the
    head gave the platform's user, read from a 0600 file; ~/.bashrc holds no password."""
    cfg = _config(name)
    token, _ = YAMLS[name]
    home = tmp_path / "home"
    token_file = home / token.removeprefix("~/")
    token_file.parent.mkdir(parents=True)
    token_file.write_text("c" * 64)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT / "platform")}
    setup = cfg["setup_commands"]
    for cmd in (_command(setup, "MLFLOW_TRACKING_PASSWORD"), _command(setup, "mlflow_auth login")):
        subprocess.run(["bash", "-c", cmd], env=env, check=True, timeout=60)
    shell = subprocess.run(
        ["bash", "-c", 'source ~/.bashrc; echo "$MLFLOW_TRACKING_USERNAME $MLFLOW_TRACKING_PASSWORD"'],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    password = mlflow_auth.derived_password(token_file)
    assert shell.stdout.split() == ["clsr", password]
    assert password not in (home / ".bashrc").read_text()
    assert _mode(home / ".clsr-mlflow-login" / "password") == 0o600
    assert os.access(home / ".clsr-mlflow-login", os.R_OK)


def test_a_server_that_wants_a_login_is_refused_before_the_study_starts(monkeypatch):
    """``/health`` needs no login: the check asks the API too, with the login the MLflow client would use."""
    import base64
    import http.server
    import threading

    from clsr.tracking.reach import check_reachable

    login = "Basic " + base64.b64encode(b"clsr:right").decode()

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            ok = self.path == "/health" or self.headers.get("Authorization") == login
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_AUTH", raising=False)
        with pytest.raises(
            ConnectionError, match="wants a login and none was given: set MLFLOW_TRACKING_USERNAME"
        ):
            check_reachable(uri)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "clsr")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(ConnectionError, match="MLFLOW_TRACKING_USERNAME/PASSWORD was refused") as refused:
            check_reachable(uri)
        assert "wrong" not in str(refused.value)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "right")
        check_reachable(uri)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "not-basic")  # MLflow's client would send this instead
        with pytest.raises(ConnectionError, match="the login in MLFLOW_TRACKING_TOKEN was refused"):
            check_reachable(uri)
    finally:
        server.shutdown()
