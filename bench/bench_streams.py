"""Live streams one worker holds: `replayer run` (one process) against a loopback
server that holds every stream open, sending one token a second (`--interval`), at
rising concurrency (1K, 2K, 5K, ... live streams) until something gives. Per level: the
streams the server saw live at once, the client's loop lag P99 and loop-thread CPU
(its self-check, after the warm-up), its peak RSS, and failed requests.

    python bench/bench_streams.py [--levels 1000,2000,5000,10000,15000,19500,25000]

Each level is a run of N one-turn sessions arriving at `--ramp` a second (Poisson,
`--session-rate`), each a stream long enough to outlive the run; the warm-up lasts
until all N have arrived (+2 s), then 10 s are measured with all N open, and
`--drain cancel` ends them (cancelled rows are not failures). `--max-inflight N`
lifts the client's default cap of 10,000 connections. The soft open-files limit of
this process (inherited by the server and the client) is raised to the hard limit
first: each live stream is one file descriptor in the client and one in the server.
The server (`--serve`, below) is a raw asyncio protocol in its own process that
writes each stream's next token in that stream's slot of every interval (tokens
spread evenly, not all at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.instant_server import next_request  # noqa: E402

PY = sys.executable
_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')
_DURATION = 10.0  # seconds measured with every stream of a level open
_SLOTS = 100  # a stream's tokens go out in its slot of the interval: spread evenly
_CHUNK = b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
_END = (
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n'
    b"data: [DONE]\n\n"
)
_MODELS = b'{"object":"list","data":[{"id":"slow"}]}'


# -- the server -------------------------------------------------------------------


class _Slow(asyncio.Protocol):
    """HTTP/1.1, one request per connection at a time: a completion is answered with
    its headers (the whole body's length) and then one token per tick."""

    slots: list[set[_Slow]] = [set() for _ in range(_SLOTS)]  # noqa: RUF012
    live = 0
    connections = 0
    started = 0

    def __init__(self) -> None:
        self.buf = b""
        self.sent = 0
        self.tokens = 0
        self.slot: set[_Slow] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        _Slow.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        _Slow.connections -= 1
        self._done()

    def _done(self) -> None:
        if self.slot is not None:
            self.slot.discard(self)
            self.slot = None
            _Slow.live -= 1

    def _reply(self, ctype: bytes, body: bytes, length: int | None = None) -> None:
        assert self.transport is not None
        n = len(body) if length is None else length
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: keep-alive\r\n"
            b"Content-Type: %s\r\n\r\n%s" % (n, ctype, body)
        )

    def data_received(self, data: bytes) -> None:
        self.buf += data
        request = next_request(self.buf)
        if request is None:
            return
        head, body, self.buf = request
        if head.startswith(b"get /stats"):
            stats = {"live": _Slow.live, "connections": _Slow.connections}
            self._reply(b"application/json", json.dumps(stats).encode())
        elif head.startswith(b"get /v1/models"):
            self._reply(b"application/json", _MODELS)
        else:
            m = _MAX_TOKENS.search(body)
            self.tokens = int(m.group(1)) if m else 1
            size = len(_CHUNK) * self.tokens + len(_END % self.tokens)
            self._reply(b"text/event-stream", b"", size)
            self._done()
            self.sent = 0
            self.slot = _Slow.slots[_Slow.started % _SLOTS]
            self.slot.add(self)
            _Slow.started += 1
            _Slow.live += 1


async def _tick(interval: float) -> None:
    """Slot k's streams get their next token at k/_SLOTS of every interval."""
    loop = asyncio.get_running_loop()
    t, k = loop.time(), 0
    while True:
        t += interval / _SLOTS
        await asyncio.sleep(max(0.0, t - loop.time()))
        for s in list(_Slow.slots[k]):
            assert s.transport is not None
            s.sent += 1
            last = s.sent == s.tokens
            s.transport.write(_CHUNK + (_END % s.tokens if last else b""))
            if last:
                s._done()
        k = (k + 1) % _SLOTS


async def _serve(interval: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Slow, "127.0.0.1", 0, backlog=65535)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)  # noqa: T201
    ticker = asyncio.create_task(_tick(interval))
    async with server:
        await server.serve_forever()
    ticker.cancel()


# -- the bench --------------------------------------------------------------------


