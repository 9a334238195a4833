"""deploy/kuberay: every manifest validates against KubeRay's own CRD schemas (offline), the RayJob runs a
shipped study that validates, credentials come from the Secret only, and the image is pinned and data-free."""

from __future__ import annotations

import copy
import re
import shlex
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from clsr.study.plan.load import load_study
from clsr.study.spec.dotted import parse_override

REPO_ROOT = Path(__file__).resolve().parents[3]
DEPLOY = REPO_ROOT / "deploy" / "kuberay"
CRDS = REPO_ROOT.parent / "shared" / "kuberay"  # KubeRay v1.7.0's CRDs, never copied into the project
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
SECRET_KEYS = {
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL",
}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path):
    return yaml.load(path.read_text(), Loader=Loader)


def without_k8s_extensions(node):
    """The schema minus Kubernetes' x-kubernetes-* keys, which are no JSON Schema keywords."""
    if isinstance(node, dict):
        return {k: without_k8s_extensions(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if isinstance(node, list):
        return [without_k8s_extensions(v) for v in node]
    return node


@cache
def validator(kind: str) -> jsonschema.Draft7Validator:
    """One validator per kind for the whole module: the CRD files are about 1 MB of YAML each."""
    if not CRDS.is_dir():
        pytest.skip(f"KubeRay's CRDs not found at {CRDS} (a checkout with ../shared/kuberay runs this test)")
    crd = load(CRDS / CRD_FILES[kind])
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(without_k8s_extensions(v1["schema"]["openAPIV3Schema"]))


def errors(manifest: dict) -> list[str]:
    found = validator(manifest["kind"]).iter_errors(manifest)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in found]


def manifest(name: str) -> dict:
    return load(DEPLOY / name)


RAY_MANIFESTS = ["raycluster.yaml", "rayjob.yaml"]


def cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def test_every_manifest_is_listed():
    shipped = sorted(p.name for p in DEPLOY.glob("*.yaml"))
    assert shipped == sorted([*RAY_MANIFESTS, "secret.example.yaml"])


@pytest.mark.parametrize("name", RAY_MANIFESTS)
def test_manifest_validates_against_the_kuberay_crd(name):
    doc = manifest(name)
    assert doc["apiVersion"] == "ray.io/v1"
    assert errors(doc) == []


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            lambda spec: spec["workerGroupSpecs"][0].update(minReplicas="two"),
            "'two' is not of type 'integer'",
        ),
        (lambda spec: spec["headGroupSpec"].pop("template"), "'template' is a required property"),
        (lambda spec: spec["authOptions"].update(mode="password"), "'password' is not one of"),
        (
            lambda spec: spec["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),
            "0 is not of type 'string'",
        ),
    ],
    ids=[
        "minReplicas-not-integer",
        "head-template-missing",
        "auth-mode-unknown",
        "rayStartParams-not-string",
    ],
)
@pytest.mark.parametrize("name", RAY_MANIFESTS)
def test_the_schema_check_bites(name, change, fragment):
    doc = copy.deepcopy(manifest(name))
    change(cluster_spec(doc))
    assert any(fragment in e for e in errors(doc)), errors(doc)


def test_the_rayjob_runs_on_the_rayclusters_shape():
    assert manifest("rayjob.yaml")["spec"]["rayClusterSpec"] == manifest("raycluster.yaml")["spec"]


@pytest.mark.parametrize("name", RAY_MANIFESTS)
def test_cluster_shape(name):
    spec = cluster_spec(manifest(name))
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"] == {"mode": "token"}  # KubeRay sets RAY_AUTH_MODE=token + RAY_AUTH_TOKEN
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert not any("gpu" in key for part in head["resources"].values() for key in part)
    (workers,) = spec["workerGroupSpecs"]
    assert workers["groupName"] == "gpu-workers"
    assert 0 <= workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"]
    resources = workers["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    from clsr.study.run.tune_compat import SUPPORTED_RAY  # pyproject.toml's range (a test holds it)

    assert SpecifierSet(SUPPORTED_RAY).contains(spec["rayVersion"])


def entrypoint_study_run() -> list[str]:
    """The `platform study run ...` command of the RayJob's entrypoint, as argv."""
    entrypoint = manifest("rayjob.yaml")["spec"]["entrypoint"]
    (command,) = [c for c in entrypoint.split("&&") if "platform study run" in c]
    argv = shlex.split(command)
    assert argv[:3] == ["platform", "study", "run"], entrypoint
    return argv[3:]


def test_the_rayjob_entrypoint_runs_a_study_that_validates():
    job = manifest("rayjob.yaml")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    assert job["ttlSecondsAfterFinished"] > 0
    study, *rest = entrypoint_study_run()
    overrides = [parse_override(value) for flag, value in zip(rest[::2], rest[1::2], strict=True)]
    assert set(rest[::2]) == {"--set"}
    assert (REPO_ROOT / study).is_file(), study
    loaded = load_study(REPO_ROOT / study, overrides)
    assert str(loaded.storage_path).startswith("s3://"), loaded.storage_path


@pytest.mark.parametrize("name", RAY_MANIFESTS)
def test_credentials_come_from_the_secret_only(name):
    secret = manifest("secret.example.yaml")
    assert secret["kind"] == "Secret"
    assert set(secret["stringData"]) == SECRET_KEYS
    spec = cluster_spec(manifest(name))
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            assert {"secretRef": {"name": secret["metadata"]["name"]}} in container["envFrom"]
            assert not SECRET_KEYS & {e["name"] for e in container.get("env", [])}
    text = (DEPLOY / name).read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    for key in SECRET_KEYS:  # not even the names: a value next to one would be a leak
        assert key not in code, key
    assert not re.search(r"AKIA[0-9A-Z]{16}|password\s*:", text, re.IGNORECASE)


def test_the_example_secret_holds_placeholders_only():
    values = manifest("secret.example.yaml")["stringData"]
    for key in (
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert re.fullmatch(r"<[a-z-]+>", values[key]), key
    assert "example.com" in values["MLFLOW_TRACKING_URI"]


def test_the_image_is_pinned_non_root_and_data_free():
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    (base,) = [line.split()[1] for line in instructions if line.startswith("FROM ")]
    image, _, tag = base.partition(":")
    assert tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+-", tag), base
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), users
    copied = [
        part for line in instructions if line.startswith(("COPY", "ADD")) for part in line.split()[1:-1]
    ]
    copied = [part for part in copied if not part.startswith("--")]
    assert "." not in copied and "./" not in copied  # never the whole checkout
    for folder in ("data", "mlruns", "runs", "mlartifacts", ".venv", "loopback-cluster"):
        assert not any(part.rstrip("/") == folder for part in copied), folder
    assert any(re.search(r"pip install .*\"\.\[", line) for line in instructions)
