"""Benchmark of `replayer generate`: speed at AgentX scale, fidelity to its targets, and
calibration fidelity on the real Weka sample (two-sample KS distances).

    /work/venv/bin/python bench/bench_generate.py [--repeats 5] [--skip-write]

Prints: generation time of the AgentX-scale corpus (393 sessions, ~100K requests;
median of repeats, one core), the Parquet write time, the full-size agentx statistics
against the published AgentX v1.0 figures, and KS distances between the Weka sample and
traces generated from a config fitted to it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from traces.fit import fit_config, ks_distances
from traces.generate import PRESETS, generate_trace
from traces.io import read_trace, write_trace
from traces.model import Trace
from traces.stats import trace_stats

REPO = Path(__file__).resolve().parents[1]
WEKA = REPO / ".." / "shared" / "data" / "weka"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _speed(repeats: int, write: bool) -> Trace:
    times = []
    trace = None
    for seed in range(repeats):
        t0 = time.perf_counter()
        trace = generate_trace(PRESETS["agentx"], sessions=393, seed=seed)
        times.append(time.perf_counter() - t0)
    assert trace is not None
    blocks = sum(r.hash_ids.size for s, _ in trace.all_sessions() for r in s.requests)
    _out(
        f"agentx 393 sessions: {trace.request_count():,} requests, {blocks:,} blocks; "
        f"generate median {statistics.median(times):.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f}, {repeats} repeats)"
    )
    if write:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "agentx.parquet"
            t0 = time.perf_counter()
            write_trace(trace, out)
            dt = time.perf_counter() - t0
            _out(f"write .parquet {dt:.2f} s ({out.stat().st_size / 1e6:.1f} MB)")
    return trace


def _targets(trace: Trace) -> None:
    t0 = time.perf_counter()
    st = trace_stats(trace)
    rows = [
        ("input tokens p50", "142,016", st.input_tokens["p50"]),
        ("input tokens p90", "~550K", st.input_tokens["p90"]),
        ("input tokens max", "~1M cap", st.input_tokens["max"]),
        ("output tokens p50", "444", st.output_tokens["p50"]),
        ("think time p50 (s)", "2.3", st.think_time_s["p50"]),
        ("think time p90 (s)", "37.5", st.think_time_s["p90"]),
        ("sessions with subagents", "44%", st.sessions_with_subagents / st.sessions),
        ("requests per session p50", "~67", st.requests_per_session["p50"]),
        ("requests (393 sessions)", "~100K", st.requests),
        ("ideal prefix hit", ">= 95%", st.ideal_cache_hit_rate),
    ]
    _out(f"\nagentx preset, full size (trace_stats {time.perf_counter() - t0:.1f} s)")
    _out("| statistic | AgentX v1.0 | generated |\n| --- | --- | --- |")
    for label, target, got in rows:
        cell = f"{got:.1%}" if got < 1 and "%" in target else f"{got:,.1f}"
        _out(f"| {label} | {target} | {cell.removesuffix('.0')} |")


def _calibration() -> None:
    if not WEKA.is_dir():
        sys.stderr.write(f"calibration skipped: {WEKA} not found\n")
        return
    real = read_trace(WEKA)
    config = fit_config(real)
    _out("\ncalibrated on shared/data/weka (30 sessions, 3,004 requests): KS distance")
    _out("| sessions generated | seed | input tokens | output tokens | think time |")
    _out("| --- | --- | --- | --- | --- |")
    for sessions in (30, 300):
        for seed in (0, 1, 2):
            ks = ks_distances(
                real, generate_trace(config, sessions=sessions, seed=seed)
            )
            cells = " | ".join(f"{x:.4f}" for x in ks.values())
            _out(f"| {sessions} | {seed} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-write", action="store_true")
    args = parser.parse_args()
    trace = _speed(args.repeats, write=not args.skip_write)
    _targets(trace)
    _calibration()


if __name__ == "__main__":
    main()
