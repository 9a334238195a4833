"""``platform cluster up|down|kill-node``: the loopback cluster (``clsr.cluster.loopback``) from a shell."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

DEFAULT_DIR = "loopback-cluster"


def add_cluster_parser(commands) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="a Ray head, worker nodes, PostgreSQL, an S3 store and an MLflow server on this machine (127.0.0.1)",
    ).add_subparsers(dest="action", required=True)
    up = cluster.add_parser("up", help="start the loopback cluster; prints how to use it")
    up.add_argument("--workers", type=int, default=2, help="Ray worker nodes (default 2)")
    up.add_argument("--cpus-per-node", type=int, default=1, help="CPUs each worker node offers (default 1)")
    up.add_argument("--wait", action="store_true", help="stay in the foreground; Ctrl-C stops the cluster")
    kill = cluster.add_parser("kill-node", help="SIGKILL one worker node's processes, as a lost machine")
    kill.add_argument("index", type=int, help="worker node index (0 = the first)")
    cluster.add_parser("down", help="stop everything `cluster up` started")
    for parser in cluster.choices.values():
        parser.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"the cluster's folder (default ./{DEFAULT_DIR})"
        )


def cmd_cluster(args: argparse.Namespace) -> int:
    from clsr.cluster.loopback import ENV_FILE, LoopbackCluster

    cluster = LoopbackCluster(args.dir)
    if args.action == "down":
        cluster.down()
        return 0
    if args.action == "kill-node":
        group = cluster.kill_node(args.index)
        print(f"killed worker node {args.index} (process group {group})")
        return 0
    env = cluster.up(workers=args.workers, cpus_per_node=args.cpus_per_node)
    env_file = Path(args.dir).resolve() / ENV_FILE
    print(
        f"\nRay {env['RAY_ADDRESS']} (dashboard {env['RAY_DASHBOARD']}), MLflow {env['MLFLOW_TRACKING_URI']}, "
        f"S3 {env['AWS_ENDPOINT_URL']} (bucket clsr)\n"
        f"  source {env_file}      # exports the addresses, the generated keys and MLflow's login (yours only)\n"
        f"  MLflow UI: log in as {env['MLFLOW_TRACKING_USERNAME']} with $MLFLOW_TRACKING_PASSWORD from that file\n"
        f"  platform study run studies/smoke.yaml --set storage_path=s3://clsr/runs\n"
        f"  platform cluster down --dir {args.dir}"
    )
    if not args.wait:
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        cluster.down()
    return 0


def _stop_on_sigterm(*_) -> None:
    """``--wait``: SIGTERM stops the cluster as Ctrl-C does."""
    raise KeyboardInterrupt
