"""Client scale-out: requests/s and streamed tokens/s of `replayer run` with 1 and 2
worker processes and as Ray actors on two local nodes, each against a zero-delay
endpoint in another process (tests/instant_server.py: a server that is never the
limit), medians of 3, side by side with the self-check's verdict.

    python bench/bench_scale.py [--duration 8] [--reps 3] [--concurrency 64]

Ray runs on a two-node cluster this script starts (`ray start --head` plus a second
`ray start --address`, one CPU and 100 MB of object store each, no dashboard) and
stops (`ray stop`) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders import growing_session, trace_of  # noqa: E402
from traces.io import write_trace  # noqa: E402

PY = sys.executable
RAY = str(Path(PY).with_name("ray"))
NODE = ["--num-cpus", "1", "--object-store-memory", "100000000",
        "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(trace: Path, url: str, out: Path, extra: list[str], args: argparse.Namespace
         ) -> dict[str, float | bool]:  # fmt: skip
    cmd = [PY, "-m", "replayer", "run", str(trace), "--endpoint", url,
           "--concurrency", str(args.concurrency), "--think-scale", "0",
           "--warmup", "2", "--duration", str(args.duration), "--loop",
           "--out", str(out), "--quiet", *extra]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    summary = json.loads(
        subprocess.run(
            [PY, "-m", "replayer", "analyze", str(out), "--json"],
            check=True,
            capture_output=True,
            timeout=600,
        ).stdout
    )
    check = summary.get("client_check") or {}
    return {
        "req_s": summary["throughput_tok_s"]["requests"],
        "tok_s": summary["throughput_tok_s"]["output"],
        "limited": bool(check.get("limited")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32, help="output tokens/request")
    args = ap.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(
            trace_of(
                *(
                    growing_session(f"s{k}", 20, out=args.tokens, block_size=16)
                    for k in range(args.concurrency * 2)
                )
            ),
            Path(tmp) / "t.jsonl",
        )
        server = subprocess.Popen(
            [PY, "-m", "tests.instant_server", "--port", "0"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        port = _port()
        configs = {
            "1 worker": ["--workers", "1"],
            "2 workers": ["--workers", "2"],
            "Ray, 2 nodes": ["--ray", f"127.0.0.1:{port}"],
        }
        results: dict[str, list[dict[str, float | bool]]] = {k: [] for k in configs}
        try:
            for cmd in (["start", "--head", "--port", str(port),
                         "--include-dashboard=false", *NODE],
                        ["start", "--address", f"127.0.0.1:{port}", *NODE]):  # fmt: skip
                subprocess.run([RAY, *cmd], check=True, capture_output=True, env=env)
            for rep in range(args.reps):
                for name, extra in configs.items():
                    out = Path(tmp) / f"{name.replace(' ', '_')}-{rep}"
                    results[name].append(_run(trace, url, out, extra, args))
        finally:
            subprocess.run([RAY, "stop"], check=False, capture_output=True, env=env)
            server.kill()
            server.wait()
            server.stdout.close()
    print(f"machine: nproc={os.cpu_count()} {platform.machine()} "  # noqa: T201
          f"python {platform.python_version()}")  # fmt: skip
    print(f"workload: --concurrency {args.concurrency}, {args.tokens} tokens/request, "  # noqa: T201
          f"no think time, {args.duration:g} s (+2 s warm-up), medians of {args.reps}")  # fmt: skip
    base = statistics.median(float(r["req_s"]) for r in results["1 worker"])
    print(f"{'':14} {'req/s':>8} {'tok/s':>9} {'vs 1 worker':>12}  client-limited")  # noqa: T201
    for name, rs in results.items():
        req = statistics.median(float(r["req_s"]) for r in rs)
        tok = statistics.median(float(r["tok_s"]) for r in rs)
        flags = sum(bool(r["limited"]) for r in rs)
        print(f"{name:14} {req:8,.0f} {tok:9,.0f} {req / base:11.2f}x  "  # noqa: T201
              f"{flags}/{len(rs)} runs")  # fmt: skip


if __name__ == "__main__":
    main()