def _stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as r:
        out: dict[str, int] = json.loads(r.read())
        return out


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _level(n: int, url: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.builders import growing_session, trace_of
    from traces.io import write_trace

    warmup = n / args.ramp + 2  # every stream open before the measured window
    tokens = math.ceil((warmup + _DURATION + 10) / args.interval)  # outlive it
    trace = write_trace(
        trace_of(*(growing_session(f"s{k}", 1, out=tokens) for k in range(n))),
        tmp / f"t{n}.jsonl",
    )
    out = tmp / f"run{n}"
    _stats(url)  # the server answers before the clients come
    proc = subprocess.Popen(
        [PY, "-m", "replayer", "run", str(trace), "--endpoint", url,
         "--session-rate", str(args.ramp),
         "--max-inflight", str(n), "--warmup", f"{warmup:g}",
         "--duration", f"{warmup + _DURATION:g}", "--drain", "cancel",
         "--out", str(out), "--quiet"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    rss, live = 0.0, 0
    while proc.poll() is None:
        rss = max(rss, _rss_mb(proc.pid))
        with contextlib.suppress(OSError):
            live = max(live, _stats(url)["live"])
        time.sleep(0.5)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    row: dict[str, Any] = {"streams": n, "live": live, "rss_mb": rss,
                           "exit": proc.returncode}  # fmt: skip
    if not (out / "run.json").exists():
        row["error"] = stderr.strip().splitlines()[-1] if stderr.strip() else "?"
        return row
    summary = json.loads(
        subprocess.run(
            [PY, "-m", "replayer", "analyze", str(out), "--json"],
            cwd=REPO, check=True, capture_output=True, text=True,
        ).stdout
    )  # fmt: skip
    meta = json.loads((out / "run.json").read_text())
    counts = meta.get("counts") or {}
    check = summary.get("client_check") or {}
    failed = counts.get("failed", 0)
    row.update(
        lag_p99_ms=(check.get("loop_lag_ms") or {}).get("p99"),
        loop_cpu=(check.get("loop_cpu_share") or {}).get("p50"),
        failed=failed,
        errors=sorted({str(e) for e in _error_types(out)}),
        limited="; ".join(check.get("reasons") or []),
    )
    return row


def _error_types(run_dir: Path) -> list[str]:
    import pandas as pd

    df = pd.read_parquet(run_dir / "requests", columns=["status", "error_type"])
    bad = df[~df["status"].isin(["ok", "cancelled"])]
    return list(bad["error_type"].dropna().unique())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1000,2000,5000,10000,15000,19500,25000")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between a stream's tokens")  # fmt: skip
    ap.add_argument("--ramp", type=float, default=500.0,
                    help="new streams a second until a level's N are open")  # fmt: skip
    ap.add_argument("--serve", action="store_true", help="run the slow server only")
    args = ap.parse_args()
    if args.serve:
        asyncio.run(_serve(args.interval))
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = subprocess.Popen(
        [PY, __file__, "--serve", "--interval", str(args.interval)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (int(x) for x in args.levels.split(",")):
                row = _level(n, url, Path(tmp), args)
                rows.append(row)
                print(json.dumps(row), flush=True)  # noqa: T201
                if row.get("error") or row.get("failed"):
                    break  # broken: the next level would only break harder
                time.sleep(2)  # the last level's sockets close
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    ports = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    print(f"machine: nproc={os.cpu_count()} {platform.machine()} "  # noqa: T201
          f"python {platform.python_version()}; open files soft {soft} -> {hard} "
          f"(hard); ephemeral ports {ports[0]}-{ports[1]}; one token per stream "
          f"every {args.interval:g} s")  # fmt: skip
    print(f"{'streams':>8} {'live':>7} {'lag p99 ms':>11} {'loop CPU':>9} "  # noqa: T201
          f"{'RSS MB':>7} {'failed':>7}  notes")  # fmt: skip
    for r in rows:
        lag, cpu = r.get("lag_p99_ms"), r.get("loop_cpu")
        note = r.get("error") or ", ".join(r.get("errors") or []) or r.get("limited")
        print(f"{r['streams']:8,} {r['live']:7,} "  # noqa: T201
              f"{'-' if lag is None else f'{lag:,.0f}':>11} "
              f"{'-' if cpu is None else f'{cpu:.0%}':>9} {r['rss_mb']:7,.0f} "
              f"{r.get('failed', '-'):>7}  "
              f"{note or ''}")  # fmt: skip


if __name__ == "__main__":
    main()
