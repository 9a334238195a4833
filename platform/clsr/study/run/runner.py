"""Run a study on Ray Tune: plan its waves of trials, build their shared inputs once, and run each wave
as a Tune experiment (``clsr.study.run.trial.run_trial`` per trial) while ``clsr.study.record.parent`` keeps the
MLflow record and ``clsr.study.control.interrupt`` turns Ctrl-C, SIGTERM and the study's time limit into a
graceful, truthful stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient

from clsr.study.control.driver_link import NO_LINK, DriverLink
from clsr.study.control.interrupt import Interrupted, Interrupts
from clsr.study.plan.distinct import also_keys, merge_identical, run_keys
from clsr.study.plan.resolve import (
    UpstreamMissing,
    grid_points,
    missing_upstream,
    resolve_trial,
    trial_document,
)
from clsr.study.plan.study_plan import StudyPlan, plan_study
from clsr.study.record.lease import Lease
from clsr.study.record.parent import (
    StudyOutcome,
    attach_labels,
    close_lost_trials,
    close_study,
    give_up,
    replay,
    skip_blocked,
    start_record,
    superseded_at,
    take_over,
)
from clsr.study.run.storage_checks import check_cloud_storage, check_local_storage_on_cluster, is_cloud
from clsr.study.run.trial import StudyContext, key_of, run_trial
from clsr.study.run.tune_state import repair_before_restore
from clsr.study.spec.schema import Outputs, Study, StudyError
from clsr.tracking.patient import PatientClient
from clsr.tracking.study_runs import (
    SUPERSEDED_TAG,
    check_reachable,
    children,
    finished_outputs,
    resolve_tracking_uri,
)

if TYPE_CHECKING:
    from clsr.config.trial import TrialConfig

# Tune's driver function only waits on the Train workers: it holds no CPU, and it runs on the head node
# (Ray's built-in head resource; a token share of it), with Train's controller beside it: a lost worker
# machine takes Train workers with it, which Train restarts from the last checkpoint, never a trial's driver.
DRIVER_SHARE = 0.001
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
    # short in-process trials checkpoint often; Tune's "snapshotting may become a bottleneck" is noise here
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
}


@dataclass
class Console:
    """What one study command's driver holds for its terminal, passed down from the command (a
    ``platform study resume --or-run`` runs the study twice with one Console): ``quiet``, without
    --verbose where Ray's and Tune's output goes instead (a ``clsr.study.run.progress.DriverLog``);
    ``noted``, the notes already said; ``link``, the supervisor's (``DriverLink``). Two studies run in one
    process with their own Consoles share none of it."""

    link: DriverLink = NO_LINK
    quiet: Any = None
    noted: set[str] = field(default_factory=set)

    def note_once(self, line: str) -> None:
        if line not in self.noted:
            self.noted.add(line)
            print(line)


def refuse_unavailable(study: Study, unavailable: list[str] | tuple[str, ...]) -> None:
    """StudyError naming the points that cannot run here (unless the study skips them); else each
    skipped one said."""
    if unavailable and not study.skip_unavailable:
        hint = "fix the above, or set skip_unavailable: true (--set skip_unavailable=true) to run the rest"
        raise StudyError(study.name, [*unavailable, hint])
    for line in unavailable:
        print(f"skipped (not available here): {line.splitlines()[0]}")


def expand_trials(study: Study, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every grid point with each of its ablation's seeds: one entry per Tune trial."""
    return [{**p, "seed": seed} for p in points for seed in study.seeds_of(p["ablation"])]


def sampled_bases(study: Study, ablation: str) -> list[dict[str, Any]]:
    """A sampled ablation's base trial per seed: it stands for the samples when shared inputs are built."""
    return [{"ablation": ablation, "overrides": {}, "seed": seed} for seed in study.seeds_of(ablation)]


