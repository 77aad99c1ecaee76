"""Fakes for tests: a real (in-process, loopback) OpenAI-compatible server with exact
timing and injectable quirks (not a mock of aiohttp), and, for engine tests in virtual
time, a FakeClock and a FakeChatClient that fill the engine's Clock and ChatClient
seams, and a virtual-time replay built on them (engine_config, replay_in_fakes)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from aiohttp import web

from replayer.config import EndpointConfig, ReplayConfig
from replayer.play.client import Outcome
from replayer.play.progress import ReplayOutcome
from traces.materialize import PromptConfig
from traces.model import Trace
from traces.textrule import chat_to_token_ids


@dataclass
class FakeLLM:
    """Behaviour of the fake server; mutate between requests if needed."""

    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens: int | None = None  # None: max_tokens of the request
    tokens_per_chunk: int = 1
    role_chunk: bool = True  # a role-only first chunk, like vLLM
    comment_lines: bool = False  # ": ping" comment events
    crlf: bool = False  # \r\n line ends
    reasoning: bool = False  # deltas carry reasoning_content instead of content
    usage: bool = True
    cached_tokens: int | None = 0
    status: int = 200  # non-200: an OpenAI error body
    fail_first: int = 0  # the first N requests get `status` 500
    disconnect_after: int | None = None  # close the connection after N chunks
    stall_after: int | None = None  # stop sending after N chunks for stall_s
    stall_s: float = 0.0
    error_event: bool = False  # an in-stream error object instead of tokens
    no_done: bool = False  # end the stream without data: [DONE]
    keep_open_after_done: float = 0.0  # seconds to hold the stream after [DONE]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # per request
    # Per request: its header names as sent (case kept) with their values.
    raw_headers: list[list[tuple[str, str]]] = field(default_factory=list)
    # Each response carries a fresh random value in this header (llm-d's session
    # token); tokens_issued: the value each request's response carried.
    token_header: str | None = None
    tokens_issued: list[str | None] = field(default_factory=list)
    # Listed in /v1/models; prompt + max_tokens past it is vLLM's 400.
    max_model_len: int | None = None
    # A chat template's tokens on top of the shared text rule's count of the messages
    # (what usage.prompt_tokens then reports): base + per message.
    template_base: int = 0
    template_per_message: int = 0
    active: int = 0
    max_active: int = 0
    requests: int = 0
    log: list[tuple[str, float, float]] = field(default_factory=list)  # id, start, end


def _sse(obj: Any, crlf: bool) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    return b"data: " + json.dumps(obj).encode() + nl + nl


def make_fake_llm_app(fake: FakeLLM) -> web.Application:
    """The aiohttp application serving ``fake``."""

    async def models(request: web.Request) -> web.Response:
        model: dict[str, Any] = {"id": "fake-model"}
        if fake.max_model_len is not None:
            model["max_model_len"] = fake.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    def prompt_tokens(body: dict[str, Any]) -> int:
        messages = body.get("messages")
        if isinstance(messages, list):
            return (
                len(chat_to_token_ids(messages))
                + fake.template_base
                + fake.template_per_message * len(messages)
            )
        prompt = body.get("prompt")
        return len(prompt) if isinstance(prompt, list) else 1

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        fake.bodies.append(body)
        fake.headers.append({k.lower(): v for k, v in request.headers.items()})
        fake.raw_headers.append(
            [(k.decode(), v.decode()) for k, v in request.raw_headers]
        )
        fake.requests += 1
        extra: dict[str, str] = {}
        token = None
        if fake.token_header is not None:
            token = f"tok-{fake.requests}-{secrets.token_hex(8)}"
            extra[fake.token_header] = token
        fake.tokens_issued.append(token)
        loop = asyncio.get_running_loop()
        started = loop.time()
        n_prompt = prompt_tokens(body)
        if (
            fake.max_model_len is not None
            and n_prompt + int(body.get("max_tokens", 1)) > fake.max_model_len
        ):
            return web.json_response(
                {"error": {"message": "maximum context length", "code": 400}},
                status=400,
                headers=extra,
            )
        if fake.requests <= fake.fail_first or fake.status != 200:
            status = fake.status if fake.status != 200 else 500
            return web.json_response(
                {"error": {"message": "injected failure", "type": "x", "code": status}},
                status=status,
                headers=extra,
            )
        fake.active += 1
        fake.max_active = max(fake.max_active, fake.active)
        try:
            return await _stream(request, body, started, extra, n_prompt)
        finally:
            fake.active -= 1
            fake.log.append((str(body.get("user", "")), started, loop.time()))

    async def _stream(
        request: web.Request,
        body: dict[str, Any],
        started: float,
        extra: dict[str, str],
        n_prompt: int,
    ) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        n = fake.tokens if fake.tokens is not None else int(body.get("max_tokens", 1))
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **extra}
        )
        await resp.prepare(request)
        crlf = fake.crlf
        if chat and fake.role_chunk:
            await resp.write(
                _sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, crlf)
            )
        if fake.comment_lines:
            await resp.write(b": ping\n\n")
        await asyncio.sleep(fake.ttft_s)
        if fake.error_event:
            await resp.write(_sse({"error": {"message": "boom in stream"}}, crlf))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        sent = 0
        chunk = 0
        while sent < n:
            k = min(fake.tokens_per_chunk, n - sent)
            text = "".join(f"t{sent + j} " for j in range(k))
            if chat:
                key = "reasoning_content" if fake.reasoning else "content"
                obj = {"choices": [{"index": 0, "delta": {key: text}}]}
            else:
                obj = {"choices": [{"index": 0, "text": text}]}
            if sent + k == n:
                obj["choices"][0]["finish_reason"] = "length"
            await resp.write(_sse(obj, crlf))
            sent += k
            chunk += 1
            if fake.disconnect_after is not None and chunk >= fake.disconnect_after:
                assert request.transport is not None
                request.transport.close()
                return resp
            if fake.stall_after is not None and chunk == fake.stall_after:
                await asyncio.sleep(fake.stall_s)
            if fake.comment_lines:
                await resp.write(b": keep-alive\n\n")
            if sent < n:
                await asyncio.sleep(fake.itl_s)
        if fake.usage:
            usage: dict[str, Any] = {
                "prompt_tokens": n_prompt,
                "completion_tokens": n,
                "total_tokens": n_prompt + n,
            }
            if fake.cached_tokens is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": fake.cached_tokens}
            await resp.write(_sse({"choices": [], "usage": usage}, crlf))
        if not fake.no_done:
            await resp.write(b"data: [DONE]\n\n")
        if fake.keep_open_after_done:
            await asyncio.sleep(fake.keep_open_after_done)
        return resp

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


@contextlib.contextmanager
def serve_in_thread(fake: FakeLLM) -> Iterator[str]:
    """``fake``'s server on 127.0.0.1 (a free port) on a loop of its own thread, for
    tests that run the real CLI (which runs its own loop); yields its base URL."""
    with serve_app_in_thread(make_fake_llm_app(fake)) as url:
        yield url


@contextlib.contextmanager
def serve_app_in_thread(app: web.Application) -> Iterator[str]:
    """``app`` on 127.0.0.1 (a free port) on a loop of its own thread; yields its
    base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)

    async def start() -> None:
        await runner.setup()
        await web.SockSite(runner, sock).start()

    thread = threading.Thread(target=loop.run_forever, name="fake-llm", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        sock.close()


class FakeClock:
    """Virtual time for engine tests (trio's autojump MockClock): a sleep returns when
    nothing else on the loop can run and its deadline is the earliest; time then
    jumps to that deadline. A 10-minute trace replays in milliseconds, and timing
    assertions are exact: no time passes that a test did not ask for.

    Works for engine runs that do no real I/O on the sessions' path (FakeChatClient,
    prompts small enough to be built on the loop).
    """

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now = start_ns
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._driver: asyncio.Task[None] | None = None

    def now_ns(self) -> int:
        return self._now

    async def sleep_until(self, deadline_ns: int) -> None:
        if deadline_ns <= self._now:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._sleepers, (deadline_ns, self._seq, fut))
        self._seq += 1
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive(), name="fake-clock")
        await fut

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while self._sleepers:
            # Let everything runnable run first; only then is time allowed to pass.
            await asyncio.sleep(0)
            # asyncio's run queue: no public way to ask "is anything runnable?"
            while loop._ready:  # type: ignore[attr-defined]  # noqa: ASYNC110
                await asyncio.sleep(0)
            deadline, _, fut = heapq.heappop(self._sleepers)
            if fut.done():  # its sleeper was cancelled
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)


