"""How late the client sends, at rising lane counts: `replayer run` of the Weka sample
(--block-tokens 16, --think-scale 0.1, --loop) against the built-in simulator, one row
per level with the self-check's dispatch lag P50/P99, loop-thread CPU and verdict.

    python bench/bench_dispatch.py [--levels 8,16,32,64] [--duration 30]
        [--code DIR ...]   # other checkouts side by side (interleaved), e.g. c5b052a's

Each level is one run per checkout, the checkouts interleaved, --reps times; the table
gives medians. The replayer runs as `python -m replayer` with PYTHONPATH=DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEKA = ROOT.parent / "shared/data/weka"


def run_level(code: Path, trace: Path, lanes: int, duration: float, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "replayer", "run", str(trace),
        "--concurrency", str(lanes), "--block-tokens", "16", "--think-scale", "0.1",
        "--duration", str(duration), "--loop", "--sim-args", "--speed 10",
        "--out", str(out), "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=code)
    check = json.loads((out / "run.json").read_text())["client_check"]
    return {
        "p50": check["dispatch_lag_ms"].get("p50"),
        "p99": check["dispatch_lag_ms"].get("p99"),
        "cpu": check["loop_cpu_share"].get("p50"),
        "limited": check["limited"],
        "reasons": check["reasons"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="8,16,32,64")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--trace", type=Path, default=WEKA)
    ap.add_argument("--code", type=Path, action="append", default=[])
    args = ap.parse_args()
    codes = [ROOT, *args.code]
    levels = [int(x) for x in args.levels.split(",")]
    got: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for lanes in levels:
                for k, code in enumerate(codes):
                    out = Path(tmp) / f"r{rep}-{lanes}-{k}"
                    r = run_level(code, args.trace, lanes, args.duration, out)
                    got.setdefault((str(code), lanes), []).append(r)
                    print(f"{code.name} c{lanes}: {r}", file=sys.stderr, flush=True)
    print("| code | lanes | dispatch lag P50 ms | P99 ms | loop CPU | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for lanes in levels:
        for code in codes:
            rs = got[(str(code), lanes)]
            med = {
                k: statistics.median(r[k] for r in rs) for k in ("p50", "p99", "cpu")
            }
            limited = [r for r in rs if r["limited"]]
            verdict = (
                f"CLIENT-LIMITED ({len(limited)}/{len(rs)}): {limited[0]['reasons'][0]}"
                if limited
                else "not limited"
            )
            print(
                f"| {code.name} | {lanes} | {med['p50']:.2f} | {med['p99']:.2f} "
                f"| {med['cpu']:.0%} | {verdict} |"
            )


if __name__ == "__main__":
    main()
