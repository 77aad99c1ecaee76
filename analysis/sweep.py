"""Sweeps: one row per level and the throughput-per-GPU vs interactivity Pareto front.
Pure: summaries in, a DataFrame / level names out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.summary import Summary

SWEEP_COLUMNS = (
    "level",
    "concurrency",
    "interactivity_tok_s",
    "throughput_tok_s",
    "per_gpu",
    "ttft_p90_ms",
    "e2e_p90_ms",
    "ok",
    "pareto",
)


def sweep_table(summaries: Sequence[Summary]) -> pd.DataFrame:
    """One row per level: x = E2E-normalized interactivity (tok/s/user, the AgentX
    headline), y = output throughput (tok/s; ``per_gpu`` says whether it is per GPU:
    only when every level knows its GPU count), and whether it is on the front."""
    per_gpu = all(s.throughput_tok_s.per_gpu is not None for s in summaries)
    rows = []
    for s in summaries:
        tp = s.throughput_tok_s
        rows.append(
            {
                "level": s.run.name,
                "concurrency": None if s.run.mode is None else s.run.mode.concurrency,
                "interactivity_tok_s": s.e2e_norm_interactivity_tok_s,
                "throughput_tok_s": tp.per_gpu.output
                if tp.per_gpu is not None and per_gpu
                else tp.output,
                "per_gpu": per_gpu,
                "ttft_p90_ms": s.ttft_ms.p90,
                "e2e_p90_ms": s.e2e_ms.p90,
                "ok": s.counts.ok,
            }
        )
    table = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS[:-1]))
    table["pareto"] = pareto_front(
        table["interactivity_tok_s"].to_numpy(dtype=float),
        table["throughput_tok_s"].to_numpy(dtype=float),
    )
    return table


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points not dominated when both ``x`` and ``y`` are better higher.

    A point is dominated if another is ≥ on both and > on one. NaN points are never
    on the front.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = ~(np.isnan(x) | np.isnan(y))
    front = np.zeros(x.size, dtype=bool)
    for i in np.flatnonzero(ok):
        ge = ok & (x >= x[i]) & (y >= y[i])
        gt = (x > x[i]) | (y > y[i])
        front[i] = not (ge & gt).any()
    return front