@dataclass
class FakeChatClient:
    """The engine's ChatClient seam without HTTP: each request "streams" ``tokens``
    (default: its max_tokens) on the clock it is given, ``ttft_ns`` then ``itl_ns``
    per token. Requests numbered in ``fail`` (1-based, in send order) get HTTP 500."""

    clock: FakeClock
    ttft_ns: int = 10_000_000
    itl_ns: int = 1_000_000
    tokens: int | None = None
    fail: frozenset[int] = frozenset()
    models: list[str] = field(default_factory=lambda: ["fake-model"])
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # extra, per request
    # Listed in /v1/models; prompt + max_tokens past it is vLLM's 400.
    max_model_len: int | None = None
    # A chat template's tokens on top of the shared text rule's count of the messages
    # (what usage.prompt_tokens then reports): base + per message.
    template_base: int = 0
    template_per_message: int = 0
    active: int = 0
    max_active: int = 0

    async def check(self) -> list[str] | None:
        return self.models

    async def send(
        self,
        body: bytes,
        out: Outcome | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        obj = json.loads(body)
        self.bodies.append(obj)
        self.headers.append(dict(headers or {}))
        clock = self.clock
        out = out if out is not None else Outcome()
        out.start_ns = clock.now_ns()
        if len(self.bodies) in self.fail:
            out.http_status = 500
            out.fail("http_error", "HTTP 500", "injected failure")
            out.end_ns = clock.now_ns()
            return out
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            n = self.tokens if self.tokens is not None else int(obj["max_tokens"])
            out.http_status = 200
            for k in range(n):
                step = self.ttft_ns if k == 0 else self.itl_ns
                await clock.sleep_until(clock.now_ns() + step)
                now = clock.now_ns()
                if k == 0:
                    out.first_token_ns = now
                out.chunk_times_ns.append(now - out.start_ns)
            prompt = obj.get("prompt")
            out.server_prompt_tokens = len(prompt) if isinstance(prompt, list) else None
            out.completion_tokens = n
            out.end_ns = clock.now_ns()
        finally:
            self.active -= 1
        return out


@dataclass
class FakeRun:
    """A finished virtual-time replay: its rows (sorted by start), summary, client."""

    rows: pd.DataFrame
    summary: ReplayOutcome
    client: FakeChatClient
    run_dir: Path


def engine_config(url: str = "http://127.0.0.1:9", **kw: Any) -> ReplayConfig:
    """A ReplayConfig for tests: salt "test", no scraping, rare flushes."""
    api = kw.pop("api", "completions")
    return ReplayConfig(
        endpoint=EndpointConfig(
            base_url=url, model="fake-model", api=api, api_key=kw.pop("api_key", None)
        ),
        prompt=PromptConfig(api=api, salt="test"),
        flush_interval_s=kw.pop("flush_interval_s", 60.0),
        scrape_interval_s=0.0,
        **kw,
    )


ReplayFake = Callable[..., Awaitable[FakeRun]]


def replay_in_fakes(folder: Path) -> ReplayFake:
    """``await run(trace, client=dict(...), **config)`` → FakeRun: a replay in
    virtual time (FakeClock + FakeChatClient, no HTTP) writing a real run directory
    under ``folder``."""
    from replayer.runner.local import replay_trace

    runs = iter(range(1_000))

    async def run(
        trace: Trace, *, client: dict[str, Any] | None = None, **config: Any
    ) -> FakeRun:
        clock = FakeClock()
        fake = FakeChatClient(clock, **(client or {}))
        run_dir = folder / f"run{next(runs)}"
        summary = await replay_trace(
            trace, engine_config(**config), run_dir, clock=clock, client=fake
        )
        rows = pd.read_parquet(run_dir / "requests").sort_values(
            ["start_ns", "session_id", "request_index"], na_position="last"
        )
        return FakeRun(
            rows=rows.reset_index(drop=True),
            summary=summary,
            client=fake,
            run_dir=run_dir,
        )

    return run
