"""``platform study reproduce``: one trial rebuilt from its study's record alone
(``clsr.study.analyse.reproduction``), this machine's environment checked against the one it recorded,
the trial trained again in this process (no Ray: ``clsr.train.loop.fit`` on one device, with the thread
count Ray gave the trial's worker), logged as a new MLflow run in the study's experiment tagged
``clsr.reproduction_of=<run id>`` (no parent run and no ``clsr.ablation``: the study's report never
counts it as a trial), and the two runs compared side by side (``clsr.study.analyse.reproduce``).
"""

from __future__ import annotations

import contextlib
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from clsr.study.analyse.drift import Drift, drift, drift_lines
from clsr.study.analyse.reproduce import (
    Comparison,
    compare_runs,
    distributions,
    package_differences,
    package_line,
)
from clsr.study.analyse.reproduction import (
    NotReproducible,
    RecordedTrial,
    changed_params,
    find_trial_run,
    rebuild,
)
from clsr.study.analyse.runs import Trial
from clsr.tracking.environment import ENV_ARTIFACTS
from clsr.tracking.escape import visible
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import (
    MAX_PARAM_LENGTH,
    close_run,
    flatten,
    resolve_tracking_uri,
    trial_run_name,
)

REPRODUCTION_TAG = "clsr.reproduction_of"  # the original trial's run id


class UnsentWrites(RuntimeError):
    """The reproduction's own MLflow writes did not all reach MLflow: its run cannot be compared."""


@dataclass(frozen=True)
class Reproduction:
    """``run_id`` and ``comparison``: None when only checked (``check_only``). ``drift``: whether the
    check found this machine's environment, code or data unlike the record's."""

    recorded: RecordedTrial
    drift: bool
    run_id: str | None = None
    comparison: Comparison | None = None


def reproduce(
    target: str,
    point: str | None = None,
    seed: int | None = None,
    tracking_uri: str | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    say: Callable[[str], None] = print,
    check_only: bool = False,
    log_model: bool = False,
    force: bool = False,
) -> Reproduction:
    """Rebuild, check, rerun and compare the trial ``target`` names (a child run id, or a study name with
    ``point`` and ``seed``); ``say`` gets the lines printed on the way (plain: escape them for where they
    go). ``check_only``: stop after the check (nothing trained, nothing written to MLflow); ``log_model``:
    log the reproduction's model as the trial did (``eval.log_model``; else not: a reproduction checks);
    ``force``: rerun even when the rebuilt configuration differs from the trial's logged params in more
    than the method file's hash (else ``NotReproducible``, before anything is checked or trained)."""
    if point is not None or seed is not None:  # a study name, or a file: its name and tracking_uri
        from clsr.study.analyse.frame import study_name_and_uri

        target, file_uri = study_name_and_uri(target)
        tracking_uri = tracking_uri or file_uri
    uri = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(uri)
    run = find_trial_run(client, uri, target, point, seed)
    with tempfile.TemporaryDirectory(prefix="clsr-reproduce-") as folder:
        recorded = rebuild(client, run, Path(folder))
        say(f"reproducing {recorded.ablation} {recorded.label} seed {recorded.seed} (run {recorded.run_id})")
        for key, logged, here in recorded.differences:
            say(f"configuration differs: {key} logged {logged[:200]!r}, rebuilt {here[:200]!r}")
        if not recorded.differences:
            say("configuration: the rebuilt one equals the trial's logged params")
        if not check_only and not force and (changed := changed_params(recorded)):
            raise NotReproducible(
                f"the rebuilt configuration differs from the trial's logged params in "
                f"{', '.join(changed)[:500]} (the record's resolved.yaml may predate an edited resume): "
                f"pass --force to rerun anyway"
            )
        if (workers := recorded.study.resources.workers_per_trial) > 1:
            say(
                f"note: the trial trained on {workers} workers (DDP); this rerun trains in one process, so its "
                f"batches and gathered negatives are not split as they were: expect no bitwise equality"
            )
        found, packages = check(recorded, client, Path(folder))
        say("this machine against the trial's record (A: the record, B: here):")
        for line in [*drift_lines(found), *([package_line(packages)] if packages is not None else [])]:
            say(f"  {line}")
        drifted = bool(recorded.differences or found.environment or found.code or found.data or packages)
        if check_only:
            return Reproduction(recorded, drifted)
        run_id = rerun(uri, recorded, Path(folder), log_model)
    again = client.get_run(run_id)
    comparison = compare_runs(as_trial(run, recorded), as_trial(again, recorded), rtol, atol)
    return Reproduction(recorded, drifted, run_id, comparison)


def check(
    recorded: RecordedTrial, client: MlflowClient, folder: Path
) -> tuple[Drift, list[tuple[str, str, str]] | None]:
    """This machine's environment and the data the trial would read here (its training rows and
    evaluation sets, hashed as the trial hashes them: ``clsr.train.data_record``) against the record;
    and the installed distributions against its ``environment/environment.txt`` (None: it has none)."""
    import torch

    from clsr.data.training import training_rows
    from clsr.tracking.environment import capture
    from clsr.train.data_record import data_params
    from clsr.train.outcome import is_evaluation_only

    config = recorded.config
    env = capture("cuda" if torch.cuda.is_available() else "cpu")
    here = env.params() | data_params(config, None if is_evaluation_only(config) else training_rows(config))
    found = drift([as_trial_params(recorded.run_id, recorded.params)], [as_trial_params("here", here)])
    lock = recorded_lock(client, recorded.run_id, folder)
    if lock is None:
        return found, None
    return found, package_differences(distributions(lock), distributions(env.lock_text()))


