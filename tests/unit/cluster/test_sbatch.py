"""``platform cluster sbatch`` without SLURM: the checks before a script is written, and the script itself
run by bash with a fake ``srun``/``scontrol``/``scancel``/``platform`` on PATH for a three-node allocation
(one machine cannot hold a multi-node SLURM; the one-node script runs on real daemons in
``tests/cluster/test_slurm.py``). Also each node's Ray start (``clsr.cluster.slurm_node``) with a fake ``ray``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from clsr.cli import main
from clsr.cluster import slurm_node
from clsr.cluster.sbatch import SbatchRequest, check_request, time_limit_s
from clsr.study.plan.load import load_study

SMOKE = Path(__file__).resolve().parents[3] / "studies" / "smoke.yaml"


def smoke(*overrides: tuple[str, object]):
    return load_study(str(SMOKE), list(overrides))


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [
        ("30", 1800),
        ("1:30", 90),
        ("02:00:00", 7200),
        ("1-00", 86400),
        ("1-2:03", 93780),
        ("2-00:00:10", 172810),
        ("168:00:00", 604800),
        ("UNLIMITED", None),
    ],
)
def test_slurm_time_formats(limit, seconds):
    assert SbatchRequest(time=limit).time == limit
    assert time_limit_s(limit) == seconds


@pytest.mark.parametrize("limit", ["1:2:3:4", "2-", "1h", "30 ", "unlimited"])
def test_a_time_slurm_would_refuse_is_refused_here(limit):
    with pytest.raises(
        ValueError, match="allowed MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
    ):
        SbatchRequest(time=limit)


def test_the_ray_folder_leaves_room_for_rays_socket_paths():
    assert SbatchRequest(tmp="/local/scratch/me").tmp == "/local/scratch/me"
    for folder in ("/local/scratch/a-long-user-name", "tmp", "/my tmp"):
        with pytest.raises(ValueError, match="at most 22 characters, no spaces"):
            SbatchRequest(tmp=folder)


def test_a_trial_that_fits_the_allocation_passes():
    study = smoke(("resources.gpus_per_worker", 1), ("resources.workers_per_trial", 4))
    request = SbatchRequest(nodes=2, gpus_per_node=2, cpus_per_node=8, time="1:00:00")
    assert check_request(study, request, "smoke.yaml", []) == [
        "smoke.yaml: storage_path 'runs' is a folder on one node, and the job has 2 nodes: use "
        "s3://<bucket>/<prefix> or file:///<a folder every node mounts>"
    ]
    for storage in ("s3://bucket/runs", "file:///shared/runs"):
        study = smoke(("resources.gpus_per_worker", 1), ("storage_path", storage))
        assert check_request(study, request, "smoke.yaml", []) == []


def test_what_cannot_run_is_refused_one_line_each():
    study = smoke(("resources.gpus_per_worker", 2), ("resources.workers_per_trial", 3))
    request = SbatchRequest(nodes=2, gpus_per_node=1, cpus_per_node=1, time="2", grace_s=120)
    problems = check_request(study, request, "s.yaml", ["storage_path=s3://key:hunter2@host/b"])
    assert any("gpus_per_worker 2 does not fit a node of --gpus-per-node 1" in p for p in problems)
    assert any("a trial needs 6 GPUs" in p and "the job has 2" in p for p in problems)
    assert any(p.startswith("--grace 120: must be shorter than --time 2") for p in problems)
    (secret,) = [p for p in problems if "credential" in p]
    assert "hunter2" not in secret and "***" in secret


def test_the_command_refuses_before_writing(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    code = main(["cluster", "sbatch", str(SMOKE), "--time", "5h", "--out", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "error: --time: '5h': allowed MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
    )
    spaced = tmp_path / "my jobs" / "job.sbatch"
    assert main(["cluster", "sbatch", str(SMOKE), "--out", str(spaced)]) == 2 and not spaced.exists()
    assert "holds a space or %" in capsys.readouterr().err
    code = main(["cluster", "sbatch", str(SMOKE), "--set", "trainer.bogus=1", "--out", str(out)])
    assert code == 2 and not out.exists() and "base.trainer.bogus: unknown key" in capsys.readouterr().err
    code = main(["cluster", "sbatch", str(SMOKE), "--nodes", "2", "--out", str(out)])
    assert code == 2 and "is a folder on one node" in capsys.readouterr().err


@pytest.fixture
def short_tmp():
    """A node-local folder short enough for Ray's socket paths (``--tmp`` takes at most 22 characters)."""
    folder = Path(tempfile.mkdtemp(prefix="clsr-sb-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write(tmp_path: Path, *options: str) -> Path:
    out = tmp_path / "slurm" / "job.sbatch"
    args = [
        "cluster",
        "sbatch",
        str(SMOKE),
        "--out",
        str(out),
        "--gpus-per-node",
        "2",
        "--cpus-per-node",
        "4",
    ]
    assert main([*args, *options]) == 0
    return out


def test_the_script_asks_for_requeue_and_an_early_sigterm(tmp_path):
    text = write(
        tmp_path, "--time", "4:00:00", "--grace", "300", "--partition", "gpu", "--account", "lab"
    ).read_text()
    directives = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    assert directives == [
        "--job-name=clsr-smoke", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=4", "--gpus-per-task=2",
        "--partition=gpu", "--account=lab", "--time=4:00:00", "--requeue", "--signal=B:TERM@300",
        "--open-mode=append", f"--output={tmp_path / 'slurm'}/%x-%j.out",
    ]  # fmt: skip
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0
    assert os.access(tmp_path / "slurm" / "job.sbatch", os.X_OK)


FAKES = {
    "scontrol": """
        [ "$1 $2" = "show hostnames" ] && printf '%s\\n' $FAKE_NODES
    """,
    "srun": """
        echo "srun $*" >> "$FAKE_LOG"
        if [[ " $* " == *" hostname --all-ip-addresses"* ]]; then echo "127.0.1.1 10.0.0.1 fe80::1"; exit 0; fi
        if [[ " $* " == *" slurm-node head "* ]]; then
            args=("$@"); for i in "${!args[@]}"; do [ "${args[i]}" = --tmp ] && tmp=${args[i+1]}; done
            folder="$tmp/clsr-$(id -u)/$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"
            mkdir -p -m 700 "$tmp/clsr-$(id -u)" && mkdir -p -m 777 "$folder" && echo 10.0.0.1:6123 > "$folder/address"
        fi
        echo $$ >> "$FAKE_DIR/steps"
        trap 'kill $!; exit 0' TERM
        sleep 60 & wait
    """,
    "scancel": """
        echo "scancel $*" >> "$FAKE_LOG"
        xargs kill -TERM < "$FAKE_DIR/steps"
    """,
    "platform": """
        echo "platform $* | RAY_ADDRESS=$RAY_ADDRESS RAY_AUTH_MODE=$RAY_AUTH_MODE token=${#RAY_AUTH_TOKEN}" >> "$FAKE_LOG"
        trap 'echo "platform got TERM" >> "$FAKE_LOG"; kill $!; exit 143' TERM
        sleep "${FAKE_DRIVER_S:-0}" & wait
    """,
}


def run_fake(
    tmp_path: Path, script: Path, restart: str = "", stop_after: float | None = None, nodes: str = "n1"
):
    fakes = tmp_path / "bin"
    fakes.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (fakes / name).write_text("#!/bin/bash\n" + textwrap.dedent(body))
        (fakes / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{fakes}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "FAKE_LOG": str(log),
        "FAKE_DIR": str(fakes),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[1-3]" if " " in nodes else nodes,
        "FAKE_NODES": nodes,
        "FAKE_DRIVER_S": "30" if stop_after else "0",
    }
    if restart:
        env["SLURM_RESTART_COUNT"] = restart
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if stop_after:
        deadline = time.monotonic() + 20
        while "platform study" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # what --signal=B:TERM@grace sends: the batch shell only
    output, _ = proc.communicate(timeout=60)
    return proc.returncode, output, log.read_text().splitlines()


def test_three_nodes_a_head_on_the_first_and_a_worker_on_each_other(tmp_path, short_tmp):
    script = write(
        tmp_path, "--nodes", "3", "--set", "storage_path=s3://bucket/runs", "--tmp", str(short_tmp)
    )
    code, output, calls = run_fake(tmp_path, script, nodes="n1 n2 n3")
    assert code == 0, output
    head = f"platform cluster slurm-node head --ip 10.0.0.1 --cpus 4 --gpus 2 --tmp {short_tmp}"
    worker = f"platform cluster slurm-node worker --address 10.0.0.1:6123 --cpus 4 --gpus 2 --tmp {short_tmp}"
    assert sorted(calls[:5]) == sorted(
        [  # background steps: their lines come in any order
            "srun --nodes=1 --ntasks=1 -w n1 hostname --all-ip-addresses",
            f"srun --nodes=1 --ntasks=1 -w n1 {head}",
            f"srun --nodes=1 --ntasks=1 -w n2 {worker}",
            f"srun --nodes=1 --ntasks=1 -w n3 {worker}",
            f"platform study run {SMOKE} --set storage_path=s3://bucket/runs "
            "| RAY_ADDRESS=10.0.0.1:6123 RAY_AUTH_MODE=token token=64",
        ]
    )
    assert calls[0].endswith("hostname --all-ip-addresses") and calls[5:] == [
        "scancel --signal=TERM 4242"
    ]  # the steps stopped, not the batch shell
    assert not (short_tmp / "clsr-ray-4242-0").exists()
    assert "clsr: job 4242 (restart 0) on n1 n2 n3" in output


def test_a_requeued_job_resumes(tmp_path, short_tmp):
    script = write(tmp_path, "--tmp", str(short_tmp))
    code, output, calls = run_fake(tmp_path, script, restart="1")
    assert code == 0, output
    assert calls[0].startswith(
        "srun --nodes=1 --ntasks=1 -w n1 platform cluster slurm-node head --ip 127.0.0.1"
    )  # one node: no address lookup
    (driver,) = [c for c in calls if c.startswith("platform study")]
    assert driver.startswith(f"platform study resume --or-run {SMOKE} |")


def test_sigterm_to_the_batch_shell_reaches_the_driver_and_the_job_exits_143(tmp_path, short_tmp):
    script = write(tmp_path, "--tmp", str(short_tmp))
    code, output, calls = run_fake(tmp_path, script, stop_after=1)
    assert code == 143, output
    assert "platform got TERM" in calls and "clsr: SIGTERM: stopping the study with a true record" in output
    assert calls[-1] == "scancel --signal=TERM 4242"


def test_each_node_gets_free_distinct_ports_and_a_job_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    folder = slurm_node.job_folder(str(tmp_path))
    assert folder == tmp_path / f"clsr-{os.getuid()}" / "77-2"
    command, address = slurm_node.head_command("127.0.0.1", 4, 1, folder)
    ports = [int(flag.split("=")[1]) for flag in command if re.match(r"--[a-z-]*port=\d+$", flag)]
    assert len(ports) == len(set(ports)) == 7
    assert address == f"127.0.0.1:{command[4].split('=')[1]}" and command[4].startswith("--port=")
    assert "--dashboard-host=127.0.0.1" in command and "--num-gpus=1" in command
    worker = slurm_node.worker_command("127.0.0.1:6379", 4, 0, folder)
    assert "--address=127.0.0.1:6379" in worker and "--node-ip-address=127.0.0.1" in worker


def test_a_node_writes_the_address_once_ray_runs_and_removes_its_folder(tmp_path, monkeypatch):
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (fakes / "ray").write_text(
        "#!/bin/bash\necho \"Ray runtime started.\"\ntrap 'kill $!; exit 0' TERM\nsleep 60 & wait\n"
    )
    (fakes / "ray").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakes}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    private = tmp_path / f"clsr-{os.getuid()}"
    earlier = private / "78-0"  # left by this job's attempt before a requeue (SIGKILLed)
    earlier.mkdir(parents=True)
    other_job = private / "780-0"
    other_job.mkdir()
    folder = private / "78-1"
    code = subprocess.Popen(
        [sys.executable, "-c", f"from clsr.cluster.slurm_node import run_node; run_node('head', 2, 0, {str(tmp_path)!r}, ip='127.0.0.1')"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (folder / "address").exists():
        assert time.monotonic() < deadline and code.poll() is None
        time.sleep(0.05)
    assert re.fullmatch(r"127\.0\.0\.1:\d+\n", (folder / "address").read_text())
    assert not earlier.exists() and other_job.exists()
    code.send_signal(signal.SIGTERM)
    assert code.wait(timeout=30) == 0
    assert not folder.exists()


def test_resume_or_run_starts_a_study_with_no_earlier_run(monkeypatch, capsys, tmp_path):
    from clsr.study.control import driver_link
    from clsr.study.record import parent as record
    from clsr.study.run import runner

    calls = []

    def fake_run_study(study, text, resume=False, allow_changes=False, new=False, **_):
        calls.append(resume)
        if resume:
            raise record.NoEarlierRun("no earlier run of study 'smoke'")
        return record.StudyOutcome(rows=[])

    link = driver_link.DriverLink(str(tmp_path / "link"))  # as the supervisor's child
    monkeypatch.setattr(driver_link.DriverLink, "from_environment", classmethod(lambda cls: link))
    monkeypatch.setattr(runner, "run_study", fake_run_study)
    assert main(["study", "resume", str(SMOKE), "--or-run"]) == 0
    assert calls == [True, False] and "starting it (--or-run)" in capsys.readouterr().out
    calls.clear()
    assert main(["study", "resume", str(SMOKE)]) == 2  # without --or-run: the error, as before
    assert calls == [True] and "no earlier run of study 'smoke'" in capsys.readouterr().err


def test_a_node_offers_ray_what_slurm_granted(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert slurm_node.granted(8, 4) == (8, 4)  # outside a step: what the script asked for
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert slurm_node.granted(8, 4) == (6, 2)
    assert slurm_node.granted(8, 0) == (6, 0)  # a CPU job's GPUs are not Ray's


def test_the_job_asks_slurm_for_gpus_only_when_the_trials_need_them(tmp_path):
    out = tmp_path / "job.sbatch"
    assert main(["cluster", "sbatch", str(SMOKE), "--out", str(out)]) == 0  # the smoke study: CPUs only
    assert "--gpus-per-task" not in out.read_text() and "--gpus 0" in out.read_text()
    args = ["cluster", "sbatch", str(SMOKE), "--set", "resources.gpus_per_worker=0.5", "--out", str(out)]
    assert main(args) == 0
    assert "#SBATCH --gpus-per-task=1" in out.read_text()
