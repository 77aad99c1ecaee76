"""The streaming client against a real fake server on loopback: timing, SSE quirks,
usage accounting and failure classification."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from replayer.clock import MonotonicClock
from replayer.config import EndpointConfig
from replayer.errors import EndpointError
from replayer.play.client import Client, Outcome
from tests.fakes import FakeLLM, make_fake_llm_app

Serve = Callable[..., Awaitable[TestServer]]
BODY = b'{"model":"fake-model","prompt":[1,2,3],"max_tokens":%d,"stream":true}'


async def _client_for(
    aiohttp_server: Serve, fake: FakeLLM, **endpoint: Any
) -> tuple[Client, TestServer]:
    server = await aiohttp_server(make_fake_llm_app(fake), host="127.0.0.1")
    cfg = EndpointConfig(
        base_url=f"http://127.0.0.1:{server.port}", model="fake-model", **endpoint
    )
    return Client(cfg, MonotonicClock(), limit=16), server


async def _send(aiohttp_server: Serve, fake: FakeLLM, n: int = 5, **ep: Any) -> Outcome:
    client, _ = await _client_for(aiohttp_server, fake, **ep)
    async with client:
        return await client.send(BODY % n)


async def test_client_stamps_never_precede_the_servers_delays(
    aiohttp_server: Serve,
) -> None:
    # The server waits 50 ms before the first token and 10 ms between tokens: no
    # stamp can come sooner. How close they come is measured in bench/ (no upper
    # bound on a shared machine).
    fake = FakeLLM(ttft_s=0.05, itl_s=0.01)
    client, _ = await _client_for(aiohttp_server, fake)
    async with client:
        for _ in range(3):
            out = await client.send(BODY % 11)
            assert out.status == "ok", out.error_message
            assert out.first_token_ns is not None
            assert out.first_token_ns - out.start_ns >= 0.05e9
            # Chunk k leaves the server 50 ms + k * 10 ms after it got the request
            # (chunks read together share one stamp, so gaps alone prove nothing).
            times = np.asarray(out.chunk_times_ns)
            assert len(times) == 11
            assert (times >= 0.05e9 + np.arange(11) * 0.01e9).all()
            assert out.start_ns < out.first_token_ns <= out.end_ns
            assert out.chunk_times_ns[0] == out.first_token_ns - out.start_ns


async def test_client_counts_chunks_and_reads_usage(aiohttp_server: Serve) -> None:
    out = await _send(aiohttp_server, FakeLLM(cached_tokens=3), n=6)
    assert out.status == "ok"
    assert len(out.chunk_times_ns) == 6
    assert out.chunk_times_ns == sorted(out.chunk_times_ns)
    assert out.completion_tokens == 6
    assert out.server_prompt_tokens == 3
    assert out.cached_tokens == 3


async def test_client_missing_cached_tokens_is_none_not_zero(
    aiohttp_server: Serve,
) -> None:
    out = await _send(aiohttp_server, FakeLLM(cached_tokens=None), n=2)
    assert out.status == "ok"
    assert out.cached_tokens is None
    out = await _send(aiohttp_server, FakeLLM(usage=False), n=2)
    assert out.completion_tokens is None
    assert out.cached_tokens is None


@pytest.mark.parametrize(
    "quirk",
    [
        {"comment_lines": True},
        {"crlf": True},
        {"tokens_per_chunk": 3},
        {"reasoning": True},
        {"keep_open_after_done": 5.0},
    ],
)
async def test_client_handles_sse_quirks(
    aiohttp_server: Serve, quirk: dict[str, Any]
) -> None:
    fake = FakeLLM(**quirk)
    client, _ = await _client_for(aiohttp_server, fake, api="chat")
    async with client:
        out = await asyncio.wait_for(client.send(BODY % 7), timeout=3)
    assert out.status == "ok", out.error_message
    assert out.completion_tokens == 7
    per_chunk = quirk.get("tokens_per_chunk", 1)
    assert len(out.chunk_times_ns) == -(-7 // per_chunk)
    # The role-only first chunk carries no content: TTFT is from the first content.
    assert out.first_token_ns is not None
    assert out.first_token_ns - out.start_ns == out.chunk_times_ns[0]


async def test_client_http_error_is_a_row(aiohttp_server: Serve) -> None:
    out = await _send(aiohttp_server, FakeLLM(status=503))
    assert out.status == "http_error"
    assert out.http_status == 503
    assert out.error_message == "injected failure"


async def test_client_disconnect_mid_stream(aiohttp_server: Serve) -> None:
    out = await _send(aiohttp_server, FakeLLM(disconnect_after=2), n=10)
    assert out.status == "client_error"
    assert len(out.chunk_times_ns) == 2


async def test_client_stream_without_done_is_incomplete(aiohttp_server: Serve) -> None:
    out = await _send(aiohttp_server, FakeLLM(no_done=True), n=3)
    assert out.status == "client_error"
    assert out.error_type == "IncompleteStream"


async def test_client_in_stream_error_event(aiohttp_server: Serve) -> None:
    out = await _send(aiohttp_server, FakeLLM(error_event=True), n=3)
    assert out.status == "http_error"
    assert out.error_message is not None
    assert "boom" in out.error_message


@pytest.mark.parametrize("total_s", [None, 30.0])
async def test_client_read_timeout_between_chunks(
    aiohttp_server: Serve, total_s: float | None
) -> None:
    fake = FakeLLM(stall_after=1, stall_s=2.0)
    out = await _send(
        aiohttp_server, fake, n=4, read_timeout_s=0.3, total_timeout_s=total_s
    )
    assert out.status == "timeout"
    assert len(out.chunk_times_ns) == 1
    # A read stall is labelled so, even beside a (longer) total timeout.
    assert out.error_message == "read timeout"


async def test_client_total_timeout(aiohttp_server: Serve) -> None:
    fake = FakeLLM(itl_s=0.2)
    out = await _send(aiohttp_server, fake, n=10, total_timeout_s=0.3)
    assert out.status == "timeout"
    assert out.error_message == "total timeout"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_client_refused_connection_is_retried_once_then_a_row() -> None:
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{_free_port()}", model="m")
    async with Client(cfg, MonotonicClock(), limit=1) as client:
        out = await client.send(BODY % 1)
        assert out.status == "client_error"
        assert out.retries == 1
        with pytest.raises(EndpointError, match="cannot reach"):
            await client.check()


async def test_client_check_lists_models(aiohttp_server: Serve) -> None:
    client, _ = await _client_for(aiohttp_server, FakeLLM())
    async with client:
        assert await client.check() == ["fake-model"]


async def test_client_sends_api_key_but_keeps_it_out_of_metadata(
    aiohttp_server: Serve,
) -> None:
    seen: list[str] = []
    fake = FakeLLM()
    app = make_fake_llm_app(fake)

    @web_middleware
    async def grab(request: Any, handler: Any) -> Any:
        seen.append(request.headers.get("Authorization", ""))
        return await handler(request)

    app.middlewares.append(grab)
    server = await aiohttp_server(app, host="127.0.0.1")
    cfg = EndpointConfig(
        base_url=f"http://127.0.0.1:{server.port}", model="m", api_key="sk-secret-123"
    )
    async with Client(cfg, MonotonicClock(), limit=1) as client:
        out = await client.send(BODY % 1)
    assert out.status == "ok"
    assert seen == ["Bearer sk-secret-123"]
    assert "sk-secret" not in repr(cfg)
    assert "sk-secret" not in str(cfg.as_metadata())


def web_middleware(f: Any) -> Any:
    from aiohttp import web

    return web.middleware(f)


async def test_client_cancellation_propagates(aiohttp_server: Serve) -> None:
    fake = FakeLLM(itl_s=0.5)
    client, _ = await _client_for(aiohttp_server, fake)
    async with client:
        task = asyncio.ensure_future(client.send(BODY % 10))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_client_check_without_models_route_and_html_errors(
    aiohttp_server: Serve,
) -> None:
    from aiohttp import web

    async def html_error(request: web.Request) -> web.Response:
        return web.Response(
            status=503, text="<html><body><h1>Service\nUnavailable</h1></body></html>"
        )

    bare = web.Application()
    server = await aiohttp_server(bare, host="127.0.0.1")
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{server.port}", model="m")
    async with Client(cfg, MonotonicClock(), limit=1) as client:
        assert await client.check() is None  # no /v1/models: the caller decides
    app = web.Application()
    app.router.add_get("/v1/models", html_error)
    server = await aiohttp_server(app, host="127.0.0.1")
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{server.port}", model="m")
    async with Client(cfg, MonotonicClock(), limit=1) as client:
        with pytest.raises(EndpointError) as info:
            await client.check()
    assert str(info.value).endswith("HTTP 503: Service Unavailable")


async def test_client_splits_the_pool_wait_into_slot_wait_and_connect(
    aiohttp_server: Serve,
) -> None:
    # One slot, two requests at once: the second queues for the slot (the client's
    # own cap) while the first opens the connection and waits 200 ms for its first
    # token; the connection is the server's part, the queueing the client's.
    server = await aiohttp_server(
        make_fake_llm_app(FakeLLM(ttft_s=0.2)), host="127.0.0.1"
    )
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{server.port}", model="m")
    async with (
        Client(cfg, MonotonicClock(), limit=1) as client,
        asyncio.TaskGroup() as tg,
    ):
        sends = [tg.create_task(client.send(BODY % 2)) for _ in range(2)]
    outs = [s.result() for s in sends]
    assert [o.status for o in outs] == ["ok", "ok"]
    for o in outs:
        assert o.slot_wait_ns is not None
        assert o.connect_ns is not None
        assert o.pool_wait_ns == o.slot_wait_ns + o.connect_ns
    first, second = sorted(outs, key=lambda o: o.slot_wait_ns or 0)
    assert first.slot_wait_ns == 0
    assert first.connect_ns is not None
    assert first.connect_ns > 0  # a new connection: the server's accept
    assert second.slot_wait_ns is not None
    assert second.slot_wait_ns >= 0.15e9  # queued behind the first request
    assert Outcome().slot_wait_ns is None  # unmeasured (a fake client): null
