"""The trials' resource request against what the Ray cluster has, before anything is recorded.

Ray queues a request no node can meet and waits for an autoscaler that may not exist: a study asking for
a GPU on a machine without one shows ``running`` forever, its only trace ("No available node types can
fulfill resource request") in the driver's log. This check says it in one line instead, before the record
starts: refused on the local Ray this driver starts (nothing will ever join it), said and waited for on a
cluster (its autoscaler may add the node).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clsr.study.spec.schema import Study, StudyError


@dataclass(frozen=True)
class Node:
    """What one Ray node offers (its totals: a study's own trials are what would use it)."""

    cpus: float
    gpus: float


def local_node() -> Node:
    """The local Ray this driver would start: the CPUs this process may use, the GPUs CUDA shows."""
    import torch

    return Node(cpus=float(len(os.sched_getaffinity(0))), gpus=float(torch.cuda.device_count()))


def cluster_nodes() -> list[Node]:
    """The alive nodes of the Ray cluster this process has joined."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return [Node(cpus=n["Resources"].get("CPU", 0.0), gpus=n["Resources"].get("GPU", 0.0)) for n in alive]


def unmet_request(study: Study, nodes: list[Node]) -> str | None:
    """Why no node (or not the whole cluster) can hold one of the study's trials, or None."""
    res = study.resources
    workers = max(res.workers_per_trial, 1)  # 0: the trial runs in its Tune process, with the same request
    ask = f"{res.cpus_per_worker:g} CPU and {res.gpus_per_worker:g} GPU per worker"
    have = _describe(nodes)
    if not any(n.cpus >= res.cpus_per_worker and n.gpus >= res.gpus_per_worker for n in nodes):
        return f"every trial asks for {ask}, and no node has that ({have})"
    if workers * res.cpus_per_worker > sum(n.cpus for n in nodes) or workers * res.gpus_per_worker > sum(
        n.gpus for n in nodes
    ):
        return f"every trial asks for {workers} workers of {ask}, more than the cluster has in all ({have})"
    return None


def _describe(nodes: list[Node]) -> str:
    if len(nodes) == 1:
        return f"this Ray has {nodes[0].cpus:g} CPUs and {nodes[0].gpus:g} GPUs"
    return (
        f"{len(nodes)} nodes, the largest with {max(n.cpus for n in nodes):g} CPUs and "
        f"{max(n.gpus for n in nodes):g} GPUs"
    )


def _what_to_do(study: Study) -> str:
    res = study.resources
    fixes = []
    if res.gpus_per_worker:
        fixes.append("resources.gpus_per_worker: 0 to train on CPUs")
    fixes.append("smaller resources.cpus_per_worker or workers_per_trial")
    fixes.append("RAY_ADDRESS set to a Ray cluster that has them (docs/clusters.md)")
    return "set " + ", or ".join(fixes)


def check_resources(study: Study, nodes: list[Node], local: bool) -> None:
    """StudyError when the local Ray cannot hold a trial; on a cluster, a line saying the study waits."""
    problem = unmet_request(study, nodes)
    if problem is None:
        return
    ablations = ", ".join(study.ablations)
    line = f"resources (ablations {ablations}): {problem}"
    if local:
        raise StudyError(study.name, [f"{line}; nothing would ever start: {_what_to_do(study)}"])
    print(f"warning: {line}; the trials wait until the cluster's autoscaler adds such a node (Ctrl-C stops)")


def no_gpu_note(study: Study) -> str | None:
    """For ``validate``: a study asking for GPUs, no ``RAY_ADDRESS``, and none here: it would be refused."""
    if not study.resources.gpus_per_worker or os.environ.get("RAY_ADDRESS"):
        return None
    if local_node().gpus >= study.resources.gpus_per_worker:
        return None
    return (
        f"resources.gpus_per_worker is {study.resources.gpus_per_worker:g} and this machine has "
        f"{local_node().gpus:g} GPUs (and no RAY_ADDRESS is set): `study run` here would refuse it; set resources.gpus_per_worker: 0 "
        f"(--set resources.gpus_per_worker=0) or RAY_ADDRESS to a cluster with GPUs"
    )
