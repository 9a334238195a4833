"""The notify webhook's client against a real HTTP server on 127.0.0.1: the JSON it posts, and every way
a webhook fails (refused, HTTP 500, no answer, a redirect) coming back as one line without the URL's
secret, never as an exception; which URLs it accepts, and what is shown in their place."""

from __future__ import annotations

import socket

import pytest

from clsr.tracking.webhook import check_url, post_json, shown_url
from tests.support.webhook_server import WebhookServer

SECRET = "s3cr3tPATH"


def test_a_post_reaches_the_server_as_json():
    with WebhookServer() as server:
        delivery = post_json(server.url(), {"text": "study smoke finished: 2 trial(s) — ok"})
        assert delivery.ok and delivery.problem == ""
        (received,) = server.received
    assert received["path"] == f"/hooks/T0/B0/{SECRET}"
    assert received["body"] == {"text": "study smoke finished: 2 trial(s) — ok"}
    assert received["headers"]["Content-Type"] == "application/json; charset=utf-8"


@pytest.mark.parametrize(
    ("server", "fragment"),
    [
        ({"status": 500}, "answered HTTP 500"),
        ({"status": 404}, "answered HTTP 404"),
        ({"redirect_to": "http://127.0.0.1:9/elsewhere"}, "answered HTTP 302"),  # not followed
        ({"hang": True}, "not reached (TimeoutError"),
    ],
)
def test_a_failing_webhook_is_one_line_never_an_exception(server, fragment):
    with WebhookServer(**server) as failing:
        delivery = post_json(failing.url(), {"text": "x"}, timeout_s=0.5)
        assert len(failing.received) == 1  # one attempt
    assert not delivery.ok and fragment in delivery.problem
    assert SECRET not in delivery.problem and delivery.problem.startswith(
        f"http://127.0.0.1:{failing.port}/***"
    )


def test_a_refused_connection_is_one_line():
    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        delivery = post_json(f"http://127.0.0.1:{port}/hooks/{SECRET}", {"text": "x"}, timeout_s=2)
    assert not delivery.ok and "not reached (ConnectionRefusedError" in delivery.problem
    assert SECRET not in delivery.problem


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://hooks.slack.com/services/T0/B0/x", None),
        ("http://127.0.0.1:8080/hook", None),
        ("http://[::1]:8080/hook", None),
        ("http://localhost/hook", None),
        ("http://hooks.example.com/x", "http:// is allowed only to a loopback host"),
        ("http://10.0.0.1/x", "http:// is allowed only to a loopback host"),
        ("ftp://example.com/x", "allowed: an https:// URL"),
        ("hooks.slack.com/services/x", "allowed: an https:// URL"),
        ("https://", "allowed: an https:// URL"),
        ("https://host:99999/x", "not a URL"),
    ],
)
def test_only_https_or_loopback_http_is_posted_to(url, why):
    assert (check_url(url) is None) if why is None else why in check_url(url)
    if why is not None:  # refused before any connection
        assert not post_json(url, {"text": "x"}).ok


def test_the_shown_url_keeps_scheme_host_and_port_only():
    assert shown_url("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/***"
    assert shown_url("http://[::1]:8080/x?token=y") == "http://[::1]:8080/***"
    assert shown_url("https://user:pw@host.example/x") == "https://host.example/***"
    assert shown_url("not a url") == "***"
