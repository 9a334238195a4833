"""Free TCP ports for servers started a moment later: the Ray nodes of a SLURM job
(``clsr.cluster.slurm_node``), and the loopback cluster and tests of a source checkout."""

from __future__ import annotations

import random
import socket
from pathlib import Path

SERVICE_PORTS_FROM = 20000  # above Ray's default worker ports


class NoFreePorts(RuntimeError):
    """Not enough free ports in the range drawn from; the message says which range."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on every interface for servers started a moment later (probed on
    the wildcard address, which a server bound to any one address holds: Ray's servers on a SLURM node
    listen on its own address too; nothing listens on the probe): held open together while chosen, so no two
    are the same (ports chosen one at a time, each closed before the next, may repeat or collide with a
    server's derived port; SeaweedFS's gRPC ports are therefore named, not left at HTTP port + 10000). Drawn
    at random from ``SERVICE_PORTS_FROM`` up to the kernel's ephemeral range, not from the port 0 hands out:
    that one is ephemeral, so until its server binds it a Ray process's own port 0 or any outgoing
    connection may take it (a test's MLflow server once lost its port to the Ray head started just before
    it). Ray's worker ports (10002-19999 by default) lie below the draw."""
    low, high = _ephemeral_range()
    candidates = (
        range(SERVICE_PORTS_FROM, low) if low - SERVICE_PORTS_FROM >= 1000 else range(high + 1, 65536)
    )
    if len(candidates) < 1000:  # the whole space is ephemeral: port 0, the kernel's choice, is all there is
        tries = [0] * count
    else:
        tries = random.SystemRandom().sample(candidates, min(len(candidates), 50 * count))
    chosen: list[socket.socket] = []
    try:
        for port in tries:
            sock = _probe(port)
            if sock is None:
                continue
            chosen.append(sock)
            if len(chosen) == count:
                return [sock.getsockname()[1] for sock in chosen]
        raise NoFreePorts(
            f"no {count} free TCP ports from {candidates.start} to {candidates.stop - 1}: "
            "stop what holds them and run this again"
        )
    finally:
        for sock in chosen:
            sock.close()


def _probe(port: int) -> socket.socket | None:
    """A socket bound to ``port`` on the wildcard address, or None where anything holds the port."""
    sock = socket.socket()
    try:
        sock.bind(("", port))
    except OSError:
        sock.close()
        return None
    return sock


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port 0 and outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return 32768, 60999
    return int(low), int(high)
