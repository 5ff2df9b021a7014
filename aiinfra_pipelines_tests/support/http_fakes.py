"""Local HTTP servers for the transport tests: a scripted lakeFS API and a faulty S3 proxy.

Both run ``http.server`` in a thread on a free localhost port and count every request they
receive, so a test can assert exactly how many times the client tried. They speak HTTP the way
the real services do (status codes, JSON/XML error bodies, ``Retry-After``); nothing in our own
code is replaced.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs


@dataclass
class Reply:
    """One scripted answer: ``status`` with ``body`` (dict → JSON).

    ``stall``: no answer at all; the request is held until the server stops, so the client's
    read timeout fires whatever the machine's load (a delay would race the timeout)."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stall: bool = False

    def encoded(self) -> tuple[bytes, str]:
        if isinstance(self.body, bytes):
            return self.body, "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), "text/html"
        if self.body is None and self.status >= 400:
            return json.dumps({"message": f"scripted {self.status}"}).encode(), "application/json"
        return json.dumps(self.body if self.body is not None else {}).encode(), "application/json"


def commit_json(commit_id: str, parents: list[str] | None = None) -> dict[str, Any]:
    """A ``Commit`` as the lakeFS API returns it."""
    return {
        "id": commit_id,
        "parents": parents or [],
        "committer": "tests",
        "message": f"commit {commit_id}",
        "creation_date": 1_700_000_000,
        "meta_range_id": "",
        "metadata": {},
    }


def repository_json(name: str = "drive-data") -> dict[str, Any]:
    """A ``Repository`` as the lakeFS API returns it."""
    return {
        "id": name,
        "creation_date": 1_700_000_000,
        "default_branch": "main",
        "storage_namespace": f"s3://bucket/{name}",
    }


@dataclass(frozen=True)
class Call:
    """One API request as the server received it, for asserting what the client asked for."""

    method: str
    path: str
    query: dict[str, str]  # the last value of each parameter
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class _Route:
    def __init__(
        self,
        method: str,
        pattern: str,
        replies: list[Reply],
        then: Reply,
        query: dict[str, str] | None = None,
    ) -> None:
        self.method = method
        self.pattern = re.compile(pattern)
        self.replies = list(replies)
        self.then = then
        self.query = dict(query or {})

    def matches(self, method: str, path: str, query: dict[str, str]) -> bool:
        return (
            self.method == method
            and self.pattern.fullmatch(path) is not None
            and all(query.get(k) == v for k, v in self.query.items())
        )

    def next_reply(self) -> Reply:
        return self.replies.pop(0) if self.replies else self.then


def _forward(handler: BaseHTTPRequestHandler, upstream: tuple[str, int], body: bytes) -> None:
    """Relay one request to ``upstream`` and its answer back, byte for byte."""
    connection = http.client.HTTPConnection(*upstream, timeout=30)
    headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
    connection.request(handler.command, handler.path, body=body, headers=headers)
    answer = connection.getresponse()
    payload = answer.read()
    handler.send_response(answer.status)
    for name, value in answer.getheaders():
        if name.lower() not in ("transfer-encoding", "connection", "content-length"):
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(payload)
    connection.close()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


class FakeLakeFS:
    """Answers lakeFS API requests (``/api/v1/...``) from a script; an unscripted request gets
    400 naming it (a bug in the test, reported at once instead of being retried).

    With ``gateway_upstream`` (an S3 server such as moto) every other path is relayed there,
    as lakeFS serves its S3 gateway on the API's host and port.
    """

    def __init__(self, gateway_upstream: str | None = None) -> None:
        self.gateway_upstream = _host_port(gateway_upstream) if gateway_upstream else None
        self.gateway_requests: list[tuple[str, str]] = []
        self._routes: list[_Route] = []
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.calls: list[Call] = []  # the same requests with their query and body
        self.url = ""
        self.released = threading.Event()  # set when the server stops: stalled requests end

    def route(
        self,
        method: str,
        path_pattern: str,
        *replies: Reply,
        then: Reply,
        query: dict[str, str] | None = None,
    ) -> None:
        """Answer ``method`` on paths matching ``path_pattern`` (regex, full match) with
        ``replies`` in order, then ``then`` for every later request. With ``query``, only
        requests carrying those query parameters match; the first matching route answers."""
        self._routes.append(_Route(method, path_pattern, list(replies), then, query))

    def calls_to(self, method: str, path_pattern: str) -> list[Call]:
        """The requests received for ``method`` on paths matching ``path_pattern``, in order."""
        pattern = re.compile(path_pattern)
        return [c for c in self.calls if c.method == method and pattern.fullmatch(c.path)]

    def count(self, method: str, path_pattern: str) -> int:
        pattern = re.compile(path_pattern)
        return sum(1 for m, p, _ in self.requests if m == method and pattern.fullmatch(p))

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        path, _, raw_query = handler.path.partition("?")
        query = {k: v[-1] for k, v in parse_qs(raw_query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if self.gateway_upstream and not path.startswith("/api/"):
            with self._lock:
                self.gateway_requests.append((handler.command, path))
            _forward(handler, self.gateway_upstream, body)
            return
        with self._lock:
            self.requests.append((handler.command, path, dict(handler.headers)))
            self.calls.append(Call(handler.command, path, query, body))
            route = next((r for r in self._routes if r.matches(handler.command, path, query)), None)
            reply = (
                route.next_reply()
                if route
                else Reply(400, {"message": f"unscripted {handler.command} {path}"})
            )
        if reply.stall:
            self.released.wait(timeout=300)
            return
        body, content_type = reply.encoded()
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(body)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and went away: that is what the test provoked


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        return

    def _dispatch(self) -> None:
        self.server.fake._answer(self)  # type: ignore[attr-defined]

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _dispatch


@contextmanager
def serve(fake: Any, handler: type[BaseHTTPRequestHandler] = _Handler) -> Iterator[str]:
    """Run ``fake`` behind a threaded HTTP server; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.fake = fake  # type: ignore[attr-defined]
    # A short poll interval: shutdown() waits up to one interval, paid by every test.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake.url
    finally:
        released = getattr(fake, "released", None)
        if released is not None:
            released.set()
        server.shutdown()
        server.server_close()


class FaultyProxy:
    """Forwards requests to ``upstream`` (an S3 server), except that the first
    ``faults[method]`` requests of a method get a scripted 5xx/4xx S3 error instead."""

    def __init__(self, upstream: str) -> None:
        self.upstream = _host_port(upstream)
        self.faults: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.url = ""

    def fail(self, method: str, *statuses: int) -> None:
        self.faults.setdefault(method, []).extend(statuses)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.requests if m == method)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((handler.command, handler.path))
            queued = self.faults.get(handler.command) or []
            fault = queued.pop(0) if queued else None
        if fault is not None:
            code = {503: "SlowDown", 500: "InternalError", 403: "AccessDenied"}.get(
                fault, "NoSuchKey"
            )
            xml = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                f"<Message>scripted {fault}</Message></Error>"
            ).encode()
            handler.send_response(fault)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(xml)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(xml)
            return
        _forward(handler, self.upstream, body)


@contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 in server mode on a free localhost port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
