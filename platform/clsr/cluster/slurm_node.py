"""One node's Ray inside a SLURM job: ``platform cluster slurm-node head|worker``, started by the batch
script that ``platform cluster sbatch`` writes (the head on the job's first node, a worker per other
node, each through ``srun``).

Each node's Ray gets what makes two jobs on one node independent: a temporary folder of its own
(``<tmp>/clsr-<uid>/<job>-<restart>``, removed when the node stops) and ports of its own, chosen free on
that node (Ray's defaults — GCS 6379, dashboard 8265, client 10001, agent 52365 — would collide). The
folder is inside the user's private folder (``clsr.runtime_dir``, rule 1: 0700, this user's, never a
link; a co-tenant's pre-made one is refused) and made new. The head writes its GCS address to
``<its folder>/address`` once ``ray start`` reports the runtime started: the batch script checks the
folders are this user's alone, then waits for that file before it starts workers and the driver.

Why not ``ray symmetric-run``: it ends with ``ray stop``, which stops every Ray of the user on the node
(another job's too), refuses a node where another Ray runs, and does not pass SIGTERM on to the study.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from clsr import runtime_dir
from clsr.cluster.ports import free_ports

READY_LINE = "Ray runtime started"
STOP_WAIT_S = 5


def job_folder(tmp: str) -> Path:
    """The node's Ray folder: unique per job and per requeue of it (a requeued job keeps its id), in the
    user's private folder under ``tmp`` (made when missing; ``UnsafeFolder`` when another user's)."""
    job = os.environ.get("SLURM_JOB_ID", "nojob")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    return runtime_dir.scratch(tmp) / f"{job}-{restart}"


def own_ports(ip: str, ports: list[int]) -> list[str]:
    """``ray start`` flags for the ports Ray would otherwise take at fixed defaults (four, chosen free)."""
    agent, metrics, runtime_env, agent_grpc = ports
    return [
        f"--node-ip-address={ip}",
        f"--dashboard-agent-listen-port={agent}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
    ]


def resources(cpus: int, gpus: int) -> list[str]:
    return [f"--num-cpus={cpus}", f"--num-gpus={gpus}"]


def head_command(ip: str, cpus: int, gpus: int, folder: Path) -> tuple[list[str], str]:
    """``ray start --head`` with free ports, the dashboard on loopback; returns it and the GCS address."""
    gcs, dashboard, client, *node_ports = free_ports(7)  # in one call: all distinct
    command = [
        "ray", "start", "--head", "--block", f"--port={gcs}", f"--temp-dir={folder}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}", "--disable-usage-stats",
        *own_ports(ip, node_ports), *resources(cpus, gpus),
    ]  # fmt: skip
    return command, f"{ip}:{gcs}"


def worker_command(address: str, cpus: int, gpus: int, folder: Path) -> list[str]:
    """``ray start --address`` from this node's address on the route to the head."""
    return [
        "ray", "start", "--block", f"--address={address}", f"--temp-dir={folder}", "--disable-usage-stats",
        *own_ports(route_ip(address.rsplit(":", 1)[0]), free_ports(4)), *resources(cpus, gpus),
    ]  # fmt: skip


def route_ip(head_ip: str) -> str:
    """This node's address on the way to the head (no packet is sent: a UDP socket only picks a route)."""
    if head_ip.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((head_ip, 9))
        return sock.getsockname()[0]


def granted(cpus: int, gpus: int) -> tuple[int, int]:
    """What SLURM gave this step (``SLURM_CPUS_PER_TASK``; the GPUs it made visible), else what the
    script asked for."""
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or cpus)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and gpus:
        gpus = len([device for device in visible.split(",") if device.strip()])
    return cpus, gpus


def run_node(role: str, cpus: int, gpus: int, tmp: str, ip: str = "", address: str = "") -> int:
    """Start this node's Ray and stay until it ends; SIGTERM and SIGINT stop it; the folder goes after."""
    asked = (cpus, gpus)
    cpus, gpus = granted(cpus, gpus)
    if (cpus, gpus) != asked:
        print(
            f"{role}: SLURM granted {cpus} CPUs and {gpus} GPUs (the script asked for {asked[0]} and {asked[1]})"
        )
    folder = job_folder(tmp)
    for earlier in folder.parent.glob(f"{folder.name.rsplit('-', 1)[0]}-*"):  # this job's, before a requeue
        shutil.rmtree(earlier, ignore_errors=True)  # the private folder holds only this user's
    runtime_dir.subfolder(folder.parent, folder.name, fresh=True)
    if role == "head":
        command, gcs_address = head_command(ip, cpus, gpus, folder)
    else:
        command, gcs_address = worker_command(address, cpus, gpus, folder), ""
    print(f"{role} on {socket.gethostname()}: {' '.join(command)}", flush=True)
    # a SIGTERM from here on stops Ray, even one that comes while Ray is being started
    started: list[subprocess.Popen] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: [_stop(ray, number) for ray in started] or sys.exit(143))
    # its own process group: Ray's GCS and raylet with it, so stopping the node stops all of them
    ray = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    started.append(ray)
    try:
        assert ray.stdout is not None
        for line in ray.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if gcs_address and READY_LINE in line:
                _write_address(folder, gcs_address)
        return ray.wait()
    finally:
        _stop(ray, signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)


def _stop(ray: subprocess.Popen, number: int) -> None:
    """The job is ending (SLURM kills what is left after its KillWait): no 30 s drain, then the folder goes."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(ray.pid, number)
    with contextlib.suppress(subprocess.TimeoutExpired):
        ray.wait(timeout=STOP_WAIT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(ray.pid, signal.SIGKILL)


def _write_address(folder: Path, gcs_address: str) -> None:
    """Whole or not at all: the batch script reads it the moment it appears."""
    partial = folder / "address.partial"
    with runtime_dir.open_private(partial, "w") as file:
        file.write(gcs_address + "\n")
    partial.replace(folder / "address")
