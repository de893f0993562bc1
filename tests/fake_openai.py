"""A fake OpenAI-compatible server for tests: an HTTP server on 127.0.0.1 that the real ``openai`` client talks to.

It answers what :mod:`inference.backends.hosted.client` sends:

=================================  ==============================================================
``POST /v1/chat/completions``      a chat completion: ``"echo: "`` + the last message, cut to
                                   ``max_tokens`` (or ``max_completion_tokens``) words, with
                                   ``logprobs.content`` when asked (``top_logprobs`` candidates)
``POST /v1/completions``           the same for a ``prompt``, with the legacy ``logprobs`` shape
``GET  /v1/models``                the served model ids
=================================  ==============================================================

Like a real server, it has a context length (``context_length``, 4096 by default;
a token here is a word of the prompt: the contents of the messages, or the
prompt, split on whitespace). As ``vllm serve`` (0.32) does, a prompt of
``context_length`` tokens or more gets a 400 with OpenAI's error body
(``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``),
and an answer that would not fit stops at the context (finish reason
``length``). With ``empty_replies`` set, every answer is empty (finish reason
``stop``, one logprob position for the end-of-sequence token, whose text is
empty), as a judge whose first token ends its answer.

A request for a model it does not serve gets OpenAI's 404 (``model_not_found``).
With ``api_key`` set, a request without ``Authorization: Bearer <api_key>`` gets a
401 that *echoes the key it was sent* (as careless servers do), so tests can
check it never reaches a message.

Fault injection: :meth:`FakeOpenAI.add_fault` makes the next ``times`` matching
requests answer with a status and headers (``Retry-After``), a raw body (a
malformed 200, an error object in a 200), the normal answer with fields of
its first choice replaced (``choice``: an error choice, a refusal, odd
logprobs), or only after ``delay`` seconds (a client timeout). Every
request is recorded in ``requests`` (path, JSON body, headers), faulty or not.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Fault:
    """The next ``times`` POSTs to a path containing ``path_contains`` misbehave."""

    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # default: an OpenAI-style error object
    delay: float = 0.0  # seconds before answering (longer than the client's timeout: a timeout)
    trickle: float = 0.0  # with status 200 and no body: seconds between the bytes of the answer (each read is quick)
    choice: dict[str, Any] | None = None  # with status 200 and no body: these fields replace the first choice's
    times: int = 1
    path_contains: str = "/v1/"
    body_contains: str | None = None  # only requests whose JSON body holds this text (one prompt's)
    after: int = 0  # let this many matching requests through first
    hits: int = 0
    seen: int = 0


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    at: float


def _words(text: str, limit: int | None) -> list[str]:
    words = ("echo: " + text).split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    return pieces[:limit] if limit is not None else pieces


def _logprob(i: int, rank: int) -> float:
    return -0.25 * (i + 1) - 1.5 * rank


class FakeOpenAI:
    """The server and what it saw; use as a context manager (see the module docstring)."""

    def __init__(
        self, models: tuple[str, ...] = ("fake-judge",), *, api_key: str | None = None, context_length: int = 4096
    ) -> None:
        self.models = models
        self.api_key = api_key
        self.context_length = context_length
        self.empty_replies = False
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.delay = 0.0  # every completion waits this long (keeps requests in flight, for kill tests)
        self.in_flight = 0
        self.max_in_flight = 0  # the most completion requests it was answering at once
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def completions(self) -> list[Recorded]:
        """The completion requests received (faulty ones included)."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("completions")]

    def add_fault(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def __enter__(self) -> FakeOpenAI:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in two writes: with Nagle's algorithm on, the body waits for the client's
            # delayed ACK of the headers (40 ms a response on Linux), which no real server adds.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._record(self, None)
                if self.path.rstrip("/") == "/v1/models":
                    data = [{"id": m, "object": "model", "owned_by": "fake"} for m in fake.models]
                    self._json(200, {"object": "list", "data": data})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                fake._record(self, body)
                fake._enter()
                try:
                    self._answer(body)
                finally:
                    fake._leave()

            def _answer(self, body: Any) -> None:
                route = self.path.rstrip("/")
                if route not in ("/v1/chat/completions", "/v1/completions"):
                    self._json(404, {"detail": "Not Found"})  # what FastAPI servers answer
                    return
                fault = fake._take_fault(self.path, body)
                if fault is not None:
                    time.sleep(fault.delay)
                    if fault.body is not None:
                        self._send(fault.status, fault.body, "application/json", fault.headers)
                        return
                    if fault.status != 200:
                        error = {"error": {"message": f"injected {fault.status}", "type": "server_error"}}
                        self._json(fault.status, error, fault.headers)
                        return
                    # a 200 fault without a body only delays the normal answer
                if fake.api_key is not None and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    sent = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    refusal = {"message": f"Incorrect API key provided: {sent}", "code": "invalid_api_key"}
                    self._json(401, {"error": {**refusal, "type": "invalid_request_error"}})
                    return
                if not isinstance(body, dict) or body.get("model") not in fake.models:
                    model = body.get("model") if isinstance(body, dict) else None
                    message = f"The model `{model}` does not exist or you do not have access to it."
                    self._json(404, {"error": {"message": message, "code": "model_not_found"}})
                    return
                chat = route == "/v1/chat/completions"
                prompt_tokens = fake.prompt_tokens(body, chat)
                if prompt_tokens >= fake.context_length:
                    message = (
                        f"This model's maximum context length is {fake.context_length} tokens. However, your prompt "
                        f"contains {prompt_tokens} input tokens, which exceeds this limit even without any output "
                        "tokens. Please reduce the length of the input prompt."
                    )
                    too_long = {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
                    self._json(400, {"error": too_long})
                    return
                time.sleep(fake.delay)
                answer = fake._chat(body, prompt_tokens) if chat else fake._text(body, prompt_tokens)
                if fault is not None and fault.choice is not None:
                    answer["choices"][0].update(fault.choice)
                self._json(200, answer, trickle=fault.trickle if fault is not None else 0.0)

            def _json(
                self, status: int, value: Any, headers: dict[str, str] | None = None, trickle: float = 0.0
            ) -> None:
                self._send(status, json.dumps(value).encode(), "application/json", headers or {}, trickle)

            def _send(
                self, status: int, data: bytes, content_type: str, headers: dict[str, str], trickle: float = 0.0
            ) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if trickle:  # a byte at a time: no read waits long, the whole answer does
                        for byte in data:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(trickle)
                        return
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout test)
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ internals

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self._lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    handler.path,
                    body,
                    {k.lower(): v for k, v in handler.headers.items()},
                    time.monotonic(),
                )
            )

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _take_fault(self, path: str, body: Any) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.hits < fault.times and fault.path_contains in path and self._holds(body, fault.body_contains):
                    fault.seen += 1
                    if fault.seen > fault.after:
                        fault.hits += 1
                        return fault
        return None

    @staticmethod
    def _holds(body: Any, text: str | None) -> bool:
        return text is None or text in json.dumps(body, ensure_ascii=False)

    def _positions(self, pieces: list[str], k: int) -> list[dict[str, Any]]:
        positions = []
        for i, piece in enumerate(pieces):
            top = [piece] + [f"alt{r}" for r in range(1, k)]
            positions.append(
                {
                    "token": piece,
                    "logprob": _logprob(i, 0),
                    "bytes": list(piece.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": _logprob(i, r), "bytes": list(t.encode())} for r, t in enumerate(top)
                    ],
                }
            )
        return positions

    def prompt_tokens(self, body: dict[str, Any], chat: bool) -> int:
        """The prompt's length in this server's tokens: its words."""
        if chat:
            return sum(len(str(m.get("content", "")).split()) for m in body["messages"] if isinstance(m, dict))
        return len(str(body["prompt"]).split())

    def _answer_pieces(self, prompt: str, limit: int | None, prompt_tokens: int) -> tuple[list[str], str]:
        """The answer's tokens and finish reason: cut at ``max_tokens`` and at the context, as vLLM does."""
        room = self.context_length - prompt_tokens
        limit = room if limit is None else min(limit, room)
        if self.empty_replies:
            return [""], "stop"
        pieces = _words(prompt, limit)
        return pieces, "length" if len(pieces) >= limit else "stop"

    def _chat(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        pieces, finish_reason = self._answer_pieces(str(body["messages"][-1]["content"]), limit, prompt_tokens)
        text = "".join(pieces)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._positions(pieces, int(body.get("top_logprobs") or 0))}
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces)}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
            "usage": usage | {"total_tokens": prompt_tokens + len(pieces)},
        }

    def _text(self, body: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
        pieces, finish_reason = self._answer_pieces(str(body["prompt"]), body.get("max_tokens"), prompt_tokens)
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(pieces),
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        k = body.get("logprobs")
        if k is not None:
            choice["logprobs"] = {
                "tokens": pieces,
                "token_logprobs": [_logprob(i, 0) for i in range(len(pieces))],
                "top_logprobs": [
                    {t: _logprob(i, r) for r, t in enumerate([p] + [f"alt{r}" for r in range(1, int(k))])}
                    for i, p in enumerate(pieces)
                ],
                "text_offset": [0] * len(pieces),
            }
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(pieces),
                "total_tokens": prompt_tokens + len(pieces),
            },
        }


@contextmanager
def fake_openai(**kwargs: Any) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(**kwargs) as server:
        yield server
