"""``platform cluster up|down|kill-node``: the loopback cluster from a shell, from a source checkout only (its
code, ``benchmarks/clsr_bench/loopback.py``, is not in the wheel: ``clsr.checkout``); ``platform cluster
sbatch``: a SLURM batch script for a study (``clsr.cluster.sbatch``)."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

DEFAULT_DIR = "loopback-cluster"


def add_cluster_parser(commands) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="a loopback cluster on this machine (Ray nodes, PostgreSQL, S3, MLflow; from a source checkout); "
        "a SLURM batch script for a study",
    ).add_subparsers(dest="action", required=True)
    up = cluster.add_parser(
        "up", help="start the loopback cluster (from a source checkout); prints how to use it"
    )
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
    add_slurm_parsers(cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action == "sbatch":
        return cmd_sbatch(args)
    if args.action == "slurm-node":
        return cmd_slurm_node(args)
    from clsr.checkout import from_checkout

    loopback = from_checkout("clsr_bench.loopback", f"platform cluster {args.action}", "cluster")
    if loopback is None:
        return 2
    cluster = loopback.LoopbackCluster(args.dir)
    if args.action == "down":
        cluster.down()
        return 0
    if args.action == "kill-node":
        group = cluster.kill_node(args.index)
        print(f"killed worker node {args.index} (process group {group})")
        return 0
    env = cluster.up(workers=args.workers, cpus_per_node=args.cpus_per_node)
    env_file = Path(args.dir).resolve() / loopback.ENV_FILE
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


def add_slurm_parsers(cluster) -> None:
    sbatch = cluster.add_parser(
        "sbatch", help="write a SLURM batch script that runs a study on a Ray cluster of the job's nodes"
    )
    sbatch.add_argument("study", help="study YAML file (studies/<name>.yaml)")
    sbatch.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    sbatch.add_argument(
        "--gpus-per-node", type=int, default=None,
        help="GPUs per node (default: what one worker asks for, resources.gpus_per_worker rounded up; 0 when "
        "the trials ask for none)",
    )  # fmt: skip
    sbatch.add_argument("--cpus-per-node", type=int, default=8, help="CPUs per node (default 8)")
    sbatch.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    sbatch.add_argument("--account", help="SLURM account to charge")
    sbatch.add_argument(
        "--time", help="time limit: MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED (default: the partition's)"
    )
    sbatch.add_argument(
        "--grace",
        type=int,
        default=120,
        help="seconds before the time limit that SIGTERM comes (default 120)",
    )
    sbatch.add_argument(
        "--setup",
        default="",
        help='shell lines run first, e.g. "module load cuda; source .venv/bin/activate"',
    )
    sbatch.add_argument(
        "--tmp", default="/tmp", help="node-local folder for Ray's job folders (default /tmp)"
    )
    sbatch.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a study value, as for study run (written into the script: no credentials)",
    )  # fmt: skip
    sbatch.add_argument("--out", help="the script's path (default slurm/<study name>.sbatch; - prints it)")
    node = cluster.add_parser(
        "slurm-node", help="(run by the batch script) start this node's Ray in a SLURM job"
    )
    node.add_argument("role", choices=("head", "worker"))
    node.add_argument("--ip", default="127.0.0.1", help="the head's address")
    node.add_argument("--address", default="", help="a worker's head address (host:port)")
    node.add_argument("--cpus", type=int, required=True)
    node.add_argument("--gpus", type=int, required=True)
    node.add_argument("--tmp", default="/tmp")


def cmd_slurm_node(args: argparse.Namespace) -> int:
    from clsr.cluster.slurm_node import run_node

    return run_node(args.role, args.cpus, args.gpus, args.tmp, ip=args.ip, address=args.address)


def cmd_sbatch(args: argparse.Namespace) -> int:
    """Check everything, then write the script; a problem is a line naming the file or the flag."""
    import math
    import os
    import shlex
    import sys

    from pydantic import ValidationError

    from clsr.cluster.sbatch import SbatchRequest, batch_script, check_request, notes
    from clsr.study.plan.load import load_study
    from clsr.study.plan.sources import require_sources
    from clsr.study.spec.dotted import parse_override

    try:
        study = load_study(args.study, [parse_override(o) for o in args.overrides])
        require_sources(study, args.study)
    except ValueError as err:  # a StudyError, or an override that does not fit the file
        print(err, file=sys.stderr)
        return 2
    gpus = args.gpus_per_node
    if gpus is None:  # GPUs only when the trials need them: a CPU study never waits in a GPU queue
        gpus = math.ceil(study.resources.gpus_per_worker)
    try:
        request = SbatchRequest(
            nodes=args.nodes, gpus_per_node=gpus, cpus_per_node=args.cpus_per_node,
            partition=args.partition, account=args.account, time=args.time, grace_s=args.grace,
            setup=args.setup, tmp=args.tmp,
        )  # fmt: skip
    except ValidationError as err:
        for problem in err.errors():
            flag = "--" + str(problem["loc"][0]).removesuffix("_s").replace("_", "-")
            print(f"error: {flag}: {problem['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    if problems := check_request(study, request, args.study, args.overrides):
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    for line in notes(study, request, dict(os.environ)):
        print(f"note: {line}", file=sys.stderr)
    if args.out and ("\n" in args.out or "\r" in args.out):  # echoed into the script's header
        print(f"error: --out {args.out!r}: no line breaks", file=sys.stderr)
        return 2
    out = Path(args.out or f"slurm/{study.name}.sbatch")
    folder = Path.cwd() if args.out == "-" else out.resolve().parent
    if any(c.isspace() or c == "%" for c in str(folder)):  # #SBATCH lines are not shell: no quoting
        print(f"error: --out {args.out or out}: SLURM's log goes beside the script, and {folder} holds a "
              f"space or %; write the script to a folder without them", file=sys.stderr)  # fmt: skip
        return 2
    command = "platform " + " ".join(shlex.quote(a) for a in args.argv)
    text = batch_script(args.study, study, request, args.overrides, (Path.cwd(), folder), command)
    if args.out == "-":
        print(text, end="")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.chmod(0o700)
    print(
        f"wrote {out}\n  sbatch {out}      # then: squeue --me; tail -f {folder}/clsr-{study.name}-<job id>.out"
    )
    return 0
