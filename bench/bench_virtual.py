"""Virtual time: how long a replay takes on the engine model, beside how long the
same replay would take live (the modeled run's own duration: a live run against a
server that behaves as the model does lasts that long).

    python bench/bench_virtual.py [--reps 3] [--quick] [--no-agentx]

Cases (each a real `replayer` subprocess pinned to one core; its CPU time, user +
sys, which a shared machine disturbs less than wall time, its wall time and its
peak RSS; medians of --reps):
  1. the shared Weka sample (3,004 requests, subagents), --concurrency 16, --think-scale 0;
  2. `capacity --virtual` on it, --slo ttft=2s, 60 s cells;
  3. the agentx preset (`generate --preset agentx`, its Parquet store), --concurrency
     64 (--quick: 16), --profile agentx (300 s warm-up, 3,600 s window).
Goals (issue 21): 1 ≤ 10 s, 2 ≤ 60 s, 3 ≤ 5 min in ≤ 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from childpeak import run_replayer

REPLAYER = str(Path(sys.executable).with_name("replayer"))
WEKA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "weka"


@dataclass(frozen=True)
class Measure:
    cpu_s: float  # user + sys of the child
    wall_s: float
    rss_mb: float  # the child's own peak (its VmHWM: childpeak)


def _measured(args: list[str]) -> Measure:
    """``replayer ARGS``, one pinned subprocess, measured."""
    pin = ["taskset", "-c", "1"] if os.cpu_count() and os.cpu_count() > 1 else []
    with tempfile.TemporaryFile() as err:
        got = run_replayer(args, stderr=err, pin=pin)
        if got.returncode != 0:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            sys.exit(f"failed ({got.returncode}): replayer {' '.join(args)}\n{tail}")
    return Measure(got.cpu_s, got.wall_s, got.peak_mib)


def _median(runs: list[Measure]) -> Measure:
    return Measure(
        statistics.median(m.cpu_s for m in runs),
        statistics.median(m.wall_s for m in runs),
        max(m.rss_mb for m in runs),
    )


def _modeled_s(run_dir: Path) -> float:
    meta = json.loads((run_dir / "run.json").read_text())
    return float(meta["duration_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="agentx at 16 lanes")
    ap.add_argument("--no-agentx", action="store_true", help="skip case 3")
    args = ap.parse_args()
    print(
        f"machine: nproc={os.cpu_count()} {platform.machine()} python {sys.version.split()[0]}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows: list[tuple[str, Measure, float, str]] = []

        runs, modeled = [], 0.0
        for k in range(args.reps):
            out = work / f"weka{k}"
            runs.append(_measured([
                "run", str(WEKA), "--concurrency", "16", "--think-scale",
                "0", "--virtual", "sim", "--quiet", "--out", str(out),
            ]))  # fmt: skip
            modeled = _modeled_s(out)
        rows.append(("Weka sample, c16", _median(runs), modeled, "10 s"))

        runs, cells, live = [], 0, 0.0
        for k in range(args.reps):
            out = work / f"cap{k}"
            runs.append(_measured([
                "capacity", str(WEKA), "--virtual", "sim", "--think-scale",
                "0", "--slo", "ttft=2s", "--duration", "60", "--quiet", "--out",
                str(out), "--json",
            ]))  # fmt: skip
            doc = json.loads((out / "capacity.json").read_text())
            cells = len(doc["cells"])
            live = sum(c["duration_s"] for c in doc["cells"])
        rows.append((
            f"capacity --virtual, Weka ({cells} cells of 60 s)", _median(runs), live,
            "60 s",
        ))  # fmt: skip

        _print(rows)
        if args.no_agentx:
            return
        lanes = 16 if args.quick else 64
        # The Parquet store: a 2 GB JSONL of this corpus takes ~47 s and 8 GB to read.
        trace = work / "agentx.parquet"
        subprocess.run(
            [REPLAYER, "generate", "--preset", "agentx", "--out", str(trace)],
            check=True, capture_output=True,
        )  # fmt: skip
        runs = []
        for k in range(args.reps):
            out = work / f"agentx{k}"
            runs.append(_measured([
                "run", str(trace), "--concurrency", str(lanes), "--virtual",
                "sim", "--profile", "agentx", "--quiet", "--out", str(out),
            ]))  # fmt: skip
        rows.append((
            f"agentx preset, c{lanes}, --profile agentx", _median(runs),
            _modeled_s(out), "5 min, 1 GB",
        ))  # fmt: skip

    _print(rows[-1:], header=False)


def _print(rows: list[tuple[str, Measure, float, str]], header: bool = True) -> None:
    if header:
        print()
        print(
            "| case | CPU (user+sys) | wall | peak RSS | live wall (modeled) "
            "| speed-up | goal |"
        )
        print("|---|---:|---:|---:|---:|---:|---|")
    for name, m, live, goal in rows:
        print(
            f"| {name} | {m.cpu_s:,.1f} s | {m.wall_s:,.1f} s | {m.rss_mb:,.0f} MB "
            f"| {live:,.0f} s | {live / m.cpu_s:,.0f}× | {goal} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
