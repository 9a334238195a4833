"""A study plan's waves, run in turn: each wave's trials (with confirmations added, blocked ones
skipped, identical ones merged), its shared inputs, its Tune experiments (and an edited resume's new
versions, and adaptive-seed rounds), then the record closed truthfully however it ended.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from mlflow.tracking import MlflowClient

from clsr.study.analyse.live import LiveReport, planned_trials
from clsr.study.control.console import Console
from clsr.study.control.interrupt import Interrupted, Interrupts
from clsr.study.control.notify import Notifier, ended_message, verdict_lines, verdicts_message
from clsr.study.control.ray_session import init_ray
from clsr.study.control.stop_request import held_by
from clsr.study.control.watch import StudyWatch
from clsr.study.plan.distinct import also_keys, merge_identical, run_keys
from clsr.study.plan.resolve import UpstreamMissing, missing_upstream, resolve_trial
from clsr.study.plan.study_plan import StudyPlan, TrialSpec
from clsr.study.record.attempts import superseded_at
from clsr.study.record.extension import ExtensionRound, current_rounds, warm_start
from clsr.study.record.lease import Lease
from clsr.study.record.parent import (
    StudyOutcome,
    attach_labels,
    close_lost_trials,
    close_study,
    give_up,
    replay,
    skip_blocked,
)
from clsr.study.run.experiment import build_tuner, errors_of, expand_trials
from clsr.study.run.shared import prepare_shared, shared_inputs
from clsr.study.run.trial import StudyContext, key_of
from clsr.study.spec.schema import Outputs, Study
from clsr.tracking.escape import terminal
from clsr.tracking.patient import PatientClient
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import SUPERSEDED_TAG, children, finished_outputs


def sampled_bases(study: Study, ablation: str) -> list[TrialSpec]:
    """A sampled ablation's base trial per seed: it stands for the samples when shared inputs are built."""
    return [TrialSpec(ablation, None, {}, {}, seed) for seed in study.seeds_of(ablation)]


def ready_trials(
    study: Study, trials: list[TrialSpec], outputs: Outputs
) -> tuple[list[TrialSpec], list[tuple[TrialSpec, str]]]:
    """The trials whose needs can be filled (a staged one with its configuration, now resolved), and
    (trial, why not) for the others."""
    ready, blocked = [], []
    for trial in trials:
        if not study.ablations[trial.ablation].needs:
            ready.append(trial)
            continue
        try:
            config = resolve_trial(study, trial.ablation, trial.overrides, trial.seed, outputs)
            ready.append(replace(trial, config=config))
        except (UpstreamMissing, ValueError) as err:
            missing = missing_upstream(study, trial.ablation, trial.seed, outputs, trial.overrides)
            reason = f"upstream trials without a checkpoint: {', '.join(missing)}" if missing else str(err)
            blocked.append((trial, reason))
    return ready, blocked


def confirm_trials(
    study: Study, client, parent_run_id: str, wave: list[str], planned: list[TrialSpec]
) -> tuple[list[TrialSpec], list[tuple[TrialSpec, str]]]:
    """A wave's trials with its confirm ablations' best upstream configurations × their seeds added
    (``clsr.study.run.confirm``), and (trial, why) for those of a confirm ablation with none to confirm."""
    from clsr.study.run.confirm import wave_points

    points, empty, lines = wave_points(study, client, parent_run_id, wave)
    for line in lines:
        print(line)
    why = {n: f"{study.ablations[n].confirm.of} has no finished configuration to confirm" for n in empty}
    for name, reason in why.items():
        print(f"skipped: ablations.{name}: {reason}")
    kept = [t for t in planned if t.ablation not in why]
    return kept + expand_trials(study, points), [(t, why[t.ablation]) for t in planned if t.ablation in why]


