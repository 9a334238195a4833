"""The identities of the data a trial reads (``clsr.data.identity.digest``), computed in the trial's process on
rank 0 and logged as params ``data.<name>.source|revision|sha256|rows`` of its run: the training rows
it was given, and each evaluation set as it is scored (the dev and test splits, capped as the trial caps
them). The training rows are already in memory; the evaluation sets are small files read once more."""

from __future__ import annotations

from clsr.config.trial import TrialConfig
from clsr.data.identity.digest import DataIdentity
from clsr.data.identity.sources import faq_identity, sts_identity, train_identity, transfer_identity
from clsr.data.sources import resolve_data_dir
from clsr.data.sts import load_sts, subsample
from clsr.data.tasks import split_eval_tasks
from clsr.data.transfer import load_transfer
from clsr.eval.custom import identities as custom_identities
from clsr.eval.faq import scored_sets
from clsr.eval.transfer import capped_splits

DEV_SPLIT = "dev"


def eval_identities(trial: TrialConfig) -> list[DataIdentity]:
    """The built-in evaluation sets the trial scores: STS dev (``<task>_dev``) and test (``<task>``)
    pairs after ``eval.sts_max_pairs``, transfer tasks (``<task>``) after ``eval.transfer_max_examples``, FAQ
    sets (``<set>``: a trained set's test fold, the query and item caps), and the user's ``eval.custom``
    sets (``custom.<name>``)."""
    cfg, data_dir = trial.eval, trial.data.data_dir
    folder = resolve_data_dir(data_dir)
    dev = split_eval_tasks([t for t in cfg.dev_tasks if t != "faq"])[0]
    if cfg.alignment_uniformity and "stsb" not in dev:
        dev.append("stsb")  # its dev pairs give the alignment and uniformity
    sts, transfer, faq = split_eval_tasks(cfg.builtin_tasks())
    found = []
    for split, tasks in ((DEV_SPLIT, dev), ("test", sts)):
        for task in tasks:
            pairs = subsample(load_sts(task, split, folder), cfg.sts_max_pairs)  # as evaluate_sts caps them
            found.append(sts_identity(f"{task}_{split}" if split == DEV_SPLIT else task, pairs, data_dir))
    for task in transfer:
        splits = capped_splits(load_transfer(task, folder), cfg.transfer_max_examples)
        found.append(transfer_identity(task, splits, data_dir))
    if faq:  # as the final evaluation scores them: a trained set's test fold, the caps
        faq_set = trial.data.faq_set()
        fold = (faq_set, trial.data.fold) if faq_set is not None else None
        caps = {"max_queries": cfg.faq_max_queries, "max_items": cfg.faq_max_items}
        sets = scored_sets(faq, data_dir, test_fold=fold, **caps)
        found += [faq_identity(name, data, data_dir) for name, data in sets.items()]
    for name, task in cfg.custom_tasks().items():  # the user's own sets (eval.custom)
        found += custom_identities(name, task)
    return found


def data_params(trial: TrialConfig, rows: list[dict[str, str]] | None) -> dict[str, str]:
    """Every identity's params: the training ``rows`` (None: an evaluation-only trial) and the
    evaluation sets."""
    found = [train_identity(trial.data, rows)] if rows is not None else []
    return {k: v for identity in [*found, *eval_identities(trial)] for k, v in identity.params().items()}