def ready_trials(
    study: Study, trials: list[dict[str, Any]], outputs: Outputs
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """The trials whose needs can be filled, and (trial, why not) for the others."""
    ready, blocked = [], []
    for trial in trials:
        if not study.ablations[trial["ablation"]].needs:
            ready.append(trial)
            continue
        try:
            resolve_trial(study, trial["ablation"], trial["overrides"], trial["seed"], outputs)
            ready.append(trial)
        except (UpstreamMissing, ValueError) as err:
            missing = missing_upstream(study, trial["ablation"], trial["seed"], outputs, trial["overrides"])
            reason = f"upstream trials without a checkpoint: {', '.join(missing)}" if missing else str(err)
            blocked.append((trial, reason))
    return ready, blocked


def prepare_shared(
    study: Study,
    trials: list[dict[str, Any]],
    outputs: Outputs | None = None,
    resolved: Callable[[dict[str, Any]], TrialConfig | None] | None = None,
) -> dict[str, Any]:
    """Build each distinct shared input (word table, tokenised corpus) once, as a Ray task.

    The results stay in Ray's object store; every trial fetches its own by key. A failure here stops
    the study before any trial starts, with the builder's own message. ``resolved``: as ``shared_inputs``.
    """
    import ray

    wanted = shared_inputs(study, trials, outputs, resolved)
    if not wanted:
        return {}
    res = study.resources
    build = ray.remote(_build_shared).options(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker)
    print(f"preparing {len(wanted)} shared input set(s) once for the trials that use them ...")
    started = time.perf_counter()
    refs = {key: build.remote(trial) for key, trial in wanted.items()}
    ray.wait(list(refs.values()), num_returns=len(refs), fetch_local=False)
    for ref in refs.values():  # surface a builder's error now, not in every trial
        ray.get(ref)
    print(f"shared inputs ready in {time.perf_counter() - started:.0f} s")
    return {key: [ref] for key, ref in refs.items()}


def shared_inputs(
    study: Study,
    trials: list[dict[str, Any]],
    outputs: Outputs | None = None,
    resolved: Callable[[dict[str, Any]], TrialConfig | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """shared_key -> the config of the first trial that needs it: one build per distinct key.
    ``resolved``: a trial's configuration when the study plan holds it (``StudyPlan.config_of``)."""
    from clsr.methods import build_method
    from clsr.train.outcome import is_evaluation_only

    wanted: dict[str, dict[str, Any]] = {}
    for t in trials:  # a sampled ablation's entry holds its base (overrides: {}); samples share it
        trial = resolved(t) if resolved is not None else None
        if trial is None:
            trial = resolve_trial(study, t["ablation"], t["overrides"], t["seed"], outputs or {})
        key = build_method(trial).shared_key(trial)
        if key is not None and not is_evaluation_only(trial):  # it trains nothing with the input
            wanted.setdefault(key, trial.model_dump())
    return wanted


def _build_shared(trial_doc: dict[str, Any]) -> Any:
    from clsr.config.trial import TrialConfig
    from clsr.methods import build_method

    trial = TrialConfig.model_validate(trial_doc)
    return build_method(trial).prepare_shared(trial)


def param_space(
    study: Study, ablation: str | None, trials: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Grids go through Tune's own variant generator (one entry per point and seed); spaces become
    Tune distributions."""
    from ray import tune

    if ablation is None:  # grid: the given trials, or every point of every ablation × its seeds
        if trials is None:
            points = [{"ablation": name, **p} for name, a in study.ablations.items() for p in grid_points(a)]
            trials = expand_trials(study, points)
        return {"point": tune.grid_search(trials)}
    from clsr.study.run.search import seed_space

    space = {key: _distribution(d) for key, d in study.ablations[ablation].space.items()}
    return {
        "point": {
            "ablation": ablation,
            "label": None,
            "overrides": space,
            "paper": {},
            "seed": seed_space(study, ablation),  # random: a grid over the seeds; optuna: SeedRepeater's
        }
    }


def _distribution(dist) -> Any:
    from ray import tune

    if dist.uniform:
        return tune.uniform(*dist.uniform)
    if dist.loguniform:
        return tune.loguniform(*dist.loguniform)
    if dist.randint:
        return tune.randint(dist.randint[0], dist.randint[1] + 1)  # inclusive upper bound in study files
    return tune.choice(dist.choice)


def _search_alg(study: Study, ablation: str | None = None):
    from clsr.study.run.search import search_alg

    return search_alg(study, ablation)


def _scheduler(study: Study, ablation: str | None, trials: list[dict[str, Any]] | None = None):
    from clsr.study.run.search import scheduler

    if study.scheduler.type == "fifo" or confirming(study, trials):  # a confirmation runs every seed out
        return None
    s = study.scheduler
    return scheduler(study, s.max_t or max(resolved_max_steps(study, ablation), s.grace_period))


def confirming(study: Study, trials: list[dict[str, Any]] | None) -> bool:
    """Whether an experiment's trials are all a confirm ablation's."""
    return bool(trials) and all(study.ablations[t["ablation"]].confirm is not None for t in trials)


def resolved_max_steps(study: Study, ablation: str | None) -> int:
    """ASHA's horizon: the trainer's max_steps, else a bound no trial reaches (epochs end it first)."""
    doc = trial_document(study, ablation, {}, study.seeds[0])
    return int(doc.get("trainer", {}).get("max_steps") or 10**9)


def build_tuner(
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    restore: bool,
    name: str | None = None,
    console: Console | None = None,
):
    tuner = _build_tuner(study, ctx, ablation, restore, name)
    if console is not None and console.quiet is not None:
        quiet_tuner(tuner, study, name or ablation or "grid")
    return tuner


def quiet_tuner(tuner, study: Study, experiment: str) -> None:
    """No Tune tables on the terminal: the platform's progress table instead. A restored Tuner takes
    its run config from the experiment's saved state, so it is set here, for new and restored alike."""
    from clsr.study.run.progress import Progress
    from clsr.study.run.tune_compat import tuner_run_config

    run_config = tuner_run_config(tuner)
    if run_config is None:  # Ray client: Tune's own output stays
        return
    run_config.verbose = 0
    run_config.progress_reporter = None
    run_config.callbacks = [
        *[c for c in run_config.callbacks or [] if not isinstance(c, Progress)],
        Progress(experiment, study.metric, max_steps(study)),
    ]


def max_steps(study: Study) -> dict[str, int | None]:
    """Each ablation's trainer.max_steps (None: epochs end its trials), for the progress table."""
    steps = {}
    for name in study.ablations:
        try:
            doc = trial_document(study, name, {}, study.seeds_of(name)[0])
            steps[name] = doc.get("trainer", {}).get("max_steps")
        except Exception:  # an ablation that needs upstream outputs to resolve: no total shown
            steps[name] = None
    return steps


def _build_tuner(
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    restore: bool,
    name: str | None = None,
):
    from ray import tune

    from clsr.study.run.search import tune_samples

    # a failed trial's report carries no metric, and test metrics come only with a trial's last result:
    # the study's metric is validated against the known metric names instead
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), trial_resources(study))
    name = name or ablation or "grid"
    path = f"{ctx.storage.rstrip('/')}/{name}"
    if restore and tune.Tuner.can_restore(path):
        # a driver killed while Tune copied its state to storage can leave a file of it truncated, and
        # Tune's restore would then start the experiment over without its trials; or killed just after a
        # trial's new checkpoint, a state naming the one Tune deleted (clsr.study.run.tune_state)
        for line in repair_before_restore(path, grid=ablation is None):
            print(f"experiment {name}: {line}")
        # interrupted trials continue from their checkpoints; errored ones (crashes past their retries,
        # trials that ran out of time) are tried again from theirs
        return tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space=param_space(study, ablation, ctx.trials),
        tune_config=tune.TuneConfig(
            # several objectives: the searcher holds them (Tune's TuneConfig takes one)
            metric=study.metric if len(study.objectives) == 1 else None,
            mode=study.mode if len(study.objectives) == 1 else None,
            search_alg=_search_alg(study, ablation),
            scheduler=_scheduler(study, ablation, ctx.trials),
            num_samples=tune_samples(study, ablation),  # optuna: configurations × seeds (Repeater)
            max_concurrent_trials=study.concurrency,
            # in-process trials: the next trial runs in the finished one's process, not a fresh one that
            # imports torch, transformers and MLflow again (~8 s of a CPU each); trials keep no state
            # between them (seeds, models and MLflow runs are the trial's own)
            reuse_actors=study.resources.workers_per_trial == 0,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=ctx.storage,
            verbose=1,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),  # in-process trials checkpoint here
            # Train retries its workers; an in-process trial has none, so Tune retries the trial itself
            failure_config=tune.FailureConfig(
                max_failures=study.max_failures if study.resources.workers_per_trial == 0 else 0
            ),
        ),
    )


