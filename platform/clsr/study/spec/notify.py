"""The study file's ``notify`` section: a webhook told when a trial fails, when the study ends and when
its verdicts are ready (``clsr.study.control.notify`` posts; ``clsr.tracking.webhook`` sends).

The URL is a credential: it is a ``SecretStr`` (its repr and dumps show ``scheme://host/***``), validated
here with the rest of the file, its refusals naming it masked; ``Study.masked`` masks it in the study
file's text (MLflow's ``study.yaml``), found in that text itself (``file_urls``), so also where
``--set notify=null`` turned it off.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_serializer, field_validator, model_validator

from clsr.study.spec.strict import Strict
from clsr.study.spec.yaml_safe import YAMLSafetyError, load_yaml
from clsr.tracking.webhook import DEFAULT_TIMEOUT_S, check_url, shown_url

EVENTS = ("failed", "finished", "verdicts")
Event = Literal["failed", "finished", "verdicts"]


class Notify(Strict):
    """Where and when a study posts a message."""

    url: SecretStr = Field(
        description="the webhook (e.g. a Slack incoming webhook): https://, or http:// to a loopback host "
        "only; a credential, masked wherever it would be shown (scheme://host/***)"
    )
    on: list[Event] = Field(
        default_factory=lambda: list(EVENTS),
        min_length=1,
        description="which events post a message: failed (a trial failed; told when its Tune experiment "
        "ends), finished (the study finished, failed or was stopped), verdicts (the report's verdicts, "
        "once the study finished)",
    )
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=60,
        description="how long one post may take; a webhook that fails or is slower is a warning line, "
        "never the study's failure",
    )

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML's safe loader) reads the key ``on`` as the boolean true: it is ``on`` here."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("url", mode="before")
    @classmethod
    def _allowed_url(cls, url: Any) -> Any:
        if not isinstance(url, str):
            return url
        if why := check_url(url):
            raise ValueError(f"{why} (given: {shown_url(url)})")
        return url

    @field_validator("on")
    @classmethod
    def _each_once(cls, on: list[str]) -> list[str]:
        if len(set(on)) != len(on):
            raise ValueError(f"each event once (allowed: {', '.join(EVENTS)})")
        return on

    @field_serializer("url")
    def _masked(self, url: SecretStr) -> str:
        return shown_url(url.get_secret_value())


def file_urls(text: str) -> list[str]:
    """The notify URLs a study file's text holds (``notify.url``, or ``notify`` given as a bare string;
    also in its ``smoke`` section), whether or not they survived the overrides: what its text is masked for."""
    try:
        raw = load_yaml(text)
    except YAMLSafetyError:
        return []
    sections = [raw] if isinstance(raw, dict) else []
    if sections and isinstance(raw.get("smoke"), dict):
        sections.append(raw["smoke"])
    urls = []
    for section in sections:
        notify = section.get("notify")
        url = notify.get("url") if isinstance(notify, dict) else notify
        if isinstance(url, str) and url:
            urls.append(url)
    return urls
