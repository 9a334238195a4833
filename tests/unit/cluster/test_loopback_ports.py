"""The loopback cluster's ports (``clsr_bench.loopback``, ports from ``clsr.cluster.ports``): every port a
server listens on is named and distinct.

CI once failed because SeaweedFS's S3 gRPC port (left at its default, the S3 HTTP port + 10000) was the
filer's HTTP port, chosen free a moment earlier: ``bind: address already in use``.
"""

from __future__ import annotations

import re
import socket

import pytest

from clsr.cluster import ports
from clsr.cluster.ports import free_ports
from clsr_bench import loopback
from clsr_bench.loopback import LoopbackCluster


def test_free_ports_are_distinct():
    for _ in range(20):
        ports = free_ports(12)
        assert len(set(ports)) == 12


class _Started(Exception):
    pass


def test_every_seaweedfs_port_is_named_and_distinct(tmp_path, monkeypatch):
    commands: list[list[str]] = []

    def spawn(self, name, cmd, env=None, umask=-1):
        commands.append(cmd)
        raise _Started

    monkeypatch.setattr(LoopbackCluster, "_spawn", spawn)
    monkeypatch.setattr(loopback.shutil, "which", lambda name: "/bin/true")
    with pytest.raises(_Started):
        LoopbackCluster(tmp_path)._object_store()
    ports = {
        flag: int(value)
        for flag, value in re.findall(r"^-([a-z0-9.]*port[a-z.]*)=(\d+)$", "\n".join(commands[0]), re.M)
    }
    servers = ("master", "volume", "filer", "s3")
    assert {f"{server}.port" for server in servers} | {f"{server}.port.grpc" for server in servers} <= set(
        ports
    )
    assert len(set(ports.values())) == len(ports), ports


def test_ray_node_ports_are_distinct():
    flags = loopback._node_ports()
    values = [flag.split("=")[1] for flag in flags]
    assert len(set(values)) == len(values) == 4


def test_free_ports_lie_below_the_ephemeral_range_and_above_rays_worker_ports(monkeypatch):
    """Port 0 hands out an ephemeral port, which a Ray process or an outgoing connection may take before
    the server chosen for it binds; the draw stays between Ray's worker ports and the ephemeral range
    (Linux's default range here: a host's own may leave no room, tested below)."""
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (32768, 60999))
    for port in free_ports(50):
        assert ports.SERVICE_PORTS_FROM <= port < 32768


def test_free_ports_fall_back_to_the_kernel_where_every_port_is_ephemeral(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 65535))
    chosen = free_ports(5)
    assert len(set(chosen)) == 5 and all(1024 <= port <= 65535 for port in chosen)


def test_free_ports_above_an_ephemeral_range_low_in_the_space(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (20500, 40000))
    assert all(40000 < port < 65536 for port in free_ports(10))


def test_a_port_held_on_another_address_is_not_free():
    """A server bound to one address (127.0.0.2 here, a SLURM node's own address there) holds its port:
    the wildcard probe sees it, where a probe on 127.0.0.1 would not."""
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        busy = held.getsockname()[1]
        assert ports._probe(busy) is None
        with socket.socket() as loopback_only:
            loopback_only.bind(("127.0.0.1", busy))  # what the probe was: it found the port free
    free = ports._probe(0)
    assert free is not None
    free.close()
