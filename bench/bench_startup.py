"""Start-up of `replayer run` on the AgentX-scale trace (393 sessions, ~100K requests,
contexts to ~1M tokens) against the built-in simulator: time from launch to the first
request sent, and peak RSS of the replayer process up to then and over the run.

    /tmp/venv/bin/python bench/bench_startup.py [--repeats 3] [--before DIR]

``--before DIR``: a directory holding an earlier ``traces`` package (for example
``mkdir DIR && git archive <commit> traces | tar -x -C DIR``). Its cases run with
``PYTHONPATH=DIR`` on a trace file it generated itself, interleaved with the current
code's, so both see the same machine load. The run command is
``replayer run TRACE --concurrency 4 --duration 5 --think-scale 0 --quiet
--block-tokens 16 --sim-args "--speed 100"``. The first request's send time is the run's
``start_unix_ns`` (run.json) plus the smallest ``start_ns`` of its rows; peak RSS is the
replayer process's VmHWM, polled every 10 ms (the simulator is a separate process).
Then, in a fresh process per code: the trace-side steps the engine takes before its
first request (read, ideal hits, the content hash), each timed, with VmHWM after it.
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
import time
from pathlib import Path

import pyarrow.parquet as pq

REPLAYER = [sys.executable, "-m", "replayer"]
RUN_ARGS = [
    "--concurrency",
    "4",
    "--duration",
    "5",
    "--think-scale",
    "0",
    "--quiet",
    "--block-tokens",
    "16",
    "--sim-args",
    "--speed 100",
]
_STEPS = """
import json, sys, time
from pathlib import Path
def hwm():
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) / 1024
t0 = time.perf_counter()
import replayer.launch
from replayer.records.rundir import trace_content_hash
from traces.io import read_trace
from traces.stats import ideal_cached_tokens, ideal_hit_totals
out = {'imports': (time.perf_counter() - t0, hwm())}
t0 = time.perf_counter(); trace = read_trace(sys.argv[1])
out['read_trace'] = (time.perf_counter() - t0, hwm())
t0 = time.perf_counter(); ideal = ideal_cached_tokens(trace)
ideal_hit_totals(trace, ideal)
out['ideal_cached_tokens + totals'] = (time.perf_counter() - t0, hwm())
t0 = time.perf_counter(); trace_content_hash(Path(sys.argv[1]))
out['trace_content_hash'] = (time.perf_counter() - t0, hwm())
print(json.dumps(out))
"""


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")


# Subprocesses run in a scratch directory: in the repository, ``python -m`` would put
# its packages ahead of ``PYTHONPATH`` and the "before" code would never load.
def _env(code: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return env


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _run_once(trace: Path, out: Path, code: Path | None) -> dict[str, float]:
    """One `replayer run`: seconds to the first request, peak RSS (MB) up to it and
    over the whole run."""
    samples: list[tuple[int, float]] = []  # (unix ns, VmHWM MB)
    launch_ns = time.time_ns()
    proc = subprocess.Popen(
        [*REPLAYER, "run", str(trace), *RUN_ARGS, "--out", str(out)],
        env=_env(code),
        cwd=out.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    while proc.poll() is None:
        hwm = _hwm_mb(proc.pid)
        if hwm is not None:
            samples.append((time.time_ns(), hwm))
        time.sleep(0.01)
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"replayer run failed ({proc.returncode}): {err.decode()[-2000:]}")
    meta = json.loads((out / "run.json").read_text())
    rows = pq.read_table(out / "requests", columns=["start_ns"]).column("start_ns")
    first_ns = int(meta["start_unix_ns"]) + int(
        min(v for v in rows.to_pylist() if v is not None)
    )
    at_first = [h for t, h in samples if t >= first_ns]
    return {
        "first_request_s": (first_ns - launch_ns) / 1e9,
        "peak_to_first_mb": at_first[0] if at_first else samples[-1][1],
        "peak_run_mb": samples[-1][1],
    }


def _traces_file(code: Path | None, cwd: Path) -> str:
    """Where the ``traces`` package of ``code`` loads from (checks the set-up)."""
    return subprocess.run(
        [sys.executable, "-c", "import traces; print(traces.__file__)"],
        env=_env(code),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _steps(trace: Path, code: Path | None) -> dict[str, tuple[float, float]]:
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, str(trace)],
        env=_env(code),
        cwd=trace.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {step: (secs, hwm) for step, (secs, hwm) in json.loads(out).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="directory of an earlier traces")
    args = parser.parse_args()
    codes: dict[str, Path | None] = {"current": None}
    if args.before is not None:
        codes = {"before": args.before.resolve(), "current": None}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        traces: dict[str, Path] = {}
        for name, code in codes.items():
            traces[name] = tmp / f"agentx-{name}.parquet"
            subprocess.run(
                [*REPLAYER, "generate", "--preset", "agentx", "-o", str(traces[name])],
                env=_env(code),
                cwd=tmp,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        results: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
        for k in range(args.repeats):
            for name, code in codes.items():  # interleaved: load hits both alike
                run_dir = tmp / f"run-{name}-{k}"
                results[name].append(_run_once(traces[name], run_dir, code))
        steps = {name: _steps(traces[name], code) for name, code in codes.items()}
        sizes = {name: p.stat().st_size / 1e6 for name, p in traces.items()}
        where = {name: _traces_file(code, tmp) for name, code in codes.items()}

    _say(f"command: {sys.executable} bench/bench_startup.py --repeats {args.repeats}")
    _say(f"machine: nproc={os.cpu_count()}, python {platform.python_version()}")
    _say(f"run: replayer run TRACE {' '.join(RUN_ARGS)}")
    for name, path in where.items():
        _say(f"code {name}: traces from {path}")
    _say()
    _say(
        "| code | trace file MB | launch → first request s (median) | all | "
        "peak RSS to first request MB | peak RSS of the run MB |"
    )
    _say("|---|---:|---:|---|---:|---:|")
    for name, rs in results.items():
        firsts = [r["first_request_s"] for r in rs]
        _say(
            f"| {name} | {sizes[name]:.1f} | {statistics.median(firsts):.2f} | "
            f"{', '.join(f'{x:.2f}' for x in firsts)} | "
            f"{statistics.median(r['peak_to_first_mb'] for r in rs):,.0f} | "
            f"{statistics.median(r['peak_run_mb'] for r in rs):,.0f} |"
        )
    _say()
    _say("trace-side steps before the first request (one fresh process per code):")
    _say("| code | step | s | VmHWM after MB |")
    _say("|---|---|---:|---:|")
    for name, st in steps.items():
        for step, (secs, hwm) in st.items():
            _say(f"| {name} | {step} | {secs:.2f} | {hwm:,.0f} |")
    goal = statistics.median(r["first_request_s"] for r in results["current"])
    peak = statistics.median(r["peak_to_first_mb"] for r in results["current"])
    _say()
    _say(
        f"goal <= 3 s to the first request: {goal:.2f} s, "
        f"{'met' if goal <= 3 else 'NOT met'}; "
        f"goal <= 1 GB up to it: {peak:,.0f} MB, {'met' if peak <= 1024 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
