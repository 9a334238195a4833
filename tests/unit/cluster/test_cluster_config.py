"""Offline checks of ``cluster.yaml``, the Ray cluster launcher config (``ray up cluster.yaml``).

Ray's own validation runs first: ``prepare_config`` merges the file with Ray's AWS defaults
(``ray/autoscaler/aws/defaults.yaml``, read from disk: no AWS call, no credentials) and
``validate_config`` checks the result against ``ray/autoscaler/ray-schema.json``. Both are private
Ray API (``ray.autoscaler._private.util``), pinned with Ray itself. The AWS-specific bootstrap that
``ray up`` runs afterwards (key pairs, subnets, security groups, AMIs) needs AWS and is not run here.

Ray's schema lets any key through inside ``provider`` and inside each ``node_config`` (the latter is
passed to EC2 RunInstances as is), so a typo there only fails at launch, or is silently ignored.
``validate_cluster_config`` adds explicit checks for those keys.

The security settings are checked too: a pinned machine image, SSH open to one address only and no
security group Ray would create with its SSH-from-anywhere rule, loopback-only dashboard with token
authentication, one MLflow server on PostgreSQL, S3 instance profiles for the workers.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import ray
import yaml
from packaging.requirements import Requirement
from ray.autoscaler._private.aws import config as ray_aws_config
from ray.autoscaler._private.util import prepare_config, validate_config

REPO_ROOT = Path(__file__).resolve().parents[3]
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"

IMAGE_PATTERN = re.compile(r"^rayproject/ray:(?P<version>\d+\.\d+\.\d+)-py311-gpu$")
AMI_PATTERN = re.compile(r"^ami-[0-9a-f]{8,17}$")
INSTANCE_PROFILE_ARN = re.compile(r"^arn:aws:iam::[^:]+:instance-profile/[\w+=,.@-]+$")
# PyTorch's CUDA 12 wheel indexes (cu121, cu124, cu126, ...): CUDA 12 builds for the AMI's driver.
TORCH_CUDA12_INDEX = re.compile(r"--index-url[ =]https://download\.pytorch\.org/whl/cu12\d\b")
MLFLOW_PORT = 5000
SSH_PORT = 22
# The widest SSH source accepted: an office or VPN range, never the internet.
MIN_SSH_PREFIX = 16
COMMAND_KEYS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)

# Provider keys the AWS node provider and the autoscaler read (ray/autoscaler/_private/aws/*.py,
# ray/autoscaler/_private/constants.py); Ray's schema allows any key here.
AWS_PROVIDER_KEYS = frozenset(
    {
        "type",
        "region",
        "availability_zone",
        "cache_stopped_nodes",
        "use_internal_ips",
        "use_external_head_ip",
        "security_group",
        "key_pair",
        "aws_credentials",
        "cloudwatch",
        "disable_node_updaters",
        "disable_launch_config_check",
        "foreground_node_launch",
        "worker_liveness_check",
    }
)

# Top-level parameters of EC2 RunInstances (boto3 ``create_instances``) that a node_config may set,
# plus Ray's own ``SubnetIds`` (Ray turns it into ``SubnetId`` per launch). Left out on purpose:
# MinCount, MaxCount, ClientToken and DryRun, which Ray sets itself.
RUN_INSTANCES_PARAMS = frozenset(
    {
        "AdditionalInfo",
        "BlockDeviceMappings",
        "CapacityReservationSpecification",
        "CpuOptions",
        "CreditSpecification",
        "DisableApiStop",
        "DisableApiTermination",
        "EbsOptimized",
        "EnablePrimaryIpv6",
        "EnclaveOptions",
        "HibernationOptions",
        "IamInstanceProfile",
        "ImageId",
        "InstanceInitiatedShutdownBehavior",
        "InstanceMarketOptions",
        "InstanceType",
        "Ipv6AddressCount",
        "Ipv6Addresses",
        "KernelId",
        "KeyName",
        "LaunchTemplate",
        "LicenseSpecifications",
        "MaintenanceOptions",
        "MetadataOptions",
        "Monitoring",
        "NetworkInterfaces",
        "NetworkPerformanceOptions",
        "Placement",
        "PrivateDnsNameOptions",
        "PrivateIpAddress",
        "RamdiskId",
        "SecurityGroupIds",
        "SecurityGroups",
        "SubnetId",
        "SubnetIds",
        "TagSpecifications",
        "UserData",
    }
)
MARKET_OPTIONS_KEYS = frozenset({"MarketType", "SpotOptions"})
BLOCK_DEVICE_KEYS = frozenset({"DeviceName", "Ebs", "NoDevice", "VirtualName"})
EBS_KEYS = frozenset(
    {
        "DeleteOnTermination",
        "Encrypted",
        "Iops",
        "KmsKeyId",
        "OutpostArn",
        "SnapshotId",
        "Throughput",
        "VolumeSize",
        "VolumeType",
    }
)

# Instance families with NVIDIA GPUs start with "g" or "p" (g5, g6e, p4d, p5, ...).
GPU_FAMILY = re.compile(r"^[gp]\d")
# (vCPUs, GPUs) of instance types this config uses or suggests, to catch stale `resources`.
KNOWN_INSTANCE_RESOURCES = {
    "m5.2xlarge": (8, 0),
    "g5.xlarge": (4, 1),
    "g5.2xlarge": (8, 1),
    "g5.12xlarge": (48, 4),
    "g5.48xlarge": (192, 8),
    "p4d.24xlarge": (96, 8),
}
UNSPECIFIED_HOSTS = {"0.0.0.0", "::", "[::]", "*", ""}


class ClusterConfigError(ValueError):
    """cluster.yaml is not a valid Ray cluster launcher config."""


def load_cluster_config(path: Path = CLUSTER_YAML) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def _unknown(keys: Any, allowed: frozenset[str]) -> list[str]:
    return sorted(set(keys) - allowed)


def _check_node_config(name: str, node_config: Any) -> list[str]:
    where = f"available_node_types.{name}.node_config"
    if not isinstance(node_config, dict):
        return [f"{where} must be a mapping"]
    errors = [
        f"{where}: {key!r} is not an EC2 RunInstances parameter"
        for key in _unknown(node_config, RUN_INSTANCES_PARAMS)
    ]
    if "InstanceType" not in node_config:
        errors.append(f"{where}: 'InstanceType' is missing")
    market = node_config.get("InstanceMarketOptions")
    if isinstance(market, dict):
        errors += [
            f"{where}.InstanceMarketOptions: unknown key {key!r}"
            for key in _unknown(market, MARKET_OPTIONS_KEYS)
        ]
    for i, mapping in enumerate(node_config.get("BlockDeviceMappings") or []):
        if not isinstance(mapping, dict):
            errors.append(f"{where}.BlockDeviceMappings[{i}] must be a mapping")
            continue
        errors += [
            f"{where}.BlockDeviceMappings[{i}]: unknown key {key!r}"
            for key in _unknown(mapping, BLOCK_DEVICE_KEYS)
        ]
        errors += [
            f"{where}.BlockDeviceMappings[{i}].Ebs: unknown key {key!r}"
            for key in _unknown(mapping.get("Ebs") or {}, EBS_KEYS)
        ]
    return errors


def validate_cluster_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Our checks of the keys Ray does not look at, then Ray's; returns Ray's prepared config.

    Raises ClusterConfigError whose message names the offending key.
    """
    errors: list[str] = []
    provider = raw.get("provider")
    if isinstance(provider, dict):
        errors += [
            f"provider: unknown key {key!r} (allowed: {', '.join(sorted(AWS_PROVIDER_KEYS))})"
            for key in _unknown(provider, AWS_PROVIDER_KEYS)
        ]
    node_types = raw.get("available_node_types")
    if not isinstance(node_types, dict) or not node_types:
        errors.append("available_node_types must list at least one node type")
        node_types = {}
    head = raw.get("head_node_type")
    if head not in node_types:
        errors.append(f"head_node_type {head!r} is not one of available_node_types {sorted(node_types)}")
    for name, node_type in node_types.items():
        if isinstance(node_type, dict):
            errors += _check_node_config(name, node_type.get("node_config"))
    if errors:
        raise ClusterConfigError("; ".join(errors))

    try:
        prepared = prepare_config(copy.deepcopy(raw))
        validate_config(prepared)
    except jsonschema.ValidationError as err:
        path = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        raise ClusterConfigError(f"Ray's schema rejects {path}: {err.message}") from err
    except (ValueError, KeyError, AssertionError, RuntimeError) as err:
        raise ClusterConfigError(f"Ray rejects the config: {err}") from err
    return prepared


