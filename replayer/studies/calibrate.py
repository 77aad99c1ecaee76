"""`replayer calibrate`: the engine model's step terms fitted to live runs, and its
error bars measured on held-out runs, both through virtual-time replays of the runs'
own settings. See docs/engine-model.md ("Calibration")."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replayer.errors import ReplayerError
from replayer.records.engine_model import (
    CacheShape,
    EngineModel,
    FitReport,
    ServerInfo,
    StepTerms,
    write_engine_model,
)

if TYPE_CHECKING:
    import pandas as pd

    from analysis.load import Run
    from replayer.config import ReplayConfig
    from traces.model import Trace

FloatArray = npt.NDArray[np.float64]

# The fitted terms, in the order of the design matrix's columns, with their unit in
# the step-time formula (µs): decode_base_ms and decode_per_seq_ms count x1000.
TERMS: tuple[str, ...] = (
    "decode_base_ms",
    "decode_per_seq_ms",
    "decode_us_per_context_token",
    "prefill_us_per_token",
    "gpu_hit_us_per_token",
    "request_overhead_us",
)
_TO_US = {"decode_base_ms": 1000.0, "decode_per_seq_ms": 1000.0}
# Labels that name the server a run was against (besides endpoint and model): runs
# that differ in one of them are not one server.
_SERVER_LABELS = (
    "engine",
    "engine_version",
    "tp",
    "ep",
    "pp",
    "gpus",
    "hardware",
    "precision",
    "disagg",
    "kv_offload",
    "spec_decode",
    "router",
)
# The figures compared between a live run and its virtual replay.
QUANTILES = (50, 90, 99)
LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")


class CalibrationError(ReplayerError):
    """Runs that cannot be calibrated on (or predicted): missing, empty, of
    different servers, or without what the fit needs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeFlags:
    """The cache shape given on the command line (None: read it from the runs)."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """One run's headline figures, as compared (latencies ms, rates tok/s, hit a
    fraction; NaN: unavailable)."""

    ttft_ms: dict[int, float]  # percentile → value
    tpot_ms: dict[int, float]
    e2e_ms: dict[int, float]
    output_tok_s: float
    hit_rate: float
    ok: int

    def flat(self) -> dict[str, float]:
        """``{"ttft_p90_ms": ..., "output_tok_s": ..., "hit_rate": ...}``."""
        out: dict[str, float] = {}
        for name in LATENCIES:
            values = getattr(self, name)
            for q in QUANTILES:
                out[f"{name.removesuffix('_ms')}_p{q}_ms"] = values[q]
        out["output_tok_s"] = self.output_tok_s
        out["hit_rate"] = self.hit_rate
        return out


# -- loading and checking the runs ------------------------------------------------


def load_live_runs(paths: Sequence[Path]) -> list[Run]:
    """The run directories, checked: each exists and has successful rows, and all
    come from one server.

    Raises:
        CalibrationError: one line naming the run and the fault.
    """
    from analysis.errors import AnalysisError
    from analysis.load import load_run

    runs: list[Run] = []
    for path in paths:
        if not Path(path).is_dir():
            raise CalibrationError(f"{path}: no such run directory")
        try:
            run = load_run(path)
        except AnalysisError as exc:
            raise CalibrationError(str(exc)) from None
        ok = int((run.requests["status"] == "ok").sum())
        if ok == 0:
            raise CalibrationError(f"{path}: no successful request to fit on")
        if run.meta.virtual is not None:
            raise CalibrationError(
                f"{path}: a virtual-time run; calibrate on (and predict) live runs"
            )
        runs.append(run)
    first = runs[0]
    for run in runs[1:]:
        a, b = server_key(first), server_key(run)
        if a != b:
            what = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise CalibrationError(
                f"{run.path} and {first.path} come from different servers "
                f"({', '.join(what)} differ); calibrate one server at a time"
            )
    return runs


def server_key(run: Run) -> dict[str, Any]:
    """What identifies the server of a run: the built-in simulator's settings, or
    the endpoint, the model and the server labels."""
    meta = run.meta
    key: dict[str, Any] = {"model": meta.model}
    if meta.simulated:
        # Its port changes from run to run; its settings are what it is.
        sim = dict(meta.sim or {})
        sim.pop("args", None)
        key["simulator"] = sim
    else:
        key["endpoint"] = meta.endpoint
    for name in _SERVER_LABELS:
        value = meta.labels.get(name)
        if value is not None:
            key[name] = value
    return key


def server_info(run: Run) -> ServerInfo:
    meta = run.meta
    labels = {k: str(v) for k, v in meta.labels.items() if v is not None}
    return ServerInfo(
        endpoint=None if meta.simulated else meta.endpoint,
        model=meta.model,
        engine=labels.get("engine") or ("replayer-sim" if meta.simulated else None),
        version=labels.get("engine_version"),
        labels=labels,
    )


def _cache_config(run: Run) -> dict[str, str]:
    sm = run.server_metrics
    if sm.empty:
        return {}
    rows = sm[sm["metric"] == "vllm:cache_config_info"]
    if rows.empty:
        return {}
    import json

    labels = json.loads(str(rows["labels"].iloc[-1]))
    return {str(k): str(v) for k, v in labels.items()}


def _int(value: Any) -> int | None:
    try:
        out = int(float(value))
    except (TypeError, ValueError):
        return None
    return out if out > 0 else None


def cache_shape_of(runs: Sequence[Run], flags: ShapeFlags) -> tuple[CacheShape, str]:
    """The server's KV cache and limits: flags first, then its scraped metrics
    (``vllm:cache_config_info``), then the simulator's settings (runs against the
    built-in one); the batch limits default to vLLM's. Also says where each came
    from.

    Raises:
        CalibrationError: the KV size or block size is nowhere to be found.
    """
    metrics = _cache_config(runs[0])
    sim = runs[0].meta.sim or {}
    sources: list[str] = []

    def pick(name: str, flag: int | None, *found: tuple[str, Any]) -> int | None:
        if flag is not None:
            sources.append(f"{name}: flag")
            return flag
        for where, value in found:
            if _int(value) is not None:
                sources.append(f"{name}: {where}")
                return _int(value)
        return None

    block = pick(
        "block_size",
        flags.block_size,
        ("vllm:cache_config_info", metrics.get("block_size")),
        ("simulator settings", sim.get("block_size")),
    )
    sim_blocks = (
        int(sim["kv_capacity_tokens"]) // int(sim["block_size"])
        if _int(sim.get("kv_capacity_tokens")) and _int(sim.get("block_size"))
        else None
    )
    blocks = pick(
        "num_gpu_blocks",
        flags.num_gpu_blocks,
        ("vllm:cache_config_info", metrics.get("num_gpu_blocks")),
        ("simulator settings", sim_blocks),
    )
    if block is None:
        raise CalibrationError(
            f"{runs[0].path}: the server's metrics do not say its KV block size: "
            "pass --block-size"
        )
    if blocks is None:
        raise CalibrationError(
            f"{runs[0].path}: the server's metrics do not say its KV size: "
            "pass --num-gpu-blocks"
        )
    seqs = pick(
        "max_num_seqs",
        flags.max_num_seqs,
        ("simulator settings", sim.get("max_num_seqs")),
        ("vLLM's default", 256),
    )
    batched = pick(
        "max_num_batched_tokens",
        flags.max_num_batched_tokens,
        ("simulator settings", sim.get("max_num_batched_tokens")),
        ("vLLM's default", 8192),
    )
    longest = max(
        int(
            (
                r.requests["prompt_tokens"].fillna(0)
                + r.requests["requested_output_tokens"].fillna(0)
            ).max()
        )
        for r in runs
    )
    model_len = pick(
        "max_model_len",
        flags.max_model_len,
        ("simulator settings", sim.get("max_model_len")),
        ("the longest request of the runs", longest),
    )
    assert seqs is not None and batched is not None and model_len is not None
    policy = str(sim.get("policy") or "vllm")
    host = _int(sim.get("host_capacity_tokens")) or 0
    shape = CacheShape(
        block_size=block,
        kv_capacity_tokens=max(blocks * block, model_len + block),
        host_capacity_tokens=host,
        max_model_len=model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        policy=policy,
    )
    return shape, "; ".join(sources)


# -- the first estimate: engine steps read off the rows ---------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSamples:
    """Engine steps recovered from the rows: the design matrix (one row per step,
    one column per term of :data:`TERMS`, in the formula's µs units) and each
    step's measured duration (µs)."""

    x: FloatArray
    y_us: FloatArray

    @property
    def steps(self) -> int:
        return int(self.y_us.size)


def _events(df: pd.DataFrame) -> tuple[FloatArray, npt.NDArray[np.int64], ...]:
    ok = df[df["status"] == "ok"]
    starts = ok["start_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    chunks = ok["chunk_times_ns"].tolist()
    prompt = ok["server_prompt_tokens"].fillna(ok["prompt_tokens"]).to_numpy(
        dtype=np.float64, na_value=0.0
    )
    cached = ok["cached_tokens"].to_numpy(dtype=np.float64, na_value=0.0)
    out_tokens = ok["output_tokens"].to_numpy(dtype=np.float64, na_value=0.0)
    times: list[float] = []
    req: list[int] = []
    tok: list[float] = []
    for i, (s, c) in enumerate(zip(starts, chunks, strict=True)):
        if c is None or not math.isfinite(s) or len(c) == 0:
            continue
        arr = np.asarray(c, dtype=np.float64)
        n = arr.size
        # A chunk may carry several tokens (a server's stream interval): token
        # counts are then spread evenly over the chunks.
        per = max(1.0, out_tokens[i] / n) if out_tokens[i] > 0 else 1.0
        times.extend((s + arr).tolist())
        req.extend([i] * n)
        tok.extend((np.arange(n) * per).tolist())
    return (
        np.asarray(times),
        np.asarray(req, dtype=np.int64),
        np.asarray(tok),
        prompt,
        cached,
    )


def step_samples(df: pd.DataFrame, budget: int) -> StepSamples:
    """The engine's steps, recovered from every ok row's chunk arrivals.

    A continuous-batching engine gives each decoding request one token per step, so
    the chunks of all requests fall into clusters, one per step end. A step's
    interval (previous cluster → this one) is kept only when a request decoded in
    both, so it holds exactly one step and no idle time. Its work: the decoding
    requests (count, and context = prompt + tokens so far) and the requests whose
    first token it made (prompt tokens computed = prompt - cached; cached hits; one
    admission), their prompts chunked back over earlier steps within ``budget``
    tokens per step. Steps where a request resumed after missing steps (a
    preemption's recompute, of unknown size) are dropped.
    """
    times, req, tok, prompt, cached = _events(df)
    empty = StepSamples(x=np.zeros((0, len(TERMS))), y_us=np.zeros(0))
    if times.size < 3:
        return empty
    order = np.argsort(times, kind="stable")
    times, req, tok = times[order], req[order], tok[order]
    # A step is at least as long as the shortest inter-token gap of one request;
    # chunks of one step arrive much closer together than that.
    gaps = []
    for r in np.unique(req):
        t = times[req == r]
        if t.size > 1:
            gaps.append(np.diff(t))
    if not gaps:
        return empty
    itl = np.concatenate(gaps)
    itl = itl[itl > 0]
    if itl.size == 0:
        return empty
    tol = max(0.4 * float(np.percentile(itl, 10)), 50_000.0)
    cluster = np.zeros(times.size, dtype=np.int64)
    c = 0
    head = times[0]
    members: set[int] = {int(req[0])}
    for i in range(1, times.size):
        r = int(req[i])
        if times[i] - head > tol or r in members:
            c += 1
            head = times[i]
            members = set()
        members.add(r)
        cluster[i] = c
    n = c + 1
    end = np.full(n, np.inf)
    np.minimum.at(end, cluster, times)
    x = np.zeros((n, len(TERMS)))
    valid = np.zeros(n, dtype=bool)
    bad = np.zeros(n, dtype=bool)
    last_cluster: dict[int, int] = {}
    decodes = np.zeros(n)
    for i in range(times.size):
        r, k, cl = int(req[i]), tok[i], int(cluster[i])
        prev = last_cluster.get(r)
        if k == 0:
            computed = max(prompt[r] - cached[r], 1.0)
            # Chunked prefill: the prompt's first chunks ran in the steps before.
            left = computed
            j = cl
            while left > 0 and j >= 0:
                room = left if j == cl else max(budget - decodes[j], 1.0)
                part = min(left, room)
                x[j, 3] += part
                left -= part
                if left > 0:
                    j -= 1
            x[j, 4] += cached[r]
            x[j, 5] += 1.0
        else:
            x[cl, 1] += 1.0
            x[cl, 2] += prompt[r] + k
            decodes[cl] += 1.0
            if prev is not None and prev == cl - 1:
                valid[cl] = True
            elif prev is not None and prev < cl - 1:
                bad[cl] = True  # resumed after missing steps: a recompute
        last_cluster[r] = cl
    x[:, 0] = 1.0
    keep = valid & ~bad
    keep[0] = False
    y = np.diff(end, prepend=np.nan) / 1000.0
    for j, name in enumerate(TERMS):
        x[:, j] *= _TO_US.get(name, 1.0)
    return StepSamples(x=x[keep], y_us=y[keep])


def fit_steps(samples: StepSamples) -> tuple[dict[str, float], float]:
    """Terms (>= 0) that best explain the steps' durations, by scipy's bounded
    least squares with a soft-L1 loss (a late chunk or a misread cluster is an
    outlier, not a trend); and the steps' RMS relative residual."""
    from scipy.optimize import least_squares

    x, y = samples.x, samples.y_us
    if samples.steps < 2 * len(TERMS):
        raise CalibrationError(
            f"only {samples.steps} engine steps could be read off the runs' rows "
            f"(at least {2 * len(TERMS)} needed): give longer runs or more "
            "concurrency"
        )
    # Columns scaled to unit size, so one tolerance fits all terms.
    scale = np.maximum(np.abs(x).mean(axis=0), 1e-12)
    xs = x / scale
    used = np.abs(x).sum(axis=0) > 0
    start = np.zeros(len(TERMS))
    start[0] = float(np.median(y))
    y_scale = float(np.median(y))

    def residuals(p: FloatArray) -> FloatArray:
        return (xs @ p - y) / y_scale

    fit = least_squares(
        residuals,
        start,
        bounds=(np.zeros(len(TERMS)), np.full(len(TERMS), np.inf)),
        loss="soft_l1",
        f_scale=0.05,
        x_scale="jac",
    )
    p = np.where(used, fit.x, 0.0) / scale
    rel = (x @ p - y) / np.maximum(y, 1e-9)
    terms = {name: float(p[j]) for j, name in enumerate(TERMS)}
    return terms, float(np.sqrt(np.mean(rel**2)))
