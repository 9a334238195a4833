"""``platform cluster sbatch``: a SLURM batch script that runs one study on a Ray cluster made of the
job's allocation, in Ray's documented SLURM pattern (a head on the first node, a worker per other node
through ``srun``, the driver on the head).

What the script adds to that pattern, and why it is written here (neither Ray nor SLURM ships it):
- each node's Ray has a job-unique folder and free ports (``clsr.cluster.slurm_node``), so two jobs on
  one node never collide; one node keeps Ray on loopback; the dashboard stays on loopback; Ray's token
  is made per job and travels only in the job's environment;
- ``--signal=B:TERM@<grace>`` and ``--requeue``: a time limit, a preemption or ``scontrol requeue`` is
  the SIGTERM the study's record already survives (finished trials recorded, unfinished ones
  interrupted, exit 143), and a requeued job (``SLURM_RESTART_COUNT > 0``) resumes from checkpoints;
- credentials never enter the script: MLflow and S3 settings come from the environment ``sbatch``
  passes on (its default ``--export=ALL``).

Everything is checked before the file is written: the study (as ``platform study validate``), its
storage against the number of nodes, and its trials' resources against what the script asks for.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clsr.study.spec.schema import Study
from clsr.tracking.credentials import masked, secret_assignments

# SLURM's --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (hours may pass 24: 168:00:00), or no limit
TIME_FORMAT = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE")
# Ray's AF_UNIX sockets live at <tmp>/clsr-<uid>/<job>-<restart>/session_<date_time_us_pid>/sockets/plasma_store:
# about 85 characters beyond <tmp> (a uid of 3 digits), of the 107 a socket path may have
TMP_MAX_CHARS = 22
NAME_FORMAT = re.compile(r"^[A-Za-z0-9_.+-]+$")


class SbatchRequest(BaseModel):
    """What the batch script asks SLURM for (one task per node, so per-task equals per-node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(1, ge=0, le=64)
    cpus_per_node: int = Field(8, ge=1, le=4096)
    partition: str | None = None
    account: str | None = None
    time: str | None = Field(None, description="SLURM's time limit: MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED")
    grace_s: int = Field(120, ge=10, le=3600, description="seconds between SIGTERM and the time limit")
    setup: str = ""
    tmp: str = Field("/tmp", description="node-local folder for each node's Ray folder")

    @field_validator("partition", "account")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        if name is not None and not NAME_FORMAT.match(name):
            raise ValueError(f"{name!r}: letters, digits and . _ + - only")
        return name

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, limit: str | None) -> str | None:
        if limit is not None and not TIME_FORMAT.fullmatch(limit):
            raise ValueError(
                f"{limit!r}: allowed MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
            )
        return limit

    @field_validator("tmp")
    @classmethod
    def _absolute(cls, folder: str) -> str:
        most = TMP_MAX_CHARS - max(0, len(str(os.getuid())) - 3)  # the private folder's name has the uid
        if not folder.startswith("/") or len(folder) > most or any(c.isspace() for c in folder):
            raise ValueError(
                f"{folder!r}: an absolute folder of at most {most} characters, no spaces "
                f"(Ray's socket paths inside it may have 107)"
            )
        return folder.rstrip("/") or "/"


