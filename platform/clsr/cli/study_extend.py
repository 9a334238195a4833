"""``platform study extend``: more samples of a finished sampled ablation, as a resume of the study's record
whose new Tune experiment warm-starts Optuna with every finished trial (``clsr.study.record.extension``);
an edited space (``--allow-changes``) narrows the search, giving the sampler only the finished trials
that still lie inside it."""

from __future__ import annotations

import argparse


def extend_parser(study) -> None:
    extend = study.add_parser(
        "extend",
        help="add samples to a finished sampled ablation; Optuna is given every finished trial first",
    )
    extend.add_argument("study", help="study YAML file (its name and tracking_uri find the record)")
    extend.add_argument("--ablation", required=True, help="the sampled ablation (one with a space) to extend")
    extend.add_argument("--samples", required=True, type=int, help="how many more configurations (1 or more)")
    extend.add_argument(
        "--allow-changes",
        action="store_true",
        help="the file was edited since the record (e.g. the ablation's space narrowed): the finished trials "
        "inside the space as it is now are given to the sampler, the others stay in the record",
    )
    extend.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    extend.add_argument("--smoke", action="store_true", help="extend the study's --smoke run (<name>-smoke)")
    extend.add_argument("--verbose", action="store_true", help="show Ray's and Tune's own output")
    extend.set_defaults(yes=False, new=False, or_run=False)


def refusal(args: argparse.Namespace, study=None) -> str | None:
    """Why ``study extend`` refuses (one line naming the file and the field) before anything starts; None
    for another action, or an extension that can run. Without ``study``: the count alone (checked before
    the driver child starts)."""
    if args.action != "extend":
        return None
    from clsr.study.spec.strict import MAX_TRIALS

    if not 1 <= args.samples <= MAX_TRIALS:  # the cap the study file puts on search.num_samples
        return f"{args.study}: --samples: {args.samples}; give 1 to {MAX_TRIALS:,}"
    return None if study is None else extend_problem(args.study, study, args.ablation)


def request_of(args: argparse.Namespace):
    """The extension ``study extend`` asks for (None for ``run`` and ``resume``)."""
    from clsr.study.record.extension import ExtendRequest

    return ExtendRequest(args.ablation, args.samples) if args.action == "extend" else None


def extend_problem(path: str, study, ablation: str) -> str | None:
    """Why the record cannot be extended so, in one line naming the file and the field; None: it can."""
    from mlflow.tracking import MlflowClient

    from clsr.study.record.extend_edits import edited_outside_space
    from clsr.study.record.reader import study_parent
    from clsr.tracking.study_runs import check_reachable, resolve_tracking_uri

    if ablation not in study.ablations:
        return f"{path}: --ablation: no ablation {ablation!r} (allowed: {', '.join(study.ablations)})"
    sampled = [name for name, a in study.ablations.items() if a.space]
    if not study.ablations[ablation].space:
        allowed = ", ".join(sampled) or "none: this study samples nothing"
        return (
            f"{path}: --ablation: {ablation!r} is a listed (grid) ablation; only a sampled one (with a space) "
            f"can be extended (allowed: {allowed})"
        )
    confirmed_by = [name for name, a in study.ablations.items() if a.confirm and a.confirm.of == ablation]
    if confirmed_by:  # its top-k ranked again, under new rank labels: confirmed configurations run twice
        return (
            f"{path}: --ablation: {ablation!r} is confirmed by {', '.join(confirmed_by)} (confirm.of), whose "
            f"points are its ranked best: an extension would rank them again and rerun confirmed ones; "
            f"extend a search no confirm stage takes from"
        )
    uri = resolve_tracking_uri(study.tracking_uri)
    try:
        check_reachable(uri)
    except ConnectionError as err:
        return f"{path}: {err}"
    parent = study_parent(MlflowClient(uri), study.name)
    if parent is None:
        return f"{path}: study {study.name!r} has no record to extend; `platform study run` it first"
    if parent.info.status != "FINISHED":
        return (
            f"{path}: study {study.name!r}'s record (MLflow run {parent.info.run_id}) is {parent.info.status}, "
            f"not finished: `platform study resume` it first (an unfinished extension continues there)"
        )
    field = edited_outside_space(MlflowClient(uri), parent.info.run_id, study, ablation)
    if field is not None:
        return (
            f"{path}: {field}: changed since the record; an extension takes an edit of "
            f"ablations.{ablation}.space only (revert it, or `platform study resume --allow-changes` to run "
            f"the edit: an edited search is searched again)"
        )
    return None
