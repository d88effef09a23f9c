"""A real rerank service on 127.0.0.1 whose behaviour each test sets.

``RerankServer`` is a threaded ``http.server`` that records every request and
answers with whatever its ``behaviour`` returns. Behaviours are plain callables
``(RecordedRequest) -> Reply``; the factories below cover the usual ones::

    server.behaviour = answer("tei")                    # score by word overlap
    server.behaviour = in_turn(status(500), answer())   # fail once, then answer
    server.behaviour = hang(5)                          # outlast the read timeout
    server.behaviour = results([(0, 0.2), (0, 0.9)])    # answer nonsense

Other test modules use it through the ``rerank_server`` fixture of
``tests/rag/conftest.py`` or import it directly.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it; header names are lower case."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What the server sends back, after waiting ``delay_s``."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay_s: float = 0.0


Behaviour = Callable[[RecordedRequest], Reply]


def json_reply(payload: Any, status: int = 200) -> Reply:
    """``payload`` as JSON; NaN and Infinity are written as the bare literals."""
    return Reply(status=status, body=json.dumps(payload).encode())


def format_results(pairs: Iterable[tuple[Any, Any]], provider: str = "jina") -> Any:
    """``(index, score)`` pairs in the answer layout of ``provider``, unchanged."""
    if provider == "tei":
        return [{"index": index, "score": score} for index, score in pairs]
    listed = [{"index": index, "relevance_score": score} for index, score in pairs]
    if provider == "dashscope":
        return {"output": {"results": listed}, "usage": {"total_tokens": 1}, "request_id": "test"}
    return {"results": listed, "model": "test-reranker"}


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _read_request(body: Any, provider: str) -> tuple[str, list[str], int | None]:
    if provider == "tei":
        return body["query"], body["texts"], None
    if provider == "dashscope":
        return body["input"]["query"], body["input"]["documents"], body["parameters"].get("top_n")
    return body["query"], body["documents"], body.get("top_n")


def overlap_scores(query: str, documents: list[str]) -> list[tuple[int, float]]:
    """Share of the query's words in each document, best first (ties by index)."""
    wanted = _words(query) or {""}
    scored = [(i, len(wanted & _words(doc)) / len(wanted)) for i, doc in enumerate(documents)]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))


def answer(provider: str = "jina") -> Behaviour:
    """Answer correctly in ``provider``'s format, honouring top_n as that service does."""

    def behave(request: RecordedRequest) -> Reply:
        query, documents, top_n = _read_request(request.json(), provider)
        ranked = overlap_scores(query, documents)
        return json_reply(format_results(ranked[:top_n] if top_n else ranked, provider))

    return behave


def results(pairs: Iterable[tuple[Any, Any]], provider: str = "jina") -> Behaviour:
    """Always answer exactly these ``(index, score)`` pairs, however wrong."""
    payload = format_results(list(pairs), provider)
    return lambda request: json_reply(payload)


def status(code: int, body: str = "service unavailable") -> Behaviour:
    """Always answer HTTP ``code`` with a plain-text body."""
    return lambda request: Reply(status=code, body=body.encode(), content_type="text/plain")


def raw(body: str, code: int = 200, content_type: str = "application/json") -> Behaviour:
    """Always answer ``body`` verbatim (malformed JSON, HTML error pages ...)."""
    return lambda request: Reply(status=code, body=body.encode(), content_type=content_type)


def hang(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Wait ``seconds`` (or until the server stops), then behave like ``then``."""
    after = then or answer()

    def behave(request: RecordedRequest) -> Reply:
        reply = after(request)
        return Reply(reply.status, reply.body, reply.content_type, delay_s=seconds)

    return behave


def in_turn(*behaviours: Behaviour) -> Behaviour:
    """The first request gets the first behaviour, and so on; the last one repeats."""
    turns = itertools.chain(behaviours, itertools.repeat(behaviours[-1]))
    lock = threading.Lock()

    def behave(request: RecordedRequest) -> Reply:
        with lock:
            current = next(turns)
        return current(request)

    return behave


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in one segment; otherwise keep-alive requests
    # wait ~40 ms on delayed ACKs.
    disable_nagle_algorithm = True
    wbufsize = 1 << 16
    server: _HttpServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = RecordedRequest(
            method="POST",
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=self.rfile.read(length),
        )
        reply = self.server.owner._handle(request)
        if self.server.owner._stopping.wait(reply.delay_s):
            self.close_connection = True
            return
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client gave up (timed out) first

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: RerankServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out reset their connection; nothing to report


class RerankServer:
    """A rerank service on 127.0.0.1:<free port>; ``url`` ends in ``path``.

    ``behaviour`` decides every answer (default: ``answer("jina")``);
    ``requests`` lists what was received, oldest first.
    """

    def __init__(self, path: str = "/v1/rerank") -> None:
        self._path = path
        self._behaviour: Behaviour = answer()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _HttpServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        # A short poll interval keeps stop() (once per test) from taking 0.5 s.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="rerank-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self.base_url + self._path

    @property
    def behaviour(self) -> Behaviour:
        return self._behaviour

    @behaviour.setter
    def behaviour(self, behaviour: Behaviour) -> None:
        self._behaviour = behaviour

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def _handle(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self._requests.append(request)
        if request.path != self._path:
            return Reply(status=404, body=b"not found", content_type="text/plain")
        try:
            return self._behaviour(request)
        except Exception as exc:  # a broken behaviour shows up as a 500 the test can read
            return Reply(status=500, body=f"behaviour raised {exc!r}".encode(), content_type="text/plain")

    def start(self) -> RerankServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases hanging handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RerankServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