MAX_LOCK_BYTES = 2_000_000


def recorded_lock(client: MlflowClient, run_id: str, folder: Path) -> str | None:
    """The trial's ``environment/environment.txt`` (its first ``MAX_LOCK_BYTES``), or None."""
    try:
        local = client.download_artifacts(run_id, f"{ENV_ARTIFACTS}/environment.txt", str(folder / "lock"))
    except Exception:  # MLflow raises its own exception types per artifact store; none: a clsr before 55
        return None
    with open(local, "rb") as f:
        return f.read(MAX_LOCK_BYTES).decode("utf-8", errors="replace")


def as_trial_params(run_id: str, params: dict[str, str]) -> Trial:
    return Trial(run_id, "", "", None, "", {}, {}, 0, params)


def as_trial(run, recorded: RecordedTrial) -> Trial:
    """A run (the original or its reproduction) as the comparison reads it."""
    return Trial(
        run.info.run_id,
        recorded.ablation,
        recorded.label,
        recorded.seed,
        run.data.tags.get("clsr.status", "unknown"),
        dict(run.data.metrics),
        dict(run.data.tags),
        run.info.start_time or 0,
        dict(run.data.params),
    )


def rerun(uri: str, recorded: RecordedTrial, folder: Path, log_model: bool = False) -> str:
    """Train the rebuilt trial in this process, logged as a new run of the study's experiment; its id.
    Without ``log_model`` its model is not logged (``eval.log_model: false``: the results are the same,
    the weights' hash is still compared)."""
    from clsr.study.run.trial import failure_text, log_method_file, trial_params
    from clsr.tracking.run_logger import TrackingTarget
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    config = recorded.config
    if not log_model and config.eval.log_model:
        config = config.model_copy(update={"eval": config.eval.model_copy(update={"log_model": False})})
    client = MlflowClient(uri)
    name = trial_run_name(recorded.ablation, recorded.label, recorded.seed)
    tags = {
        REPRODUCTION_TAG: recorded.run_id,
        "clsr.reproduction.parent": recorded.parent_run_id,
        "clsr.reproduction.trial": f"{recorded.ablation}[{recorded.label}] seed={recorded.seed}",
        "clsr.method": recorded.config.method["name"],
        "clsr.status": "running",
    }
    run = client.create_run(
        recorded.experiment_id,
        run_name=f"reproduce {name}",
        tags={k: mask_uri(visible(v)) for k, v in tags.items()},
    )
    run_id = run.info.run_id
    study = {"ablation": recorded.ablation, "point": recorded.label, "seed": recorded.seed}
    params = [
        Param(k, mask_uri(str(v))[:MAX_PARAM_LENGTH])
        for k, v in flatten(trial_params(config) | {"study": study}).items()
    ]
    for start in range(0, len(params), 100):  # MLflow's per-request param limit
        client.log_batch(run_id, params=params[start : start + 100])
    log_method_file(uri, run_id, config)
    resources = recorded.study.resources
    # no system metrics: they measure the machine's load, which a reproduction does not compare
    tracking = TrackingTarget(uri, run_id, None, str(folder / "pending"))
    try:
        with _threads(max(1, round(resources.cpus_per_worker))):
            fit(config, LocalSession(folder / "checkpoints"), tracking=tracking)
    except Exception as err:
        close_run(uri, run_id, "failed", failure_text(err) + "\n" + "".join(traceback.format_exception(err)))
        raise
    try:
        send_kept(uri, run_id, folder / "pending", recorded.study.tracking_wait_s)
    except UnsentWrites as err:
        close_run(uri, run_id, "failed", str(err))
        raise
    close_run(uri, run_id, "finished")
    return run_id


def send_kept(uri: str, run_id: str, pending: Path, wait_s: float) -> None:
    """Send what the rerun left in its journal (``pending``: a temporary folder, gone with the command)
    before its run is compared, retried for up to ``wait_s``; ``UnsentWrites`` when any write did not
    reach MLflow (it did not answer, or refused one for good)."""
    from clsr.study.record.parent import wait_for_tracking
    from clsr.tracking.spool import PENDING

    if not pending.exists():
        return
    left = wait_for_tracking(uri, str(pending), wait_s)
    if left or (pending / PENDING / run_id).exists():  # still pending, or kept aside as refused
        raise UnsentWrites(
            f"the reproduction's MLflow writes did not all reach {mask_uri(uri)} (run {run_id}): its "
            f"results cannot be compared"
        )


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op threads as Ray gives a trial's worker (``OMP_NUM_THREADS`` = its CPUs): a sum split
    over another number of threads adds in another order, so its last bits may differ."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
