"""Where a training loop runs: inside Ray Train (workers, DDP, reports to Tune) or in this process."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clsr.runtime.distributed import rank, world_size
from clsr.train.staging import staging_folder


class _OneDevice:
    """One process on one device: rank 0 of 1, the model moved to the GPU if there is one."""

    rank = property(lambda self: 0)
    world_size = property(lambda self: 1)
    gpu_share = 1.0  # the fraction of its GPU a worker holds (cost accounting)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def wait_for_upload(self) -> None:
        """Nothing is copied in the background here."""


class LocalSession(_OneDevice):
    """Single process, no Ray: unit tests and quick local runs. Reports are kept in a list."""

    def __init__(self, checkpoint_root: str | Path | None = None):
        self.reports: list[dict[str, Any]] = []
        if checkpoint_root is None:  # a temporary root, removed with this session (or at exit)
            self._temporary = tempfile.TemporaryDirectory(prefix="clsr-local-")
            checkpoint_root = self._temporary.name
        self.checkpoint_root = Path(checkpoint_root)
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        self.latest: Path | None = None

    def restored(self) -> contextlib.AbstractContextManager[Path | None]:
        """The latest checkpoint folder of this session (its own: nothing to copy or remove)."""
        return contextlib.nullcontext(self.latest)

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint_dir is not None:
            target = self.checkpoint_root / f"step_{metrics.get('step', len(self.reports))}"
            shutil.move(checkpoint_dir, target)
            self.latest = target


class RayTrainSession:
    """Inside ``TorchTrainer``: every worker reports; rank 0 attaches the checkpoint. With
    ``upload_async`` Ray copies it to the study's storage on a background thread and removes the local
    folder once copied (``CheckpointUploadMode.ASYNC``: reports reach Tune in order, a checkpoint counts
    only once copied, and the worker's end waits for the copies); otherwise the step waits for the copy."""

    rank = property(lambda self: rank())
    world_size = property(lambda self: world_size())
    gpu_share = 1.0

    def __init__(self, upload_async: bool = True):
        self.upload_async = upload_async
        self._uploading: Path | None = None  # the folder Ray is copying in the background

    def wait_for_upload(self, limit_s: float = 3600.0, poll_s: float = 0.05) -> None:
        """Before the next checkpoint is written: until Ray has copied the last one (it removes the folder
        then), so that at most one checkpoint waits on this machine's disk and Tune's view lags by at
        most one. Past ``limit_s`` (Ray could not remove the folder) it goes on with a warning."""
        started = time.monotonic()
        while self._uploading is not None and self._uploading.exists():
            if time.monotonic() - started > limit_s:
                warnings.warn(f"{self._uploading} is still there after {limit_s:.0f} s", stacklevel=2)
                break
            time.sleep(poll_s)
        self._uploading = None

    @property
    def device(self) -> torch.device:
        import ray.train.torch

        return ray.train.torch.get_device()

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def restored(self) -> contextlib.AbstractContextManager[Path | None]:
        import ray.train

        return _local_copy(ray.train.get_checkpoint())

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None = None) -> None:
        """Every session's ``report`` takes the checkpoint folder: the caller leaves it alone afterwards."""
        import ray.train

        checkpoint = _checkpoint(ray.train.Checkpoint, checkpoint_dir)
        if self.upload_async:  # Ray removes the folder once it is copied
            mode = ray.train.CheckpointUploadMode.ASYNC
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode)
            self._uploading = checkpoint_dir or self._uploading
            return
        ray.train.report(metrics, checkpoint=checkpoint)
        if checkpoint_dir is not None:  # copied to the study's storage
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


class TuneTrialSession(_OneDevice):
    """Ray Train local mode (``num_workers=0``): the loop runs in the Tune trial's own process, one
    device, no DDP. Ray's Train context is not available inside a Tune function, so the model is placed
    here (Ray has set ``CUDA_VISIBLE_DEVICES`` for the trial), and reports and checkpoints go to Tune."""

    def restored(self) -> contextlib.AbstractContextManager[Path | None]:
        import ray.tune

        return _local_copy(ray.tune.get_checkpoint())

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None = None) -> None:
        import ray.tune

        ray.tune.report(metrics, checkpoint=_checkpoint(ray.tune.Checkpoint, checkpoint_dir))
        if checkpoint_dir is not None:  # copied to the study's storage
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


@contextlib.contextmanager
def _local_copy(checkpoint: Any) -> Iterator[Path | None]:
    """A Ray checkpoint (possibly on remote storage) copied to a temporary local folder, or None; the
    copy (a model, its optimiser state and the best weights: GBs for BERT-large) is removed on exit."""
    if checkpoint is None:
        yield None
        return
    folder = staging_folder("restore")
    try:
        yield Path(checkpoint.to_directory(str(folder)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cap_gpu_memory(share: float, device: torch.device) -> float | None:
    """A trial holding a fraction of a GPU (``gpus_per_worker`` < 1: several trials packed on one card) may
    allocate only that fraction of the card's memory: PyTorch's caching allocator then raises an
    out-of-memory error in this trial instead of taking the memory the others were promised (Ray shares
    the card by its bookkeeping only). Returns the fraction set, or None (a whole GPU, or none)."""
    if device.type != "cuda" or share >= 1:
        return None
    # an index, not torch.device("cuda"): PyTorch refuses a CUDA device without one
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(share, index)
    return share


def _checkpoint(kind: Any, checkpoint_dir: Path | None) -> Any:
    """``kind``: Train's or Tune's Checkpoint class (each API accepts only its own)."""
    return kind.from_directory(str(checkpoint_dir)) if checkpoint_dir else None


def node_tags() -> dict[str, str]:
    """Where this process runs, for the trial's MLflow run: the host, and on Ray the node's id and address
    (several nodes can share a host, as on the loopback cluster)."""
    import socket

    tags = {"clsr.host": socket.gethostname()}
    with contextlib.suppress(ImportError):
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            tags |= {"clsr.node_id": context.get_node_id(), "clsr.node_ip": ray.util.get_node_ip_address()}
    return tags
