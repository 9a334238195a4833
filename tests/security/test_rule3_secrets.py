"""Rule 3: no secret travels in the environment Ray copies to its workers, or on a command line or in a
file another user can read. The attacks of issue 52: Ray Tune copying AWS_SECRET_ACCESS_KEY and
AWS_SESSION_TOKEN into every trial actor's runtime environment (then on workers' command lines and in
runtime_env_agent.log), and ``platform cluster sbatch`` writing tokens into a readable script."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.security.rule123_cotenant import cotenant_reads, shared_tmp, start_local_ray

SECRET, SESSION = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY", "FQoGZXIvYXdzSESSIONTOKEN"
SMOKE = Path(__file__).resolve().parents[2] / "studies" / "smoke.yaml"


@pytest.fixture()
def aws(monkeypatch):
    """A driver's environment with AWS keys (restored after the test, as is AWS_SHARED_CREDENTIALS_FILE)."""
    with shared_tmp(monkeypatch) as folder:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
        monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        yield folder


def test_aws_secrets_are_absent_from_the_trials_environment(aws, monkeypatch):
    from ray.tune.execution.class_cache import ENV_VARS_TO_PROPAGATE

    env_vars = start_local_ray(monkeypatch)["runtime_env"]["env_vars"]
    # what Ray gives every worker (the job's runtime env) and what Tune copies to each trial actor
    tune_copies = {name: os.environ[name] for name in ENV_VARS_TO_PROPAGATE if name in os.environ}
    for where in (env_vars, tune_copies, dict(os.environ)):
        assert not any(SECRET in value or SESSION in value for value in where.values())
    path = Path(env_vars["AWS_SHARED_CREDENTIALS_FILE"])
    assert os.environ["AWS_SHARED_CREDENTIALS_FILE"] == str(path)
    text = path.read_text()
    assert (
        text.startswith("[default]\n") and SECRET in text and SESSION in text and "AKIAEXAMPLEKEYID" in text
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and path.is_relative_to(aws)


def test_the_credentials_file_reads_as_the_variables_did(aws):
    """botocore (MLflow's artifacts) takes the same keys from the file."""
    botocore_session = pytest.importorskip("botocore.session")
    from clsr.tracking.credentials import move_aws_to_file

    move_aws_to_file()
    credentials = botocore_session.get_session().get_credentials()
    assert (credentials.secret_key, credentials.token) == (SECRET, SESSION)


def test_a_cotenant_cannot_read_the_credentials_file(aws):
    from clsr.tracking.credentials import move_aws_to_file

    path = Path(move_aws_to_file()["AWS_SHARED_CREDENTIALS_FILE"])
    assert not cotenant_reads(path)


@pytest.mark.parametrize(
    "setup",
    [
        "export MLFLOW_TRACKING_TOKEN=abc123",
        "export AWS_SESSION_TOKEN=FQoGZXIvYXdz",
        "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI",
        "export HF_TOKEN=hf_abcdef",
        "export OPENAI_API_KEY=sk-abc",
        "export WANDB_API_KEY=0123",
        "GITHUB_TOKEN=ghp_x pip install -e .",
        "pip install git+https://ghp_token123@github.com/lab/pkg",
        "pip install --index-url https://user:hunter2@pypi.lab/simple pkg",
        "export MLFLOW_TRACKING_PASSWORD=hunter2",
    ],
)
def test_sbatch_refuses_a_setup_holding_a_secret(tmp_path, capsys, setup):
    from clsr.cli import main

    out = tmp_path / "job.sbatch"
    assert main(["cluster", "sbatch", str(SMOKE), "--setup", setup, "--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "holds a credential" in err
    for secret in (
        "abc123",
        "FQoGZXIvYXdz",
        "wJalrXUtnFEMI",
        "hf_abcdef",
        "sk-abc",
        "ghp_token123",
        "hunter2",
    ):
        assert secret not in err


def test_sbatch_refuses_a_set_holding_a_url_token(tmp_path, capsys):
    from clsr.cli import main

    out = tmp_path / "job.sbatch"
    code = main(
        ["cluster", "sbatch", str(SMOKE), "--set", "tracking_uri=https://tok3n@mlflow.lab", "--out", str(out)]
    )
    assert code == 2 and not out.exists() and "tok3n" not in capsys.readouterr().err


def test_sbatch_keeps_a_setup_without_secrets(tmp_path):
    from clsr.cli import main

    out = tmp_path / "job.sbatch"
    setup = "module load cuda; source ~/venv/bin/activate; export HF_HOME=/scratch/hf; unset HF_TOKEN"
    assert main(["cluster", "sbatch", str(SMOKE), "--setup", setup, "--out", str(out)]) == 0


def test_a_killed_drivers_credentials_file_is_removed_by_the_next(aws):
    import subprocess
    import sys

    from clsr import runtime_dir
    from clsr.tracking.credentials import move_aws_to_file

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = runtime_dir.subfolder(runtime_dir.scratch(), "credentials")
    namespace = runtime_dir.pid_namespace()
    left = runtime_dir.write_private(folder / f"aws-{dead.pid}-{namespace}-abcd", "[default]\n")
    other_container = runtime_dir.write_private(
        folder / f"aws-{dead.pid}-{namespace + 1}-abcd", "[default]\n"
    )
    move_aws_to_file()
    assert not left.exists() and other_container.exists()
