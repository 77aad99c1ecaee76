"""Benchmark: `analyze` of one N-row run (default 10M) from its Parquet part files,
against a naive pandas implementation of the headline figures, both codes back to
back in fresh processes (peak RSS of each its own).

    python bench/bench_analysis.py [--rows 10000000] [--repeats 3] [--dir DIR] [--tiers]
        [--part-rows 1000000] [--compact] [--compression lz4] [--no-baseline]
        [--full-load]

Writes the rows once as part files (``--dir``, default a temp folder kept for the
next run): 1M rows a part, or ``--part-rows 5000`` as ``run`` writes them during a
run (thousands of small parts, each with its own session ids), and with
``--compact`` joined as ``run`` joins them when it ends (``--part-rows 5000
--compact`` is the layout a finished run leaves; without ``--compact``, a killed
one's). LZ4 as ``run`` writes them, or ``--compression zstd`` as earlier versions
did. Then alternates, per repeat: ours = ``load_run(compact=True)`` of
``summary.COLUMNS`` + ``summarize`` (what ``analyze`` does); the baseline =
``pd.read_parquet`` + :func:`naive`; with ``--full-load`` also the path before the
compact load (``load_run`` of every column + ``summarize``). Prints each run's wall
time (load and summarize apart) and peak RSS, the medians and the ratio. Rows: 50
requests per session, every other session a subagent of the one before it, 4
content chunks per request (some arriving two in one network read: 0 ns gaps), 3%
errors, 5% warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analysis.heap import hold_freed_memory

if __name__ == "__main__" and "--child" in sys.argv:
    # A timed code's process sets its heap up as `analyze` does: before pandas and
    # Arrow are imported (Arrow starts a thread at import, and glibc fixes its
    # arenas at a thread's first allocation).
    hold_freed_memory()

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.load import load_run
from analysis.summary import COLUMNS, summarize
from replayer.records import RECORD_SCHEMA, RunMeta
from replayer.records.parts import (
    PART_COMPRESSION,
    compact_parts,
    part_name,
    part_write_options,
)

MS = 1_000_000


def synthetic_table(n: int, seed: int = 0, *, tiers: bool = False) -> pa.Table:
    """The rows; ``tiers``: with per-tier hits (3/4 of the cached tokens from the
    GPU, the rest from the host), as a server that reports them gives; else null
    there, as most servers leave them."""
    rng = np.random.default_rng(seed)
    per = 50
    sess = np.arange(n) // per
    idx = (np.arange(n) % per).astype(np.int32)
    root = sess - (sess % 2)
    depth = (sess % 2).astype(np.int32)
    ttft = rng.integers(20, 3000, n) * MS
    out = rng.integers(1, 900, n)
    e2e = ttft + (out - 1) * rng.integers(5, 60, n) * MS
    start = sess * 10_000 * MS + idx * 200_000 * MS // per + rng.integers(0, MS, n)
    status = np.where(rng.random(n) < 0.03, "timeout", "ok")
    # As the engine fills it (replayer.records.tpot_ns): ok rows with 2+ tokens.
    has_tpot = (status == "ok") & (out >= 2)
    tpot = (e2e - ttft) // np.maximum(out - 1, 1)
    prompt = rng.integers(1_000, 200_000, n)
    n_chunks = 4
    offs = np.arange(0, (n + 1) * n_chunks, n_chunks, dtype=np.int32)
    chunk_mat = ttft[:, None] + np.arange(n_chunks) * (e2e - ttft)[:, None] // 3
    # Coalesced reads, as servers send them: in 20% of rows chunk 2 came in chunk
    # 1's read, in 5% chunk 1 came with the first one.
    chunk_mat[:, 2] = np.where(rng.random(n) < 0.2, chunk_mat[:, 1], chunk_mat[:, 2])
    chunk_mat[:, 1] = np.where(rng.random(n) < 0.05, chunk_mat[:, 0], chunk_mat[:, 1])
    chunk_vals = chunk_mat.ravel()
    names = np.array([f"s{i}" for i in range(sess.max() + 1)], dtype=object)

    def ids(codes: np.ndarray) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32()), pa.array(names)
        )

    null_i64 = pa.nulls(n, pa.int64())
    cols = {
        "run_id": ids(np.zeros(n, np.int32)),
        "worker_id": pa.array(np.zeros(n, np.int32)),
        "session_id": ids(sess.astype(np.int32)),
        "root_session_id": ids(root.astype(np.int32)),
        "parent_session_id": pa.DictionaryArray.from_arrays(
            pa.array(np.where(depth > 0, root, -1).astype(np.int32),
                     mask=depth == 0), pa.array(names)),
        "agent_depth": pa.array(depth),
        "request_index": pa.array(idx),
        "scheduled_ns": pa.array(start - rng.integers(0, 5 * MS, n)),
        "start_ns": pa.array(start),
        "first_token_ns": pa.array(start + ttft),
        "end_ns": pa.array(start + e2e),
        "ttft_ns": pa.array(ttft),
        "e2e_ns": pa.array(e2e),
        "tpot_ns": pa.array(tpot, mask=~has_tpot),
        "chunk_times_ns": pa.ListArray.from_arrays(offs, pa.array(chunk_vals)),
        "trace_input_tokens": pa.array(prompt),
        "prompt_tokens": pa.array(prompt),
        "dropped_input_tokens": pa.array(np.zeros(n, np.int64)),
        "server_prompt_tokens": null_i64,
        "trace_output_tokens": pa.array(out),
        "requested_output_tokens": pa.array(out),
        "dropped_output_tokens": pa.array(np.zeros(n, np.int64)),
        "output_tokens": pa.array(out),
        "cached_tokens": pa.array((prompt * 0.8).astype(np.int64)),
        "ideal_cached_tokens": pa.array((prompt * 0.9).astype(np.int64)),
        "status": pa.array(status).dictionary_encode(),
        "http_status": pa.nulls(n, pa.int32()),
        "error_type": pa.nulls(n, pa.string()).dictionary_encode(),
        "error_message": pa.nulls(n, pa.string()),
        "retries": pa.array(np.zeros(n, np.int32)),
        "pool_wait_ns": pa.array(rng.integers(0, MS // 10, n)),
        "slot_wait_ns": pa.array(np.zeros(n, np.int64)),
        "connect_ns": null_i64,  # = pool_wait_ns, below
        "inflight_at_send": pa.array(np.zeros(n, np.int32)),
        "lanes_at_send": pa.array(np.zeros(n, np.int32)),
        "warmup": pa.array(np.arange(n) < n // 20),
        "primer": pa.array(np.zeros(n, bool)),
        "replay_index": pa.array(np.zeros(n, np.int32)),
        "live_drift_tokens": null_i64,
        "cached_gpu_tokens": pa.array((prompt * 0.6).astype(np.int64))
        if tiers else null_i64,
        "cached_host_tokens": pa.array(
            (prompt * 0.8).astype(np.int64) - (prompt * 0.6).astype(np.int64)
        ) if tiers else null_i64,
    }  # fmt: skip
    cols["connect_ns"] = cols["pool_wait_ns"]  # after the draws: same data as before
    assert list(cols) == RECORD_SCHEMA.names
    return pa.table(cols)


def naive(df: pd.DataFrame) -> dict[str, float]:
    """The same headline figures the obvious pandas way (the baseline)."""
    ok = df[(df["status"] == "ok") & ~df["warmup"]]
    out: dict[str, float] = {}
    for name in ("ttft_ns", "e2e_ns"):
        q = ok[name].astype("float64").quantile([0.5, 0.9, 0.99])
        out[name] = float(q.iloc[1])
    out["tpot_p90"] = float(ok["tpot_ns"].dropna().astype("float64").quantile(0.9))
    chunks = ok["chunk_times_ns"].explode().astype("float64")
    gaps = chunks.groupby(level=0).diff().dropna()
    out["itl_p90"] = float(gaps.quantile(0.9))
    window = (ok["end_ns"].max() - ok["start_ns"].min()) / 1e9
    out["output_tok_s"] = float(ok["output_tokens"].sum() / window)
    trees = df.groupby("root_session_id", observed=True).agg(
        first=("start_ns", "min"), last=("end_ns", "max")
    )
    out["tree_wall_p90"] = float((trees["last"] - trees["first"]).quantile(0.9))
    return out


def _rss_mb() -> float:
    """This process's peak RSS, MiB: the kernel's high-water mark of its own memory
    (``VmHWM``). Not ``ru_maxrss``: a child starts with its parent's at the fork
    and keeps it through exec, so every code measured after the parent wrote the
    rows (2.4 GiB) showed at least that."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def write_run(
    path: Path,
    rows: int,
    part_rows: int = 1_000_000,
    *,
    compact: bool = False,
    compression: str = PART_COMPRESSION,
    tiers: bool = False,
) -> None:
    """The synthetic rows as a run directory: part files + run.json, with the
    recorder's column types (ids as strings). With ``compact`` the parts are then
    joined as the recorder joins them when a run ends (``compact_parts``)."""
    table = synthetic_table(rows, tiers=tiers)
    (path / "requests").mkdir(parents=True, exist_ok=True)
    meta = RunMeta(run_id="bench")
    count = 0
    for k, at in enumerate(range(0, rows, part_rows)):
        # As the recorder writes them: RECORD_SCHEMA's types (ids as strings,
        # which Parquet stores as each row group's dictionary and indices).
        part = table.slice(at, part_rows)
        part = pa.table(
            [
                c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                for c in part.columns
            ],
            names=part.column_names,
        )
        pq.write_table(
            part,
            path / "requests" / part_name(0, k),
            **{**part_write_options(part.column_names), "compression": compression},
        )
        count += 1
    if compact:
        compact_parts(path / "requests", 0, count, json.dumps(meta.as_dict()).encode())
    (path / "run.json").write_text(json.dumps(meta.as_dict()))