def _resources(node_type: dict[str, Any]) -> dict[str, int]:
    return node_type.get("resources") or {}


def _worker_types(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]}


def _mlflow_server_commands(cfg: dict[str, Any]) -> list[str]:
    return [cmd for cmd in cfg["head_start_ray_commands"] if "mlflow server" in cmd]


def _all_commands(cfg: dict[str, Any]) -> list[str]:
    """Every shell command of the file: top-level lists and per-node-type overrides."""
    commands = [cmd for key in COMMAND_KEYS for cmd in cfg.get(key) or []]
    for node_type in cfg["available_node_types"].values():
        commands += [cmd for key in COMMAND_KEYS for cmd in node_type.get(key) or []]
    return commands


def _ray_start(commands: list[str]) -> str:
    (cmd,) = [c for c in commands if "ray start" in c]
    return cmd


def _exported_before_ray_start(cmd: str, assignment: str) -> bool:
    """``assignment`` (NAME=value) is exported in ``cmd`` ahead of its ``ray start``."""
    prefix = cmd[: cmd.index("ray start")]
    return any(
        re.search(rf"(^|\s){re.escape(assignment)}(\s|;|$)", part)
        for part in prefix.split(";")
        if part.strip().startswith("export ")
    )


def _ip_permissions(node: Any) -> list[dict[str, Any]]:
    """Every rule of every ``IpPermissions`` list anywhere in the config."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "IpPermissions":
                found += list(value)
            found += _ip_permissions(value)
    elif isinstance(node, list):
        for item in node:
            found += _ip_permissions(item)
    return found


def _rule_cidrs(rule: dict[str, Any]) -> list[str]:
    return [r["CidrIp"] for r in rule.get("IpRanges") or []] + [
        r["CidrIpv6"] for r in rule.get("Ipv6Ranges") or []
    ]


def _rule_ports(rule: dict[str, Any]) -> range:
    if str(rule.get("IpProtocol")) == "-1":
        return range(0, 65536)
    return range(rule.get("FromPort", 0), rule.get("ToPort", 65535) + 1)


def _env_default(value: str, name: str) -> str | None:
    """The default of ``${NAME:-default}``, or None when ``value`` is not that expansion."""
    match = re.fullmatch(rf"\$\{{{re.escape(name)}:-(?P<default>.+)\}}", value)
    return match["default"] if match else None


def _option(cmd: str, name: str) -> str | None:
    """The value of ``name`` in the ``mlflow server`` part of a shell command."""
    words = shlex.split(cmd[cmd.index("mlflow server") :])
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


@pytest.fixture(scope="module")
def cfg() -> dict[str, Any]:
    return load_cluster_config()


# ---- Ray's own validation -------------------------------------------------------------------


def test_ray_accepts_cluster_yaml(cfg):
    prepared = validate_cluster_config(cfg)
    assert prepared["cluster_name"] == "clsr"
    # prepare_config merged Ray's defaults and the setup commands the way `ray up` does.
    assert prepared["available_node_types"][cfg["head_node_type"]]["max_workers"] == 0
    assert prepared["head_setup_commands"][: len(cfg["setup_commands"])] == cfg["setup_commands"]


def test_provider_is_aws_us_west_2_and_reuses_stopped_nodes(cfg):
    provider = cfg["provider"]
    assert provider["type"] == "aws"
    assert provider["region"] == "us-west-2"
    assert provider["cache_stopped_nodes"] is True
    assert set(provider) <= AWS_PROVIDER_KEYS
    for zone in provider.get("availability_zone", "").split(","):
        assert zone.startswith(provider["region"]), zone


@pytest.mark.parametrize("node_type", ["head", "gpu_1x_a10g", "gpu_4x_a10g"])
def test_node_config_keys_are_run_instances_params(cfg, node_type):
    node_config = cfg["available_node_types"][node_type]["node_config"]
    assert _check_node_config(node_type, node_config) == []


# ---- image, nodes -----------------------------------------------------------------------------


def test_docker_image_is_pinned_to_the_installed_ray(cfg):
    docker = cfg["docker"]
    match = IMAGE_PATTERN.match(docker["image"])
    assert match, f"docker.image {docker['image']!r} is not rayproject/ray:<version>-py311-gpu"
    assert match["version"] == ray.__version__
    assert docker["container_name"]
    for override in ("head_image", "worker_image"):
        assert override not in docker, f"docker.{override} would run another Ray on some nodes"
    for name, node_type in cfg["available_node_types"].items():
        assert "worker_image" not in node_type.get("docker", {}), name


def test_image_ray_satisfies_the_project_pin(cfg):
    """Otherwise `pip install -e ~/clsr` would replace the image's Ray on the nodes."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    ray_reqs = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "ray"]
    assert ray_reqs, "pyproject.toml does not depend on ray"
    image_version = IMAGE_PATTERN.match(cfg["docker"]["image"])["version"]
    assert ray_reqs[0].specifier.contains(image_version)


