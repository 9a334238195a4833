"""The evaluation tasks a study may name, by group: ``sts``, ``transfer`` and ``faq`` expand to their
data sets' task names."""

from __future__ import annotations

from collections.abc import Iterable

from clsr.data.faq import FAQ_TASKS
from clsr.data.sts import STS_TASKS
from clsr.data.transfer import TRANSFER_TASKS

TASK_GROUPS = {"sts": STS_TASKS, "transfer": TRANSFER_TASKS, "faq": FAQ_TASKS}


def split_eval_tasks(tasks: str | Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Groups (``sts``, ``transfer``, ``faq``) and task names → (STS tasks, transfer tasks, FAQ entries).

    STS and transfer groups are expanded; FAQ entries are kept as given (``faq`` stays ``faq``, for
    :func:`clsr.eval.faq.evaluate_faq` skips group members whose data is missing). Each list is
    de-duplicated. A string is read as a comma-separated list. Unknown names raise ValueError with
    every allowed name.
    """
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    sts: list[str] = []
    transfer: list[str] = []
    faq: list[str] = []
    for task in tasks:
        name = task.strip()
        members = (name,) if name == "faq" else TASK_GROUPS.get(name, (name,))
        for member in members:
            buckets = ((sts, STS_TASKS), (transfer, TRANSFER_TASKS), (faq, ("faq", *FAQ_TASKS)))
            bucket = next((b for b, known in buckets if member in known), None)
            if bucket is None:
                allowed = ", ".join([*TASK_GROUPS, *STS_TASKS, *TRANSFER_TASKS, *FAQ_TASKS])
                raise ValueError(f"unknown evaluation task {task!r}; allowed: {allowed}")
            if member not in bucket:
                bucket.append(member)
    return sts, transfer, faq
