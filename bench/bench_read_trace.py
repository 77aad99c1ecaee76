"""`traces.read_trace` of a 32,000-session JSONL (one 2,000-token request each, 32
hash ids: the shape of the peer benchmark's trace), checkouts side by side: each read
in a fresh interpreter (`PYTHONPATH=DIR`), checkouts interleaved, median of --reps,
with the reader's peak RSS (ru_maxrss, imports included).

    python bench/bench_read_trace.py --code /work/wt-c5b [--code DIR ...] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MAKE = """\
import sys, numpy as np
from traces.io import write_trace
from traces.model import Request, Session, Trace
n = int(sys.argv[2])
write_trace(Trace(sessions=tuple(Session(session_id=f"s{i:05d}", requests=(Request(
    input_tokens=2000, output_tokens=256,
    hash_ids=np.arange(i * 32, (i + 1) * 32, dtype=np.int64)),)) for i in range(n))),
    sys.argv[1])
"""
_READ = """\
import sys, time, resource
from traces.io import read_trace
t = time.perf_counter(); tr = read_trace(sys.argv[1]); dt = time.perf_counter() - t
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, action="append", default=[])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=32000)
    args = ap.parse_args()
    codes = [ROOT, *args.code]
    got: dict[Path, list[tuple[float, float]]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.jsonl"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-c", _MAKE, str(trace), str(args.sessions)]
        subprocess.run(cmd, env=env, cwd=ROOT, check=True)
        for _ in range(args.reps):
            for code in codes:
                env = {**os.environ, "PYTHONPATH": str(code)}
                out = subprocess.run(
                    [sys.executable, "-c", _READ, str(trace)],
                    env=env,
                    cwd=code,  # `-c` puts the working folder first on sys.path
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split()
                got[code].append((float(out[0]), float(out[1])))
    first = statistics.median(t for t, _ in got[ROOT])
    print("| code | median s | all s | vs ours | peak RSS MiB |")
    print("|---|---:|---|---:|---:|")
    for code, rs in got.items():
        t = statistics.median(r[0] for r in rs)
        runs = ", ".join(f"{r[0]:.2f}" for r in rs)
        rss = statistics.median(r[1] for r in rs)
        print(f"| {code.name} | {t:.2f} | {runs} | {t / first:.2f}x | {rss:.0f} |")


if __name__ == "__main__":
    main()
