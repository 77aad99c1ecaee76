"""HTTP client: one aiohttp session; one POST per request, retried once when the
connection fails before a response; reads stamped by the run's Clock. HTTP, timeout
and aiohttp errors become the Outcome's status, the rest propagate (docs/metrics.md)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace, TracebackType
from typing import Any, Protocol

import aiohttp
import orjson

from replayer.clock import Clock
from replayer.config import EndpointConfig, public_url, redact_urls
from replayer.errors import EndpointError
from replayer.play.sse import EventFramer, usage_counts, usage_tiers
from replayer.records import RequestStatus

# error_type of an ok row whose server ignored "stream": true.
NOT_STREAMED = "not_streamed"
# error_message of a request cut by the read timeout (no byte for that long).
READ_TIMEOUT = "read timeout"

# Failures that happen before the server could have seen the request: safe to retry
# once (a stale keep-alive connection closed by the server is the common case).
_RETRYABLE_BEFORE_SEND = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)


@dataclass(slots=True)
class Outcome:
    """What one HTTP request produced (mutable builder, private to the client)."""

    start_ns: int = 0
    first_token_ns: int | None = None
    end_ns: int = 0
    chunk_times_ns: list[int] = field(default_factory=list)  # offsets from start_ns
    server_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cached_gpu_tokens: int | None = None  # of cached_tokens, by tier (None: not said)
    cached_host_tokens: int | None = None
    status: RequestStatus = "ok"
    http_status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    retries: int = 0
    finish_reason: str | None = None
    # Getting a connection: pool_wait_ns = slot_wait_ns + connect_ns. The two parts
    # are None when the client does not measure them (a fake or in-process client).
    pool_wait_ns: int = 0
    slot_wait_ns: int | None = None  # queued for a free slot under the client's cap
    connect_ns: int | None = None  # opening a new connection (the server accepting)
    _slot_since_ns: int = 0  # set by the connector's trace while it queues
    _connect_since_ns: int = 0  # ... and while it connects
    text: list[str] | None = None  # the reply's text, collected when not None
    last_byte_ns: int = 0  # the latest byte of the answer (0: none arrived)
    # The response's --session-token-header value (None: none); never recorded.
    session_token: str | None = None
    # Before the send, where the caller stamps them (0: not): when it woke up to
    # send, and when the body was ready (the prompt built).
    woke_ns: int = 0
    built_ns: int = 0

    def end_phase(self, now_ns: int) -> None:
        """Close the open slot wait or connect at ``now_ns``: the connector's end
        signal, or the attempt's end when a connect failed or was cancelled (aiohttp
        then sends no end signal, and the time spent is the server's all the same)."""
        if self._slot_since_ns:
            waited = now_ns - self._slot_since_ns
            self.slot_wait_ns = (self.slot_wait_ns or 0) + waited
            self.pool_wait_ns += waited
            self._slot_since_ns = 0
        if self._connect_since_ns:
            waited = now_ns - self._connect_since_ns
            self.connect_ns = (self.connect_ns or 0) + waited
            self.pool_wait_ns += waited
            self._connect_since_ns = 0

    def fail(self, status: RequestStatus, error_type: str, message: str) -> None:
        self.status = status
        self.error_type = error_type
        # Servers and aiohttp quote URLs in errors: their secrets stay out of rows.
        self.error_message = redact_urls(message)[:500]


