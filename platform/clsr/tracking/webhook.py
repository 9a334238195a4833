"""Post a JSON message to a webhook (a study's ``notify.url``: Slack's incoming webhooks, or any endpoint
that takes ``{"text": ...}``), never failing its caller.

The standard library's ``urllib`` is enough: one small POST per event, a few per study, from the driver
only; no retries beyond one attempt (a missed message is a warning line, not a reason to hold a study
up), and nothing here needs a session, streaming or HTTP/2. It keeps the platform's dependencies as
they are (``requests`` is only there through MLflow, and this module sits below every layer that uses
MLflow).

A webhook's URL is a credential (Slack's holds its secret in the path), so:

* ``check_url`` allows ``https://`` anywhere, and ``http://`` only to a loopback host (127.0.0.0/8,
  ``::1``, ``localhost``: a local relay or a test server), where nothing crosses a network;
* ``shown_url`` is what is shown in its place (scheme, host and port, then ``/***``): in the study's
  dumps and the study file's text (``clsr.study.spec``), and in this module's problem lines;
* redirects are not followed (a redirect would send the message, or the URL's secret in a header, where
  the study file did not say) and a loopback URL skips any proxy the environment names.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_TIMEOUT_S = 5.0
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> str | None:
    """None when ``url`` may be posted to; else why not (one line, the URL not in it)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "not a URL"
    if any(c.isspace() for c in url):
        return "a URL holds no spaces"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and host and is_loopback(host):
        return None
    if parts.scheme == "http" and host:
        return "http:// is allowed only to a loopback host (127.0.0.1, ::1, localhost); use https://"
    return "allowed: an https:// URL, or http:// to a loopback host (127.0.0.1, ::1, localhost)"


def shown_url(url: str) -> str:
    """What is shown in the URL's place: its scheme, host and port, the rest masked."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if ":" in netloc:  # an IPv6 literal
            netloc = f"[{netloc}]"
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return "***"
    return f"{parts.scheme}://{netloc}/***" if parts.scheme and netloc else "***"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0913 - urllib's signature
        return None  # urllib then raises HTTPError with the 3xx


@dataclass(frozen=True)
class Delivery:
    """How one post went: ``ok``, or ``problem`` (one line, the URL masked)."""

    ok: bool
    problem: str = ""


def post_json(url: str, body: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> Delivery:
    """POST ``body`` as JSON to ``url``, once, within ``timeout_s``; never raises (a refused connection,
    an HTTP error, a timeout or a bad URL come back as a ``Delivery`` with its ``problem``)."""
    shown = shown_url(url)
    if why := check_url(url):
        return Delivery(False, f"{shown}: {why}")
    host = urlsplit(url).hostname or ""
    proxies = urllib.request.ProxyHandler({} if is_loopback(host) else None)
    opener = urllib.request.build_opener(proxies, _NoRedirect())
    data = json.dumps(body, ensure_ascii=False).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            response.read(4096)
            return Delivery(True)
    except urllib.error.HTTPError as err:
        return Delivery(False, f"{shown} answered HTTP {err.code}")
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        return Delivery(False, f"{shown} not reached ({type(reason).__name__}: {_clean(str(reason), url)})")


def _clean(text: str, url: str) -> str:
    """An error's text without the URL (or its path) in it, on one short line."""
    path = urlsplit(url).path
    for secret in (url, path if len(path) > 1 else ""):
        if secret:
            text = text.replace(secret, "/***")
    return " ".join(text.split())[:200]