def run_waves(
    plan: StudyPlan,
    uri: str,
    parent_run_id: str,
    storage: str,
    lease: Lease,
    skip: frozenset[str],
    searches: dict[str, int],
    interrupts: Interrupts,
    console: Console | None = None,
    py_modules: list[str] | tuple[str, ...] = (),
    extensions: list[ExtensionRound] | tuple[ExtensionRound, ...] = (),
) -> StudyOutcome:
    """Each experiment of the plan in turn (its ``waves``); ``searches``: the sampled ablations an edited resume
    searched again, with the attempt that started their search (``clsr.study.record.attempts.search_versions``);
    ``py_modules``: the study's method code every worker imports; ``extensions``: ``study extend``'s rounds."""
    console = console if console is not None else Console()
    client = PatientClient(uri)
    console.notifier = notifier = _notifier(plan.study, client, parent_run_id)
    study = without_notify(plan.study)  # what goes to Ray (trials, searchers) holds no webhook URL
    interrupts.on_give_up = lambda: give_up(client, uri, parent_run_id, interrupts.reason, lease)
    lease.on_lost = interrupts.lease_lost
    init_ray(console, py_modules)
    interrupts.install()  # after ray.init, which replaces the SIGTERM handler
    watch = StudyWatch(study, uri, parent_run_id, interrupts).start()  # budget: and `study stop`
    planned = planned_trials(plan, extensions, searches)
    live = LiveReport.of(study, uri, parent_run_id, planned, lambda: lease.lost is None)
    status = "FINISHED"
    try:
        for index, (name, ablation, wave) in enumerate(plan.waves):
            if index:  # the report of the wave before, as this one starts
                live.wave_ended()
            interrupts.check()
            if ablation in searches:  # searched again: a new experiment, not the old search restored
                name = f"{name}-v{searches[ablation]}"
            trials, outputs = _wave_trials(plan, study, wave, ablation, client, uri, parent_run_id, storage)
            if ablation is None and not trials:
                continue  # every trial of this wave lost an upstream trial
            builds = trials if ablation is None else sampled_bases(study, ablation)
            shared = prepare_shared(study, builds, outputs)
            ctx = StudyContext(
                study, uri, parent_run_id, storage, trials, shared, outputs,
                lease.generation, skip,
            )  # fmt: skip
            _fit(study, ctx, ablation, name, interrupts, console)
            for extension in current_rounds(extensions, ablation, searches):  # `study extend`'s rounds
                _fit_extension(study, ctx, extension, extension.experiment(name), interrupts, console)
            if ablation is None:  # an edited resume: the changed and added trials, as their own wave
                _fit_new_versions(study, ctx, name, trials, interrupts, client, parent_run_id, console)
                adaptive_rounds(study, ctx, wave, interrupts, client, console)
    except Interrupted:
        pass
    except BaseException:
        status = "FAILED"
        raise
    finally:
        outcome = _end_study(
            study, client, uri, parent_run_id, storage, lease, interrupts, watch, console, live, status
        )
        if notifier is not None and outcome.stopped_by != "lease_lost":  # a failed study's too
            tell_end(notifier, plan.study, client, uri, outcome)
    if outcome.stopped_by is None and not outcome.pending_records:  # finished: resumable state not needed
        print(_shrink_checkpoints(study, client, parent_run_id, storage))
    return outcome


def _end_study(
    study: Study, client, uri: str, parent_run_id: str, storage: str, lease: Lease, interrupts: Interrupts,
    watch: StudyWatch, console: Console, live: LiveReport, status: str,
) -> StudyOutcome:  # fmt: skip
    """The record closed truthfully (``close_study``), then the live report's final one on our record only:
    marked stopped when the study did not run all it planned, and the refresh thread ended even when
    closing the record raised."""
    watch.close()
    interrupts.recording = True
    status = "KILLED" if interrupts.stopped and status != "FAILED" else status
    outcome: StudyOutcome | None = None
    try:
        with interrupts.closed:
            stop = (interrupts.reason, interrupts.exit_code)
            if stop[0] is None and status == "FINISHED" and (held := watch.settle(client)) is not None:
                stop, status = (held, 0), "KILLED"  # an ablation stopped: the study did not run it all
            outcome = close_study(client, uri, parent_run_id, storage, study, stop, status, lease)
            interrupts.record_written = True
            console.link.tell(settled=True)
    finally:
        stopped_by = outcome.stopped_by if outcome is not None else None
        failed = status == "FAILED" or outcome is None  # an error ended it (or closing the record)
        live.finish(final=stopped_by != "lease_lost", stopped_by=stopped_by or ("error" if failed else None))
    return outcome