def test_every_node_type_pins_the_same_machine_image(cfg):
    """Without ImageId Ray picks its built-in Deep Learning AMI, whose CUDA 11 driver is too old."""
    images = {name: t["node_config"].get("ImageId") for name, t in cfg["available_node_types"].items()}
    for name, image in images.items():
        assert isinstance(image, str) and AMI_PATTERN.match(image), f"{name}: ImageId {image!r}"
    assert len(set(images.values())) == 1, f"different AMIs per node type: {images}"


def test_head_has_cpus_but_no_gpu(cfg):
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert _resources(head).get("GPU") == 0
    assert _resources(head).get("CPU", 1) > 0, "the head runs the study driver and MLflow"
    assert not GPU_FAMILY.match(head["node_config"]["InstanceType"])
    assert "InstanceMarketOptions" not in head["node_config"], "the head must not be a spot instance"


def test_gpu_workers_autoscale_from_zero_on_spot(cfg):
    workers = _worker_types(cfg)
    gpu_workers = {n: t for n, t in workers.items() if _resources(t).get("GPU", 0) >= 1}
    assert gpu_workers, "no GPU worker node type"
    for name, node_type in workers.items():
        assert node_type["min_workers"] == 0, name
        assert 1 <= node_type["max_workers"] <= cfg["max_workers"], name
    for name, node_type in gpu_workers.items():
        node_config = node_type["node_config"]
        assert GPU_FAMILY.match(node_config["InstanceType"]), name
        assert node_config["InstanceMarketOptions"]["MarketType"] == "spot", name
    assert cfg["idle_timeout_minutes"] > 0


