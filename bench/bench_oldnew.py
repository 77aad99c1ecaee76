"""Client cost side by side with another checkout (the code of c5b052a, say): `replayer
run` of one-request sessions against the zero-cost endpoint (tests/instant_server.py,
its own process), both checkouts interleaved, --reps times, medians.

    python bench/bench_oldnew.py --old /work/wt-c5b [--reps 3] [--configs ...]

Per config (lanes, output tokens per stream, sessions): requests per second over the
run's own span (first send to last end, from its rows), CPU per request (the whole
process, start-up included), peak RSS (the child's VmHWM), and the per-chunk cost
(CPU per request at 256 tokens less at 16, per extra chunk). Then `read_trace` of the
32,000-session JSONL in a fresh interpreter, per checkout. Prompts are 64 tokens (one
block): the client's streaming, not prompt building, is the cost.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from childpeak import run_replayer  # noqa: E402

CONFIGS = {  # name: lanes, output tokens, sessions
    "c256-t256": (256, 256, 1024),
    "c64-t256": (64, 256, 1024),
    "c64-t16": (64, 16, 1024),
    "c64-t16-32k": (64, 16, 32000),
}
_MAKE = """\
import sys, numpy as np
from traces.io import write_trace
from traces.model import Request, Session, Trace
out, n, osl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
write_trace(Trace(sessions=tuple(Session(session_id=f"s{i:05d}", requests=(Request(
    input_tokens=64, output_tokens=osl, hash_ids=np.array([i], dtype=np.int64)),))
    for i in range(n))), out)
"""
_READ = """\
import sys, time, resource
from traces.io import read_trace
t = time.perf_counter(); tr = read_trace(sys.argv[1]); dt = time.perf_counter() - t
print(dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def _server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.instant_server", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()[-1]


def _span_rate(run: Path) -> float:
    import pyarrow.parquet as pq

    parts = glob.glob(str(run / "requests/*.parquet"))
    d = pq.read_table(parts, columns=["start_ns", "end_ns", "status"]).to_pydict()
    ok = sum(s == "ok" for s in d["status"])
    return ok / ((max(d["end_ns"]) - min(d["start_ns"])) / 1e9)


def one(code: Path, url: str, trace: Path, lanes: int, n: int, out: Path) -> dict:
    args = [
        "run", str(trace), "--endpoint", url, "--model", "instant",
        "--concurrency", str(lanes), "--think-scale", "0", "--out", str(out), "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    m = run_replayer(args, env=env, cwd=code)
    if m.returncode != 0:
        raise RuntimeError(f"{code}: replayer run failed ({m.returncode})")
    return {
        "rps": _span_rate(out),
        "cpu_ms_per_req": m.cpu_s / n * 1e3,
        "peak_mib": m.peak_mib,
        "wall_s": m.wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    codes = {"ours": ROOT, "old": args.old}
    names = args.configs.split(",")
    res: dict[tuple[str, str], list[dict]] = {}
    reads: dict[str, list[tuple[float, float]]] = {}
    server, url = _server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            traces: dict[tuple[int, int], Path] = {}
            for name in names:
                _, osl, n = CONFIGS[name]
                if (n, osl) not in traces:
                    p = Path(tmp) / f"t{n}-{osl}.jsonl"
                    env = {**os.environ, "PYTHONPATH": str(args.old)}
                    make = [sys.executable, "-c", _MAKE, str(p), str(n), str(osl)]
                    subprocess.run(make, env=env, cwd=args.old, check=True)
                    traces[(n, osl)] = p
            big = traces.get((32000, 16))
            for rep in range(args.reps):
                for name in names:
                    lanes, osl, n = CONFIGS[name]
                    order = list(codes.items())
                    for who, code in order if rep % 2 == 0 else order[::-1]:
                        out = Path(tmp) / f"{name}-{who}-{rep}"
                        r = one(code, url, traces[(n, osl)], lanes, n, out)
                        res.setdefault((name, who), []).append(r)
                        print(f"rep {rep} {name} {who}: {r}", file=sys.stderr)
                if big is not None:
                    for who, code in codes.items():
                        env = {**os.environ, "PYTHONPATH": str(code)}
                        cmd = [sys.executable, "-c", _READ, str(big)]
                        got = subprocess.run(
                            cmd,
                            env=env,
                            cwd=code,  # `-c` puts the working folder on sys.path
                            check=True,
                            capture_output=True,
                            text=True,
                        ).stdout.split()
                        reads.setdefault(who, []).append((float(got[0]), float(got[1])))
                        print(f"rep {rep} read_trace {who}: {got}", file=sys.stderr)
    finally:
        server.terminate()
        server.wait()

    def med(name: str, who: str, k: str) -> float:
        return statistics.median(r[k] for r in res[(name, who)])

    print(
        "| config (lanes, tokens/stream, sessions) | ours req/s | old req/s | ratio "
        "| ours CPU ms/req | old CPU ms/req | ratio | ours peak MiB | old peak MiB "
        "| ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        o = {k: med(name, "ours", k) for k in ("rps", "cpu_ms_per_req", "peak_mib")}
        b = {k: med(name, "old", k) for k in ("rps", "cpu_ms_per_req", "peak_mib")}
        cells = [f"{name} {CONFIGS[name]}"]
        for k, fmt in (("rps", ",.0f"), ("cpu_ms_per_req", ".3f"), ("peak_mib", ".0f")):
            cells += [f"{o[k]:{fmt}}", f"{b[k]:{fmt}}", f"{o[k] / b[k]:.2f}x"]
        print("| " + " | ".join(cells) + " |")
    for who in codes:
        if "c64-t256" in names and "c64-t16" in names:
            long, short = med("c64-t256", who, "cpu_ms_per_req"), med(
                "c64-t16", who, "cpu_ms_per_req"
            )
            print(f"\nper-chunk cost ({who}): {(long - short) / 240 * 1e3:.1f} us")
        if "c64-t16" in names and "c64-t16-32k" in names:
            # Start-up cancels out: the extra CPU of 32,000 requests over 1,024.
            n1, n2 = CONFIGS["c64-t16"][2], CONFIGS["c64-t16-32k"][2]
            c1 = med("c64-t16", who, "cpu_ms_per_req") * n1
            c2 = med("c64-t16-32k", who, "cpu_ms_per_req") * n2
            print(f"marginal CPU per request at 64 in flight ({who}): "
                  f"{(c2 - c1) / (n2 - n1):.3f} ms")
    for who, rs in reads.items():
        t = statistics.median(r[0] for r in rs)
        rss = statistics.median(r[1] for r in rs)
        print(f"\nread_trace 32,000 sessions ({who}): {t:.2f} s, {rss:.0f} MiB peak")

if __name__ == "__main__":
    main()
