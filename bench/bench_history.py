"""Benchmark: the results store (`replayer history`) over many generated runs, default
100 runs of 1M rows each (100M rows), added and queried.

    python bench/bench_history.py [--runs 100] [--rows 1000000] [--configs 4]
                                  [--dir DIR] [--chart docs/img/history-trend.png]

Each run is written as the engine writes it (one Parquet part file and run.json):
bench_analysis's synthetic rows, their times scaled per engine version (each version 2%
faster), over nightly dates; the last night plants a 15% P90 TTFT regression in one
configuration and a 15-point drop of the server hit in another. Then `history add`,
`show`, `trend`, `regressions` (all configurations, against the predecessor and the
first version), `canary` and `report --history` run as the real CLI, each timed with its
own peak RSS (its VmHWM as it exits: bench/childpeak.py).
Goals: trend <= 10 s, regressions <= 60 s, <= 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analysis import _cpu_model, synthetic_table
from childpeak import run_replayer

from replayer.records import RunMeta, TraceInfo

DAY_NS = 86_400 * 10**9
T0 = 1_780_000_000 * 10**9
HARDWARE = ("H100", "H200", "MI300X", "MI355X", "B200", "GB200")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _scaled(table: pa.Table, name: str, factor: float) -> pa.Table:
    col = pc.cast(
        pc.floor(pc.multiply(pc.cast(table[name], pa.float64()), factor)), pa.int64()
    )
    return table.set_column(table.schema.get_field_index(name), name, col)


def write_runs(root: Path, *, runs: int, rows: int, configs: int) -> list[Path]:
    """``runs`` run directories: ``configs`` configurations (hardware) by nightly
    dates, the engine version advancing every 5 nights."""
    base = synthetic_table(rows)
    dirs = []
    per = -(-runs // configs)
    for k in range(runs):
        config, night = k % configs, k // configs
        version = night // 5
        factor = 0.98**version * (1 + 0.002 * (k % 3))
        table = base
        for name in ("ttft_ns", "tpot_ns", "e2e_ns", "start_ns", "end_ns"):
            table = _scaled(table, name, factor)
        last = night == per - 1
        if config == 0 and last:
            table = _scaled(table, "ttft_ns", 1.15)  # a planted regression, last night
        hit = 0.65 if config == 1 and last else 0.8  # a cache regression, last night
        table = _scaled(table.set_column(
            table.schema.get_field_index("cached_tokens"), "cached_tokens",
            table["prompt_tokens"]), "cached_tokens", hit)  # fmt: skip
        run_dir = root / f"run-{k:03d}"
        (run_dir / "requests").mkdir(parents=True)
        meta = RunMeta(
            run_id=f"bench-{k:03d}",
            tool_version="0.1.0",
            trace=TraceInfo(content_hash="bench-trace", format="native"),
            model="bench-model",
            api="completions",
            labels={
                "engine": "sglang",
                "engine_version": f"0.{4 + version}.0",
                "hardware": HARDWARE[config % len(HARDWARE)],
                "tp": 8,
                "gpus": 8,
            },
            start_unix_ns=T0 + night * DAY_NS + config * 3_600 * 10**9,
            end_unix_ns=T0 + night * DAY_NS + config * 3_600 * 10**9 + 600 * 10**9,
            duration_s=600.0,
        )
        pq.write_table(table, run_dir / "requests" / "part-0-00000.parquet")
        (run_dir / "run.json").write_text(json.dumps(meta.as_dict()))
        dirs.append(run_dir)
    return dirs


def timed(*args: str) -> tuple[float, float, str]:
    """``replayer ARGS`` as a subprocess: wall s, its peak RSS MiB, its stdout."""
    with tempfile.TemporaryFile("w+") as out:
        got = run_replayer(args, stdout=out)
        out.seek(0)
        text = out.read()
    if got.returncode not in (0, 1):  # regressions exits 1 on --fail-on
        raise SystemExit(f"replayer {' '.join(args[:2])} failed: {got.returncode}")
    return got.wall_s, got.peak_mib, text


def chart(db: Path, path: Path) -> None:
    """The trend charts of ``db`` as a PNG (the docs' picture)."""
    from analysis import history as h
    from analysis import report

    with h.Store(db, read_only=True) as store:
        runs = store.runs()
    trends = [h.trend(runs, metric, by="engine_version") for metric, _ in
              report.HISTORY_CHARTS]  # fmt: skip
    fig = report.history_figure(trends)
    fig.savefig(path, format="png", dpi=80, bbox_inches="tight")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--configs", type=int, default=4)
    ap.add_argument("--dir", type=Path, help="Where to write the runs [a temp dir].")
    ap.add_argument("--chart", type=Path, help="Also draw the trend charts here.")
    ap.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_only:  # in a child: the parent's RSS floors its children's peaks
        write_runs(args.dir, runs=args.runs, rows=args.rows, configs=args.configs)
        return
    _say(
        f"machine: {os.cpu_count()} CPUs, {_cpu_model()}; python "
        f"{platform.python_version()}, numpy {np.__version__}, pyarrow {pa.__version__}"
    )
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--write-only", "--dir", str(root),
             "--runs", str(args.runs), "--rows", str(args.rows),
             "--configs", str(args.configs)],
            check=True,
        )  # fmt: skip
        dirs = [root / f"run-{k:03d}" for k in range(args.runs)]
        size = sum(f.stat().st_size for f in root.rglob("*.parquet")) / 2**30
        _say(
            f"wrote {args.runs} runs x {args.rows:,} rows ({args.runs * args.rows:,} "
            f"rows, {size:.1f} GiB Parquet) in {time.perf_counter() - t:.0f} s"
        )
        db = root / "results.duckdb"
        steps = [
            ("add", ["history", "add", *map(str, dirs), "--db", str(db), "--json"]),
            ("add again (no-op)",
             ["history", "add", *map(str, dirs), "--db", str(db), "--json"]),
            ("show", ["history", "show", "--db", str(db), "--json"]),
            ("trend ttft_p90",
             ["history", "trend", "ttft_p90", "--db", str(db), "--json"]),
            ("regressions (all configurations)",
             ["history", "regressions", "--db", str(db), "--json", "--fail-on", "10",
              "--baseline", "0.4.0"]),
            ("canary", ["history", "canary", "--db", str(db), "--json"]),
            ("report --history",
             ["report", "--history", str(db), "-o", str(root / "report.html")]),
        ]  # fmt: skip
        for name, argv in steps:
            wall, rss, text = timed(*argv)
            note = ""
            if name == "regressions (all configurations)":
                found = json.loads(text)
                flagged = [r for r in found["comparisons"] if r["flagged"]]
                note = (
                    f"; {len(found['comparisons'])} comparisons, {len(flagged)} "
                    f"flagged, {len(found['failed'])} past --fail-on 10"
                )
            if name == "canary":
                note = (
                    f"; {sum(r['flagged'] for r in json.loads(text)['runs'])} flagged"
                )
            _say(f"{name}: {wall:.2f} s, peak RSS {rss:,.0f} MiB{note}")
        if args.chart is not None:
            chart(db, args.chart)
            _say(f"chart: {args.chart}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