def test_stated_resources_match_the_instance_types(cfg):
    for name, node_type in cfg["available_node_types"].items():
        known = KNOWN_INSTANCE_RESOURCES.get(node_type["node_config"]["InstanceType"])
        if known is None:
            continue
        cpus, gpus = known
        resources = _resources(node_type)
        assert resources.get("CPU", cpus) == cpus, name
        assert resources.get("GPU", gpus) == gpus, name


# ---- network exposure ------------------------------------------------------------------------


def test_no_security_group_rule_is_open_to_the_internet(cfg):
    rules = _ip_permissions(cfg)
    assert rules, "no IpPermissions: the SSH rule is missing"
    for rule in rules:
        for cidr in _rule_cidrs(rule):
            assert cidr not in {"0.0.0.0/0", "::/0"}, rule
            assert ipaddress.ip_network(cidr, strict=False).prefixlen > 0, rule


def test_only_ssh_is_open_and_only_to_a_narrow_range(cfg):
    security_group = cfg["provider"]["security_group"]
    assert security_group["GroupName"]
    rules = security_group["IpPermissions"]
    ssh = [rule for rule in rules if SSH_PORT in _rule_ports(rule)]
    assert len(ssh) == 1, "one SSH rule"
    for rule in rules:
        assert rule["IpProtocol"] == "tcp", rule
        assert rule["FromPort"] == rule["ToPort"] == SSH_PORT, f"only SSH is reachable from outside: {rule}"
        assert not rule.get("UserIdGroupPairs") and not rule.get("PrefixListIds"), rule
        cidrs = _rule_cidrs(rule)
        assert cidrs, rule
        for cidr in cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            assert network.prefixlen >= MIN_SSH_PREFIX, f"SSH open to {cidr}"


def test_ray_adds_ssh_from_anywhere_to_any_group_it_creates(cfg):
    """Why every node type names its security group: IpPermissions cannot take Ray's rule away."""
    extended = cfg["provider"]["security_group"]["IpPermissions"]
    rules = ray_aws_config._create_default_inbound_rules({"sg-00000000"}, extended)
    assert {"CidrIp": "0.0.0.0/0"} in [r for rule in rules for r in rule.get("IpRanges", [])]
    assert all(rule in rules for rule in extended)