def time_limit_s(limit: str) -> int | None:
    """SLURM's ``--time`` in seconds (a lone number is minutes; ``D-H``, ``D-H:M``, ``H:M:S``, ``M:S``);
    None for no limit."""
    if limit in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, *parts
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def check_request(study: Study, request: SbatchRequest, source: str, overrides: list[str]) -> list[str]:
    """Problems that would make the job fail or waste its allocation, one line each (empty: fine)."""
    problems = []
    res, need = study.resources, max(study.resources.workers_per_trial, 1)
    if res.gpus_per_worker > request.gpus_per_node:
        problems.append(
            f"{source}: resources.gpus_per_worker {res.gpus_per_worker:g} does not fit a node of "
            f"--gpus-per-node {request.gpus_per_node}; ask for at least {res.gpus_per_worker:g}"
        )
    if res.cpus_per_worker > request.cpus_per_node:
        problems.append(
            f"{source}: resources.cpus_per_worker {res.cpus_per_worker:g} does not fit a node of "
            f"--cpus-per-node {request.cpus_per_node}"
        )
    if need * res.gpus_per_worker > request.nodes * request.gpus_per_node:
        problems.append(
            f"{source}: a trial needs {need * res.gpus_per_worker:g} GPUs (workers_per_trial x "
            f"gpus_per_worker); the job has {request.nodes * request.gpus_per_node}: raise --nodes or "
            f"--gpus-per-node"
        )
    if request.nodes > 1 and not _shared_storage(study.storage_path):
        problems.append(
            f"{source}: storage_path {study.storage_path!r} is a folder on one node, and the job has "
            f"{request.nodes} nodes: use s3://<bucket>/<prefix> or file:///<a folder every node mounts>"
        )
    limit_s = time_limit_s(request.time) if request.time else None
    if limit_s is not None and request.grace_s >= limit_s:
        problems.append(f"--grace {request.grace_s}: must be shorter than --time {request.time}")
    for what, value in [*(("--set", o) for o in overrides), ("--setup", request.setup), ("study", source)]:
        if "\n" in value or "\r" in value:  # a line break would end the #SBATCH block early
            problems.append(f"{what} {value!r}: no line breaks (separate shell commands with ;)")
        secrets = secret_assignments(value)
        if secrets:
            problems.append(
                f"{what} {masked(value)!r}: holds a credential ({', '.join(secrets)}); the script is a "
                f"file others may read: the job takes MLflow, S3 and hub logins from the environment "
                f"sbatch passes on (MLFLOW_TRACKING_TOKEN, AWS_SECRET_ACCESS_KEY, HF_TOKEN), never from it"
            )
    return problems


def _shared_storage(storage_path: str) -> bool:
    return (
        "://" in storage_path
        and not storage_path.startswith("file://")
        or storage_path.startswith("file:///")
    )


def notes(study: Study, request: SbatchRequest, environ: dict[str, str]) -> list[str]:
    """What is allowed but probably not meant."""
    lines = []
    if request.gpus_per_node and not study.resources.gpus_per_worker:
        lines.append(f"the study's trials ask for no GPU (resources.gpus_per_worker 0); the job asks for "
                     f"{request.gpus_per_node} per node")  # fmt: skip
    if not study.tracking_uri and not environ.get("MLFLOW_TRACKING_URI"):
        lines.append("MLFLOW_TRACKING_URI is not set here: set it before `sbatch` (the job inherits it), or "
                     "the study records to ./mlruns on the head node")  # fmt: skip
    return lines


def batch_script(
    study_file: str,
    study: Study,
    request: SbatchRequest,
    overrides: list[str],
    where: tuple[Path, Path],
    command: str = "platform cluster sbatch",
) -> str:
    """The batch script's text (see the module doc); ``where``: the project folder the job runs in and the
    folder for SLURM's log file; ``command``: what wrote it (its first comment says)."""
    project, output = where
    q = shlex.quote
    sets = "".join(f" --set {q(o)}" for o in overrides)
    resources = f"--cpus {request.cpus_per_node} --gpus {request.gpus_per_node}"
    directives = [
        f"--job-name=clsr-{study.name}",
        f"--nodes={request.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={request.cpus_per_node}",
        *([f"--gpus-per-task={request.gpus_per_node}"] if request.gpus_per_node else []),
        *([f"--partition={request.partition}"] if request.partition else []),
        *([f"--account={request.account}"] if request.account else []),
        *([f"--time={request.time}"] if request.time else []),
        "--requeue",
        f"--signal=B:TERM@{request.grace_s}",
        "--open-mode=append",
        f"--output={output}/%x-%j.out",
    ]
    return SCRIPT.format(
        name=study.name,
        command=command,
        directives="\n".join(f"#SBATCH {d}" for d in directives),
        grace=request.grace_s,
        project=q(str(project)),
        setup=request.setup or "# (no --setup: `platform` and `ray` must be on the PATH sbatch passes on)",
        tmp=q(request.tmp),
        resources=resources,
        study=q(study_file),
        sets=sets,
    )