class ChatClient(Protocol):
    """What the engine needs of a client (the seam tests fill with a fake)."""

    async def check(self) -> list[str] | None:
        """The served model ids; None when the server has no model list."""
        ...

    async def send(
        self,
        body: bytes,
        out: Outcome | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        """POST ``body`` (with extra ``headers``: session routing), stream the
        response into ``out`` (a new one by default); failures are data, never
        raised. Cancelled, it re-raises; ``out`` then holds what was measured
        before the cancel."""
        ...


class Client:
    """Streams requests to one endpoint.

    async with Client(endpoint, clock, limit=64) as client:
        outcome = await client.send(body_bytes)
    """

    def __init__(self, endpoint: EndpointConfig, clock: Clock, *, limit: int) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self._limit = max(1, limit)
        self._session: aiohttp.ClientSession | None = None
        self._url = endpoint.url()
        self._token_header = endpoint.session_token_header
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        if endpoint.api_key:
            self._headers["Authorization"] = f"Bearer {endpoint.api_key}"
        # What the side requests (model list, cache reset) send: the key, if any.
        self._auth = {k: v for k, v in self._headers.items() if k == "Authorization"}
        # Their time limit: a connection, then a short answer.
        self._side_timeout_s = endpoint.connect_timeout_s + 20

    async def __aenter__(self) -> Client:
        # The connector limit must cover every request in flight: aiohttp's default
        # of 100 would queue requests inside the pool and hide that wait in TTFT.
        connector = aiohttp.TCPConnector(
            limit=self._limit,
            force_close=not self.endpoint.keepalive,
            enable_cleanup_closed=False,
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.endpoint.connect_timeout_s,
            sock_read=self.endpoint.read_timeout_s,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            trace_configs=[self._pool_trace()],
        )
        return self

    def _pool_trace(self) -> aiohttp.TraceConfig:
        """The connector's own signals, per request: how long it queued for a free
        slot under the connector's limit (``Outcome.slot_wait_ns``) and how long a new
        connection took to open (``Outcome.connect_ns``); a server slow to accept
        shows in the second only."""
        clock = self.clock

        def outcome(ctx: SimpleNamespace) -> Outcome | None:
            out = ctx.trace_request_ctx
            return out if isinstance(out, Outcome) else None

        async def queued(
            session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
        ) -> None:
            if (out := outcome(ctx)) is not None:
                out._slot_since_ns = clock.now_ns()

        async def connecting(
            session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
        ) -> None:
            if (out := outcome(ctx)) is not None:
                out._connect_since_ns = clock.now_ns()

        async def end(
            session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
        ) -> None:
            if (out := outcome(ctx)) is not None:
                out.end_phase(clock.now_ns())

        trace = aiohttp.TraceConfig()
        trace.on_connection_queued_start.append(queued)
        trace.on_connection_queued_end.append(end)
        trace.on_connection_create_start.append(connecting)
        trace.on_connection_create_end.append(end)
        return trace

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Client as an async context manager"
        return self._session

    async def check(self) -> list[str] | None:
        """GET /v1/models: the served model ids, or None when the server has no such
        route (404). Raises EndpointError when the server is unreachable or refuses."""
        models = await self.models()
        return None if models is None else list(models)

    async def models(self) -> dict[str, int | None] | None:
        """GET /v1/models: each served model id with the ``max_model_len`` the
        list gives it (vLLM's and the simulator's; None: not given), or None when
        the server has no such route (404). Raises EndpointError as :meth:`check`."""
        url = self.endpoint.models_url()
        shown = public_url(url)  # credentials in the URL never reach a message
        try:
            async with asyncio.timeout(self._side_timeout_s):
                async with self.session.get(url, headers=self._auth) as resp:
                    if resp.status == 404:
                        return None
                    if resp.status != 200:
                        text = _error_text(await resp.text(errors="replace"))
                        raise EndpointError(
                            f"{shown}: HTTP {resp.status}: {_one_line(text)}"
                        )
                    obj = await resp.json(loads=orjson.loads, content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise EndpointError(
                f"cannot reach {public_url(self.endpoint.base_url)}: {_describe(exc)}"
            ) from exc
        except orjson.JSONDecodeError as exc:
            raise EndpointError(
                f"{shown}: not an OpenAI-compatible model list (not JSON)"
            ) from exc
        data = obj.get("data") if isinstance(obj, dict) else None
        out: dict[str, int | None] = {}
        for m in data or ():
            if isinstance(m, dict):
                length = m.get("max_model_len")
                usable = type(length) is int and length > 0
                out[str(m.get("id"))] = length if usable else None
        return out

    async def reset_cache(self) -> str | None:
        """POST the server's prefix-cache reset (vLLM's, then SGLang's route); the
        URL that answered 2xx (credentials removed), or None when neither did or the
        server is unreachable (the caller says so: a reset is best effort)."""
        for url in self.endpoint.reset_cache_urls():
            try:
                async with asyncio.timeout(self._side_timeout_s):
                    async with self.session.post(url, headers=self._auth) as resp:
                        await resp.read()
                        if 200 <= resp.status < 300:
                            return public_url(url)
            except (aiohttp.ClientError, OSError, TimeoutError):
                return None
        return None

    async def send(
        self,
        body: bytes,
        out: Outcome | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        """POST ``body`` (plus ``headers``) and stream the response into ``out``;
        failures are recorded, not raised. Cancelled, it re-raises, and ``out``
        keeps the send time, the first token and the chunks received so far."""
        out = out if out is not None else Outcome()
        # Measured from here on: zero unless the connector queues or connects.
        out.slot_wait_ns = out.slot_wait_ns or 0
        out.connect_ns = out.connect_ns or 0
        for attempt in range(2):
            out.start_ns = self.clock.now_ns()
            total = None
            try:
                if self.endpoint.total_timeout_s is None:
                    await self._stream(body, out, headers)
                else:
                    total = asyncio.timeout(self.endpoint.total_timeout_s)
                    async with total:
                        await self._stream(body, out, headers)
            except _RETRYABLE_BEFORE_SEND as exc:
                if out.http_status is None and attempt == 0:
                    out.retries += 1
                    continue
                out.fail("client_error", type(exc).__name__, _describe(exc))
            except TimeoutError as exc:
                # Named for what fired: the total deadline, or the socket's own.
                if total is not None and total.expired():
                    what = "total timeout"
                elif isinstance(exc, aiohttp.ConnectionTimeoutError):
                    what = "connect timeout"
                else:
                    what = READ_TIMEOUT
                out.fail("timeout", "TimeoutError", what)
            except aiohttp.ClientError as exc:
                out.fail("client_error", type(exc).__name__, _describe(exc))
            except asyncio.CancelledError:
                out.end_ns = self.clock.now_ns()
                out.fail("cancelled", "CancelledError", "cancelled")
                raise
            finally:
                out.end_phase(self.clock.now_ns())
            break
        out.end_ns = self.clock.now_ns()
        return out

    async def _stream(
        self, body: bytes, out: Outcome, headers: Mapping[str, str] | None
    ) -> None:
        sent = self._headers if not headers else {**self._headers, **headers}
        async with self.session.post(
            self._url, data=body, headers=sent, trace_request_ctx=out
        ) as resp:
            out.http_status = resp.status
            out.last_byte_ns = self.clock.now_ns()
            if self._token_header is not None:
                out.session_token = resp.headers.get(self._token_header)
            if resp.status != 200:
                text = await resp.text(errors="replace")
                # One plain line: error pages are HTML more often than not.
                out.fail(
                    "http_error",
                    f"HTTP {resp.status}",
                    _one_line(_error_text(text), 300),
                )
                return
            if "text/event-stream" not in resp.headers.get("Content-Type", ""):
                await self._whole(resp, out)
                return
            await self._events(resp, out)

    async def _events(self, resp: aiohttp.ClientResponse, out: Outcome) -> None:
        # Read whatever bytes have arrived (one await per network read, not per line);
        # events that arrived in one read share its stamp.
        clock = self.clock
        start = out.start_ns
        content = resp.content
        text = out.text
        framer = EventFramer(text=text is not None)
        done = False
        while not done:
            data = await content.readany()
            if not data:
                break  # EOF
            now = out.last_byte_ns = clock.now_ns()
            for stamp, event in framer.feed(data, now):
                if event.done:
                    done = True  # break eagerly: some servers keep the stream open
                    break
                if event.error is not None:
                    out.fail("http_error", "stream_error", event.error)
                    return
                if event.has_content:
                    if out.first_token_ns is None:
                        out.first_token_ns = stamp
                    out.chunk_times_ns.append(stamp - start)
                if text is not None and event.text:
                    text.append(event.text)
                if event.usage is not None:
                    prompt, completion, cached = usage_counts(event.usage)
                    out.server_prompt_tokens = prompt
                    out.completion_tokens = completion
                    out.cached_tokens = cached
                    out.cached_gpu_tokens, out.cached_host_tokens = usage_tiers(
                        event.usage
                    )
                if event.finish_reason is not None:
                    out.finish_reason = event.finish_reason
        if not done:
            tail = framer.finish()
            done = tail is not None and tail.done
        if not done:
            out.fail(
                "client_error",
                "IncompleteStream",
                "stream ended before data: [DONE]",
            )

    async def _whole(self, resp: aiohttp.ClientResponse, out: Outcome) -> None:
        raw = await resp.read()
        now = out.last_byte_ns = self.clock.now_ns()
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            out.fail("http_error", "bad_response", f"not JSON: {raw[:200]!r}")
            return
        out.first_token_ns = now
        out.chunk_times_ns.append(now - out.start_ns)
        # Recorded, and said: TTFT is the whole response time here, not a first token.
        out.error_type = NOT_STREAMED
        out.error_message = (
            "a stream was asked for; the server sent one JSON response "
            f"({resp.headers.get('Content-Type', 'no Content-Type')})"
        )
        if isinstance(obj, dict):
            prompt, completion, cached = usage_counts(obj.get("usage"))
            out.server_prompt_tokens = prompt
            out.completion_tokens = completion
            out.cached_tokens = cached
            out.cached_gpu_tokens, out.cached_host_tokens = usage_tiers(
                obj.get("usage")
            )


@dataclass(slots=True)
class ServerWatch:
    """Whether the server still answers, judged from one process's requests
    (event-loop owned). It is taken for gone when ``refused_limit`` requests in a
    row failed without a byte of an answer (refused, reset, timed out) and none was
    answered between them, or when a read timeout fires and no request in flight
    has received a byte for the read timeout."""

    silence_ns: int  # the read timeout
    refused_limit: int = 20
    unanswered: int = 0  # failures in a row without a byte of an answer
    last_byte_ns: int = 0  # the latest byte an ended request received
    _inflight: dict[int, Outcome] = field(default_factory=dict)

    def sent(self, out: Outcome) -> None:
        """``out`` is about to be sent."""
        self._inflight[id(out)] = out

    def ended(self, out: Outcome, now_ns: int) -> str | None:
        """``out`` ended (or was cancelled): why the server is taken for gone, or
        None while it is not."""
        self._inflight.pop(id(out), None)
        if out.http_status is not None or out.last_byte_ns:
            self.unanswered = 0
            self.last_byte_ns = max(self.last_byte_ns, out.last_byte_ns)
        elif out.status in ("client_error", "timeout"):
            self.unanswered += 1
        if self.unanswered >= self.refused_limit:
            last = _one_line(f"{out.error_type}: {out.error_message}", 120)
            return f"{self.unanswered} requests in a row got no answer (last: {last})"
        if out.status == "timeout" and out.error_message == READ_TIMEOUT:
            latest = max(
                [self.last_byte_ns, *(o.last_byte_ns for o in self._inflight.values())]
            )
            if now_ns - latest >= self.silence_ns:
                return (
                    f"no byte from it for the read timeout "
                    f"({self.silence_ns / 1e9:g} s) on any of the "
                    f"{len(self._inflight) + 1} requests in flight"
                )
        return None


def _error_text(text: str) -> str:
    with contextlib.suppress(orjson.JSONDecodeError):
        obj: Any = orjson.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            if msg:
                return str(msg)[:500]
    return text.strip()[:500]


def _one_line(text: str, limit: int = 160) -> str:
    """Markup-free single line: error pages are HTML more often than not."""
    text = re.sub(r"<[^>]+>", " ", text)
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _describe(exc: BaseException) -> str:
    text = redact_urls(str(exc)) or type(exc).__name__
    return text.splitlines()[0][:300] if text else type(exc).__name__
