"""``platform study stop``: a request to stop a running study, or one ablation of it, carried by the
record, so it reaches the driver from any shell or machine that can write to the tracking server.

The request is a tag on the study's parent run: ``clsr.stop_request`` holds ``*`` (the whole study) or
the names of the ablations to stop, comma-separated. The driver reads it between its polls
(``clsr.study.control.watch``) and each trial reads it as it starts: a trial of a stopped ablation is
not run (Tune records it errored, so a resume runs it), while the trials already running finish.
The tag is anyone's to write who can write the record: it can stop a study, never run anything.
"""

from __future__ import annotations

from dataclasses import dataclass

STOP_TAG = "clsr.stop_request"  # "*" or ablation names, comma-separated
HOLD_TAG = "clsr.stop_reason"  # the driver's: why it launches no more trials (a budget, a request)
WHOLE = "*"


@dataclass(frozen=True)
class StopRequest:
    """What the record asks of the driver: the whole study, or these ablations, stopped."""

    whole: bool = False
    ablations: frozenset[str] = frozenset()

    @property
    def any(self) -> bool:
        return self.whole or bool(self.ablations)

    def stops(self, ablation: str) -> bool:
        return self.whole or ablation in self.ablations

    def describe(self) -> str:
        if self.whole:
            return "platform study stop: the whole study"
        return f"platform study stop: ablation(s) {', '.join(sorted(self.ablations))}"


def read_request(tags: dict[str, str]) -> StopRequest:
    """The parent run's stop request (none when untagged)."""
    names = {n.strip() for n in tags.get(STOP_TAG, "").split(",") if n.strip()}
    return StopRequest(WHOLE in names, frozenset(names - {WHOLE}))


def added(tags: dict[str, str], ablation: str | None) -> str:
    """The tag's new value with ``ablation`` (None: the whole study) added to what it already asks."""
    names = [n.strip() for n in tags.get(STOP_TAG, "").split(",") if n.strip()]
    name = WHOLE if ablation is None else ablation
    return ",".join([*names, name] if name not in names else names)


def held_by(tags: dict[str, str], ablation: str) -> str | None:
    """Why a trial of ``ablation`` must not start now (the driver's hold, or a request), or None."""
    if tags.get(HOLD_TAG):
        return tags[HOLD_TAG]
    request = read_request(tags)
    return request.describe() if request.stops(ablation) else None


def request_stop(client, parent_run_id: str, ablation: str | None) -> str:
    """Tag the parent run with the request; returns the tag's new value."""
    value = added(client.get_run(parent_run_id).data.tags, ablation)
    client.set_tag(parent_run_id, STOP_TAG, value)
    return value
