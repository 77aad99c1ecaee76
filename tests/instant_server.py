"""A zero-delay OpenAI-compatible endpoint in a few microseconds per request: a raw
asyncio protocol (no HTTP framework) that answers every completion at once with
``max_tokens`` one-token SSE chunks, a usage chunk and ``[DONE]``. It is what a client
is measured against when the server must never be the limit (the self-check's overload
test, ``bench/bench_scale.py``).

    python -m tests.instant_server --port 0     # first line: the URL
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re

_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')
_MODELS = b'{"object":"list","data":[{"id":"instant"}]}'
_CHUNK = b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'


def _response(status: str, ctype: bytes, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\nContent-Type: "
    ).encode()
    return head + ctype + b"\r\n\r\n" + body


@functools.lru_cache(maxsize=256)
def _stream(tokens: int) -> bytes:
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n'
        % tokens
    )
    body = _CHUNK * tokens + usage + b"data: [DONE]\n\n"
    return _response("200 OK", b"text/event-stream", body)


def next_request(buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The first whole HTTP/1.1 request in ``buf``: (lower-cased head, body, the rest
    of ``buf``); None until it has all arrived."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].lower()
    length = 0
    at = head.find(b"content-length:")
    if at >= 0:
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else None])
    if len(buf) < end + 4 + length:
        return None
    return head, buf[end + 4 : end + 4 + length], buf[end + 4 + length :]


def answer(head: bytes, body: bytes) -> bytes:
    """The whole response to one request (``next_request``'s head and body)."""
    if head.startswith(b"get /v1/models"):
        return _response("200 OK", b"application/json", _MODELS)
    if head.startswith(b"post "):
        m = _MAX_TOKENS.search(body)
        return _stream(int(m.group(1)) if m else 1)
    return _response("404 Not Found", b"text/plain", b"not found")


class _Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (request := next_request(self.buf)) is not None:
            head, body, self.buf = request
            assert self.transport is not None
            self.transport.write(answer(head, body))


async def _serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"instant endpoint listening on http://{host}:{bound}", flush=True)  # noqa: T201
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
