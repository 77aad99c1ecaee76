"""Prefix-cache hits per tier (GPU, host): from the rows' usage split, else the
server's per-tier counters (vLLM's by source, SGLang's by cache source); per run, per
session tree and over time, beside the ideal hit. See docs/metrics.md."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis import metrics as m

NAN = math.nan
COLUMNS = ("cached_gpu_tokens", "cached_host_tokens")

# vLLM (vllm#33290): every prompt token by where it came from.
VLLM_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
VLLM_GPU_SOURCES = ("local_cache_hit",)
VLLM_HOST_SOURCES = ("external_kv_transfer",)
# SGLang: cached prompt tokens by tier, over its prompt tokens.
SGLANG_CACHED = "sglang:cached_tokens_total"
SGLANG_PROMPT = "sglang:prompt_tokens_total"
SGLANG_HOST_SOURCES = ("host", "storage")
# vLLM's CPU offloading connector: bytes moved by direction (CPU_to_GPU: host loads).
VLLM_OFFLOAD_BYTES = "vllm:kv_offload_total_bytes_total"
# KV usage in [0, 1] of each tier; SGLang's host tier as used / total tokens.
GPU_USAGE = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
HOST_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
SGLANG_HOST_USED = "sglang:hicache_host_used_tokens"
SGLANG_HOST_TOTAL = "sglang:hicache_host_total_tokens"
OVER_TIME_BINS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class TierRates:
    """Hit rates in [0, 1] per tier (NaN: unavailable). ``source`` says where
    ``gpu`` and ``host`` come from: ``"rows"`` (the usage split) or
    ``"counters"`` (the server's per-tier counters, when the rows have none);
    ``counters`` holds the counters' own figures beside the rows' (their
    reconciliation)."""

    source: str
    gpu: float
    host: float
    overall: float
    ideal: float
    lru: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    kv_usage: dict[str, float] = field(default_factory=dict)
    by_tree: pd.DataFrame | None = None
    over_time: pd.DataFrame | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "gpu": self.gpu,
            "host": self.host,
            "overall": self.overall,
            "ideal": self.ideal,
        }
        if self.lru is not None:
            out["lru"] = self.lru
        if self.counters:
            out["counters"] = dict(self.counters)
        if self.kv_usage:
            out["kv_usage"] = dict(self.kv_usage)
        for name in ("by_tree", "over_time"):
            frame = getattr(self, name)
            if frame is not None:
                out[name] = [
                    {k: _plain(v) for k, v in row.items()}
                    for row in frame.to_dict("records")
                ]
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def row_split(df: pd.DataFrame, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GPU, host) hit tokens of the rows where ``keep``, NaN where not said."""
    cols = [
        m.column(df, c)[keep] if c in df.columns else np.full(int(keep.sum()), NAN)
        for c in COLUMNS
    ]
    return cols[0], cols[1]


def _rates(
    gpu: np.ndarray, host: np.ndarray, prompt: np.ndarray
) -> tuple[float, float, float]:
    known = ~np.isnan(gpu) & ~np.isnan(host)
    denom = float(prompt[known].sum())
    if not known.any() or denom <= 0:
        return NAN, NAN, NAN
    g = float(gpu[known].sum()) / denom
    h = float(host[known].sum()) / denom
    return g, h, g + h


def labelled_deltas(
    server_metrics: pd.DataFrame, metric: str, label: str, since_ns: int = 0
) -> dict[str, float]:
    """Increase of counter ``metric`` over the run per value of ``label``
    (:func:`analysis.metrics.counter_delta`'s baseline), summed over the other
    labels; empty when not scraped."""
    rows = server_metrics[server_metrics["metric"] == metric]
    out: dict[str, float] = {}
    for labels, g in rows.groupby("labels", sort=False):
        value = str(json.loads(str(labels)).get(label, ""))
        delta = m.counter_delta(g, metric, since_ns)
        out[value] = out.get(value, 0.0) + delta
    return out


def counter_tiers(server_metrics: pd.DataFrame, since_ns: int = 0) -> dict[str, float]:
    """GPU, host and overall hit rates from the server's per-tier counters, and the
    family they came from: vLLM's Δ``prompt_tokens_by_source`` (local cache hit,
    external KV transfer, over all sources) or SGLang's Δ``cached_tokens`` by
    ``cache_source`` over Δ``prompt_tokens``; with vLLM's offloading connector, the
    bytes it loaded from the CPU (``host_load_bytes``). Empty when neither was
    scraped."""
    by_source = labelled_deltas(server_metrics, VLLM_BY_SOURCE, "source", since_ns)
    if by_source:
        total = sum(by_source.values())
        gpu = sum(by_source.get(s, 0.0) for s in VLLM_GPU_SOURCES)
        host = sum(by_source.get(s, 0.0) for s in VLLM_HOST_SOURCES)
    else:
        cached = labelled_deltas(
            server_metrics, SGLANG_CACHED, "cache_source", since_ns
        )
        if not cached or "device" not in cached:
            return {}
        total = m.counter_delta(server_metrics, SGLANG_PROMPT, since_ns)
        gpu = cached.get("device", 0.0)
        host = sum(cached.get(s, 0.0) for s in SGLANG_HOST_SOURCES)
    if not total > 0:
        return {}
    out = {"gpu": gpu / total, "host": host / total, "overall": (gpu + host) / total}
    moved = labelled_deltas(
        server_metrics, VLLM_OFFLOAD_BYTES, "transfer_type", since_ns
    )
    loads = sum(v for k, v in moved.items() if k.lower() == "cpu_to_gpu")
    if moved:
        out["host_load_bytes"] = loads
    return out


def _gauge(server_metrics: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
    """The first of ``names`` scraped, summed over label sets per scrape."""
    for name in names:
        rows = server_metrics[server_metrics["metric"] == name]
        if not rows.empty:
            return rows.groupby("scrape_ns")["value"].sum()
    return pd.Series(dtype=np.float64)


def usage_gauges(server_metrics: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(GPU, host) KV usage in [0, 1] per scrape, as the servers publish them."""
    gpu = _gauge(server_metrics, GPU_USAGE)
    host = _gauge(server_metrics, (HOST_USAGE,))
    if host.empty:
        used = _gauge(server_metrics, (SGLANG_HOST_USED,))
        total = _gauge(server_metrics, (SGLANG_HOST_TOTAL,))
        if not used.empty and not total.empty:
            host = (used / total.where(total > 0)).dropna()
    return gpu, host


def _usage_summary(gpu: pd.Series, host: pd.Series) -> dict[str, float]:
    out: dict[str, float] = {}
    for tier, series in (("gpu", gpu), ("host", host)):
        if not series.empty:
            out[f"{tier}_mean"] = float(series.mean())
            out[f"{tier}_max"] = float(series.max())
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class _OkRows:
    """The ok rows' columns the tier figures read, each read once (10M-row runs:
    one float array a column, shared by the run, per-tree and over-time parts)."""

    ok: np.ndarray  # over all rows
    measured: np.ndarray  # over the ok rows: not warm-up
    gpu: np.ndarray  # NaN where the row does not split its hits
    host: np.ndarray
    prompt: np.ndarray  # the server's count, else ours
    known: np.ndarray  # gpu and host both said

    @classmethod
    def of(cls, df: pd.DataFrame) -> _OkRows:
        ok = m.has_status(df, "ok")
        gpu, host = row_split(df, ok)
        return cls(
            ok=ok,
            measured=~m.is_warmup(df)[ok],
            gpu=gpu,
            host=host,
            prompt=m.server_prompt(df, ok),
            known=~np.isnan(gpu) & ~np.isnan(host),
        )


def _masked_rates(rows: _OkRows, mask: np.ndarray) -> tuple[float, float, float]:
    """:func:`_rates` of the ok rows where ``mask``, with no copies."""
    denom = float(np.sum(rows.prompt, where=mask))
    if not mask.any() or denom <= 0:
        return NAN, NAN, NAN
    g = float(np.sum(rows.gpu, where=mask)) / denom
    h = float(np.sum(rows.host, where=mask)) / denom
    return g, h, g + h


def tier_rates(
    df: pd.DataFrame,
    server_metrics: pd.DataFrame,
    *,
    since_ns: int = 0,
    lru: np.ndarray | None = None,
) -> TierRates | None:
    """Per-tier hit rates of a run (ok, measured rows), per session tree and over
    time; None when neither the rows nor the counters split the hits by tier (a run
    of a server that does not say, or one written before the columns existed).

    Formula: Σ cached_gpu_tokens / Σ prompt and Σ cached_host_tokens / Σ prompt
    over the rows that report the split (:func:`analysis.metrics.hit_rate`'s
    ratio); overall = their sum. Without a split in the rows, the counters'
    figures (:func:`counter_tiers`) stand in, for the run only.
    """
    counters = counter_tiers(server_metrics, since_ns)
    said = all(c in df.columns and bool(df[c].notna().any()) for c in COLUMNS)
    if not said and not counters:
        return None
    rows = _OkRows.of(df)
    g, h, overall = _masked_rates(rows, rows.measured & rows.known)
    source = "rows"
    if math.isnan(g):
        if not counters:
            return None
        source = "counters"
        g, h, overall = counters["gpu"], counters["host"], counters["overall"]
    sent = m.kept_column(df, "prompt_tokens", rows.ok)
    ideal_tokens = m.kept_column(df, "ideal_cached_tokens", rows.ok)
    ideal = m.hit_rate(ideal_tokens[rows.measured], sent[rows.measured])
    gpu_use, host_use = usage_gauges(server_metrics)
    return TierRates(
        source=source,
        gpu=g,
        host=h,
        overall=overall,
        ideal=ideal,
        lru=None if lru is None else m.lru_hit_rate(df, lru),
        counters=counters,
        kv_usage=_usage_summary(gpu_use, host_use),
        by_tree=_by_tree(df, rows, sent, ideal_tokens) if source == "rows" else None,
        over_time=_over_time(df, rows, sent, ideal_tokens, gpu_use, host_use),
    )


def _tree_codes(df: pd.DataFrame, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each kept row's session-tree code (-1: no id) and the trees' ids as text: the
    categorical's own codes when the column is one (no string per row)."""
    col = df["root_session_id"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = np.asarray(col.array.codes)[keep]
        names = np.asarray(col.cat.categories.astype(str), dtype=object)
        return codes.astype(np.int64, copy=False), names
    found, uniques = pd.factorize(col.to_numpy()[keep], use_na_sentinel=True)
    return found.astype(np.int64, copy=False), np.asarray(
        [str(u) for u in uniques], dtype=object
    )


def _binned(bins: np.ndarray, n: int, *weights: np.ndarray) -> list[np.ndarray]:
    """Per bin 0..n-1 (n: the rows left out): the count of rows and each weight's
    sum; ``bins`` and the weights are whole columns (no subsets copied)."""
    out: list[np.ndarray] = [np.bincount(bins, minlength=n + 1)[:n].astype(np.float64)]
    out += [np.bincount(bins, weights=w, minlength=n + 1)[:n] for w in weights]
    return out


def by_tree(df: pd.DataFrame) -> pd.DataFrame:
    """One row per session tree (by id): its ok, measured rows' GPU, host, overall
    and ideal hit rates (the run's formulas on the tree's rows that report the
    split)."""
    rows = _OkRows.of(df)
    return _by_tree(
        df,
        rows,
        m.kept_column(df, "prompt_tokens", rows.ok),
        m.kept_column(df, "ideal_cached_tokens", rows.ok),
    )


def _by_tree(
    df: pd.DataFrame, rows: _OkRows, sent: np.ndarray, ideal: np.ndarray
) -> pd.DataFrame:
    """:func:`by_tree` on the columns read: sums by the trees' codes, no group-by."""
    codes, names = _tree_codes(df, rows.ok)
    n = len(names)
    left_out = ~(rows.measured & rows.known) | (codes < 0)
    codes[left_out] = n  # a bin of its own, dropped
    # The NaNs of rows that do not split their hits fall in the dropped bin only.
    count, p, g, h, s, i = _binned(codes, n, rows.prompt, rows.gpu, rows.host,
                                   sent, ideal)  # fmt: skip
    present = np.flatnonzero(count > 0)
    order = present[np.argsort(names[present].astype(str), kind="stable")]
    with np.errstate(divide="ignore", invalid="ignore"):
        return pd.DataFrame(
            {
                "root_session_id": names[order],
                "requests": count[order].astype(np.int64),
                "gpu": g[order] / p[order],
                "host": h[order] / p[order],
                "overall": (g[order] + h[order]) / p[order],
                "ideal": i[order] / s[order],
            }
        )


def over_time(
    df: pd.DataFrame, server_metrics: pd.DataFrame, bins: int = OVER_TIME_BINS
) -> pd.DataFrame:
    """The run's ok rows in ``bins`` equal intervals of their send time: each
    interval's GPU, host, overall and ideal hit rates (rows that report the split),
    and the KV usage gauges of both tiers averaged over its scrapes (NaN where
    none)."""
    rows = _OkRows.of(df)
    gpu_use, host_use = usage_gauges(server_metrics)
    return _over_time(
        df,
        rows,
        m.kept_column(df, "prompt_tokens", rows.ok),
        m.kept_column(df, "ideal_cached_tokens", rows.ok),
        gpu_use,
        host_use,
        bins,
    )


def _over_time(
    df: pd.DataFrame,
    rows: _OkRows,
    sent: np.ndarray,
    ideal: np.ndarray,
    gpu_use: pd.Series,
    host_use: pd.Series,
    bins: int = OVER_TIME_BINS,
) -> pd.DataFrame:
    """:func:`over_time` on the columns read: sums by interval."""
    start = m.kept_column(df, "start_ns", rows.ok)
    if start.size == 0 or np.isnan(start).all():
        return pd.DataFrame(columns=["start_s", "end_s", "requests", "gpu", "host",
                                     "overall", "ideal", "gpu_kv_usage",
                                     "host_kv_usage"])  # fmt: skip
    lo, hi = float(np.nanmin(start)), float(np.nanmax(start))
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    # Each row's interval: past the first edge (start >= lo), the last one closed.
    which = np.searchsorted(edges, start, side="right")
    del start
    which -= 1
    np.minimum(which, bins - 1, out=which)
    requests, s, i = _binned(which, bins, sent, ideal)
    which[~rows.known] = bins  # rows that do not split their hits: dropped
    said, p, g, h = _binned(which, bins, rows.prompt, rows.gpu, rows.host)
    out = []
    for b in range(bins):
        rated = bool(said[b] > 0 and p[b] > 0)
        lo_ns, hi_ns = edges[b], edges[b + 1]
        out.append(
            {
                "start_s": lo_ns / 1e9,
                "end_s": hi_ns / 1e9,
                "requests": int(requests[b]),
                "gpu": g[b] / p[b] if rated else NAN,
                "host": h[b] / p[b] if rated else NAN,
                "overall": (g[b] + h[b]) / p[b] if rated else NAN,
                "ideal": float(i[b]) / s[b] if s[b] > 0 else NAN,
                "gpu_kv_usage": _mean_within(gpu_use, lo_ns, hi_ns),
                "host_kv_usage": _mean_within(host_use, lo_ns, hi_ns),
            }
        )
    return pd.DataFrame(out)


def _mean_within(series: pd.Series, lo_ns: float, hi_ns: float) -> float:
    if series.empty:
        return NAN
    idx = series.index.to_numpy(dtype=np.float64)
    sel = (idx >= lo_ns) & (idx <= hi_ns)
    return float(series.to_numpy()[sel].mean()) if sel.any() else NAN
