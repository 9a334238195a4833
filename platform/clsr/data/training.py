"""A trial's training rows: the catalogue data set named by ``data.train`` (subset and seed applied), an
FAQ set's training folds, or a file, folder or hub data set (``clsr.data.external``). Read by the training loop, by methods that prepare a study-wide input from
the same rows (GCLSR's word table, RCL's embeddings, SelfCCL's scores, SupMPN's positives) and by
``platform study plan``, which counts them."""

from __future__ import annotations

from typing import Any

from clsr.data.catalog import load_rows, seeded_subset
from clsr.data.external import external_rows
from clsr.data.faq import fold_split, load_faq
from clsr.data.faq import training_rows as faq_training_rows
from clsr.data.sources import resolve_data_dir


def training_rows(trial: Any) -> list[dict[str, str]]:
    """``trial``: a validated ``clsr.config.trial.TrialConfig``."""
    subset_seed = trial.data.subset_seed if trial.data.subset_seed is not None else trial.trainer.seed
    if (faq_set := trial.data.faq_set()) is not None:  # an FAQ set's fold: its training queries' rows
        data = load_faq(faq_set, resolve_data_dir(trial.data.data_dir))
        rows = faq_training_rows(data, fold_split(len(data), trial.data.fold).train)
        return list(seeded_subset(rows, trial.data.max_rows, subset_seed))
    if trial.data.external():
        return list(seeded_subset(external_rows(trial.data), trial.data.max_rows, subset_seed))
    return load_rows(trial.data.train, trial.data.data_dir, trial.data.max_rows, seed=subset_seed)