def _after_fit(tuner, results, experiment: str, ctx: StudyContext, console: Console | None) -> None:
    """An experiment's fit ended: its pruning line, its trials lost to errors closed, failures told."""
    if line := pruning_summary(tuner, experiment):
        print(line)
    plain = MlflowClient(ctx.tracking_uri)
    # a plain client: an outage here is only a warning (the study's end closes them)
    close_lost_trials(plain, ctx.tracking_uri, ctx.parent_run_id, errors_of(results))
    if console is not None and console.notifier is not None:
        console.notifier.tell_failed(plain)


def _wave_trials(plan: StudyPlan, study: Study, wave, ablation, client, uri, parent_run_id, storage):
    """The wave's trials ready to run, and the upstream trials' outputs they read: the unconfirmed and
    blocked ones recorded as skipped, a grid wave's identical trials merged."""
    # upstream trials' checkpoint tags, or a searched ablation's last results that a confirmation ranks,
    # may still wait in their journals
    if any(study.ablations[a].needs or study.ablations[a].confirm for a in wave):
        replay(uri, storage)
    staged = any(study.ablations[a].needs for a in wave)
    outputs = finished_outputs(client, parent_run_id, storage_root=storage) if staged else {}
    planned, unconfirmed = confirm_trials(study, client, parent_run_id, wave, plan.wave_trials(wave))
    trials, blocked = ready_trials(study, planned, outputs)
    skip_blocked(uri, parent_run_id, unconfirmed + blocked)
    if ablation is None:
        trials = merge_identical(study, trials, outputs)
        say_merged(trials)
    return trials, outputs


def without_notify(study: Study) -> Study:
    """The study as trials and Tune see it: no ``notify`` (its URL is a credential the driver keeps)."""
    return study if study.notify is None else study.model_copy(update={"notify": None})


def _notifier(study: Study, client, parent_run_id: str) -> Notifier | None:
    notifier = Notifier.of(study.notify, study.name, parent_run_id)
    if notifier is not None:
        try:
            notifier.note_failed_before(client)
        except Exception as err:  # the study goes on; at worst an earlier failure is told again
            print(f"warning: notify: could not read the earlier trials' runs: {mask_uri(str(err))[:200]}")
    return notifier


def tell_end(notifier: Notifier, study: Study, client, uri: str, outcome: StudyOutcome) -> None:
    """The webhook told of failed trials, the study's end and, once it finished, its verdicts; never
    raises (a webhook or a report that fails is a warning line)."""
    try:
        notifier.tell_failed(client)
        if outcome.pending_records:
            state = f"stopped with {outcome.pending_records} trial run(s) waiting for MLflow"
        else:
            state = client.get_run(notifier.run_id).data.tags.get("clsr.status", "ended")
        counts = dict(Counter(str(row.get("status")) for row in outcome.rows))
        notifier.post(ended_message(study.name, notifier.run_id, state, counts))
        if state == "finished" and notifier.wants("verdicts"):
            notifier.post(
                verdicts_message(study.name, notifier.run_id, _verdicts(study, client, uri, notifier))
            )
    except Exception as err:
        print(f"warning: notify: {type(err).__name__}: {mask_uri(str(err))[:200]}")


def _verdicts(study: Study, client, uri: str, notifier: Notifier) -> list[str]:
    """The report's verdicts: each row's against each paper number it has."""
    from clsr.study.analyse.rows import build_report

    report = build_report(study, client, notifier.run_id, uri)
    return verdict_lines(
        (ab.name, row.label, metric, verdict.short)
        for ab in report.ablations
        for row in ab.rows
        for metric, verdict in row.verdicts.items()
    )


def _shrink_checkpoints(study: Study, client, parent_run_id: str, storage: str) -> str:
    """Finished trials' checkpoints down to their weights (clsr.study.record.retention); never fails the study."""
    from clsr.study.record.retention import shrink_finished_checkpoints

    try:
        return shrink_finished_checkpoints(study, client, parent_run_id, storage)
    except Exception as err:  # MLflow or the storage not answering: the checkpoints stay whole
        return f"checkpoints: kept whole ({type(err).__name__}: {str(err)[:200]})"


