"""A real (in-process, loopback) fake OpenAI-compatible server with exact timing and
injectable quirks, for client and session tests. Not a mock of aiohttp."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


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
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        fake.bodies.append(body)
        fake.requests += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        if fake.requests <= fake.fail_first or fake.status != 200:
            status = fake.status if fake.status != 200 else 500
            return web.json_response(
                {"error": {"message": "injected failure", "type": "x", "code": status}},
                status=status,
            )
        fake.active += 1
        fake.max_active = max(fake.max_active, fake.active)
        try:
            return await _stream(request, body, started)
        finally:
            fake.active -= 1
            fake.log.append((str(body.get("user", "")), started, loop.time()))

    async def _stream(
        request: web.Request, body: dict[str, Any], started: float
    ) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        n = fake.tokens if fake.tokens is not None else int(body.get("max_tokens", 1))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
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
            prompt = body.get("prompt")
            n_prompt = len(prompt) if isinstance(prompt, list) else 1
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