def test_every_node_type_names_one_security_group_so_ray_creates_none(cfg, monkeypatch):
    """With SecurityGroupIds on every node type Ray creates no group and adds no rule."""
    groups = {n: t["node_config"].get("SecurityGroupIds") for n, t in cfg["available_node_types"].items()}
    for name, ids in groups.items():
        assert ids and all(str(i).startswith("sg-") for i in ids), f"{name}: SecurityGroupIds {ids!r}"
    assert len({tuple(ids) for ids in groups.values()}) == 1, f"different groups per node type: {groups}"

    def no_aws(*args, **kwargs):
        raise AssertionError("Ray would call AWS to create or edit a security group")

    monkeypatch.setattr(ray_aws_config, "_resource", no_aws)
    monkeypatch.setattr(ray_aws_config, "_client", no_aws)
    prepared = validate_cluster_config(cfg)
    configured = ray_aws_config._configure_security_group(copy.deepcopy(prepared))
    for name, node_type in configured["available_node_types"].items():
        assert node_type["node_config"]["SecurityGroupIds"] == groups[name]
    # The negative control: one node type without SecurityGroupIds sends Ray to AWS.
    bad = copy.deepcopy(prepared)
    del bad["available_node_types"]["gpu_1x_a10g"]["node_config"]["SecurityGroupIds"]
    with pytest.raises(AssertionError, match="security group"):
        ray_aws_config._configure_security_group(bad)


