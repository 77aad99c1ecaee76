"""Benchmark of `replayer generate`: time and peak RSS of the commands at AgentX scale,
speed in process, fidelity to its targets, and calibration fidelity on the real Weka
sample (two-sample KS distances).

    /tmp/venv/bin/python bench/bench_generate.py [--repeats 5] [--cli-repeats 3]
        [--before DIR] [--skip-write]

Prints: wall time and peak RSS (the child's own VmHWM: ``childpeak``) of
``replayer generate --preset agentx -o X.parquet`` and ``replayer trace stats
X.parquet``, each in a fresh process (median of ``--cli-repeats``); with ``--before
DIR`` (a directory holding an earlier ``traces`` package, e.g. ``git archive <commit>
traces | tar -x -C DIR``) the same commands also run on that code (``PYTHONPATH=DIR``,
its own trace file), interleaved with the current code's. Then generation time of the
AgentX-scale corpus in process (393 sessions, ~100K requests; median of repeats), the
Parquet write time, the full-size agentx statistics against the published AgentX v1.0
figures, and KS distances between the Weka sample and traces generated from a config
fitted to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childpeak import run_replayer

from traces.fit import fit_config, ks_distances
from traces.generate import PRESETS, generate_trace
from traces.io import read_trace, write_trace
from traces.model import Trace
from traces.stats import trace_stats
from traces.table import request_column

REPO = Path(__file__).resolve().parents[1]
WEKA = REPO / ".." / "shared" / "data" / "weka"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _measured(args: list[str], code: Path | None, cwd: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of ``replayer ARGS`` in a fresh process; run in
    ``cwd``, not the repository, whose packages ``python -m`` would put ahead of
    ``PYTHONPATH``."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    got = run_replayer(args, env=env, cwd=cwd)
    if got.returncode != 0:
        sys.exit(f"replayer {' '.join(args)} failed ({got.returncode})")
    return got.wall_s, got.peak_mib


def _traces_file(code: Path | None, cwd: Path) -> str:
    """Where the ``traces`` package of ``code`` loads from (checks the set-up)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return subprocess.run(
        [sys.executable, "-c", "import traces; print(traces.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _cli(repeats: int, before: Path | None) -> None:
    codes: dict[str, Path | None] = {"current": None}
    if before is not None:
        codes = {"before": before.resolve(), "current": None}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, code in codes.items():
            _out(f"code {name}: traces from {_traces_file(code, Path(tmp))}")
        for _ in range(repeats):
            for name, code in codes.items():  # interleaved: load hits both alike
                out = str(Path(tmp) / f"agentx-{name}.parquet")
                for step, cmd in (
                    ("generate", ["generate", "--preset", "agentx", "-o", out]),
                    ("trace stats", ["trace", "stats", out]),
                ):
                    got = _measured(cmd, code, Path(tmp))
                    runs.setdefault((step, name), []).append(got)
    _out(f"CLI at agentx scale ({repeats} repeats, medians; fresh process each):")
    _out("| command | code | wall s | all runs s | peak RSS MB |")
    _out("| --- | --- | ---: | --- | ---: |")
    for (step, name), measured in runs.items():
        secs = [s for s, _ in measured]
        _out(
            f"| replayer {step} | {name} | {statistics.median(secs):.2f} | "
            f"{', '.join(f'{x:.2f}' for x in secs)} | "
            f"{statistics.median(m for _, m in measured):,.0f} |"
        )
    gen_s = statistics.median(s for s, _ in runs[("generate", "current")])
    gen_mb = statistics.median(m for _, m in runs[("generate", "current")])
    stats_mb = statistics.median(m for _, m in runs[("trace stats", "current")])
    _out(
        f"goals: generate <= 5 s {'met' if gen_s <= 5 else 'NOT met'}, "
        f"<= 1 GB {'met' if gen_mb <= 1024 else 'NOT met'}; "
        f"trace stats <= 1 GB {'met' if stats_mb <= 1024 else 'NOT met'}\n"
    )


def _speed(repeats: int, write: bool) -> Trace:
    times = []
    trace = None
    for seed in range(repeats):
        t0 = time.perf_counter()
        trace = generate_trace(PRESETS["agentx"], sessions=393, seed=seed)
        times.append(time.perf_counter() - t0)
    assert trace is not None
    blocks = sum(
        int(request_column(s.requests, "n_blocks").sum())
        for s, _ in trace.all_sessions()
    )
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
    parser.add_argument("--cli-repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="directory of an earlier traces")
    parser.add_argument("--skip-write", action="store_true")
    args = parser.parse_args()
    if args.cli_repeats > 0:
        _cli(args.cli_repeats, args.before)
    trace = _speed(args.repeats, write=not args.skip_write)
    _targets(trace)
    _calibration()


if __name__ == "__main__":
    main()
