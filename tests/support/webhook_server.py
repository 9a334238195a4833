"""A real HTTP server on 127.0.0.1 that records what is POSTed to it, for the notify webhook's tests.

``WebhookServer(status=500)`` answers every post with that status; ``hang=True`` reads the request and
never answers (a client's timeout); ``redirect_to`` answers 302 to that address. Started in a thread,
stopped by ``close`` (or as a context manager).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookServer:
    def __init__(self, status: int = 200, hang: bool = False, redirect_to: str | None = None):
        self.received: list[dict[str, Any]] = []  # each post: path, headers, parsed body
        self.status, self.hang, self.redirect_to = status, hang, redirect_to
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                server.received.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                if server.hang:
                    server._release.wait(30)
                    return
                if server.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", server.redirect_to)
                else:
                    self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hooks/T0/B0/s3cr3tPATH") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.received]

    def close(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> WebhookServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
