"""The driver's side of a study's ``notify`` webhook: which events it is told, the messages' bodies, and
the posts, each of which may fail without failing the study (a warning line).

Messages are Slack-compatible JSON: ``text`` (what a person reads; ``&``, ``<`` and ``>`` escaped as
Slack's mrkdwn wants, control characters shown as escapes, since trial names and errors come from the
record), and ``event``, ``study`` and ``run_id`` for a program. Events:

* ``failed``: trials whose runs closed failed, told after each Tune experiment and at the study's end
  (one message for all those new since the last; a resume does not tell the earlier attempt's again,
  but a trial whose reopened run fails again is told);
* ``finished``: the study's end as its parent run records it (finished, failed, interrupted, timed out);
* ``verdicts``: each row's verdicts against the paper, once the study finished (the report's lines).

The webhook's URL stays in the driver: ``Notifier`` holds it as a ``SecretStr`` and the study that goes
to Ray's workers has no ``notify`` (``clsr.study.run.waves``); texts are masked (``mask_uri``) before
they are sent, so an error that quoted a URL does not carry it to the channel either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from clsr.study.spec.notify import Notify
from clsr.tracking.escape import terminal
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import children
from clsr.tracking.tags import SUPERSEDED_TAG
from clsr.tracking.webhook import post_json

MAX_LINES = 20  # lines of trials or verdicts in one message; the rest counted
MAX_ERROR = 200  # characters of a failed trial's error


@dataclass(frozen=True)
class Message:
    """One post: the event, the study and its parent run, and what a person reads."""

    event: str
    study: str
    run_id: str
    text: str

    def body(self) -> dict[str, Any]:
        return {
            "text": slack_text(self.text),
            "event": self.event,
            "study": self.study,
            "run_id": self.run_id,
        }


@dataclass(frozen=True)
class FailedTrial:
    name: str  # its run's name: ablation, point, seed
    error: str  # the first line of its clsr.error, masked
    key: tuple[str, int | None] = ("", None)  # (run id, end time): a resumed run's new failure is new


def slack_text(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``& < >`` escaped, control characters as escapes."""
    text = terminal(mask_uri(text)).replace("\t", " ")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _listed(lines: list[str]) -> list[str]:
    shown = [f"• {line}" for line in lines[:MAX_LINES]]
    return shown + ([f"… and {len(lines) - MAX_LINES} more"] if len(lines) > MAX_LINES else [])


def failed_message(study: str, run_id: str, failed: list[FailedTrial]) -> Message:
    head = f"clsr study {study}: {len(failed)} trial(s) failed"
    lines = [f"{t.name}: {t.error}" if t.error else t.name for t in failed]
    return Message("failed", study, run_id, "\n".join([head, *_listed(lines)]))


def ended_message(study: str, run_id: str, state: str, counts: dict[str, int]) -> Message:
    total = sum(counts.values())
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    text = f"clsr study {study} {state.replace('_', ' ')}: {total} trial(s)" + (
        f" ({parts})" if parts else ""
    )
    return Message("finished", study, run_id, text)


def verdicts_message(study: str, run_id: str, lines: list[str]) -> Message:
    if not lines:
        text = f"clsr study {study}: verdicts ready, none to give (no row has a paper number to judge)"
    else:
        text = "\n".join([f"clsr study {study}: verdicts against the papers", *_listed(lines)])
    return Message("verdicts", study, run_id, text)


@dataclass
class Notifier:
    """A study's webhook for one driver: what it is told, and the failed runs already told."""

    url: SecretStr
    events: frozenset[str]
    timeout_s: float
    study: str
    run_id: str
    # failures already told (or there before this driver), as (run id, end time): a resume reopens a
    # trial's run, so a run that fails again ends at a new time and is told
    told: set[tuple[str, int | None]] = field(default_factory=set)
    sent: list[Message] = field(default_factory=list)  # what went out, for the driver's own record

    @classmethod
    def of(cls, notify: Notify | None, study: str, run_id: str) -> Notifier | None:
        if notify is None:
            return None
        return cls(notify.url, frozenset(notify.on), notify.timeout_s, study, run_id)

    def wants(self, event: str) -> bool:
        return event in self.events

    def post(self, message: Message) -> bool:
        """Send ``message`` if its event is wanted; a failure is a warning line, never an exception."""
        if not self.wants(message.event):
            return False
        try:
            delivery = post_json(self.url.get_secret_value(), message.body(), self.timeout_s)
        except Exception as err:  # noqa: BLE001 - the webhook never fails the study
            print(
                f"warning: notify ({message.event}) not sent: {type(err).__name__}: {mask_uri(str(err))[:200]}"
            )
            return False
        if not delivery.ok:
            print(f"warning: notify ({message.event}) not sent: {delivery.problem}")
            return False
        self.sent.append(message)
        return True

    def note_failed_before(self, client) -> None:
        """The runs already failed when this driver starts (a resume's earlier attempts): not told again."""
        if self.wants("failed"):
            self.told |= {t.key for t in _failed(children(client, self.run_id))}

    def tell_failed(self, client) -> None:
        """One message for the trials whose runs closed failed since the last; never raises."""
        if not self.wants("failed"):
            return
        try:
            fresh = [t for t in _failed(children(client, self.run_id)) if t.key not in self.told]
        except Exception as err:  # noqa: BLE001 - MLflow not answering: the next check tells them
            print(f"warning: notify (failed): could not read the trials' runs: {mask_uri(str(err))[:200]}")
            return
        if fresh:
            self.told |= {t.key for t in fresh}
            self.post(failed_message(self.study, self.run_id, fresh))


def _failed(runs: Iterable) -> list[FailedTrial]:
    failed = []
    for run in runs:
        tags = run.data.tags
        if tags.get("clsr.status") != "failed" or SUPERSEDED_TAG in tags or run.info.status == "RUNNING":
            continue  # RUNNING: its status tag is written, its end (and end time) not yet
        # the last line of a traceback names the error; a one-line reason is its own last line
        error = next((line for line in reversed(tags.get("clsr.error", "").splitlines()) if line.strip()), "")
        name = run.info.run_name or run.info.run_id
        key = (run.info.run_id, run.info.end_time)
        failed.append(FailedTrial(f"{name} ({run.info.run_id})", mask_uri(error.strip())[:MAX_ERROR], key))
    return failed


def verdict_lines(rows: Iterable[tuple[str, str, str, str]]) -> list[str]:
    """``ablation[label] metric: verdict`` for each (ablation, label, metric, verdict)."""
    return [f"{ablation}[{label}] {metric}: {verdict}" for ablation, label, metric, verdict in rows]