def child(code: str, path: Path) -> dict[str, float]:
    """One timed code in this (fresh) process: seconds, peak RSS, a few figures.
    Freed memory is held for reuse, as ``analyze`` does (for every code alike; set
    up at import, before pandas and Arrow)."""
    t = time.perf_counter()
    if code == "naive":
        df = pd.read_parquet(path / "requests")
        loaded = time.perf_counter()
        b = naive(df)
        done = time.perf_counter()
        figures = {"ttft_p90_ms": b["ttft_ns"] / 1e6, "e2e_p90_ms": b["e2e_ns"] / 1e6}
    else:
        if code == "ours":
            run = load_run(path, columns=COLUMNS, compact=True)
        else:  # "full": every column, the frame before the compact load
            run = load_run(path)
        loaded = time.perf_counter()
        s = summarize(run, gpus=8).as_dict()
        done = time.perf_counter()
        figures = {"ttft_p90_ms": s["ttft_ms"]["p90"], "e2e_p90_ms": s["e2e_ms"]["p90"]}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "load_s": loaded - t,
        "compute_s": done - loaded,
        "total_s": done - t,
        "peak_mib": _rss_mb(),
        **figures,
    }


def _measure(code: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", code, "--dir", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.splitlines()[-1])
    return result


LABELS = {
    "ours": "ours (compact load + summarize)",
    "naive": "naive pandas baseline (read_parquet + fewer figures)",
    "full": "full load (every column, records_frame) + summarize",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument(
        "--part-rows",
        type=int,
        default=1_000_000,
        help="rows a part file (5000: as `run` writes them, each with its own ids)",
    )
    ap.add_argument(
        "--compact",
        action="store_true",
        help="join the parts as a finished `run` does (with --part-rows 5000: "
        "the layout `run` leaves)",
    )
    ap.add_argument(
        "--compression",
        default=PART_COMPRESSION,
        help="of the part files (zstd: as earlier versions wrote them)",
    )
    ap.add_argument(
        "--tiers",
        action="store_true",
        help="rows with per-tier hits (cached_gpu/host_tokens), as vLLM and SGLang "
        "report them; without, those columns are null",
    )
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--full-load", action="store_true")
    ap.add_argument("--child", choices=sorted(LABELS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = args.dir or Path(tempfile.gettempdir()) / (
        f"bench-analysis-{args.rows}-{args.part_rows}-{args.compression}"
        + ("-compact" if args.compact else "")
        + ("-tiers" if args.tiers else "")
    )
    if args.child:
        _say(json.dumps(child(args.child, path)))
        return
    _say(
        f"machine: {os.cpu_count()} CPUs, {_cpu_model()}; "
        f"python {platform.python_version()}, pandas {pd.__version__}, "
        f"numpy {np.__version__}, pyarrow {pa.__version__}"
    )
    if not (path / "run.json").exists():
        t = time.perf_counter()
        write_run(
            path,
            args.rows,
            args.part_rows,
            compact=args.compact,
            compression=args.compression,
            tiers=args.tiers,
        )
        _say(f"wrote {args.rows:,} rows to {path} in {time.perf_counter() - t:.1f} s")
    codes = ["ours"] + ([] if args.no_baseline else ["naive"])
    codes += ["full"] if args.full_load else []
    results: dict[str, list[dict[str, float]]] = {c: [] for c in codes}
    for rep in range(args.repeats):  # alternated: the box's noise hits all alike
        for code in codes:
            r = _measure(code, path)
            results[code].append(r)
            _say(
                f"{LABELS[code]} run {rep + 1}: {r['total_s']:.2f} s (load "
                f"{r['load_s']:.2f} s + {r['compute_s']:.2f} s; CPU "
                f"{r['cpu_s']:.1f} s), peak RSS {r['peak_mib']:,.0f} MiB "
                f"(TTFT p90 {r['ttft_p90_ms']:.3f} ms)"
            )
    medians = {}
    for code, runs in results.items():
        medians[code] = statistics.median(r["total_s"] for r in runs)
        peak = max(r["peak_mib"] for r in runs)
        load = statistics.median(r["load_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        _say(
            f"{LABELS[code]}: median {medians[code]:.2f} s (load {load:.2f} s; "
            f"CPU {cpu:.1f} s), "
            f"peak RSS {peak:,.0f} MiB"
        )
    for code in codes[1:]:
        _say(f"{code} / ours (medians): {medians[code] / medians['ours']:.2f}")


if __name__ == "__main__":
    main()
