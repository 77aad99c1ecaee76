"""`--workers N`: one asyncio process per core, sessions sharded round-robin, one start
barrier and one shared zero (perf_counter_ns is system-wide on Linux), part files per
worker in one run directory; the parent merges the run metadata."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from replayer.config import ReplayConfig
from replayer.errors import ReplayerError
from replayer.run import RunSummary, replay_trace
from traces.io import read_trace
from traces.model import Trace

_START_DELAY_NS = 200_000_000  # after the barrier, so every worker is waiting at t0


def _worker(
    trace_path: str,
    config: ReplayConfig,
    run_dir: str,
    run_id: str,
    extra: dict[str, Any],
    barrier: Any,
    t0: Any,
    results: Any,
) -> None:
    try:
        trace = read_trace(trace_path)
        # Two barrier rounds: all loaded; one sets the shared zero; all read it.
        if barrier.wait() == 0:
            t0.value = time.perf_counter_ns() + _START_DELAY_NS
        barrier.wait()
        summary = asyncio.run(
            replay_trace(
                trace,
                config,
                Path(run_dir),
                trace_path=Path(trace_path),
                run_id=run_id,
                extra_metadata=extra,
                t0_ns=t0.value,
                run_json_name=f"run-worker-{config.worker_id:03d}.json",
            )
        )
        results.put((config.worker_id, "ok", summary.counts, summary.duration_s))
    except ReplayerError as exc:
        results.put((config.worker_id, "error", str(exc), 0.0))
    except KeyboardInterrupt:
        results.put((config.worker_id, "interrupted", "", 0.0))


def replay_with_workers(
    trace: Trace,
    config: ReplayConfig,
    run_dir: Path,
    *,
    trace_path: Path,
    run_id: str,
    extra_metadata: dict[str, Any],
    progress: bool,
) -> RunSummary:
    """Run ``config.workers`` processes over shards of the trace; merge run.json."""
    ctx = mp.get_context("spawn")
    n = config.workers
    t0 = ctx.Value("q", 0)
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = []
    for k in range(n):
        cfg = replace(
            config,
            worker_id=k,
            scrape_interval_s=config.scrape_interval_s if k == 0 else 0.0,
        )
        p = ctx.Process(
            target=_worker,
            args=(
                str(trace_path),
                cfg,
                str(run_dir),
                run_id,
                extra_metadata,
                barrier,
                t0,
                results,
            ),
            name=f"replayer-worker-{k}",
        )
        p.start()
        procs.append(p)
    outcomes = []
    try:
        for _ in range(n):
            outcomes.append(results.get())
    finally:
        for p in procs:
            p.join()
    errors = [msg for _, status, msg, _ in outcomes if status == "error"]
    if errors:
        raise ReplayerError(errors[0])
    counts: dict[str, int] = {}
    for _, _, c, _ in outcomes:
        for key, value in c.items():
            if key != "trace_requests":
                counts[key] = counts.get(key, 0) + value
    counts["trace_requests"] = trace.request_count()
    duration = max(d for *_, d in outcomes)
    meta = json.loads((run_dir / "run-worker-000.json").read_text())
    meta.update(counts=counts, duration_s=duration, worker_id=None, workers=n)
    meta["trace"]["sessions"] = len(trace.sessions)
    meta["trace"]["requests"] = trace.request_count()
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    del progress
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(
        run_dir / "requests", columns=["status", "ttft_ns", "output_tokens"]
    )
    ok = table.filter(pc.equal(table["status"], "ok"))
    ttft = ok["ttft_ns"].drop_null().to_numpy()
    out_tokens = float(pc.sum(ok["output_tokens"]).as_py() or 0)
    return RunSummary(
        run_dir=run_dir,
        run_id=run_id,
        requests=counts.get("requests", 0),
        ok=counts.get("ok", 0),
        failed=counts.get("failed", 0),
        skipped=counts.get("skipped", 0),
        duration_s=duration,
        interrupted=False,
        p90_ttft_ms=float(np.percentile(ttft, 90)) / 1e6 if ttft.size else None,
        output_tok_s=out_tokens / duration if duration > 0 else 0.0,
        counts=counts,
    )
