"""Client scale-out: requests/s and streamed tokens/s of `replayer run` with 1 and 2
worker processes and as Ray actors on two local nodes, each against a zero-delay
endpoint in another process (tests/instant_server.py: a server that is never the
limit), medians of 3, side by side with the self-check's verdict.

    python bench/bench_scale.py [--duration 8] [--reps 3] [--concurrency 64]

Ray runs on a two-node cluster this script starts and stops: two nodes of
`ray.cluster_utils.Cluster` on 127.0.0.1, one CPU and 100 MB of object store each, no
dashboard (`tests/ray_cluster.py`, as the `--ray` tests start theirs; `ray start`
would listen on every interface). Once a second while each run goes, the script
reads /proc for the TCP listeners of every process it started (the Ray nodes and
actors, the endpoint, each `replayer run`) and exits with status 1 after the table
if any listened beyond loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders import growing_session, trace_of  # noqa: E402
from tests.ray_cluster import (  # noqa: E402
    beyond_loopback,
    listening,
    loopback_cluster,
    ray_pids,
    replay_actors,
)
from traces.io import write_trace  # noqa: E402

PY = sys.executable


class Listeners:
    """The TCP listeners of every process this script started, sampled as it runs."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.seen: dict[str, set[int]] = {}
        self.samples = 0
        self.actors = 0  # samples that found the --ray actors running

    def sample(self) -> None:
        pids = ray_pids(self.cluster, os.getpid())
        for address, ports in listening(pids).items():
            self.seen.setdefault(address, set()).update(ports)
        self.samples += 1
        self.actors += bool(replay_actors(pids))


def _run(trace: Path, url: str, out: Path, extra: list[str], args: argparse.Namespace,
         listeners: Listeners) -> dict[str, float | bool]:  # fmt: skip
    cmd = [PY, "-m", "replayer", "run", str(trace), "--endpoint", url,
           "--concurrency", str(args.concurrency), "--think-scale", "0",
           "--warmup", "2", "--duration", str(args.duration), "--loop",
           "--out", str(out), "--quiet", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        listeners.sample()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
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
    with tempfile.TemporaryDirectory() as tmp, loopback_cluster(2) as cluster:
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
        configs = {
            "1 worker": ["--workers", "1"],
            "2 workers": ["--workers", "2"],
            "Ray, 2 nodes": ["--ray", str(cluster.address)],
        }
        results: dict[str, list[dict[str, float | bool]]] = {k: [] for k in configs}
        listeners = Listeners(cluster)
        try:
            for rep in range(args.reps):
                for name, extra in configs.items():
                    out = Path(tmp) / f"{name.replace(' ', '_')}-{rep}"
                    results[name].append(_run(trace, url, out, extra, args, listeners))
        finally:
            server.kill()
            server.wait()
            server.stdout.close()
    print(f"machine: nproc={os.cpu_count()} {platform.machine()} "  # noqa: T201
          f"python {platform.python_version()}")  # fmt: skip
    print(f"workload: --concurrency {args.concurrency}, {args.tokens} tokens/request, "  # noqa: T201
          f"no think time, {args.duration:g} s (+2 s warm-up), "
          f"medians of {args.reps}")  # fmt: skip
    base = statistics.median(float(r["req_s"]) for r in results["1 worker"])
    print(f"{'':14} {'req/s':>8} {'tok/s':>9} {'vs 1 worker':>12}  client-limited")  # noqa: T201
    for name, rs in results.items():
        req = statistics.median(float(r["req_s"]) for r in rs)
        tok = statistics.median(float(r["tok_s"]) for r in rs)
        flags = sum(bool(r["limited"]) for r in rs)
        print(f"{name:14} {req:8,.0f} {tok:9,.0f} {req / base:11.2f}x  "  # noqa: T201
              f"{flags}/{len(rs)} runs")  # fmt: skip
    seen = sorted(listeners.seen.items())
    shown = ", ".join(f"{address} ({len(ports)} ports)" for address, ports in seen)
    print(f"listening: {shown or 'nothing'}; {listeners.samples} samples, "  # noqa: T201
          f"{listeners.actors} with the Ray actors up")  # fmt: skip
    wide = beyond_loopback(listeners.seen)
    if wide:
        sys.exit(f"listening beyond loopback: {wide}")


if __name__ == "__main__":
    main()