def test_no_command_binds_all_interfaces(cfg):
    for cmd in _all_commands(cfg):
        assert "0.0.0.0" not in cmd, cmd
    head_start = _ray_start(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in shlex.split(head_start)


# ---- Ray token authentication ------------------------------------------------------------------


def test_token_auth_reaches_every_ray_start(cfg):
    head_start = _ray_start(cfg["head_start_ray_commands"])
    worker_start = _ray_start(cfg["worker_start_ray_commands"])
    token_paths = set()
    for cmd in (head_start, worker_start):
        # Exported in the command itself, not only in ~/.bashrc (the launcher overrides some variables).
        assert _exported_before_ray_start(cmd, "RAY_AUTH_MODE=token"), cmd
        token_paths.add(re.search(r"RAY_AUTH_TOKEN_PATH=(\S+?);", cmd)[1])
    (token_path,) = token_paths
    # Shells (`ray attach`, drivers, `ray status`) get the same settings from ~/.bashrc on every node.
    bashrc = " ".join(cmd for cmd in cfg["setup_commands"] if ">> ~/.bashrc" in cmd)
    assert "RAY_AUTH_MODE=token" in bashrc
    assert f"RAY_AUTH_TOKEN_PATH={token_path} " in bashrc


def test_the_token_is_shipped_from_the_users_machine_as_a_folder(cfg):
    head_start = _ray_start(cfg["head_start_ray_commands"])
    token_path = re.search(r"RAY_AUTH_TOKEN_PATH=(\S+?);", head_start)[1]
    assert token_path.startswith("$HOME/")
    folder, file_name = token_path.replace("$HOME/", "~/", 1).rsplit("/", 1)
    assert file_name == "auth_token"
    # A folder: Ray warns that single files bind-mounted into the container may miss updates.
    assert folder in cfg["file_mounts"], f"{folder} is not shipped by file_mounts"
    assert not cfg["file_mounts"][folder].endswith("auth_token")
    checks = [cmd for cmd in cfg["setup_commands"] if f"test -s {folder}/{file_name}" in cmd]
    assert checks and "exit 1" in checks[0], "a missing token stops `ray up` on the node"


# ---- IAM ---------------------------------------------------------------------------------------


def test_every_worker_type_has_an_instance_profile(cfg):
    """Workers write checkpoints to s3:// themselves; Ray gives an IAM role only to the head."""
    for name, node_type in _worker_types(cfg).items():
        profile = node_type["node_config"].get("IamInstanceProfile")
        assert profile and "Arn" in profile, f"{name}: no IamInstanceProfile.Arn"
        assert INSTANCE_PROFILE_ARN.match(profile["Arn"]), profile["Arn"]


# ---- project install, environment ------------------------------------------------------------


def test_project_is_synced_and_installed_on_every_node(cfg):
    assert cfg["file_mounts"]["~/clsr"] == "."
    assert ".gitignore" in cfg["rsync_filter"], "keeps .venv and local runs out of the sync"
    assert "pip install -e ~/clsr" in cfg["setup_commands"]
    for cmd in cfg["setup_commands"] + cfg["head_setup_commands"] + cfg["worker_setup_commands"]:
        if "pip install" in cmd and "torch" in cmd:
            assert re.search(r"torch==\d", cmd), f"unpinned torch install: {cmd}"


def test_torch_comes_from_a_cuda_12_wheel_index_before_the_project(cfg):
    setup = cfg["setup_commands"]
    torch_installs = [cmd for cmd in setup if re.search(r"pip install .*torch==", cmd)]
    assert len(torch_installs) == 1, torch_installs
    (cmd,) = torch_installs
    assert TORCH_CUDA12_INDEX.search(cmd), cmd
    assert setup.index(cmd) < setup.index("pip install -e ~/clsr"), "else the project pulls another torch"
    # The pinned torch satisfies the project's range, so `pip install -e` keeps it.
    pinned = re.search(r"torch==([\w.]+)", cmd)[1]
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    torch_reqs = [
        Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "torch"
    ]
    assert torch_reqs and torch_reqs[0].specifier.contains(pinned)


def test_drivers_on_the_head_join_the_cluster(cfg):
    head = " ".join(cfg["head_setup_commands"])
    assert "export RAY_ADDRESS=\\$(hostname -I | awk '{print \\$1}'):6379 " in head


def test_quiet_environment_on_every_node(cfg):
    common = " ".join(cfg["setup_commands"])
    assert "RAY_USAGE_STATS_ENABLED=0" in common
    assert "MLFLOW_DISABLE_TELEMETRY=true" in common
    # The launcher exports the laptop's usage-stats setting into the head's start commands.
    ray_start = next(cmd for cmd in cfg["head_start_ray_commands"] if "ray start --head" in cmd)
    assert ray_start.index("RAY_USAGE_STATS_ENABLED=0") < ray_start.index("ray start")


# ---- MLflow on the head -----------------------------------------------------------------------


def test_one_mlflow_server_on_the_private_ip_never_all_interfaces(cfg):
    commands = [cmd for cmd in _all_commands(cfg) if "mlflow server" in cmd]
    assert len(commands) == 1, "exactly one MLflow server"
    assert commands == _mlflow_server_commands(cfg), "started by head_start_ray_commands"
    (cmd,) = commands
    host = _option(cmd, "--host")
    assert host is not None, f"MLflow server without --host: {cmd}"
    assert host not in UNSPECIFIED_HOSTS, f"MLflow server bound to all interfaces: {cmd}"
    assert host == "$HEAD_IP"
    assert re.search(r"HEAD_IP=\$\(hostname -I \| awk '\{print \$1\}'\)", cmd)
    assert _option(cmd, "--port") == str(MLFLOW_PORT)
    assert _option(cmd, "--artifacts-destination"), cmd


def test_mlflow_backend_is_postgresql_without_a_password_in_the_uri(cfg):
    (cmd,) = _mlflow_server_commands(cfg)
    backend = _option(cmd, "--backend-store-uri")
    # Either a literal URI or ${CLSR_MLFLOW_BACKEND_URI:-<default>} (RDS overrides the default).
    uri = _env_default(backend, "CLSR_MLFLOW_BACKEND_URI") or backend
    assert "sqlite" not in backend
    assert uri.startswith("postgresql+psycopg://"), uri  # psycopg 3, installed on the head below
    parts = urlsplit(uri)
    assert parts.password is None, "the password belongs in the pgpass file, not on a command line"
    assert parts.hostname == "127.0.0.1", "the default is the PostgreSQL server on the head"
    # libpq reads the password from PGPASSFILE; the server's environment and the head's shells get it.
    assert "export PGPASSFILE=$HOME/mlflow/pgpass" in cmd
    assert "PGPASSFILE=\\$HOME/mlflow/pgpass" in " ".join(cfg["head_setup_commands"])
    assert any(re.search(r"pip install .*psycopg\[binary\]", c) for c in cfg["head_setup_commands"])
    for command in _all_commands(cfg):
        assert "PGPASSWORD" not in command, command


def test_postgresql_on_the_head_listens_on_loopback_with_a_private_password_file(cfg):
    (pg,) = [cmd for cmd in cfg["head_start_ray_commands"] if "initdb" in cmd]
    starts = cfg["head_start_ray_commands"]
    assert starts.index(pg) < starts.index(_mlflow_server_commands(cfg)[0]), "database first"
    assert pg.startswith('[ -n "${CLSR_MLFLOW_BACKEND_URI:-}" ] && exit 0;'), "skipped for RDS"
    assert "-c listen_addresses=127.0.0.1 " in pg
    assert "--auth=scram-sha-256" in pg, "password authentication, also over the local socket"
    assert "umask 077;" in pg, "the generated password file is created 0600"
    assert "secrets.token_urlsafe" in pg and "--pwfile=" in pg
    assert "echo" not in pg, "nothing of the password is printed into the launcher's output"
    # Debian's packaging must not start a second cluster of its own on port 5432.
    (install,) = [cmd for cmd in cfg["head_setup_commands"] if "apt-get install" in cmd]
    assert install.index("create_main_cluster = false") < install.index("--no-install-recommends postgresql;")


def test_mlflow_data_outlives_the_container(cfg):
    """Ray runs the container with --rm, and `ray down` stops it: MLflow's files go to a host volume."""
    mounts = [opt.split()[1] for opt in cfg["docker"]["head_run_options"] if opt.startswith("-v ")]
    host_dir, container_dir = next(m.split(":") for m in mounts if m.endswith(":/home/ray/mlflow"))
    # `ray up` runs only the top-level initialization_commands on the head, never the head type's own.
    assert f"mkdir -p {host_dir}" in cfg["initialization_commands"]
    assert "initialization_commands" not in cfg["available_node_types"][cfg["head_node_type"]]
    (pg,) = [cmd for cmd in cfg["head_start_ray_commands"] if "initdb" in cmd]
    assert "PGDATA=$HOME/mlflow/postgres;" in pg
    assert "export PGPASSFILE=$HOME/mlflow/pgpass;" in pg
    for cmd in _mlflow_server_commands(cfg):
        assert "$HOME/mlflow/" in _option(cmd, "--artifacts-destination")  # local fallback
    assert container_dir == "/home/ray/mlflow"  # $HOME/mlflow in the rayproject/ray image


def test_mlflow_port_is_not_opened_to_the_internet(cfg):
    rules = cfg["provider"].get("security_group", {}).get("IpPermissions", [])
    for rule in rules:
        assert not rule.get("FromPort", 0) <= MLFLOW_PORT <= rule.get("ToPort", -1), rule


def test_tracking_uri_points_every_node_at_the_head(cfg):
    head = " ".join(cfg["head_setup_commands"])
    assert f"MLFLOW_TRACKING_URI=http://\\$(hostname -I | awk '{{print \\$1}}'):{MLFLOW_PORT}" in head
    workers = " ".join(cfg["worker_setup_commands"])
    assert f"MLFLOW_TRACKING_URI=http://${{RAY_HEAD_IP}}:{MLFLOW_PORT}" in workers


# ---- stopping the previous MLflow server: only a group of this user's that runs MLflow -----------

# The command under test runs with `kill` replaced: it signals the test's own process group only and
# records any other target, so a command that would kill another group (or, as root, every process
# with `kill -- -1`) fails this test instead of doing it.
FENCED_KILL = """kill() {
  if [ "${@: -1}" = "-$TEST_GROUP" ]; then command kill "$@"; else echo "kill $*" >> "$OTHER_KILLS"; return 1; fi
}
"""


def _stop_command(path: Path, tmp_path: Path) -> tuple[str, Path]:
    """The start command that stops the last MLflow server, its pgid files moved into ``tmp_path``;
    the pgid file it reads."""
    starts = yaml.safe_load(path.read_text())["head_start_ray_commands"]
    (stop,) = [cmd for cmd in starts if 'kill -TERM -- "-$g"' in cmd]
    (named,) = re.findall(r"(?:for f in |f=)~/(\S+?/server\.pgid)", stop)  # in the home (HOME=tmp_path)
    (tmp_path / named).parent.mkdir(parents=True)
    return stop, tmp_path / named


def _process_group(argv0: str, user: int | None = None) -> subprocess.Popen:
    """A process group of its own (a ``sleep`` shown as ``argv0``), reaped as soon as it ends."""
    group = subprocess.Popen(
        [argv0, "300"], executable=shutil.which("sleep"), start_new_session=True, user=user, group=user
    )
    threading.Thread(target=group.wait, daemon=True).start()
    return group


@pytest.mark.parametrize("path", [CLUSTER_YAML, REPO_ROOT / "cluster.local.yaml"], ids=lambda p: p.name)
@pytest.mark.parametrize(
    ("argv0", "recorded", "stopped"),
    [
        ("mlflow server", "{pgid}", True),  # the server of the last `ray up`
        ("sleep", "{pgid}", False),  # some other group of this user's: a pgid file in /tmp is anyone's
        ("mlflow server", "0", False),  # -0: the command's own group
        ("mlflow server", "1", False),  # -1: every process the user may signal
        ("mlflow server", "0001", False),  # kill reads -0001 as -1 too
        ("mlflow server", "{pgid}x", False),
        ("mlflow server", "nobody's", False),  # the group of another user (run as root)
    ],
)
def test_stopping_mlflow_kills_only_a_group_of_this_users_that_runs_mlflow(
    tmp_path, path, argv0, recorded, stopped
):
    nobody = recorded == "nobody's"
    if nobody and os.geteuid() != 0:
        pytest.skip("starting another user's process needs root")
    stop, pgid_file = _stop_command(path, tmp_path)
    group = _process_group(argv0, user=65534 if nobody else None)
    other_kills = tmp_path / "other-kills"
    try:
        pgid_file.write_text(str(group.pid) if nobody else recorded.format(pgid=group.pid))
        env = {
            **os.environ,
            "HOME": str(tmp_path),
            "TEST_GROUP": str(group.pid),
            "OTHER_KILLS": str(other_kills),
        }
        ran = subprocess.run(["bash", "-c", FENCED_KILL + stop], env=env, start_new_session=True, timeout=60)
        assert ran.returncode == 0
        assert not other_kills.exists(), other_kills.read_text()
        if stopped:
            group.wait(timeout=10)
        else:
            time.sleep(0.5)
            assert group.poll() is None, "a process group that is not this user's MLflow was killed"
    finally:
        group.kill()


# ---- the validator rejects what Ray's schema lets through -------------------------------------


def _mutated(cfg: dict[str, Any], mutate) -> dict[str, Any]:
    bad = copy.deepcopy(cfg)
    mutate(bad)
    return bad


def _rename(mapping: dict[str, Any], old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        pytest.param(
            lambda c: _rename(c["provider"], "cache_stopped_nodes", "cache_stoped_nodes"),
            "cache_stoped_nodes",
            id="provider-typo",
        ),
        pytest.param(
            lambda c: _rename(
                c["available_node_types"]["gpu_1x_a10g"]["node_config"], "InstanceType", "InstanceTyp"
            ),
            "InstanceTyp",
            id="node-config-typo",
        ),
        pytest.param(
            lambda c: c["available_node_types"]["head"]["node_config"].update(SecurityGroupId=["sg-1"]),
            "SecurityGroupId",
            id="node-config-not-a-run-instances-param",
        ),
        pytest.param(
            lambda c: _rename(
                c["available_node_types"]["head"]["node_config"]["BlockDeviceMappings"][0]["Ebs"],
                "VolumeSize",
                "VolumSize",
            ),
            "VolumSize",
            id="ebs-typo",
        ),
        pytest.param(
            lambda c: c.update(head_node_type="ray.head.default"), "head_node_type", id="wrong-head-type"
        ),
        pytest.param(lambda c: c.update(idle_timeout_minute=5), "idle_timeout_minute", id="top-level-typo"),
        pytest.param(
            lambda c: c["available_node_types"]["gpu_1x_a10g"].update(min_worker=0),
            "min_worker",
            id="node-type-typo",
        ),
    ],
)
def test_validator_names_the_bad_key(cfg, mutate, named):
    with pytest.raises(ClusterConfigError, match=re.escape(named)):
        validate_cluster_config(_mutated(cfg, mutate))


def test_ray_alone_misses_typos_inside_provider_and_node_config(cfg):
    """Why the explicit checks exist: Ray's own validation accepts both typos."""
    bad = _mutated(cfg, lambda c: _rename(c["provider"], "cache_stopped_nodes", "cache_stoped_nodes"))
    bad["available_node_types"]["gpu_1x_a10g"]["node_config"]["InstanceTyp"] = "g5.xlarge"
    validate_config(prepare_config(bad))
