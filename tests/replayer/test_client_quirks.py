"""What the real engines send, replayed byte for byte by a loopback aiohttp server, and
how the client reads it. The chunks are copied from vLLM 0.32.0 (CPU build) and
llama.cpp's server (xllamacpp 2026.10.11549) as seen by the e2e tests (tests/e2e,
docs/engines.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.test_utils import TestServer

from replayer.clock import MonotonicClock
from replayer.config import EndpointConfig
from replayer.play.client import Client, Outcome

Serve = Callable[..., Awaitable[TestServer]]

# vLLM, /v1/chat/completions: the first chunk has the role and an EMPTY content string
# (not a token); usage comes in a chunk of its own with empty choices and, on chat, a
# `created_cache_tokens` beside `cached_tokens`.
VLLM_CHAT = [
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
    b'"prompt_text":null}\n\n',
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":" struggled"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":null}]}\n\n',
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"ugu"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":null}]}\n\n',
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":" protagonist"},"logprobs":null,'
    b'"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n',
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[],"usage":{"prompt_tokens":32,"total_tokens":35,'
    b'"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0,'
    b'"created_cache_tokens":0}},"system_fingerprint":"vllm-0.32.0"}\n\n',
    b"data: [DONE]\n\n",
]

# llama.cpp, /v1/completions: the LAST token chunk is an empty text carrying
# finish_reason AND usage (choices not empty) plus a `timings` object.
LLAMACPP_COMPLETIONS = [
    b'data: {"choices":[{"text":"\'s","index":0,"logprobs":null,'
    b'"finish_reason":null}],"model":"smollm2","object":"text_completion"}\n\n',
    b'data: {"choices":[{"text":" answer","index":0,"logprobs":null,'
    b'"finish_reason":null}],"model":"smollm2","object":"text_completion"}\n\n',
    b'data: {"choices":[{"text":"","index":0,"logprobs":null,'
    b'"finish_reason":"length"}],"model":"smollm2","object":"text_completion",'
    b'"usage":{"completion_tokens":2,"prompt_tokens":446,"total_tokens":448,'
    b'"prompt_tokens_details":{"cached_tokens":337}},"timings":{"cache_n":337,'
    b'"prompt_n":109,"prompt_ms":5665.0,"predicted_n":2}}\n\n',
    b"data: [DONE]\n\n",
]

# llama.cpp, /v1/chat/completions: role chunk with content NULL, a finish chunk with
# an empty delta, then a usage chunk with empty choices and `timings`.
LLAMACPP_CHAT = [
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":'
    b'"assistant","content":null}}],"model":"smollm2",'
    b'"object":"chat.completion.chunk"}\n\n',
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
    b'"hello"}}],"model":"smollm2","object":"chat.completion.chunk"}\n\n',
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
    b'" there"}}],"model":"smollm2","object":"chat.completion.chunk"}\n\n',
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
    b'"model":"smollm2","object":"chat.completion.chunk"}\n\n',
    b'data: {"choices":[],"model":"smollm2","object":"chat.completion.chunk",'
    b'"usage":{"completion_tokens":2,"prompt_tokens":31,"total_tokens":33,'
    b'"prompt_tokens_details":{"cached_tokens":14}},"timings":{"cache_n":14}}\n\n',
    b"data: [DONE]\n\n",
]

# llama.cpp's /v1/models: an Ollama-style "models" list beside the OpenAI "data".
LLAMACPP_MODELS = {
    "models": [{"name": "smollm2", "model": "smollm2", "capabilities": ["completion"]}],
    "object": "list",
    "data": [
        {"id": "smollm2", "aliases": ["smollm2"], "object": "model",
         "owned_by": "llamacpp", "meta": {"n_ctx": 4096, "n_vocab": 49152}},
    ],
}  # fmt: skip

GAP_S = 0.02


def _app(
    chunks: Sequence[bytes], headers: dict[str, str] | None = None
) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **(headers or {})}
        )
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
            await asyncio.sleep(GAP_S)  # one network read per chunk
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response(LLAMACPP_MODELS)

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_get("/v1/models", models)
    return app


async def _send(
    aiohttp_server: Serve,
    chunks: Sequence[bytes],
    api: str,
    times: int = 1,
    pause_s: float = 0.0,
    **server_kwargs: object,
) -> list[Outcome]:
    server = await aiohttp_server(_app(chunks), host="127.0.0.1", **server_kwargs)
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{server.port}", model="m", api=api)  # type: ignore[arg-type]
    outs = []
    async with Client(cfg, MonotonicClock(), limit=4) as client:
        for k in range(times):
            if k:
                await asyncio.sleep(pause_s)
            outs.append(await client.send(b'{"stream":true}'))
    return outs


async def test_vllm_chat_empty_role_chunk_is_not_the_first_token(
    aiohttp_server: Serve,
) -> None:
    (out,) = await _send(aiohttp_server, VLLM_CHAT, "chat")
    assert out.status == "ok", out.error_message
    assert len(out.chunk_times_ns) == 3  # the three content chunks, not the role one
    assert out.first_token_ns is not None
    # TTFT starts at the second chunk (one GAP_S after the role chunk).
    assert out.first_token_ns - out.start_ns >= GAP_S * 1e9 * 0.9
    assert (out.server_prompt_tokens, out.completion_tokens, out.cached_tokens) == (
        32,
        3,
        0,
    )
    assert out.finish_reason == "length"


async def test_llamacpp_completions_usage_on_the_last_token_chunk(
    aiohttp_server: Serve,
) -> None:
    (out,) = await _send(aiohttp_server, LLAMACPP_COMPLETIONS, "completions")
    assert out.status == "ok", out.error_message
    assert len(out.chunk_times_ns) == 2  # the empty closing text is not a token
    assert (out.server_prompt_tokens, out.completion_tokens, out.cached_tokens) == (
        446,
        2,
        337,
    )
    assert out.finish_reason == "length"


async def test_llamacpp_chat_null_role_content_and_empty_finish_delta(
    aiohttp_server: Serve,
) -> None:
    (out,) = await _send(aiohttp_server, LLAMACPP_CHAT, "chat")
    assert out.status == "ok", out.error_message
    assert len(out.chunk_times_ns) == 2
    assert out.first_token_ns is not None
    assert out.first_token_ns - out.start_ns >= GAP_S * 1e9 * 0.9
    assert out.cached_tokens == 14
    assert out.finish_reason == "length"


async def test_llamacpp_models_list_reads_the_openai_data(
    aiohttp_server: Serve,
) -> None:
    server = await aiohttp_server(_app(()), host="127.0.0.1")
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{server.port}", model="m")
    async with Client(cfg, MonotonicClock(), limit=1) as client:
        assert await client.check() == ["smollm2"]


async def test_server_closing_idle_keepalive_connections(aiohttp_server: Serve) -> None:
    # llama.cpp (Keep-Alive: timeout=5) and uvicorn/vLLM (5 s) close idle pooled
    # connections; a request after a think gap longer than that must not fail.
    outs = await _send(
        aiohttp_server,
        LLAMACPP_COMPLETIONS,
        "completions",
        times=3,
        pause_s=0.3,
        keepalive_timeout=0.1,
    )
    assert [o.status for o in outs] == ["ok"] * 3, [o.error_message for o in outs]
    assert all(len(o.chunk_times_ns) == 2 for o in outs)


async def test_choices_not_a_list_is_a_failed_request(aiohttp_server: Serve) -> None:
    # Counted ok before: the string was walked as choices, and none had content.
    chunks = [
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
        b'data: {"choices":"notalist"}\n\n',
        b"data: [DONE]\n\n",
    ]
    (out,) = await _send(aiohttp_server, chunks, "chat")
    assert (out.status, out.error_type) == ("http_error", "stream_error")
    assert out.error_message == (
        "malformed SSE chunk: 'choices' is not a list: b'{\"choices\":\"notalist\"}'"
    )
