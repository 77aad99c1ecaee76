"""The simulator's HTTP face: OpenAI routes, SSE streaming, faults and /metrics in front
of the one engine, whose loop lives exactly as long as the app. See
docs/replaying.md ("Against the built-in simulator")."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from replayer.sim.config import SimConfig
from replayer.sim.dice import Dice, roll
from replayer.sim.engine import Engine, EngineStopped, Sequence
from replayer.sim.metrics import render_metrics
from replayer.sim.wire import (
    DONE,
    ApiError,
    ChunkEncoder,
    GenerateRequest,
    Kind,
    error_body,
    parse_request,
    usage_body,
    word_table,
)

OWNED_BY = "replayer-sim"
_THREAD_PARSE_BYTES = 256 * 1024  # text tokenization of bigger bodies leaves the loop


class _Sim:
    """Per-application state: config, engine, RNG and the wall-clock anchor."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self.rng = random.Random(config.seed)
        self.requests = 0
        # One wall-clock anchor; `created` fields are offsets from it on the one clock.
        self._wall_anchor_s = time.time()
        self._perf_anchor_s = time.perf_counter()

    def created(self) -> int:
        return int(self._wall_anchor_s + time.perf_counter() - self._perf_anchor_s)

    def roll(self, req: GenerateRequest) -> Dice:
        return roll(self.rng, self.config, req)


SIM_KEY = web.AppKey("replayer_sim", _Sim)


def make_app(config: SimConfig) -> web.Application:
    """The simulator as an aiohttp application; its engine runs while the app does."""
    app = web.Application(middlewares=[_json_errors], client_max_size=1 << 30)
    app[SIM_KEY] = _Sim(config)
    app.cleanup_ctx.append(_engine_loop)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    # Prefix-cache reset, under vLLM's and SGLang's names.
    app.router.add_post("/reset_prefix_cache", _reset_cache)
    app.router.add_post("/flush_cache", _reset_cache)
    return app


@contextlib.asynccontextmanager
async def serve(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve the simulator on ``host:port`` (0 = a free port); yields the base URL.

    async with serve(SimConfig.fast()) as url:  # "http://127.0.0.1:54321"
        ...
    """
    # handler_cancellation: a client that leaves while its request waits or prefills
    # cancels the handler, which aborts the sequence, as vLLM aborts on disconnect.
    runner = web.AppRunner(
        make_app(config),
        access_log=None,
        shutdown_timeout=1.0,
        handler_cancellation=True,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound_port}"
    finally:
        await runner.cleanup()


async def _engine_loop(app: web.Application) -> AsyncIterator[None]:
    # The task belongs to this context: created on startup, cancelled and awaited on
    # cleanup, so a crash of the loop surfaces when the app stops.
    task = asyncio.create_task(app[SIM_KEY].engine.run(), name="replayer-sim-engine")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@web.middleware
async def _json_errors(
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=error_body(status, message), content_type="application/json"
    )


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _reset_cache(request: web.Request) -> web.Response:
    dropped = request.app[SIM_KEY].engine.reset_prefix_cache()
    return web.json_response({"dropped_blocks": dropped})


async def _models(request: web.Request) -> web.Response:
    sim = request.app[SIM_KEY]
    model = {
        "id": sim.config.model,
        "object": "model",
        "created": sim.created(),
        "owned_by": OWNED_BY,
        "root": sim.config.model,
        "parent": None,
        "max_model_len": sim.config.max_model_len,
    }
    return web.json_response({"object": "list", "data": [model]})


async def _metrics(request: web.Request) -> web.Response:
    sim = request.app[SIM_KEY]
    config = sim.config
    text = render_metrics(
        sim.engine.stats,
        config.model,
        block_size=config.block_size,
        host=config if config.host_capacity_tokens else None,
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    sim = request.app[SIM_KEY]
    body = await request.read()
    try:
        if len(body) > _THREAD_PARSE_BYTES:
            req = await asyncio.to_thread(parse_request, body, kind, sim.config)
        else:
            req = parse_request(body, kind, sim.config)
    except ApiError as exc:
        return _error(exc.status, exc.message)
    dice = sim.roll(req)
    if dice.fail:
        return _error(500, "simulated server error (replayer sim --fail-rate)")
    sim.requests += 1
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    encoder = ChunkEncoder(
        kind, f"{prefix}-sim-{sim.requests:x}", req.model, sim.created()
    )
    try:
        seq = sim.engine.submit(req.prompt_ids, dice.output_tokens)
    except EngineStopped as exc:
        return _error(500, str(exc))
    try:
        if req.stream:
            return await _stream(request, req, dice, seq, encoder, sim.config.stall_s)
        return await _respond(request, req, dice, seq, encoder, sim.config.stall_s)
    except EngineStopped as exc:
        return _error(500, str(exc))
    finally:
        sim.engine.abort(seq)  # no-op unless the client left or a fault dropped it


def _finish_reason(req_max_tokens: int, dice: Dice) -> str:
    return "length" if dice.output_tokens >= req_max_tokens else "stop"


def _usage(seq: Sequence, config: SimConfig) -> dict[str, object]:
    host = max(0, seq.core.host_hit_tokens) if config.host_capacity_tokens else None
    return usage_body(
        seq.prompt_tokens, seq.generated, seq.cached_tokens, host, config.host_dialect
    )


async def _respond(
    request: web.Request,
    req: GenerateRequest,
    dice: Dice,
    seq: Sequence,
    encoder: ChunkEncoder,
    stall_s: float,
) -> web.StreamResponse:
    n = dice.output_tokens
    while seq.generated < n:
        await seq.wait_tokens(seq.generated)
    if dice.disconnect_after is not None:
        _drop(request)
        return web.Response()
    if dice.stall_after is not None:
        await asyncio.sleep(stall_s)
    words = word_table()
    text = b" ".join(words[(dice.word_offset + i) % len(words)] for i in range(n))
    reason = _finish_reason(req.max_tokens, dice)
    usage = _usage(seq, request.app[SIM_KEY].config)
    body = encoder.full_response(text.decode(), reason, usage)
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    req: GenerateRequest,
    dice: Dice,
    seq: Sequence,
    encoder: ChunkEncoder,
    stall_s: float,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    n = dice.output_tokens
    reason = _finish_reason(req.max_tokens, dice)
    words = word_table()
    stall_after = dice.stall_after
    sent = 0
    try:
        while sent < n:
            have = await seq.wait_tokens(sent)
            upto = min(have, dice.disconnect_after or n, stall_after or n)
            parts = [encoder.role_chunk()] if sent == 0 and req.kind == "chat" else []
            for i in range(sent, upto):
                word = words[(dice.word_offset + i) % len(words)]
                text = word if i == 0 else b" " + word
                parts.append(
                    encoder.content_chunk(text, reason if i == n - 1 else None)
                )
            if parts:
                await resp.write(b"".join(parts))
            sent = upto
            if sent == dice.disconnect_after:
                _drop(request)
                return resp
            if sent == stall_after:
                stall_after = None
                await asyncio.sleep(stall_s)
        tail = (
            encoder.usage_chunk(_usage(seq, request.app[SIM_KEY].config))
            if req.include_usage
            else b""
        )
        await resp.write(tail + DONE)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the caller aborts the sequence
    return resp


def _drop(request: web.Request) -> None:
    # Closing the transport mid-body leaves the client with an incomplete chunked
    # response and no [DONE], which is what a crashed or killed server looks like.
    if request.transport is not None:
        request.transport.close()
