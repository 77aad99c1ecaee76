"""``summarize(run) -> Summary``: the headline figures of one run, the
``replayer analyze --json`` contract.

Pure: the run (and, for the LRU estimate, its trace) come in as arguments.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis import metrics as m
from analysis.cache import lru_cached_tokens, miss_impact, request_cache
from analysis.depth import by_turn_and_depth
from analysis.errors import AnalysisError
from analysis.load import Run, block_tokens_of
from analysis.sessions import session_trees
from analysis.steady import steady_state
from analysis.validity import block_ideal_hit_rate, verdict
from replayer.records import RunMeta
from traces.model import Trace


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Headline figures of one run; :meth:`as_dict` is the ``analyze --json`` object.

    Latencies in ms (mean/p50/p90/p99/count), rates in tok/s, hit rates in [0, 1];
    NaN means "unavailable" and becomes null in JSON.
    """

    run: dict[str, Any]  # path, run_id, model, endpoint, mode, labels, complete ...
    counts: dict[str, Any]  # requests, ok, errors{status: n}, warmup, measured_ok
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    itl_spread_ms: dict[str, float]  # each read's wait spread over its chunks
    itl_coalesced_share: float  # share of chunk gaps that are 0 ns
    e2e_ms: dict[str, float]
    # From scheduled_ns (when the session wanted to send): client queueing included.
    queued_ttft_ms: dict[str, float]
    queued_e2e_ms: dict[str, float]
    # The steady-state window and percentiles with CIs over it (analysis.steady).
    steady_state: dict[str, Any] | None
    interactivity_tok_s: dict[str, float]  # p50, p90 (p90 = the slow end)
    e2e_norm_interactivity_tok_s: float
    throughput_tok_s: dict[str, Any]  # input, output, total, requests, per_gpu?
    dispatch_lag_ms: dict[str, float]
    cache_hit_rate: dict[str, Any]  # server, ideal, prometheus, lru? (+ capacity)
    cache_misses: dict[str, Any]
    session_trees: dict[str, Any]
    by_turn: list[dict[str, Any]]  # per turn bucket: latency and hit rates
    by_depth: list[dict[str, Any]]  # per subagent depth: the same
    goodput: dict[str, Any] | None = None
    gpus: int | None = None
    # The client's self-check (run.json), with connection waits from the rows:
    # limited, reasons, server_notes, loop_lag_ms, loop_cpu_share, pool_wait_ms,
    # slot_wait_ms, connect_ms. None: not recorded.
    client_check: dict[str, Any] | None = None
    # The AgentX verdict (analysis.validity): valid, invalid_reasons, window, gates.
    validity: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN left as NaN; ``cli.echo_json`` prints null)."""
        out: dict[str, Any] = {
            "run": self.run,
            **self.counts,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_ms": self.itl_ms,
            "itl_spread_ms": self.itl_spread_ms,
            "itl_coalesced_share": self.itl_coalesced_share,
            "e2e_ms": self.e2e_ms,
            "queued_ttft_ms": self.queued_ttft_ms,
            "queued_e2e_ms": self.queued_e2e_ms,
            "steady_state": self.steady_state,
            "interactivity_tok_s": self.interactivity_tok_s,
            "e2e_norm_interactivity_tok_s": self.e2e_norm_interactivity_tok_s,
            "throughput_tok_s": self.throughput_tok_s,
            "dispatch_lag_ms": self.dispatch_lag_ms,
            "cache_hit_rate": self.cache_hit_rate,
            "cache_misses": self.cache_misses,
            "session_trees": self.session_trees,
            "by_turn": self.by_turn,
            "by_depth": self.by_depth,
            "gpus": self.gpus,
        }
        if self.goodput is not None:
            out["goodput"] = self.goodput
        out["client_check"] = self.client_check
        if self.validity is not None:
            out.update(agentx_figures(self))
        return out


def agentx_figures(s: Summary) -> dict[str, Any]:
    """The AgentX verdict and headline, over the measured window: ``valid``,
    ``invalid_reasons``, ``window`` and ``agentx`` (E2E-normalized interactivity,
    interactivity, throughput per GPU, theoretical vs server prefix hit, labels)."""
    assert s.validity is not None
    tput = s.throughput_tok_s
    return {
        "valid": s.validity["valid"],
        "invalid_reasons": s.validity["invalid_reasons"],
        "window": s.validity["window"],
        "agentx": {
            "e2e_norm_interactivity_tok_s": s.e2e_norm_interactivity_tok_s,
            "interactivity_tok_s": s.interactivity_tok_s,
            "throughput_per_gpu_tok_s": tput.get("per_gpu"),
            "prefix_hit": {
                "theoretical": s.cache_hit_rate.get("ideal"),
                "theoretical_server_blocks": s.validity["block_ideal"],
                "server": s.cache_hit_rate.get("server"),
            },
            "gates": s.validity["gates"],
            "live_drift": s.validity["live_drift"],
            "labels": s.run.get("labels"),
        },
    }


def _run_info(run: Run) -> dict[str, Any]:
    meta = run.meta
    # A run without any metadata says null, not RunMeta's defaults (no made-up mode).
    known = meta != RunMeta()
    return {
        "path": str(run.path),
        "name": run.name,
        "run_id": meta.run_id or None,
        "model": meta.model,
        "endpoint": meta.endpoint,
        "api": meta.api,
        "simulated": meta.simulated if known else None,
        "mode": asdict(meta.mode) if known else None,
        "labels": dict(meta.labels) if known else None,
        "duration_s": meta.duration_s,
        # Ended on its own, having played what it was meant to; else why not.
        "complete": meta.incomplete_reason is None,
        "incomplete_reason": meta.incomplete_reason,
        "problems": list(run.problems),
    }


def _client_check(run: Run) -> dict[str, Any] | None:
    """run.json's self-check verdict, with the connection waits of the rows (ms):
    ``pool_wait_ms`` (both parts), ``slot_wait_ms`` and ``connect_ms``."""
    recorded = run.meta.client_check
    df = run.requests
    waits = {
        f"{name[:-3]}_ms": (
            m.column(df, name) / 1e6 if name in df.columns else np.array([])
        )
        for name in ("pool_wait_ns", "slot_wait_ns", "connect_ns")
    }
    if recorded is None and not np.isfinite(waits["pool_wait_ms"]).any():
        return None
    out = dict(recorded or {"limited": None, "reasons": []})
    out.pop("workers", None)
    out.setdefault("server_notes", [])  # a run.json from before they were kept
    out.update({key: m.describe(values) for key, values in waits.items()})
    return out


def _per_s(ms: float) -> float:
    return 1000.0 / ms if ms > 0 and math.isfinite(ms) else math.nan


def _gpus(run: Run, gpus: int | None) -> int | None:
    if gpus is not None:
        return gpus
    label = run.meta.labels.get("gpus")
    return int(label) if isinstance(label, int | float) and label > 0 else None


def _threads() -> int:
    """Threads for :func:`summarize`'s parts beside the calling one: one per core
    left (at least one, at most the three parts there are)."""
    return max(1, min(3, (os.cpu_count() or 1) - 1))


def _itl(df: pd.DataFrame) -> tuple[dict[str, float], dict[str, float], float]:
    """ITL figures, spread ITL figures and the share of 0 ns gaps."""
    itl, spread = m.itl_and_spread_ms(df)
    figures = m.describe(itl)
    spread_figures = dict(figures) if spread is itl else m.describe(spread)
    return figures, spread_figures, m.itl_coalesced_share(df, itl)


def _trees(df: pd.DataFrame) -> dict[str, Any]:
    trees = session_trees(df)
    measured = trees[~trees["warmup"].astype(bool)] if not trees.empty else trees
    wall = measured["wall_ms"].to_numpy(dtype=float)
    join = measured["join_wait_ms"].to_numpy(dtype=float)
    total_wall = float(np.nansum(wall))
    return {
        "trees": len(trees),
        "measured_trees": len(measured),
        "wall_ms": m.describe(wall),
        "critical_path_ttft_ms": m.describe(
            measured["critical_path_ttft_ms"].to_numpy(dtype=float)
        ),
        "join_wait_ms": m.describe(join),
        "join_wait_share": float(np.nansum(join)) / total_wall
        if total_wall > 0
        else math.nan,
    }


def summarize(
    run: Run,
    *,
    gpus: int | None = None,
    slo: m.Slo | None = None,
    kv_capacity_tokens: int | None = None,
    host_capacity_tokens: int | None = None,
    trace: Trace | None = None,
    server_block_tokens: int | None = None,
) -> Summary:
    """The headline figures of ``run`` (see each metric's population in ``metrics``).

    ``gpus`` overrides run.json's ``labels.gpus`` for per-GPU throughput. With
    ``kv_capacity_tokens`` the LRU estimate needs ``trace`` (the replayed trace).
    ``server_block_tokens`` is the server's KV block size (default: what its
    ``vllm:cache_config_info`` says); a request misses its ideal hit only when it
    falls short by more than one server block, since servers cache whole blocks.

    Raises:
        AnalysisError: an LRU estimate was asked for without the trace.
    """
    df = m.numeric_view(run.requests)
    gpus = _gpus(run, gpus)
    lru = None
    rates: dict[str, Any] = {
        "server": m.server_hit_rate(df),
        "ideal": m.ideal_hit_rate(df),
        "prometheus": m.prometheus_hit_rate(
            run.server_metrics, run.meta.measure_start_ns
        ),
    }
    if run.meta.trace.provider_cache_hit_rate is not None:
        # An imported agent log: what its own provider served from cache, beside
        # what this server did with the same traffic.
        rates["provider"] = run.meta.trace.provider_cache_hit_rate
    block = block_tokens_of(run, trace)
    # Servers cache whole blocks of their own size: a shortfall within one of them
    # is rounding, not a miss. Unknown server block: the replay's.
    tolerance = (
        server_block_tokens or m.server_block_tokens(run.server_metrics) or block
    )
    if kv_capacity_tokens is not None:
        if trace is None:
            raise AnalysisError(
                f"{run.path}: the LRU estimate (--kv-capacity-tokens) needs the trace"
            )
        lru = lru_cached_tokens(
            df,
            trace,
            block_size=block,
            capacity_tokens=kv_capacity_tokens,
            host_capacity_tokens=host_capacity_tokens,
        )
        rates["lru"] = m.lru_hit_rate(df, lru)
        rates["lru_capacity_tokens"] = kv_capacity_tokens
        rates["lru_host_capacity_tokens"] = host_capacity_tokens
    per_request = request_cache(
        df,
        lru,
        reporting_only=True,
        columns=("ttft_ms", "cached_tokens", "missed_tokens"),
    )
    # Three of the larger independent parts in threads beside this one (numpy and
    # pandas release the GIL in their loops): on 10M rows the ITL gaps alone are
    # ~28M values. This thread takes the by-turn/by-depth tables and the rest.
    with ThreadPoolExecutor(max_workers=_threads()) as pool:
        itl_job = pool.submit(_itl, df)
        steady_job = pool.submit(steady_state, df, seed=run.meta.seed)
        trees_job = pool.submit(_trees, df)
        turn, depth = by_turn_and_depth(df, lru)
        lag = m.dispatch_lag_ms(df)
        tpot = m.describe(m.tpot_ms(df))
        itl_figures, spread_figures, coalesced = itl_job.result()
        lag_p50, lag_p99 = m.percentiles(lag, [50, 99])
        return Summary(
            run=_run_info(run),
            counts=m.counts(df),
            ttft_ms=m.describe(m.ttft_ms(df)),
            tpot_ms=tpot,
            itl_ms=itl_figures,
            itl_spread_ms=spread_figures,
            itl_coalesced_share=coalesced,
            e2e_ms=m.describe(m.e2e_ms(df)),
            queued_ttft_ms=m.describe(m.queued_ttft_ms(df)),
            queued_e2e_ms=m.describe(m.queued_e2e_ms(df)),
            steady_state=steady_job.result(),
            # = m.interactivity_tok_s(df), from the TPOT percentiles already computed.
            interactivity_tok_s={q: _per_s(tpot[q]) for q in ("p50", "p90")},
            e2e_norm_interactivity_tok_s=m.e2e_norm_interactivity_tok_s(df),
            throughput_tok_s=m.throughput_tok_s(df, gpus),
            dispatch_lag_ms={
                "mean": float(lag.mean()) if lag.size else math.nan,
                "p50": lag_p50,
                "p99": lag_p99,
            },
            cache_hit_rate=rates,
            cache_misses=miss_impact(per_request, tolerance_tokens=tolerance),
            session_trees=trees_job.result(),
            by_turn=turn,
            by_depth=depth,
            goodput=m.goodput(df, slo) if slo is not None else None,
            gpus=gpus,
            client_check=_client_check(run),
            validity={
                **verdict(df, run.meta),
                "block_ideal": block_ideal_hit_rate(df, tolerance),
            },
        )