def trial_resources(study: Study) -> dict[str, float]:
    """What a Tune trial holds: a token share when Train workers do the work, else the trial's own."""
    res = study.resources
    if res.workers_per_trial > 0:
        from clsr.study.run.tune_compat import HEAD_NODE_RESOURCE

        return {"cpu": 0, HEAD_NODE_RESOURCE: DRIVER_SHARE}
    return {"cpu": res.cpus_per_worker, "gpu": res.gpus_per_worker}


def init_ray(console: Console | None = None) -> str | None:
    """Join ``RAY_ADDRESS`` when set (a cluster), else start a local Ray; returns the dashboard's address.

    A local Ray keeps its dashboard process: it serves the state API through which Ray Train removes
    the resources of a trial that was stopped (by ASHA, a time limit or Ctrl-C); without it later trials
    wait for those CPUs and GPUs forever. But the dashboard's job API runs any code it is sent, so it
    listens on 127.0.0.1 only and Ray's token authentication is on, with the token readable by this
    user alone (Ray writes it world-readable): another user of a shared machine cannot submit code.
    """
    import ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return None
    address = cluster_address(console)
    local = {}
    if not address:  # Ray 2.60 turns token authentication on for a new local cluster unless told not to
        if os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
            private_token()
        local = {"include_dashboard": True, "dashboard_host": "127.0.0.1"}
    context = ray.init(
        address=address or "local",  # "local": a new Ray, even where a dead cluster's pointer file is left
        runtime_env={"env_vars": QUIET_ENV | _forwarded_env()},
        log_to_driver=True,  # without --verbose, to the driver's log (clsr.study.run.progress)
        **local,
    )
    if console is not None and console.quiet is not None:
        console.quiet.route_workers()
    return context.dashboard_url


