"""A single-node SLURM on 127.0.0.1 for the tests: Debian's ``munged``, ``slurmctld`` and ``slurmd``,
started as root in a temporary folder (their own key, socket, state, spool, logs and ports), stopped by
pid. What runs here (../shared/docs/stack-notes.md, "SLURM on loopback"); accounting is off, so jobs are
read with ``scontrol show job``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from clsr.cluster.ports import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")


def why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "SLURM's daemons run as root here: run the tests as root (CI does)"
    for daemon in DAEMONS:
        if not (shutil.which(daemon) or Path("/usr/sbin", daemon).exists()):
            return f"{daemon} not found: apt-get install slurm-wlm munge"
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class LocalSlurm:
    """``up()`` starts the three daemons; ``env`` holds ``SLURM_CONF`` for the client commands."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self.pids: dict[str, Path] = {}
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}

    def up(self) -> LocalSlurm:
        for folder in ("munge", "state", "spool", "log", "run"):
            (self.root / folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._munge()
        self._conf()
        for daemon in ("slurmctld", "slurmd"):
            self._start(daemon, [_daemon(daemon), "-f", str(self.root / "slurm.conf")])
        self._wait_idle()
        return self

    def _munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.socket = self.root / "munge" / "munge.socket"
        self.pids["munged"] = self.root / "munge" / "munged.pid"
        subprocess.run(
            [_daemon("munged"), "--force", f"--key-file={key}", f"--socket={self.socket}",
             f"--pid-file={self.pids['munged']}", f"--log-file={self.root / 'munge' / 'munged.log'}",
             f"--seed-file={self.root / 'munge' / 'munged.seed'}"],
            check=True, capture_output=True,
        )  # fmt: skip

    def _conf(self) -> None:
        ctld_port, slurmd_port = free_ports(2)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2
        r = self.root
        lines = [
            "ClusterName=clsrtest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.socket}",
            "CredType=cred/munge",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobRequeue=1",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",
            "KillWait=30",
            "InactiveLimit=0",
            "MinJobAge=3600",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={memory} State=UNKNOWN",
            f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        (r / "slurm.conf").write_text("\n".join(lines) + "\n")
        self.pids["slurmctld"] = r / "run" / "slurmctld.pid"
        self.pids["slurmd"] = r / "run" / "slurmd.pid"

    def _start(self, name: str, cmd: list[str]) -> None:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"{name} failed ({done.returncode}): {done.stderr or done.stdout}\n{self.logs()}"
            )

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM node never became idle (sinfo: {state!r})\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
            for log in (self.root / "log").glob("*.log")
        )

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check)

    def submit(self, script: Path, *options: str, env: dict[str, str] | None = None) -> int:
        done = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env={**(env or os.environ), "SLURM_CONF": self.env["SLURM_CONF"]},
            capture_output=True, text=True, check=True, cwd=script.parent,
        )  # fmt: skip
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, Restarts, ...)."""
        text = self.run("scontrol", "show", "job", str(job_id), "-o", check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_state(self, job_id: int, states: set[str], timeout: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(1)
        raise TimeoutError(f"job {job_id} never reached {states}: {self.job(job_id)}\n{self.logs()}")

    def down(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.pids.get(name)
            if pid_file is None or not pid_file.exists():
                continue
            pid = int(pid_file.read_text().split()[0])
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
