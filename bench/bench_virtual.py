"""Virtual time: how long a replay takes on the engine model, beside how long the
same replay would take live (the modeled run's own duration: a live run against a
server that behaves as the model does lasts that long).

    python bench/bench_virtual.py [--quick]

Cases (each a real `replayer` subprocess pinned to one core; wall time and peak RSS
of that process, median of --reps):
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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPLAYER = str(Path(sys.executable).with_name("replayer"))
WEKA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "weka"


def _measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB of the child, stderr) of one pinned subprocess."""
    pin = ["taskset", "-c", "1"] if os.cpu_count() and os.cpu_count() > 1 else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([*pin, *cmd], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest so far: a smaller later child shows as
    # the earlier peak, so each case runs its largest configuration first.
    return wall, max(peak, before) / 1024, proc.stderr


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
        rows: list[tuple[str, float, float, float, str]] = []

        walls, rss, modeled = [], 0.0, 0.0
        for k in range(args.reps):
            out = work / f"weka{k}"
            wall, peak, _ = _measured([
                REPLAYER, "run", str(WEKA), "--concurrency", "16", "--think-scale",
                "0", "--virtual", "sim", "--quiet", "--out", str(out),
            ])  # fmt: skip
            walls.append(wall)
            rss = max(rss, peak)
            modeled = _modeled_s(out)
        rows.append(
            ("Weka sample, c16", statistics.median(walls), rss, modeled, "10 s")
        )

        walls = []
        cells = 0
        for k in range(args.reps):
            out = work / f"cap{k}"
            wall, _, _ = _measured([
                REPLAYER, "capacity", str(WEKA), "--virtual", "sim", "--think-scale",
                "0", "--slo", "ttft=2s", "--duration", "60", "--quiet", "--out",
                str(out), "--json",
            ])  # fmt: skip
            walls.append(wall)
            doc = json.loads((out / "capacity.json").read_text())
            cells = len(doc["cells"])
            live = sum(c["duration_s"] for c in doc["cells"])
        rows.append((
            f"capacity --virtual, Weka ({cells} cells of 60 s)",
            statistics.median(walls), float("nan"), live, "60 s",
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
        out = work / "agentx"
        wall, peak, _ = _measured([
            REPLAYER, "run", str(trace), "--concurrency", str(lanes), "--virtual",
            "sim", "--profile", "agentx", "--quiet", "--out", str(out),
        ])  # fmt: skip
        rows.append((
            f"agentx preset, c{lanes}, --profile agentx", wall, peak,
            _modeled_s(out), "5 min, 1 GB",
        ))  # fmt: skip

    _print(rows[-1:])


def _print(rows: list[tuple[str, float, float, float, str]]) -> None:
    if rows and rows[0][0].startswith("Weka"):
        print()
        print(
            "| case | virtual wall | peak RSS | live wall (modeled) | speed-up | goal |"
        )
        print("|---|---:|---:|---:|---:|---|")
    for name, wall, peak, live, goal in rows:
        mem = "-" if peak != peak else f"{peak:,.0f} MB"
        print(
            f"| {name} | {wall:,.1f} s | {mem} | {live:,.0f} s | {live / wall:,.0f}× "
            f"| {goal} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