def say_merged(trials: list[TrialSpec]) -> None:
    """Which identical trials run once, standing for which points."""
    merged = [t for t in trials if t.also]
    if not merged:
        return
    stood_for = len(trials) + sum(len(t.also) for t in merged)
    print(f"{stood_for} trials, {len(trials)} distinct: identical trials run once for all their points")
    for trial in merged[:10]:
        others = ", ".join(f"{a}[{p}]" for a, p in trial.also)
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
        last: frozenset[str] = frozenset()
        for k in range(2, spec.max - spec.min + 2):  # each round adds a seed: at most max - min rounds
            interrupts.check()
            if (why := held_by(client.get_run(ctx.parent_run_id).data.tags, ablation)) is not None:
                print(f"ablations.{ablation}: no further seed round ({terminal(why)})")
                break  # its trials would not start: a round of the same trials again, run twice on resume
            replay(ctx.tracking_uri, ctx.storage)  # the last round's results may wait in their journals
            trials = round_trials(study, ablation, load_trials(client, ctx.parent_run_id))
            keys = frozenset(key_of(t) for t in trials)
            if not trials or keys == last:
                break  # nothing to add, or a new round finished none of its trials: a resume goes on
            # a resume's round may restore an earlier driver's experiment of other trials: not compared
            last = frozenset() if _restorable(ctx, f"{ablation}-seeds{k}") else keys
            rows = len({t.label for t in trials})
            print(f"ablations.{ablation}: round {k} adds a seed to {rows} row(s) (CI wider than "
                  f"±{spec.until_ci:g} or verdict inconclusive)")  # fmt: skip
            trials = merge_identical(study, ready_trials(study, trials, ctx.outputs)[0], ctx.outputs)
            fresh = [key for key in shared_inputs(study, trials, ctx.outputs) if key not in ctx.shared]
            shared = {**ctx.shared, **(prepare_shared(study, trials, ctx.outputs) if fresh else {})}
            round_ctx = replace(ctx, trials=trials, shared=shared, skip=frozenset())
            _fit(study, round_ctx, None, f"{ablation}-seeds{k}", interrupts, console)
            if interrupts.reason == "lease_lost":
                return


def _restorable(ctx: StudyContext, name: str) -> bool:
    from ray import tune

    return tune.Tuner.can_restore(f"{ctx.storage.rstrip('/')}/{name}")


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
        _after_fit(tuner, results, experiment, ctx, console)


def pruning_summary(tuner, experiment: str) -> str | None:
    """Seed pruning's count for the driver's output (None: the experiment did not prune seeds)."""
    from clsr.study.control.seed_pruning import SeedPruningSearcher
    from clsr.study.run.tune_compat import tuner_tune_config

    config = tuner_tune_config(tuner)
    search = getattr(config, "search_alg", None)
    return search.summary(experiment) if isinstance(search, SeedPruningSearcher) else None


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
    if console is not None and console.notifier is not None:
        console.notifier.tell_failed(client)


def _fit_extension(
    study: Study,
    ctx: StudyContext,
    extension: ExtensionRound,
    name: str,
    interrupts: Interrupts,
    console: Console | None = None,
) -> None:
    """A ``study extend`` round as its own Tune experiment: new, its sampler warm-started with the record's
    finished configurations of the ablation inside its space; else restored, as Tune saved it (its
    finished trials are not run again)."""
    if interrupts.reason == "lease_lost":
        return
    warm = None
    fresh = not _restorable(ctx, name)
    if fresh and study.search.algorithm == "optuna":
        warm = warm_start(
            study, extension.ablation, children(MlflowClient(ctx.tracking_uri), ctx.parent_run_id)
        )
        given = (
            f"the sampler is given {len(warm.configurations)} finished configuration(s) ({warm.runs_inside} "
            f"run(s)); {warm.runs_outside} finished run(s) outside the space as it is now stay in the "
            f"record, not given"
        )
    else:
        given = "random search learns nothing: drawn with the round's own seed"
    if fresh:
        print(f"ablations.{extension.ablation}: extension {extension.round} ({name}): "
              f"{extension.samples} more configuration(s); {given}")  # fmt: skip
    with interrupts.experiment():
        tuner = build_tuner(study, ctx, extension.ablation, True, name, console, extension, warm)
        results = tuner.fit()
    if interrupts.reason == "lease_lost":
        return
    _after_fit(tuner, results, name, ctx, console)
