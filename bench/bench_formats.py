"""Writing and reading the agentic formats on the shared Weka sample (issue 23).

Run: python bench/bench_formats.py [--repeats N] [--data DIR]

Side by side in one run (cases interleaved, median of N repeats): writing the sample
as native JSONL and as Dynamo's agentic Mooncake rows, and reading each back (full
validation; the agentic reader also rebuilds the session trees from the wait_for
DAG). Then the peak RSS of each read in a fresh subprocess.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_load import _peak_rss_mb  # the same fresh-process VmHWM reading

from traces import read_trace, write_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data" / "weka"


def _time_s(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    trace = read_trace(args.data)
    ids = sum(r.hash_ids.size for s, _ in trace.all_sessions() for r in s.requests)
    with tempfile.TemporaryDirectory() as tmp:
        native = Path(tmp) / "t.jsonl"
        agentic = Path(tmp) / "t.agentic.jsonl"
        cases: dict[str, Callable[[], object]] = {
            "write native JSONL": lambda: write_trace(trace, native),
            "write agentic Mooncake": lambda: write_trace(
                trace, agentic, to="agentic-mooncake"
            ),
            "read native JSONL": lambda: read_trace(native),
            "read agentic Mooncake": lambda: read_trace(agentic),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():
                times[name].append(_time_s(fn))
        sizes = {
            "native JSONL": native.stat().st_size,
            "agentic Mooncake": agentic.stat().st_size,
        }
        rss = {"native JSONL": _peak_rss_mb(native)[1]}
        rss["agentic Mooncake"] = _peak_rss_mb(agentic)[1]
    say = sys.stdout.write
    say(
        f"{len(trace)} sessions, {trace.request_count():,} requests, {ids / 1e6:.1f}M "
        f"hash ids; Python {platform.python_version()}, nproc {os.cpu_count()}, "
        f"median of {args.repeats}\n"
    )
    base = {"write": "write native JSONL", "read": "read native JSONL"}
    say("| case | median s | time vs native | file MB | peak RSS MB (read) |\n")
    say("|---|---:|---:|---:|---:|\n")
    for name, ts in times.items():
        verb, fmt = name.split(" ", 1)
        med = statistics.median(ts)
        ratio = med / statistics.median(times[base[verb]])
        mb = sizes[fmt] / 1e6
        peak = f"{rss[fmt]:.0f}" if verb == "read" else ""
        say(f"| {name} | {med:.3f} | {ratio:.2f}x | {mb:.1f} | {peak} |\n")


if __name__ == "__main__":
    main()
