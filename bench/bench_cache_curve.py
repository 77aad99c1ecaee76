"""The KV knee predicted from a trace against the hit the simulated endpoint measures,
and how long the curve takes.

    python bench/bench_cache_curve.py [--corpus agentx710.parquet] [--kv 230000,...]

1. Speed: ``traces.cache_curve.cache_curve`` (20 budgets, LRU + Belady + ceiling) on
   the Weka sample and on an AgentX-scale corpus (710 sessions; generated into a
   temporary folder when ``--corpus`` is not given), median of ``--repeats``; beside
   it the existing ``traces.cache.lru_hits`` (one OrderedDict pass per budget) on the
   Weka sample, same order, all 20 budgets.
2. Predicted against measured: ``replayer run`` of the 30 Weka sessions against the
   built-in sim at each ``--kv`` size (sim tokens; 16 tokens per trace block, sim
   blocks of 16), then ``replayer analyze --json``'s ``cache_hit_rate.server`` beside
   the predicted LRU and Belady at that size, and the error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEKA = REPO.parent / "shared" / "data" / "weka"
BLOCK_TOKENS = 16
MAX_MODEL_LEN = 226_000  # the sample's longest prompt (838K / 4) plus its output


def _replayer(*args: str) -> str:
    cmd = [sys.executable, "-m", "replayer", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _timed(fn: object, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def speed(corpus: Path | None, repeats: int) -> None:
    import numpy as np

    from traces.cache import lru_hits
    from traces.cache_curve import cache_curve, default_budgets, trace_model
    from traces.io import read_trace
    from traces.sendorder import send_order

    with tempfile.TemporaryDirectory() as tmp:
        if corpus is None:
            corpus = Path(tmp) / "agentx710.parquet"
            _replayer("generate", "--preset", "agentx", "--sessions", "710", "-o",
                      str(corpus))  # fmt: skip
        for name, path in (
            ("weka (30 sessions)", WEKA),
            ("agentx 710 sessions", corpus),
        ):
            trace = read_trace(path)
            blocks = sum(
                int(r.hash_ids.size)
                for s, _ in trace.all_sessions()
                for r in s.requests
            )
            sec, curve = _timed(lambda t=trace: cache_curve(t, concurrency=8), repeats)
            print(  # noqa: T201
                f"curve    {name}: {trace.request_count():,} requests, {blocks:,} "
                f"block lookups, {len(curve.points)} budgets: {sec:.2f} s "  # type: ignore[attr-defined]
                f"(median of {repeats})"
            )
    trace = read_trace(WEKA)
    order = send_order(trace, concurrency=8)
    budgets = default_budgets(trace_model(trace, concurrency=8))
    bs = trace.sessions[0].block_size
    reqs = [
        (s.root_index, s.session.requests[s.index].hash_ids,
         s.session.requests[s.index].input_tokens)
        for s in order
    ]  # fmt: skip
    t0 = time.perf_counter()
    for b in budgets:
        lru_hits(reqs, block_size=bs, capacity_tokens=b * bs)
    base = time.perf_counter() - t0
    n_blocks = int(np.sum([r[1].size for r in reqs]))
    print(  # noqa: T201
        f"baseline lru_hits weka, same order, {len(budgets)} budgets: {base:.2f} s "
        f"({base / len(budgets) / n_blocks * 1e9:.0f} ns per block lookup); LRU only"
    )


def predicted_vs_measured(kv_sizes: list[int], concurrency: int, out: Path) -> None:
    from traces.cache_curve import cache_curve
    from traces.io import read_trace

    think = ["--think-scale", "0.01", "--think-cap", "2"]
    curve = cache_curve(
        read_trace(WEKA),
        concurrency=concurrency,
        think_scale=0.01,
        think_cap_s=2.0,
        budgets_tokens=kv_sizes,
        block_tokens=BLOCK_TOKENS,
    )
    print(f"ceiling {curve.ceiling_hit_rate:.1%}; knee {curve.knee_tokens:,} tokens")  # noqa: T201
    print(f"{'KV tokens':>10} {'LRU':>7} {'Belady':>7} {'sim':>7} {'sim-LRU':>8}")  # noqa: T201
    errors = []
    for point in curve.points:
        kv = point.budget_tokens
        run_dir = out / f"kv{kv}"
        sim = (
            f"--speed 100 --block-size {BLOCK_TOKENS} --kv-capacity-tokens {kv} "
            f"--max-model-len {MAX_MODEL_LEN}"
        )
        _replayer("run", str(WEKA), "--concurrency", str(concurrency), *think,
                  "--block-tokens", str(BLOCK_TOKENS), "--quiet", "--out",
                  str(run_dir), "--sim-args", sim)  # fmt: skip
        summary = json.loads(_replayer("analyze", str(run_dir), "--json"))
        measured = summary["cache_hit_rate"]["server"]
        err = (measured - point.lru_hit_rate) * 100
        errors.append(abs(err))
        print(  # noqa: T201
            f"{kv:>10,} {point.lru_hit_rate:>7.1%} {point.belady_hit_rate:>7.1%} "
            f"{measured:>7.1%} {err:>+7.1f}",
            flush=True,
        )
    print(f"max |sim - predicted LRU|: {max(errors):.1f} points")  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, help="AgentX-scale trace for the timing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kv", default="230000,260000,300000,350000,400000,600000")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args()
    if not args.skip_speed:
        speed(args.corpus, args.repeats)
    if not args.skip_sim:
        with tempfile.TemporaryDirectory() as tmp:
            kv = [int(x) for x in args.kv.split(",")]
            predicted_vs_measured(kv, args.concurrency, Path(tmp))


if __name__ == "__main__":
    main()
