"""Logins on the MLflow servers the project deploys: ``mlflow server --app-name basic-auth``, MLflow's own
username/password authentication, on the loopback cluster and on the clusters of ``cluster.local.yaml``
and ``cluster.yaml``.

Two logins. ``admin`` (MLflow's administrator: creates and removes users, grants permissions) lives on
the server's machine alone. ``clsr``, an ordinary user, is the platform's: the driver and the Ray
workers write the study's runs with it, reading ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``
as MLflow's client does. ``default_permission = READ``: every login may read every experiment (the lab
shares its results) but changes only what it created or was granted, so a colleague's login cannot
rewrite or delete a study, and the platform's login cannot touch a colleague's experiments. Without a
login, nothing but ``/health`` answers (401).

The server's auth folder (mode 0700) holds, each file 0600 and made once (MLflow creates ``admin`` from
the config at its first start only, so a new password would no longer match):

* ``basic_auth.ini``: MLflow's auth config (``MLFLOW_AUTH_CONFIG_PATH``), the admin's generated password
  in it, and the auth database beside it (``basic_auth.db``, written by a server started with umask 077);
* ``secret_key``: Flask's CSRF key, which MLflow reads from ``MLFLOW_FLASK_SERVER_SECRET_KEY``.

MLflow checks the password of every request with its scrypt hash, about 150 ms of the server's CPU on
the machines here, and a study makes several requests a second (each trial's metrics, the lease's
heartbeat, a dashboard polling): the config turns on MLflow's own credential cache
(``auth_cache_ttl_seconds``): a server worker checks a user's password once per ``AUTH_CACHE_TTL_S``
(successful checks only are kept). The cost: a password change, a user's deletion or admin flag made
through the API reaches the server's other worker up to that long after.

Secrets reach the server through that file and the environment, never its command line: ``ps`` shows
every process's arguments to every user, while ``/proc/<pid>/environ`` is the owner's alone.

On the ``ray up`` clusters the platform's password is derived from Ray's auth token (``login``): every
node already holds that token (0600, shipped by ``file_mounts``), so each node computes the same password
for itself and nothing new travels. An HMAC and not the token itself: MLflow's basic auth crosses the LAN
unencrypted, and a captured MLflow password must not open the Ray cluster. ``platform-user`` (on the head,
once the server answers) gives ``clsr`` that password, and gives it again after the token changed.

From a shell (the cluster YAMLs)::

    python -m clsr.cluster.mlflow_auth login TOKEN_FILE LOGIN_DIR      # every node: LOGIN_DIR/password
    python -m clsr.cluster.mlflow_auth server-config AUTH_DIR          # the head, before `mlflow server`
    python -m clsr.cluster.mlflow_auth platform-user URL AUTH_DIR LOGIN_DIR   # the head, once it answers
"""

from __future__ import annotations

import argparse
import base64
import configparser
import hashlib
import hmac
import json
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ADMIN = "admin"
PLATFORM_USER = "clsr"
DEFAULT_PERMISSION = "READ"
AUTH_CACHE_TTL_S = 30  # a server worker checks a login's scrypt hash once in this long (MLflow's cache)
CONFIG = "basic_auth.ini"
DATABASE = "basic_auth.db"
SECRET_KEY = "secret_key"
PASSWORD = "password"  # the platform's password, in a login folder
APP = ("--app-name", "basic-auth")
DERIVATION = b"clsr: the platform's MLflow login"  # HMAC message: a password only for this use


class AuthError(RuntimeError):
    """A login could not be set up; the message says what to check."""


def private_folder(folder: Path) -> Path:
    """``folder``, made if missing, readable by this user alone."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 from the start (O_EXCL: never through a link someone planted, never
    over an existing secret)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def _replace_secret(path: Path, text: str) -> None:
    """Write ``path`` anew (0600 throughout): a fresh file moved over the old one."""
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    write_secret(fresh, text)
    fresh.replace(path)


def server_config(folder: Path) -> Path:
    """The auth folder of a server: MLflow's auth config with a generated admin password, and Flask's
    secret key, each made once and kept. Returns the config's path."""
    private_folder(folder)
    config = folder / CONFIG
    if not config.exists():
        write_secret(config, auth_config_text(folder, secrets.token_urlsafe(32)))
    if not (folder / SECRET_KEY).exists():
        write_secret(folder / SECRET_KEY, secrets.token_urlsafe(32))
    return config