def cluster_address(console: Console | None = None) -> str | None:
    """The Ray cluster to join: ``RAY_ADDRESS``, else the one ``ray start`` last started on this machine
    while it answers (``ray.init()`` would join it too) and its pointer file is this user's own, else
    None: start a local Ray."""
    import socket
    import tempfile

    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if not written_by_me_alone(pointer):
            (console or Console()).note_once(
                f"note: not joining the Ray cluster named in {pointer}: another user could have written "
                f"it (Ray makes that folder writable by everyone); set RAY_ADDRESS to join a cluster"
            )
            return None
        address = pointer.read_text().strip()
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2):
            return address
    except (OSError, ValueError):
        return None


def written_by_me_alone(path: Path) -> bool:
    """Whether ``path`` is a plain file of this user's in a folder of this user's that no one else may
    write to. ``/tmp/ray`` is shared by every user of a machine (Ray makes it mode 777): a pointer file
    there that someone else could have replaced would send this study (its code, data and credentials)
    to their Ray. Raises OSError when there is no such file."""
    import stat

    me = os.getuid()
    folder, file = os.stat(path.parent, follow_symlinks=False), os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(file.st_mode) or file.st_uid != me or folder.st_uid != me:
        return False
    return not (folder.st_mode | file.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)


def private_token() -> Path:
    """Ray's token file (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``), created if missing, and
    readable by this user only."""
    import secrets

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token:
            token.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def _forwarded_env() -> dict[str, str]:
    """What trials need of the driver's environment. Folders are made absolute: Ray runs each trial in a
    folder of its own, where ``CLSR_DATA_DIR=../shared/data`` (the README's command) points nowhere."""
    keys = ("CLSR_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    for folder in ("CLSR_DATA_DIR", "HF_HOME"):
        if env.get(folder):
            env[folder] = os.path.abspath(os.path.expanduser(env[folder]))
    return env


def run_study(
    study: Study,
    study_text: str,
    resume: bool = False,
    allow_changes: bool = False,
    new: bool = False,
    verbose: bool = True,
    console: Console | None = None,
) -> StudyOutcome:
    """Run (or resume) a study: one driver holds the study's lease; SIGINT/SIGTERM stop it with a
    truthful record (``StudyOutcome.stopped_by``). ``verbose=False`` (the command's default): Ray's and
    Tune's output to ``<storage>/driver.log``, a progress table of the platform's on the terminal.
    ``console``: the command's (``Console``); a fresh one when not given."""
    console = console if console is not None else Console()
    from clsr.study.run.tune_compat import check_stack

    check_stack()  # before anything starts: a Ray or MLflow outside the supported ranges, in one line
    if not verbose and console.quiet is None:
        from clsr.study.run.progress import DriverLog

        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's new output prints its folder at any verbosity
        console.quiet = DriverLog()
        console.quiet.start()
    try:
        return _run_study(study, study_text, resume, allow_changes, new, console)
    finally:
        if console.quiet is not None and console.quiet.path is None:  # ended before its storage: to stderr
            console.quiet.close()
            console.quiet = None


def _run_study(
    study: Study,
    study_text: str,
    resume: bool,
    allow_changes: bool,
    new: bool,
    console: Console | None = None,
) -> StudyOutcome:
    console = console if console is not None else Console()
    # validated (load_study), and the tracking server answers ...
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    # ... plan: every point's sources checked, every trial, its configuration, its wave and the fingerprint,
    # built once ...
    plan = plan_study(study)
    refuse_unavailable(study, plan.unavailable)  # before anything is recorded
    check_storage(study, console)
    check_trial_resources(study, console)  # a request no node meets would wait forever, silently
    client = PatientClient(uri)  # a busy store (SQLite locked by a colleague's writes) is waited out
    # ... then the record starts (or is taken over) and the plan runs, wave by wave
    with Interrupts(study.study_timeout_s, console.link) as interrupts:
        if resume:
            parent_run_id, storage, lease, skip, searches = take_over(
                client, uri, study, study_text, plan.fingerprint, allow_changes, console.link.command_pid
            )
        else:
            parent_run_id, storage, lease = start_record(
                client, uri, study, study_text, plan.fingerprint, new, console.link.command_pid
            )
            skip, searches = frozenset(), {}
        if console.quiet is not None:
            from clsr.study.run.progress import log_path

            console.quiet.open(log_path(storage))
        lease.start()
        console.link.tell(  # the supervisor closes the record if this process dies without closing it
            uri=uri,
            parent_run_id=parent_run_id,
            token=lease.token,
            generation=lease.generation,
            storage=storage,
        )
        try:
            return _run_waves(plan, uri, parent_run_id, storage, lease, skip, searches, interrupts, console)
        finally:
            lease.release()


def confirm_trials(
    study: Study, client, parent_run_id: str, wave: list[str], planned: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """A wave's trials with its confirm ablations' best upstream configurations × their seeds added
    (``clsr.study.run.confirm``), and (trial, why) for those of a confirm ablation with none to confirm."""
    from clsr.study.run.confirm import wave_points

    points, empty, lines = wave_points(study, client, parent_run_id, wave)
    for line in lines:
        print(line)
    why = {n: f"{study.ablations[n].confirm.of} has no finished configuration to confirm" for n in empty}
    for name, reason in why.items():
        print(f"skipped: ablations.{name}: {reason}")
    kept = [t for t in planned if t["ablation"] not in why]
    return kept + expand_trials(study, points), [
        (t, why[t["ablation"]]) for t in planned if t["ablation"] in why
    ]


def check_storage(study: Study, console: Console | None = None) -> None:
    """Before anything is recorded: cloud storage answers (a probe object), and a local folder is not
    used by a cluster whose nodes are on several hosts."""
    if is_cloud(study.storage_path):
        check_cloud_storage(study.name, study.storage_path)
    if cluster_address(console):  # a cluster: join it now to see its nodes
        init_ray(console)
        check_local_storage_on_cluster(study.name, study.storage_path)


def check_trial_resources(study: Study, console: Console | None = None) -> None:
    """Before anything is recorded: a trial's request fits a node of the Ray it will run on."""
    from clsr.study.run.resources import check_resources, cluster_nodes, local_node

    if cluster_address(console):  # joined by check_storage
        check_resources(study, cluster_nodes(), local=False)
    else:
        check_resources(study, [local_node()], local=True)


def _run_waves(
    plan: StudyPlan,
    uri: str,
    parent_run_id: str,
    storage: str,
    lease: Lease,
    skip: frozenset[str],
    searches: dict[str, int],
    interrupts: Interrupts,
    console: Console | None = None,
) -> StudyOutcome:
    """Each experiment of the plan in turn (its ``waves``); ``searches``: the sampled ablations an edited resume
    searched again, with the attempt that started their search (``record.search_versions``)."""
    study = plan.study
    console = console if console is not None else Console()
    client = PatientClient(uri)
    interrupts.on_give_up = lambda: give_up(client, uri, parent_run_id, interrupts.reason, lease)
    lease.on_lost = interrupts.lease_lost
    init_ray(console)
    interrupts.install()  # after ray.init, which replaces the SIGTERM handler
    status = "FINISHED"
    try:
        for name, ablation, wave in plan.waves:
            interrupts.check()
            if ablation in searches:  # searched again: a new experiment, not the old search restored
                name = f"{name}-v{searches[ablation]}"
            # upstream trials' checkpoint tags, or a searched ablation's last results that a confirmation
            # ranks, may still wait in their journals
            if any(study.ablations[a].needs or study.ablations[a].confirm for a in wave):
                replay(uri, storage)
            staged = any(study.ablations[a].needs for a in wave)
            outputs = finished_outputs(client, parent_run_id, storage_root=storage) if staged else {}
            planned = plan.wave_trials(wave)
            planned, unconfirmed = confirm_trials(study, client, parent_run_id, wave, planned)
            trials, blocked = ready_trials(study, planned, outputs)
            skip_blocked(uri, parent_run_id, unconfirmed + blocked)
            if ablation is None:
                trials = merge_identical(study, trials, outputs, plan.config_of)
                say_merged(trials)
            if ablation is None and not trials:
                continue  # every trial of this wave lost an upstream trial
            builds = trials if ablation is None else sampled_bases(study, ablation)
            shared = prepare_shared(study, builds, outputs, plan.config_of)
            ctx = StudyContext(
                study.model_dump(by_alias=True), uri, parent_run_id, storage, trials, shared, outputs,
                lease.generation, skip,
            )  # fmt: skip
            _fit(study, ctx, ablation, name, interrupts, console)
            if ablation is None:  # an edited resume: the changed and added trials, as their own wave
                _fit_new_versions(study, ctx, name, trials, interrupts, client, parent_run_id, console)
                adaptive_rounds(study, ctx, wave, interrupts, client, console)
    except Interrupted:
        pass
    except BaseException:
        status = "FAILED"
        raise
    finally:
        interrupts.recording = True
        status = "KILLED" if interrupts.stopped and status != "FAILED" else status
        with interrupts.closed:
            stop = (interrupts.reason, interrupts.exit_code)
            outcome = close_study(client, uri, parent_run_id, storage, study, stop, status, lease)
            interrupts.record_written = True
            console.link.tell(settled=True)
    if outcome.stopped_by is None and not outcome.pending_records:  # finished: resumable state not needed
        print(_shrink_checkpoints(study, client, parent_run_id, storage))
    return outcome


def _shrink_checkpoints(study: Study, client, parent_run_id: str, storage: str) -> str:
    """Finished trials' checkpoints down to their weights (clsr.study.record.retention); never fails the study."""
    from clsr.study.record.retention import shrink_finished_checkpoints

    try:
        return shrink_finished_checkpoints(study, client, parent_run_id, storage)
    except Exception as err:  # MLflow or the storage not answering: the checkpoints stay whole
        return f"checkpoints: kept whole ({type(err).__name__}: {str(err)[:200]})"


def say_merged(trials: list[dict[str, Any]]) -> None:
    """Which identical trials run once, standing for which points."""
    merged = [t for t in trials if t["also"]]
    if not merged:
        return
    stood_for = len(trials) + sum(len(t["also"]) for t in merged)
    print(f"{stood_for} trials, {len(trials)} distinct: identical trials run once for all their points")
    for trial in merged[:10]:
        others = ", ".join(f"{a}[{p}]" for a, p in trial["also"])
        print(f"  {key_of(trial)} also stands for {others}")
    if len(merged) > 10:
        print(f"  ... and {len(merged) - 10} more")


def adaptive_rounds(
    study: Study,
    ctx: StudyContext,
    wave: list[str],
    interrupts: Interrupts,
    client,
    console: Console | None = None,
) -> None:
    """Adaptive-seeds ablations of a finished wave: round k (2, 3, ...) gives one more seed to each row
    that needs one (``clsr.study.run.adaptive``), as Tune experiment ``<ablation>-seeds<k>``; a resume
    restores a round's experiment by that name (``_fit``), then decides the next from MLflow again."""
    from clsr.study.analyse.runs import load_trials
    from clsr.study.run.adaptive import round_trials

    for ablation in [a for a in wave if study.adaptive_of(a) is not None]:
        spec = study.adaptive_of(ablation)
        for k in range(2, spec.max - spec.min + 2):  # each round adds a seed: at most max - min rounds
            interrupts.check()
            replay(ctx.tracking_uri, ctx.storage)  # the last round's results may wait in their journals
            trials = round_trials(study, ablation, load_trials(client, ctx.parent_run_id))
            if not trials:
                break
            rows = len({t["label"] for t in trials})
            print(f"ablations.{ablation}: round {k} adds a seed to {rows} row(s) (CI wider than "
                  f"±{spec.until_ci:g} or verdict inconclusive)")  # fmt: skip
            trials = merge_identical(study, ready_trials(study, trials, ctx.outputs)[0], ctx.outputs)
            fresh = [key for key in shared_inputs(study, trials, ctx.outputs) if key not in ctx.shared]
            shared = {**ctx.shared, **(prepare_shared(study, trials, ctx.outputs) if fresh else {})}
            round_ctx = replace(ctx, trials=trials, shared=shared, skip=frozenset())
            _fit(study, round_ctx, None, f"{ablation}-seeds{k}", interrupts, console)
            if interrupts.reason == "lease_lost":
                return


def _fit(
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    name: str,
    interrupts: Interrupts,
    console: Console | None = None,
) -> None:
    """Run one Tune experiment, or continue it (and the new-version experiments of earlier edited
    resumes) where an earlier driver left it."""
    from ray import tune

    # a grid wave's edited resumes ran their new trials as <name>-vN; a search runs as one experiment
    versions = range(2, ctx.attempt) if ablation is None else range(0)
    restorable = [n for n in versions if tune.Tuner.can_restore(f"{ctx.storage.rstrip('/')}/{name}-v{n}")]
    # a trial an edited resume superseded after an experiment began is not that experiment's to run,
    # on this resume or any later one (its new version, if any, runs in a later experiment)
    superseded = superseded_at(MlflowClient(ctx.tracking_uri), ctx.parent_run_id) if versions else {}
    for version, experiment in [(1, name), *[(n, f"{name}-v{n}") for n in restorable]]:
        later = frozenset(key for key, at in superseded.items() if at > version)
        with interrupts.experiment():
            tuner = build_tuner(
                study, replace(ctx, skip=ctx.skip | later), ablation, True, experiment, console
            )
            results = tuner.fit()
        if interrupts.reason == "lease_lost":  # the record is another driver's now
            return
        close_lost_trials(  # a plain client: an outage here is only a warning (the study's end closes them)
            MlflowClient(ctx.tracking_uri), ctx.tracking_uri, ctx.parent_run_id, errors_of(results)
        )


def errors_of(results) -> dict[str, str]:
    """Trial key -> Tune's error, for each trial of a Tune ResultGrid that ended in error."""
    import re

    lost = {}
    for result in results:
        if result.error is None or "point" not in (result.config or {}):
            continue
        named = re.search(r"_([0-9a-f]{5}_\d{5})", Path(result.path).name) if result.path else None
        trial_id = (result.metrics or {}).get("trial_id") or (named.group(1) if named else None)
        lost[key_of(result.config["point"], trial_id)] = f"{type(result.error).__name__}: {result.error}"
    return lost


def _fit_new_versions(study, ctx, name, trials, interrupts, client, parent_run_id, console=None) -> None:
    """An edited resume's changed and added trials of this wave, as a new Tune experiment."""
    if ctx.attempt == 1:  # a new study: its experiments hold every trial
        return
    done = {key: run for run in children(client, parent_run_id) if SUPERSEDED_TAG not in run.data.tags
            for key in run_keys(run.data.tags)}  # fmt: skip
    fresh = []
    for trial in trials:
        keys = [key_of(trial), *also_keys(trial)]
        carrier = next((done[k] for k in keys if k in done), None)
        if key_of(trial) in ctx.skip or carrier is None:
            fresh.append(trial)
        else:  # an added point identical to a trial already run: that run stands for it too
            attach_labels(client, carrier, trial)
    if not fresh:
        return
    with interrupts.experiment():
        new_ctx = replace(ctx, trials=fresh, skip=frozenset())
        results = build_tuner(study, new_ctx, None, True, f"{name}-v{ctx.attempt}", console).fit()
    close_lost_trials(client, ctx.tracking_uri, parent_run_id, errors_of(results))