SCRIPT = """\
#!/bin/bash
# The clsr study {name!r} as one SLURM job: a Ray head on the job's first node, a Ray worker on each
# other node, the study's driver on the head. Written by
#   {command}
# Submit:  sbatch <this file>     (MLflow and S3 settings and logins come from your environment)
# A time limit ({grace} s before it), a preemption or `scontrol requeue` sends SIGTERM: the study stops with
# a true record (finished trials kept, unfinished ones interrupted, exit 143); a requeued job resumes
# from the trials' checkpoints. After a time limit, `CLSR_RESUME=1 sbatch <this file>` resumes too.
{directives}
set -uo pipefail

stopping=0
driver=
trap 'stopping=1; echo "clsr: SIGTERM: stopping the study with a true record"; \\
      [[ -n $driver ]] && kill -TERM "$driver" 2>/dev/null' TERM

cd {project} || exit 1
{setup}

restart=${{SLURM_RESTART_COUNT:-0}}
ray_tmp={tmp}
private="$ray_tmp/clsr-$(id -u)"  # this user's alone (0700), made by slurm-node (clsr.runtime_dir)
head_folder="$private/$SLURM_JOB_ID-$restart"
own_folder() {{  # a real folder of this user's; with --private, one no one else can write either
    local folder=${{2:-$1}}
    [[ -d $folder && ! -L $folder && -O $folder ]] || return 1
    [[ $1 != --private ]] || (( (8#$(stat -c %a "$folder") & 8#022) == 0 ))
}}
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${{nodes[0]}}
# Slurm 22.05 and later: srun steps no longer inherit --cpus-per-task from the job; say it again
[[ -n ${{SLURM_CPUS_PER_TASK:-}} ]] && export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
if (( ${{#nodes[@]}} == 1 )); then
    head_ip=127.0.0.1  # one node: no address to look up
else  # the head's first IPv4 address other nodes can reach (not 127.x, which Debian maps its name to)
    head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --all-ip-addresses \
              | tr ' ' '\\n' | grep -v '^127\\.' | grep -m1 -E '^[0-9]+(\\.[0-9]+){{3}}$')
    if [[ -z $head_ip ]]; then
        echo "clsr: no IPv4 address other nodes can reach on $head_node (hostname --all-ip-addresses)" >&2
        exit 1
    fi
fi
# Ray's login for this job only: every srun step inherits it; it is never written to a file
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')
: "${{RAY_AUTH_TOKEN:?no python on the PATH to make the Ray token: check --setup}}"
export RAY_AUTH_TOKEN

steps=()
stop_ray() {{  # SIGTERM to the job's steps, not to this shell (srun's own would SIGKILL them at once)
    (( ${{#steps[@]}} )) && scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
    wait "${{steps[@]}}" 2>/dev/null
    rm -rf "$head_folder"
}}
srun --nodes=1 --ntasks=1 -w "$head_node" \\
    platform cluster slurm-node head --ip "$head_ip" {resources} --tmp "$ray_tmp" &
steps+=($!)
started=$SECONDS
until [[ -s $head_folder/address ]]; do  # the head writes it once Ray runs
    if (( stopping )) || ! kill -0 "${{steps[0]}}" 2>/dev/null || (( SECONDS - started > 300 )); then
        echo "clsr: the Ray head on $head_node did not start (its output is above)" >&2
        stop_ray
        exit $(( stopping ? 143 : 1 ))
    fi
    sleep 0.5
done
# Ray makes the head folder 0777: what no other user can write into is the private folder around it
if ! own_folder --private "$private" || ! own_folder "$head_folder" \
        || [[ -L $head_folder/address || ! -O $head_folder/address ]]; then
    echo "clsr: $head_folder is not this user's private folder (another user may have made it): not joining the Ray it names" >&2
    stop_ray
    exit 1
fi
export RAY_ADDRESS=$(<"$head_folder/address")
for node in "${{nodes[@]:1}}"; do
    srun --nodes=1 --ntasks=1 -w "$node" \\
        platform cluster slurm-node worker --address "$RAY_ADDRESS" {resources} --tmp "$ray_tmp" &
    steps+=($!)
done

if (( restart > 0 )) || [[ ${{CLSR_RESUME:-0}} == 1 ]]; then
    action=(resume --or-run)  # requeued: continue from the checkpoints (or start, if nothing was recorded)
else
    action=(run)
fi
echo "clsr: job $SLURM_JOB_ID (restart $restart) on ${{nodes[*]}}: platform study ${{action[*]}}" {study}
platform study "${{action[@]}}" {study}{sets} &
driver=$!
(( stopping )) && kill -TERM "$driver"
while :; do  # a trapped SIGTERM ends `wait` early: wait again until the driver has closed its record
    wait "$driver"
    status=$?
    kill -0 "$driver" 2>/dev/null || break
done
stop_ray
exit "$status"
"""