def auth_config_text(folder: Path, admin_password: str) -> str:
    """MLflow's auth config (the keys of mlflow/server/auth/basic_auth.ini)."""
    return (
        "[mlflow]\n"
        f"default_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = sqlite:///{folder.resolve() / DATABASE}\n"
        f"admin_username = {ADMIN}\n"
        f"admin_password = {admin_password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n"
    )


def server_env(folder: Path) -> dict[str, str]:
    """What ``mlflow server --app-name basic-auth`` reads from its environment."""
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(folder / CONFIG),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": (folder / SECRET_KEY).read_text().strip(),
    }


def admin_password(folder: Path) -> str:
    config = configparser.ConfigParser(interpolation=None)
    config.read(folder / CONFIG)
    return config["mlflow"]["admin_password"]


def derived_password(token_file: Path) -> str:
    """The platform's MLflow password on a ``ray up`` cluster: an HMAC of Ray's auth token."""
    token = token_file.read_bytes().strip()
    if not token:
        raise AuthError(f"Ray's auth token {token_file} is empty: `ray get-auth-token --generate`")
    return hmac.new(token, DERIVATION, hashlib.sha256).hexdigest()


def write_login(token_file: Path, folder: Path) -> Path:
    """``folder/password`` (0600, in a 0700 folder): the platform's password, derived from the token."""
    path = private_folder(folder) / PASSWORD
    password = derived_password(token_file)
    if not path.exists() or path.read_text().strip() != password:
        _replace_secret(path, password)
    return path


def login_env(password: str) -> dict[str, str]:
    """The platform's login, as MLflow's client reads it."""
    return {"MLFLOW_TRACKING_USERNAME": PLATFORM_USER, "MLFLOW_TRACKING_PASSWORD": password}


def set_platform_user(url: str, admin: str, password: str) -> None:
    """Make ``clsr`` a user of the server at ``url`` with ``password`` (created, or its password set
    again), as the admin; then check that the login works."""
    exists = _request(url, "GET", "users/get", (ADMIN, admin), {"username": PLATFORM_USER}) is not None
    body = {"username": PLATFORM_USER, "password": password}
    if exists:
        _request(url, "PATCH", "users/update-password", (ADMIN, admin), body)
    else:
        _request(url, "POST", "users/create", (ADMIN, admin), body)
    _request(url, "GET", "users/current", (PLATFORM_USER, password))


def _request(
    url: str, method: str, path: str, login: tuple[str, str], body: dict[str, str] | None = None
) -> dict | None:
    """One call of MLflow's auth REST API; None for 404 on a lookup."""
    endpoint = f"{url.rstrip('/')}/api/2.0/mlflow/{path}"
    data = None
    if method == "GET" and body:
        endpoint += "?" + urllib.parse.urlencode(body)
    elif body:
        data = json.dumps(body).encode()
    basic = base64.b64encode(":".join(login).encode()).decode()
    request = urllib.request.Request(endpoint, data=data, method=method, headers={
        "Authorization": f"Basic {basic}", "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        if err.code == 404 and method == "GET" and path == "users/get":
            return None
        raise AuthError(
            f"MLflow's auth API {method} {path} as {login[0]!r} answered {err.code} "
            f"({err.read()[:300].decode(errors='replace')}): is the server started with --app-name basic-auth "
            f"and this auth folder's config?"
        ) from None  # the chained error holds the request, password header included


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clsr.cluster.mlflow_auth", description=__doc__.split("\n")[0]
    )
    actions = parser.add_subparsers(dest="action", required=True)
    login = actions.add_parser(
        "login", help="the platform's password, derived from Ray's token, into LOGIN_DIR"
    )
    login.add_argument("token_file", type=Path)
    login.add_argument("login_dir", type=Path)
    config = actions.add_parser("server-config", help="the server's auth folder: config, admin password, key")
    config.add_argument("auth_dir", type=Path)
    user = actions.add_parser(
        "platform-user", help="give the platform's user (clsr) the password in LOGIN_DIR"
    )
    user.add_argument("url")
    user.add_argument("auth_dir", type=Path)
    user.add_argument("login_dir", type=Path)
    args = parser.parse_args(argv)
    if args.action == "login":
        write_login(args.token_file.expanduser(), args.login_dir.expanduser())
    elif args.action == "server-config":
        server_config(args.auth_dir.expanduser())
    else:
        password = (args.login_dir.expanduser() / PASSWORD).read_text().strip()
        set_platform_user(args.url, admin_password(args.auth_dir.expanduser()), password)
        print(f"MLflow at {args.url}: user {PLATFORM_USER!r} logs the studies' runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
