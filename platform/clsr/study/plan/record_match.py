"""``platform study plan --from <record>``: whether the recorded trials ran the configuration being
priced. Unit costs measured on another configuration (a smoke run's 50-d vectors, 500 STS pairs and two
steps) misprice a full study by orders of magnitude, so the fields that set a unit's cost are compared,
per ablation where the record ran it, and each planned value the record never ran is named. (Steps,
evaluations and rows are counted from the planned study, so a short record of the same configuration
prices it.)"""

from __future__ import annotations

from clsr.study.plan.point import GridPoint
from clsr.study.plan.projection import Measured, priced_trials
from clsr.study.plan.resolve import Resolve, resolver
from clsr.study.spec.schema import Study

# What a unit of a trial's work costs depends on: the model's size and length, the data's sentences, the
# batch, and the evaluation sets. The number of steps, evaluations, checkpoints and rows is the planned
# study's own (a 20-step record of the real configuration prices it), so those are not compared.
COST_FIELDS = (
    "model.name", "model.vectors", "model.max_seq_length", "model.filters", "model.region_sizes",
    "data.train", "trainer.batch_size", "trainer.precision", "eval.tasks", "eval.dev_tasks",
    "eval.sts_max_pairs", "eval.transfer_mode", "eval.transfer_max_examples", "eval.transfer_classifier",
)  # fmt: skip


def flat_config(doc: dict, prefix: str = "") -> dict[str, str]:
    """A trial's configuration as its MLflow params hold it: dotted keys, ``str`` of each value."""
    flat: dict[str, str] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            flat |= flat_config(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def differing_fields(
    study: Study,
    measured: Measured,
    grids: dict[str, list[GridPoint]] | None = None,
    resolve: Resolve | None = None,
) -> list[str]:
    """``field (recorded A, B; planned C)`` for each cost field with a planned value that no recorded
    trial of the same ablation ran (of any ablation, where the record has none of it)."""
    recorded: dict[str | None, list[dict[str, str]]] = {}
    for ablation, params in measured.configs:
        recorded.setdefault(ablation, []).append(params)
    everything = [p for runs in recorded.values() for p in runs]
    grid, sampled = priced_trials(study, grids, resolver(study, resolve))
    planned: dict[str, set[str]] = {}
    ran: dict[str, set[str]] = {}
    for trial in grid + sampled:
        if trial.config is None:
            continue
        flat = flat_config(trial.config.model_dump())
        runs = recorded.get(trial.ablation) or everything
        for name in COST_FIELDS:
            values = {p[name] for p in runs if name in p}
            if name in flat and values and flat[name] not in values:
                planned.setdefault(name, set()).add(flat[name])
                ran.setdefault(name, set()).update(values)
    return [
        f"{name} (recorded {_some(ran[name])}; planned {_some(planned[name])})"
        for name in COST_FIELDS
        if name in planned
    ]


def _some(values: set[str], shown: int = 3) -> str:
    listed = sorted(values)
    return ", ".join(listed[:shown]) + (", ..." if len(listed) > shown else "")
