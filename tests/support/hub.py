"""Stub Hugging Face caches laid out as the hub's clients leave them, for offline validation tests."""

from __future__ import annotations

from pathlib import Path


def stub_hub_cache(root: Path, repo_ids: list[str]) -> Path:
    """A Hugging Face hub cache at ``root`` in which each model id has a snapshot holding a config.json,
    laid out as ``hf download`` leaves it (``models--owner--name/refs/main`` → ``snapshots/<commit>``):
    what ``study validate`` looks for offline. No weights: validation never reads them."""
    commit = "0" * 40
    for repo_id in repo_ids:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text("{}")
    return root


def stub_datasets_cache(root: Path) -> Path:
    """A datasets cache (``HF_DATASETS_CACHE``) at ``root`` holding every hub data set of the manifest as
    ``load_dataset`` leaves a prepared one (``owner___name/<config>/<version>/<hash>``), and the ordered
    Wikipedia text as ``wiki_ordered`` keeps it: what ``study validate`` looks for offline. No rows."""
    from clsr.data.hub.manifest import HUB_DATASETS
    from clsr.data.ordered_text import built_copy

    for hub_id, entry in HUB_DATASETS.items():
        for config in entry.configs or ("default",):
            (root / hub_id.replace("/", "___") / config / "0.0.0" / ("0" * 16)).mkdir(
                parents=True, exist_ok=True
            )
    built_copy(root).parent.mkdir(parents=True, exist_ok=True)
    built_copy(root).write_text("A sentence .\n")
    return root


def hub_model_ids(studies: list[Path]) -> list[str]:
    """Every hub id the shipped studies' trials name as model.name (not short names, not folders)."""
    from clsr.data.hub.model_registry import SHORT_NAMES

    names = {getattr(trial.model, "name", "minilm") for trial in _shipped_trials(studies)}
    return sorted(names - set(SHORT_NAMES))


def _shipped_trials(studies: list[Path]) -> list:
    """One resolved trial per point (a sampled ablation's base) of each study."""
    from clsr.study.plan.load import load_study
    from clsr.study.plan.point import GridPoint
    from clsr.study.plan.resolve import grid_points, resolve_trial

    trials = []
    for path in studies:
        study = load_study(path)
        for name, ablation in study.ablations.items():
            points = grid_points(ablation) if not ablation.space else [GridPoint("base", {}, {})]
            for point in points:
                trials.append(resolve_trial(study, name, point.overrides, study.seeds_of(name)[0]))
    return trials
