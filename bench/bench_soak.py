"""Soak: does the client's memory stay flat over a long run with many live sessions?

    python bench/bench_soak.py [--minutes 10] [--sessions 2000] [--prompt-cache-mb 256]

Generates a demo-preset trace of SESSIONS session trees, replays it with as many lanes
(every tree live at once, recycled with --loop) against the built-in simulated
endpoint for MINUTES, and samples the resident memory (VmRSS) of the replayer process
(the simulator, its child, is sampled apart) every 5 s. Prints the RSS curve and the
growth after warm-up (the first fifth of the run): max / value at the end of warm-up.
The goal is growth within 10%: request rows go to Parquet every 2 s, server metrics
to raw parts every 2 s, and the prompt-block cache is bounded by --prompt-cache-mb.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPLAYER = str(Path(sys.executable).with_name("replayer"))


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--prompt-cache-mb", type=int, default=256)
    ap.add_argument(
        "--sim-args",
        default="--speed 20 --max-num-seqs 512",
        help="the simulator's options (the default saturates it on purpose)",
    )
    ap.add_argument(
        "--run-args",
        default="",
        help="more `replayer run` options, e.g. '--block-tokens 2'",
    )
    args = ap.parse_args()
    duration = int(args.minutes * 60)
    with tempfile.TemporaryDirectory(prefix="replayer-soak-") as tmp:
        trace = Path(tmp) / "soak.parquet"
        subprocess.run(
            [REPLAYER, "generate", "-o", str(trace), "--preset", "demo",
             "--sessions", str(args.sessions), "--seed", "1"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        cmd = [
            REPLAYER, "run", str(trace), "--concurrency", str(args.sessions),
            "--loop", "--duration", str(duration), "--drain", "cancel",
            "--prompt-cache-mb", str(args.prompt_cache_mb), "--quiet",
            "--out", str(Path(tmp) / "run"), *args.run_args.split(),
            "--sim-args", args.sim_args,
        ]  # fmt: skip
        print(f"machine: nproc={os.cpu_count()} {platform.machine()}")
        print("command:", " ".join(cmd[1:]))
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        curve: list[tuple[float, float, float]] = []
        while proc.poll() is None:
            time.sleep(5)
            ours = _rss_mb(proc.pid)
            sims = [r for c in _children(proc.pid) if (r := _rss_mb(c)) is not None]
            if ours is not None:
                curve.append((time.monotonic() - t0, ours, sum(sims)))
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"run failed ({proc.returncode}): {err.decode()[-2000:]}")
        print(out.decode().strip())
    print("\n  t (s)   replayer RSS (MB)   simulator RSS (MB)")
    for t, ours, sim in curve[:: max(1, len(curve) // 30)]:
        print(f"{t:7.0f}   {ours:17.0f}   {sim:18.0f}")
    warm = [c for c in curve if c[0] >= duration / 5]
    if not warm:
        sys.exit("run too short to judge")
    base = warm[0][1]
    peak = max(c[1] for c in warm)
    end = warm[-1][1]
    print(
        f"\nafter warm-up ({duration / 5:.0f} s): {base:.0f} MB; peak {peak:.0f} MB;"
        f" end {end:.0f} MB; growth {peak / base - 1:+.1%} (goal: within 10%)"
    )


if __name__ == "__main__":
    main()
