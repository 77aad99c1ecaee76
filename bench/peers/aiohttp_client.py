"""Minimal asyncio + aiohttp streaming load generator: the floor any client pays.

    python bench/peers/aiohttp_client.py URL PROMPTS.jsonl OUT.json --concurrency N \
        --max-tokens 128 [--model sim]

Each line of PROMPTS.jsonl is {"text": ...}; every prompt is sent once as a streamed
/v1/chat/completions request (ignore_eos, include_usage). Per request it writes the
wall-clock send time, first content chunk and end (time.time_ns()) and the server's
completion token count. No retries, no recording beyond that: a baseline, not a tool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="sim")
    a = ap.parse_args()
    with open(a.prompts) as f:
        prompts = [json.loads(line)["text"] for line in f if line.strip()]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    rows: list[dict] = []
    url = a.url.rstrip("/") + "/v1/chat/completions"

    async def lane(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            text = queue.get_nowait()
            body = {
                "model": a.model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": a.max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            start = time.time_ns()
            first = 0
            out_tokens = None
            async with session.post(url, json=body) as resp:
                async for line in resp.content:
                    if not line.startswith(b"data: ") or line.startswith(
                        b"data: [DONE]"
                    ):
                        continue
                    ev = json.loads(line[6:])
                    ch = ev.get("choices") or []
                    if not first and ch and (ch[0].get("delta") or {}).get("content"):
                        first = time.time_ns()
                    if ev.get("usage"):
                        out_tokens = ev["usage"].get("completion_tokens")
                ok = resp.status == 200
            end = time.time_ns()
            rows.append(
                {
                    "start_ns": start,
                    "first_ns": first,
                    "end_ns": end,
                    "output_tokens": out_tokens,
                    "ok": ok and bool(first),
                }
            )

    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*(lane(session) for _ in range(a.concurrency)))
    with open(a.out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    asyncio.run(main())
