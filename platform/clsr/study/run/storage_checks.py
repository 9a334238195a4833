"""Checks a study makes of its storage and its Ray cluster before anything is recorded or started.

* An ``s3://`` (or any cloud) ``storage_path`` is written, read back and deleted once: a wrong endpoint, a
  missing bucket or bad credentials stop the study with the fix, not every trial at its first checkpoint.
* A local ``storage_path`` on a cluster whose nodes are on several hosts is refused: each node would write
  checkpoints to its own disk, where a retry on another node, a resumed study and a later stage cannot
  read them.
"""

from __future__ import annotations

import uuid

CLOUD_HINT = (
    "for an S3-compatible store set AWS_ENDPOINT_URL (e.g. http://127.0.0.1:8333), and AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY (or an instance profile on AWS); check that the bucket exists and that every "
    "node has the same settings"
)


class StorageError(RuntimeError):
    """The study's storage cannot hold its checkpoints; the message names the field and the fix."""


def is_cloud(storage_path: str) -> bool:
    return "://" in storage_path and not storage_path.startswith("file://")


def check_cloud_storage(study_name: str, storage_path: str) -> None:
    """Write, read back and delete a small object under ``storage_path`` (pyarrow's filesystem, as Ray
    Train's checkpoints use it); raise StorageError saying what to set when that fails."""
    import pyarrow.fs

    probe = f".clsr-probe-{uuid.uuid4().hex}"
    try:
        filesystem, root = pyarrow.fs.FileSystem.from_uri(storage_path)
        bucket = root.split("/", 1)[0]
        # some S3-compatible stores (SeaweedFS) create a missing bucket on the first write: a misspelt
        # bucket must be refused, not created
        if filesystem.get_file_info(bucket).type == pyarrow.fs.FileType.NotFound:
            raise StorageError(
                f"study {study_name}: storage_path {storage_path}: cannot write a checkpoint there (bucket "
                f"{bucket!r} does not exist: create it first, or check its name); {CLOUD_HINT}"
            )
        path = f"{root.rstrip('/')}/{probe}"
        with filesystem.open_output_stream(path) as out:
            out.write(b"clsr")
        with filesystem.open_input_stream(path) as back:
            read = back.read()
        filesystem.delete_file(path)
    except (OSError, ValueError, pyarrow.ArrowException) as err:
        reason = " ".join(str(err).split())[:300]
        raise StorageError(
            f"study {study_name}: storage_path {storage_path}: cannot write a checkpoint there ({reason}); "
            f"{CLOUD_HINT}"
        ) from err
    if read != b"clsr":
        raise StorageError(f"study {study_name}: storage_path {storage_path}: an object read back differs")


def cluster_hosts() -> set[str]:
    """The addresses of the alive nodes of the Ray cluster this process is connected to."""
    import ray

    return {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}


def check_local_storage_on_cluster(study_name: str, storage_path: str) -> None:
    """A local storage path is fine on one host (one node, or several nodes on one machine), never across
    hosts."""
    if is_cloud(storage_path) or storage_path.startswith("file://"):  # file://: a folder every node mounts
        return
    hosts = cluster_hosts()
    if len(hosts) > 1:
        raise StorageError(
            f"study {study_name}: storage_path {storage_path!r} is a local folder, but the Ray cluster spans "
            f"{len(hosts)} hosts ({', '.join(sorted(hosts))}): checkpoints written on one node could not be "
            f"read on another. Set storage_path: s3://<bucket>/<prefix> (or a folder every node mounts, "
            f"as file:///shared/path)"
        )
