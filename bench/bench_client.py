"""Client benchmark: timing accuracy against a server with known delays, and streaming
overhead (SSE events/s) of our client against a plain aiohttp readline + json baseline,
side by side in one run.

    python bench/bench_client.py

The server runs in its own process (its own core): a fake OpenAI-compatible endpoint
that stamps its own writes with perf_counter_ns (system-wide on Linux), so the client's
measured TTFT/TPOT are compared with what the server actually did.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replayer.clock import MonotonicClock
from replayer.config import EndpointConfig
from replayer.play.client import Client

TTFT_S, ITL_S, TOKENS = 0.050, 0.010, 32
FAST_TOKENS = 4000


def _server(port_q: mp.Queue) -> None:
    async def main() -> None:
        truth: dict[str, tuple[int, int, int]] = {}

        async def complete(request: web.Request) -> web.StreamResponse:
            t_recv = time.perf_counter_ns()
            body = await request.json()
            rid = body.get("user", "")
            fast = body.get("fast", False)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if fast:
                chunk = b'data: {"choices":[{"index":0,"text":"tok "}]}\n\n'
                batch = chunk * 100
                for _ in range(FAST_TOKENS // 100):
                    await resp.write(batch)
                await resp.write(b"data: [DONE]\n\n")
                return resp
            await asyncio.sleep(TTFT_S)
            first = last = 0
            for i in range(TOKENS):
                last = time.perf_counter_ns()
                first = first or last
                await resp.write(
                    b'data: {"choices":[{"index":0,"text":"t%d "}]}\n\n' % i
                )
                if i < TOKENS - 1:
                    await asyncio.sleep(ITL_S)
            await resp.write(b"data: [DONE]\n\n")
            truth[rid] = (t_recv, first, last)
            return resp

        async def get_truth(request: web.Request) -> web.Response:
            return web.json_response(truth)

        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        app.router.add_get("/truth", get_truth)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        gc.freeze()  # the server's own full collections would not be in its truth
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    asyncio.run(main())


async def accuracy(url: str, concurrency: int, n: int) -> dict[str, float]:
    cfg = EndpointConfig(base_url=url, model="m")
    errs_ttft: list[float] = []
    errs_tpot: list[float] = []
    outs = {}
    async with Client(cfg, MonotonicClock(), limit=concurrency) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            body = json.dumps(
                {"model": "m", "prompt": [1], "max_tokens": TOKENS, "user": f"r{i}"}
            ).encode()
            async with sem:
                outs[f"r{i}"] = await client.send(body)

        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(one(i))
        async with client.session.get(url + "/truth") as resp:
            truth = await resp.json()
    for rid, out in outs.items():
        t_recv, first, last = truth[rid]
        assert out.first_token_ns is not None
        ttft = out.first_token_ns - out.start_ns
        tpot = (out.chunk_times_ns[-1] - out.chunk_times_ns[0]) / (TOKENS - 1)
        errs_ttft.append((ttft - (first - t_recv)) / 1e6)
        errs_tpot.append((tpot - (last - first) / (TOKENS - 1)) / 1e6)
    return {
        "ttft_err_ms_p50": statistics.median(errs_ttft),
        "ttft_err_ms_p90": sorted(errs_ttft)[int(0.9 * len(errs_ttft))],
        "tpot_err_ms_p50": statistics.median(errs_tpot),
        "tpot_err_ms_max": max(abs(e) for e in errs_tpot),
    }


async def ours_events_per_s(url: str) -> float:
    cfg = EndpointConfig(base_url=url, model="m")
    body = json.dumps({"model": "m", "prompt": [1], "fast": True}).encode()
    async with Client(cfg, MonotonicClock(), limit=4) as client:
        t = time.perf_counter()
        out = await client.send(body)
        dt = time.perf_counter() - t
    assert len(out.chunk_times_ns) == FAST_TOKENS, out.error_message
    return FAST_TOKENS / dt


async def baseline_events_per_s(url: str) -> float:
    """A straightforward client: readline per line, json.loads per data line."""
    body = json.dumps({"model": "m", "prompt": [1], "fast": True}).encode()
    n = 0
    async with aiohttp.ClientSession() as session:
        t = time.perf_counter()
        async with session.post(url + "/v1/completions", data=body) as resp:
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if obj["choices"][0].get("text"):
                    time.perf_counter_ns()
                    n += 1
        dt = time.perf_counter() - t
    assert n == FAST_TOKENS
    return n / dt


def body_build() -> None:
    """Building a ~1M-token completions body: ours (cached block fragments) against a
    baseline that materializes the token list and json.dumps it."""
    import numpy as np

    from traces.materialize import Materializer, PromptConfig
    from traces.model import Request, Session

    n_blocks = 1_000_000 // 64
    prev = Request(
        input_tokens=(n_blocks - 50) * 64,
        output_tokens=1,
        hash_ids=np.arange(n_blocks - 50, dtype=np.int64),
    )
    req = Request(
        input_tokens=n_blocks * 64 + 17,
        output_tokens=1,
        hash_ids=np.arange(n_blocks, dtype=np.int64),
    )
    session = Session(session_id="s", requests=(prev, req), block_size=64)
    for api in ("completions", "chat"):
        m = Materializer(PromptConfig(api=api, salt="bench"))
        t = time.perf_counter()
        m.prompt(session, 1, "s")
        cold = time.perf_counter() - t
        m.prompt(session, 0, "s")
        warm = []
        for _ in range(5):
            m2 = Materializer(PromptConfig(api=api, salt="bench"))
            m2.prompt(session, 0, "s")  # the previous turn: its blocks are cached
            t = time.perf_counter()
            m2.prompt(session, 1, "s")
            warm.append(time.perf_counter() - t)
        print(
            f"  {api:<12} 1M-token body: first build {cold * 1e3:7.1f} ms,"
            f" next turn (prefix cached) {statistics.median(warm) * 1e3:6.1f} ms"
        )
    rng = np.random.default_rng(0)
    base = []
    for _ in range(5):
        t = time.perf_counter()
        ids = rng.integers(1000, 30000, size=n_blocks * 64 + 17).tolist()
        json.dumps({"model": "m", "prompt": ids}).encode()
        base.append(time.perf_counter() - t)
    print(
        f"  baseline     1M-token body: random ids + json.dumps {statistics.median(base) * 1e3:7.1f} ms"
    )


async def loop_stall_ms(off_loop: bool) -> float:
    """Worst lateness of a 1 ms ticker on the event loop (what every stream's chunk
    stamps would suffer) while five ~142K-token prompts are built: on the prompt
    thread (ours) or inline on the loop (the baseline)."""
    import numpy as np

    from replayer.play.session import PromptBuilder
    from traces.materialize import Materializer, PromptConfig
    from traces.model import Request, Session

    n_blocks = 142_000 // 64
    reqs = tuple(
        Request(
            input_tokens=n_blocks * 64,
            output_tokens=1,
            hash_ids=np.arange(k * n_blocks, (k + 1) * n_blocks, dtype=np.int64),
        )
        for k in range(5)
    )
    session = Session(session_id="s", requests=reqs, block_size=64)
    builder = PromptBuilder(
        Materializer(PromptConfig(salt="bench")),
        lambda frag, n: frag,
        inline_tokens=4096 if off_loop else 1 << 40,
    )
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    for i in range(len(reqs)):
        await builder.build(session, i, "s", 0, 1)
    done = True
    await task
    builder.close()
    return worst * 1e3


def main() -> None:
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=_server, args=(port_q,), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port_q.get(timeout=30)}"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
    # As a run does once it is loaded (runner/local.py): what is in memory now is
    # out of the cyclic collector's reach, so a full collection in the middle of a
    # burst does not pause the loop for the size of the imports (a 37 ms stall of
    # 16 requests in flight made the c=16 P90 TTFT error, whichever code it ran).
    gc.freeze()
    try:
        print(
            f"machine: nproc={os.cpu_count()} {platform.processor() or platform.machine()}"
        )
        print(
            f"server truth: TTFT {TTFT_S * 1e3:.0f} ms, ITL {ITL_S * 1e3:.0f} ms, {TOKENS} tokens"
        )
        for conc, n in ((1, 20), (16, 160)):
            acc = asyncio.run(accuracy(url, conc, n))
            print(
                f"accuracy c={conc:<3} n={n:<4} TTFT error p50 {acc['ttft_err_ms_p50']:.3f} ms"
                f" p90 {acc['ttft_err_ms_p90']:.3f} ms; TPOT error p50"
                f" {acc['tpot_err_ms_p50']:.4f} ms max {acc['tpot_err_ms_max']:.4f} ms"
            )
        ours, base = [], []
        for _ in range(7):
            ours.append(asyncio.run(ours_events_per_s(url)))
            base.append(asyncio.run(baseline_events_per_s(url)))
        mo, mb = statistics.median(ours), statistics.median(base)
        print(f"SSE events/s (one stream, {FAST_TOKENS} events, median of 7):")
        print(f"  ours      {mo:12,.0f}")
        print(f"  baseline  {mb:12,.0f}   (aiohttp readline + json.loads)")
        print(f"  ratio     {mo / mb:12.2f}x")
        print("request body construction:")
        body_build()
        ours_stall = statistics.median(
            asyncio.run(loop_stall_ms(True)) for _ in range(5)
        )
        base_stall = statistics.median(
            asyncio.run(loop_stall_ms(False)) for _ in range(5)
        )
        print("event-loop stall while five 142K-token prompts build (median of 5):")
        print(f"  ours (prompt thread)  {ours_stall:7.2f} ms worst tick lateness")
        print(f"  baseline (on loop)    {base_stall:7.2f} ms")
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
