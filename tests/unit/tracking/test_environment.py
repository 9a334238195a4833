"""A trial's environment (``clsr.tracking.environment``, issue 55): each ``env.*`` value equals what
platform, sys and torch say themselves, ``environment.txt`` lists the installed torch, and a dirty
checkout's diff is cut at its cap with a note."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess

import torch

import clsr
from clsr.tracking import environment
from clsr.tracking.environment import MAX_DIFF_BYTES, capture, git_state


def test_the_params_are_the_values_python_and_torch_report():
    env = capture("cpu")
    params = env.params()
    assert params["env.python"] == platform.python_version()
    assert params["env.os"] == platform.platform()
    # the installed distribution's version (what pip reinstalls; environment.txt's), not torch.__version__,
    # which adds the build's local label on a PyPI CUDA wheel (2.11.0+cu130 for 2.11.0): env.cuda says that
    assert params["env.torch"] == importlib.metadata.version("torch")
    assert params["env.cuda"] == (torch.version.cuda or "none")
    assert params["env.cudnn"] == str(torch.backends.cudnn.version() or "none")
    assert params["env.transformers"] == importlib.metadata.version("transformers")
    assert params["env.clsr"] == clsr.__version__
    assert (params["env.gpu"], params["env.gpu_count"]) == ("none", "0")  # a CPU trial names no GPU
    assert params["env.git_dirty"] in ("true", "false")
    assert set(params) == {
        f"env.{k}"
        for k in [
            "python",
            "os",
            "cpu",
            "torch",
            "cuda",
            "cudnn",
            "gpu",
            "gpu_count",
            "driver",
            "transformers",
            "clsr",
            "git_commit",
            "git_dirty",
        ]
    }
    assert params["env.cpu"] and params["env.cpu"] != "unknown"


def test_environment_txt_lists_every_distribution_once_sorted():
    lines = capture("cpu").lock_text().splitlines()
    assert f"torch=={importlib.metadata.version('torch')}" in lines
    names = [line.split("==")[0].lower() for line in lines]
    assert lines == sorted(lines, key=str.lower) and len(names) == len(set(names))
    assert len(lines) > 50  # the platform's own dependencies alone are more


def test_the_commit_is_the_checkouts_head():
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clsr.__path__[0], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_state()[0] == head


def test_a_dirty_checkouts_diff_is_capped_with_a_note(tmp_path, monkeypatch):
    repo = tmp_path / "checkout"
    (repo / "clsr").mkdir(parents=True)
    (repo / "clsr" / "__init__.py").write_text("x = 0\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    monkeypatch.setattr(environment.clsr, "__file__", str(repo / "clsr" / "__init__.py"))
    commit, dirty, diff = git_state()
    assert (len(commit), dirty, diff) == (40, False, "")
    (repo / "clsr" / "__init__.py").write_text("x = 1\n" + "y = 'a long line'\n" * 100_000)  # ~1.8 MB diff
    (repo / "notes.txt").write_text("scratch")
    commit2, dirty, diff = git_state()
    assert commit2 == commit and dirty
    assert diff.startswith("# untracked: notes.txt\n") and "+x = 1" in diff
    assert len(diff.encode()) < MAX_DIFF_BYTES + 200
    assert diff.rstrip().splitlines()[-1].startswith(f"# clsr: diff cut at {MAX_DIFF_BYTES} bytes of ")


def test_the_header_read_names_what_importlib_parses_in_full():
    """``distributions`` reads each metadata file's header only: the same names and versions as
    ``importlib.metadata``'s full parse, the first found of a name kept (as imports resolve it)."""
    expected: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        expected.setdefault(dist.metadata["Name"].lower(), f"{dist.metadata['Name']}=={dist.version}")
    assert environment.distributions() == tuple(sorted(expected.values(), key=str.lower))
