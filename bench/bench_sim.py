"""Streamed chunks/s of the simulated endpoint on one core, with zero modeled delays.

    python bench/bench_sim.py [--streams 64] [--tokens 2000] [--repeats 5]

The sim runs in a subprocess pinned to CPU 0; this process (the client, plain aiohttp,
counting SSE events without parsing JSON) is pinned to CPU 1 when there is one. Prints
one line per repeat and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
ZERO_DELAYS = [
    "--prefill-us-per-token", "0", "--host-hit-us-per-token", "0",
    "--gpu-hit-us-per-token", "0", "--decode-base-ms", "0",
    "--decode-per-seq-ms", "0", "--decode-us-per-context-token", "0",
]  # fmt: skip


async def _stream(session: aiohttp.ClientSession, url: str, i: int, tokens: int) -> int:
    body = {
        "model": "sim",
        "prompt": list(range(1000 + 64 * i, 1064 + 64 * i)),
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    events = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for data in resp.content.iter_any():
            events += data.count(b"\n\n")
    return events - 1  # the [DONE] event carries no token


async def _round(url: str, streams: int, tokens: int) -> float:
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(_stream(session, url, i, tokens) for i in range(streams))
        )
        elapsed = time.perf_counter() - start
    assert sum(counts) == streams * tokens, (sum(counts), streams * tokens)
    return sum(counts) / elapsed


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "replayer", "sim", "--port", "0", *ZERO_DELAYS]
    server = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}),
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[1]})
        rates = []
        for i in range(args.repeats):
            rate = asyncio.run(_round(url, args.streams, args.tokens))
            rates.append(rate)
            print(f"repeat {i + 1}: {rate:,.0f} chunks/s")  # noqa: T201
        print(  # noqa: T201
            f"median {statistics.median(rates):,.0f} chunks/s "
            f"({args.streams} streams x {args.tokens} tokens, sim on 1 core; "
            f"nproc={os.cpu_count()}, {_cpu_model()})"
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
