"""Run a study on Ray Tune: the driver's checks before anything is recorded (tracking server, the plan's
sources, storage, trial resources), then the record started or taken over and the plan's waves run
(``clsr.study.run.waves``) while ``clsr.study.record.parent`` keeps the MLflow record and
``clsr.study.control.interrupt`` turns Ctrl-C, SIGTERM and the study's time limit into a graceful, truthful stop.
"""

from __future__ import annotations

import os

from clsr.study.control.console import Console
from clsr.study.control.interrupt import Interrupts
from clsr.study.control.ray_session import cluster_address, init_ray, shipped_methods
from clsr.study.plan.resolve import StudyDocuments
from clsr.study.plan.study_plan import plan_study
from clsr.study.record.extension import ExtendRequest, extension_rounds
from clsr.study.record.parent import StudyOutcome, start_record, take_over
from clsr.study.run.storage_checks import check_cloud_storage, check_local_storage_on_cluster, is_cloud
from clsr.study.run.waves import run_waves
from clsr.study.spec.schema import Study, StudyError
from clsr.tracking.patient import PatientClient
from clsr.tracking.study_runs import check_reachable, resolve_tracking_uri


def refuse_unavailable(study: Study, unavailable: list[str] | tuple[str, ...]) -> None:
    """StudyError naming the points that cannot run here (unless the study skips them); else each
    skipped one said."""
    if unavailable and not study.skip_unavailable:
        hint = "fix the above, or set skip_unavailable: true (--set skip_unavailable=true) to run the rest"
        raise StudyError(study.name, [*unavailable, hint])
    for line in unavailable:
        print(f"skipped (not available here): {line.splitlines()[0]}")


def run_study(
    study: Study,
    study_text: str,
    resume: bool = False,
    allow_changes: bool = False,
    new: bool = False,
    verbose: bool = True,
    console: Console | None = None,
    documents: StudyDocuments | None = None,
    extend: ExtendRequest | None = None,
) -> StudyOutcome:
    """Run (or resume) a study: one driver holds the study's lease; SIGINT/SIGTERM stop it with a
    truthful record (``StudyOutcome.stopped_by``). ``verbose=False`` (the command's default): Ray's and
    Tune's output to ``<storage>/driver.log``, a progress table of the platform's on the terminal.
    ``console``: the command's (``Console``); a fresh one when not given. ``documents``: the trials
    validation resolved (``load_documents``), which the plan keeps; resolved here when not given.
    ``extend``: a resume that adds a round of samples to a finished search (``platform study extend``)."""
    console = console if console is not None else Console()
    from clsr.study.run.tune_compat import check_stack

    check_stack()  # before anything starts: a Ray or MLflow outside the supported ranges, in one line
    if not verbose and console.quiet is None:
        from clsr.study.run.progress import DriverLog

        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's new output prints its folder at any verbosity
        console.quiet = DriverLog()
        console.quiet.start()
    try:
        return _run_study(study, study_text, resume, allow_changes, new, console, documents, extend)
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
    documents: StudyDocuments | None = None,
    extend: ExtendRequest | None = None,
) -> StudyOutcome:
    console = console if console is not None else Console()
    # validated (load_study), and the tracking server answers ...
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    # ... plan: every point's sources checked, every trial, its configuration, its wave and the fingerprint,
    # built once ...
    plan = plan_study(study, documents)
    refuse_unavailable(study, plan.unavailable)  # before anything is recorded
    shipped = shipped_methods(plan.methods)  # the study's own methods' code, for every worker
    check_storage(study, console, shipped)
    check_trial_resources(study, console)  # a request no node meets would wait forever, silently
    client = PatientClient(uri)  # a busy store (SQLite locked by a colleague's writes) is waited out
    # ... then the record starts (or is taken over) and the plan runs, wave by wave
    with Interrupts(study.study_timeout_s, console.link) as interrupts:
        if resume:
            parent_run_id, storage, lease, skip, searches = take_over(
                client,
                uri,
                study,
                study_text,
                plan.fingerprint,
                allow_changes,
                console.link.command_pid,
                extend,
            )
            extensions = extension_rounds(client, parent_run_id)
        else:
            parent_run_id, storage, lease = start_record(
                client, uri, study, study_text, plan.fingerprint, new, console.link.command_pid
            )
            skip, searches, extensions = frozenset(), {}, []
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
            return run_waves(
                plan,
                uri,
                parent_run_id,
                storage,
                lease,
                skip,
                searches,
                interrupts,
                console,
                shipped,
                extensions,
            )
        finally:
            lease.release()


def check_storage(
    study: Study, console: Console | None = None, py_modules: list[str] | tuple[str, ...] = ()
) -> None:
    """Before anything is recorded: cloud storage answers (a probe object), and a local folder is not
    used by a cluster whose nodes are on several hosts. ``py_modules``: what the driver ships (``init_ray``)."""
    if is_cloud(study.storage_path):
        check_cloud_storage(study.name, study.storage_path)
    if cluster_address(console):  # a cluster: join it now to see its nodes
        init_ray(console, py_modules)
        check_local_storage_on_cluster(study.name, study.storage_path)


def check_trial_resources(study: Study, console: Console | None = None) -> None:
    """Before anything is recorded: a trial's request fits a node of the Ray it will run on."""
    from clsr.study.run.resources import check_resources, cluster_nodes, local_node

    if cluster_address(console):  # joined by check_storage
        check_resources(study, cluster_nodes(), local=False)
    else:
        check_resources(study, [local_node()], local=True)
