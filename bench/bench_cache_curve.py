"""The KV knee predicted from a trace against the hit the simulated endpoint measures,
and how long the curve takes.

    python bench/bench_cache_curve.py [--corpus agentx710.parquet] [--kv 230000,...]

1. Speed: ``traces.cache_curve.cache_curve`` (20 budgets, LRU + Belady + ceiling) on
   the Weka sample and on an AgentX-scale corpus (710 sessions; generated into a
   temporary folder when ``--corpus`` is not given), median of ``--repeats``; beside
   it the existing ``traces.cache.lru_hits`` (one OrderedDict pass per budget) on the
   Weka sample, same order, all 20 budgets.
2. Predicted against measured: ``replayer run`` of the whole Weka sample (30 trees,
   3,004 requests) against the built-in sim at each ``--kv`` size (sim tokens), then
   ``replayer analyze RUN --json --kv-capacity-tokens KV``: the sim's measured hit
   (``cache_hit_rate.server``) and the LRU over the run's own start order
   (``cache_hit_rate.lru``), beside the predicted LRU and Belady
   (``traces.cache_curve.cache_curve``, same concurrency, think scale, block tokens
   and max in-flight) and the error in points.

   The default regime is where the model's assumption holds: 16 live trees (the
   cache working set spans the knee) but one request in flight (``--max-inflight
   1``), so what the sim pins (~9.6K tokens, p90) stays far below every KV size;
   4 tokens per trace block (sim blocks of 4) so the longest request (52,585 sim
   tokens) fits below the knee; think scale 0; sim ``--speed 1000``. With
   ``--max-inflight 2`` the second request's pinned blocks cost up to 6 points at
   the knee's steepest; without the cap (``--max-inflight 0``) the requests in
   flight hold about what the knee needs and the sim queues: the curve flags those
   sizes as below the in-flight tokens.
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


def _max_model_len(trace: object, block_tokens: int) -> int:
    """The longest request the replay sends (prompt + max_tokens), sim tokens."""
    import numpy as np

    from traces.table import request_column

    longest = 0.0
    for s, _ in trace.all_sessions():  # type: ignore[attr-defined]
        inp = request_column(s.requests, "input_tokens") * block_tokens / s.block_size
        out = np.maximum(request_column(s.requests, "output_tokens"), 1)
        if inp.size:
            longest = max(longest, float((np.ceil(inp) + out).max()))
    return int(longest) + block_tokens


def predicted_vs_measured(args: argparse.Namespace, out: Path) -> None:
    from traces.cache_curve import cache_curve
    from traces.io import read_trace

    trace = read_trace(WEKA)
    kv_sizes = [int(x) for x in args.kv.split(",")]
    bt = args.block_tokens
    cap = args.max_inflight or None
    max_len = _max_model_len(trace, bt)
    if min(kv_sizes) < max_len + bt:
        raise SystemExit(f"the sim needs --kv >= {max_len + bt:,} (longest request)")
    curve = cache_curve(
        trace,
        concurrency=args.concurrency,
        think_scale=args.think_scale,
        budgets_tokens=kv_sizes,
        block_tokens=bt,
        max_inflight=cap,
    )
    run = ["--concurrency", str(args.concurrency), "--think-scale",
           str(args.think_scale), "--block-tokens", str(bt)]  # fmt: skip
    if cap:
        run += ["--max-inflight", str(cap)]
    sim = (
        f"--speed {args.speed:g} --block-size {bt} --max-model-len {max_len} "
        "--kv-capacity-tokens {kv}"
    )
    print(  # noqa: T201
        f"replayer run {WEKA.name} {' '.join(run)} --sim-args '{sim}'\n"
        f"ceiling {curve.ceiling_hit_rate:.1%}; knee {curve.knee_tokens:,} tokens; "
        f"in flight ~{curve.inflight_tokens:,} tokens (p90)"
    )
    print(  # noqa: T201
        f"{'KV tokens':>10} {'LRU':>7} {'Belady':>7} {'sim':>7} {'run LRU':>8} "
        f"{'sim-LRU':>8} {'s':>5}"
    )
    errors = []
    for point in curve.points:
        kv = point.budget_tokens
        run_dir = out / f"kv{kv}"
        t0 = time.perf_counter()
        _replayer("run", str(WEKA), *run, "--quiet", "--out", str(run_dir),
                  "--sim-args", sim.format(kv=kv))  # fmt: skip
        sec = time.perf_counter() - t0
        summary = json.loads(
            _replayer(
                "analyze", str(run_dir), "--json", "--kv-capacity-tokens", str(kv)
            )
        )
        rates = summary["cache_hit_rate"]
        measured = rates["server"]
        err = (measured - point.lru_hit_rate) * 100
        errors.append(abs(err))
        flag = "  (below in-flight)" if curve.below_inflight(kv) else ""
        print(  # noqa: T201
            f"{kv:>10,} {point.lru_hit_rate:>7.1%} {point.belady_hit_rate:>7.1%} "
            f"{measured:>7.1%} {rates['lru']:>8.1%} {err:>+8.1f} {sec:>5.0f}{flag}",
            flush=True,
        )
    print(f"max |sim - predicted LRU|: {max(errors):.1f} points")  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, help="AgentX-scale trace for the timing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-inflight", type=int, default=1, help="0: no cap")
    ap.add_argument("--think-scale", type=float, default=0.0)
    ap.add_argument("--block-tokens", type=int, default=4)
    ap.add_argument("--speed", type=float, default=1000.0)
    ap.add_argument("--kv", default="56000,70000,85000,100000,130000,200000")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args()
    if not args.skip_speed:
        speed(args.corpus, args.repeats)
    if not args.skip_sim:
        with tempfile.TemporaryDirectory() as tmp:
            predicted_vs_measured(args, Path(tmp))


if __name__ == "__main__":
    main()
