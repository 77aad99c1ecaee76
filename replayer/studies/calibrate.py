"""`replayer calibrate`: the engine model's step terms fitted to live runs, and its
error bars measured on held-out runs, both through virtual-time replays of the runs'
own settings. See docs/engine-model.md ("Calibration")."""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replayer.errors import ReplayerError
from replayer.records.engine_model import (
    CacheShape,
    EngineModel,
    FitReport,
    HostFit,
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
    "host_hit_us_per_token",
)
_HOST = TERMS.index("host_hit_us_per_token")
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


class _BudgetSpent(Exception):
    """The refinement used its replays (caught where it starts)."""


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
    policy: str | None = None
    host_capacity_tokens: int | None = None


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
    # Each tier's hit rate where the rows split the hits (NaN: they do not).
    gpu_hit_rate: float = math.nan
    host_hit_rate: float = math.nan
    # The log standard error of each P50/P90 latency (``flat()``'s names), from its
    # seeded bootstrap interval: how tightly the run's requests pin it. Measured
    # runs only (empty for predictions).
    log_se: dict[str, float] = field(default_factory=dict)

    def flat(self) -> dict[str, float]:
        """``{"ttft_p90_ms": ..., "output_tok_s": ..., "hit_rate": ...}``."""
        out: dict[str, float] = {}
        for name in LATENCIES:
            values = getattr(self, name)
            for q in QUANTILES:
                out[f"{name.removesuffix('_ms')}_p{q}_ms"] = values[q]
        out["output_tok_s"] = self.output_tok_s
        out["hit_rate"] = self.hit_rate
        if math.isfinite(self.host_hit_rate):
            out["gpu_hit_rate"] = self.gpu_hit_rate
            out["host_hit_rate"] = self.host_hit_rate
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
        key["simulator"] = {} if meta.sim is None else asdict(meta.sim.settings)
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


def _samples(run: Run, metric: str) -> pd.DataFrame:
    sm = run.server_metrics
    if sm.empty:
        return sm
    return sm[sm["metric"] == metric]


def _cache_config(run: Run) -> dict[str, str]:
    rows = _samples(run, "vllm:cache_config_info")
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


def step_budget_seen(runs: Sequence[Run]) -> int | None:
    """The engine's step token budget (``max_num_batched_tokens``) read off
    ``vllm:iteration_tokens_total``: the upper edge of the highest bucket any step
    of the runs fell in, when some request had more prompt tokens to compute
    (prompt - cached) than that edge (its chunks then filled the budget, so the
    budget is at most that edge and more than the one below: vLLM's budgets, 2,048
    and 8,192 by default, are bucket edges). None: no such histogram, or no prompt
    long enough to fill a step."""
    import json

    top = 0.0
    longest = 0.0
    for run in runs:
        rows = _samples(run, "vllm:iteration_tokens_total_bucket")
        if rows.empty:
            continue
        # The last scrape's counts: every step the server made (the same server
        # before the run too, which has the same budget).
        last = rows[rows["scrape_ns"] == rows["scrape_ns"].max()]
        count: dict[float, float] = {}
        for labels, value in zip(last["labels"], last["value"], strict=True):
            le = str(json.loads(str(labels)).get("le", ""))
            if le not in ("", "+Inf"):
                count[float(le)] = count.get(float(le), 0.0) + float(value)
        edges = sorted(count.items())
        below = 0.0
        for edge, cumulative in edges:
            if cumulative > below:  # some step fell in (previous edge, edge]
                top = max(top, edge)
            below = cumulative
        ok = run.requests[run.requests["status"] == "ok"]
        computed = ok["prompt_tokens"].fillna(0) - ok["cached_tokens"].fillna(0)
        longest = max(longest, float(computed.max()) if len(computed) else 0.0)
    return int(top) if top >= 1 and longest > top else None


def running_cap_seen(runs: Sequence[Run]) -> int | None:
    """``max_num_seqs`` where the runs hit it: the most requests
    ``vllm:num_requests_running`` showed at a scrape that also had requests
    waiting while the KV cache had room (under 90 % used). None: the cap never
    bound."""
    import pandas as pd

    found: int | None = None
    for run in runs:
        frames = [
            _samples(run, name).groupby("scrape_ns")["value"].sum().rename(key)
            for name, key in (
                ("vllm:num_requests_running", "running"),
                ("vllm:num_requests_waiting", "waiting"),
                ("vllm:kv_cache_usage_perc", "usage"),
            )
        ]
        if any(f.empty for f in frames):
            continue
        joined = pd.concat(frames, axis=1).dropna()
        most = joined["running"].max()
        bound = joined[
            (joined["waiting"] > 0)
            & (joined["usage"] < 0.9)
            & (joined["running"] == most)
        ]
        if not bound.empty and most >= 1:
            found = max(found or 0, int(most))
    return found


def _vllm_default_seqs(batched: int, cpu: bool) -> tuple[tuple[str, Any], ...]:
    """vLLM's API-server default ``max_num_seqs`` for what the runs show of the
    device: its CPU build (128, beside 2,048-token steps), a GPU of 70 GiB or more
    (1,024, beside 8,192) or a smaller one (256, beside 2,048)."""
    if cpu:
        return (("vLLM's CPU-build default", 128),)
    if batched == 8192:
        return (("vLLM's default beside 8,192-token steps (a GPU of >= 70 GiB)", 1024),)
    return (("vLLM's default", 256),)


def cache_shape_of(runs: Sequence[Run], flags: ShapeFlags) -> tuple[CacheShape, str]:
    """The server's KV cache and limits: flags first, then its scraped metrics
    (``vllm:cache_config_info``), then the simulator's settings (runs against the
    built-in one); the batch limits default to vLLM's. Also says where each came
    from.

    Raises:
        CalibrationError: the KV size or block size is nowhere to be found.
    """
    metrics = _cache_config(runs[0])
    settings = None if runs[0].meta.sim is None else runs[0].meta.sim.settings
    sources: list[str] = []

    def sim(name: str) -> Any:
        """The simulator's setting ``name`` (None: not simulated)."""
        return None if settings is None else getattr(settings, name)

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
        ("simulator settings", sim("block_size")),
    )
    sim_blocks = (
        int(sim("kv_capacity_tokens")) // int(sim("block_size"))
        if _int(sim("kv_capacity_tokens")) and _int(sim("block_size"))
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
    batched = pick(
        "max_num_batched_tokens",
        flags.max_num_batched_tokens,
        ("simulator settings", sim("max_num_batched_tokens")),
        (
            "the largest engine step of vllm:iteration_tokens_total",
            step_budget_seen(runs),
        ),
        ("vLLM's default", 8192),
    )
    cpu = _int(metrics.get("cpu_kvcache_space_bytes")) is not None
    seqs = pick(
        "max_num_seqs",
        flags.max_num_seqs,
        ("simulator settings", sim("max_num_seqs")),
        ("the plateau of vllm:num_requests_running", running_cap_seen(runs)),
        *_vllm_default_seqs(batched or 0, cpu),
    )
    first = runs[0].meta.config.replay
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
        (
            "the server's /v1/models",
            None if first is None else first.max_model_len,
        ),
        ("simulator settings", sim("max_model_len")),
        ("the longest request of the runs", longest),
    )
    assert seqs is not None
    assert batched is not None
    assert model_len is not None
    if flags.policy is not None:
        policy = flags.policy
        sources.append("policy: flag")
    else:
        policy = str(sim("policy") or "vllm")
        sources.append(
            "policy: simulator settings" if sim("policy") else "policy: vLLM's default"
        )
    sm = runs[0].server_metrics
    hicache = sm[sm["metric"] == "sglang:hicache_host_total_tokens"]["value"]
    hicache_max = hicache.max() if len(hicache) else None
    host = (
        pick(
            "host_capacity_tokens",
            flags.host_capacity_tokens,
            ("sglang:hicache_host_total_tokens", hicache_max),
            ("simulator settings", sim("host_capacity_tokens")),
        )
        or 0
    )
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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Events:
    """Every chunk of every ok row (time, row, tokens before it), and the rows."""

    times: FloatArray  # run-relative ns
    req: npt.NDArray[np.int64]  # the row's index among the ok rows
    tok: FloatArray  # output tokens before this chunk's
    prompt: FloatArray  # per row: prompt tokens (the server's count if it gave one)
    cached: FloatArray  # per row: cached tokens (0 when not reported)
    gpu: FloatArray  # per row: of those, found on the GPU (all, without a split)
    host: FloatArray  # per row: loaded from the host tier (0 without a split)
    starts: FloatArray  # per row: sent, ns
    ends: FloatArray  # per row: last byte, ns


def _events(df: pd.DataFrame) -> _Events:
    ok = df[df["status"] == "ok"]
    starts = ok["start_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    ends = ok["end_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    chunks = ok["chunk_times_ns"].tolist()
    prompt = (
        ok["server_prompt_tokens"]
        .fillna(ok["prompt_tokens"])
        .to_numpy(dtype=np.float64, na_value=0.0)
    )
    cached = ok["cached_tokens"].to_numpy(dtype=np.float64, na_value=0.0)
    gpu, host = cached, np.zeros_like(cached)
    if "cached_host_tokens" in ok.columns:
        split = ok["cached_host_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
        said = ~np.isnan(split)
        host = np.where(said, split, 0.0)
        gpu = cached - host
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
    return _Events(
        times=np.asarray(times, dtype=np.float64),
        req=np.asarray(req, dtype=np.int64),
        tok=np.asarray(tok, dtype=np.float64),
        prompt=prompt,
        cached=cached,
        gpu=gpu,
        host=host,
        starts=starts,
        ends=ends,
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
    ev = _events(df)
    times, req, tok, prompt, cached = ev.times, ev.req, ev.tok, ev.prompt, ev.cached
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
    firsts: list[tuple[int, int]] = []  # (row, cluster) of each first token
    for i in range(times.size):
        r, k, cl = int(req[i]), tok[i], int(cluster[i])
        prev = last_cluster.get(r)
        if k == 0:
            firsts.append((r, cl))
        else:
            x[cl, 1] += 1.0
            x[cl, 2] += prompt[r] + k
            if prev is not None and prev == cl - 1:
                valid[cl] = True
            elif prev is not None and prev < cl - 1:
                bad[cl] = True  # resumed after missing steps: a recompute
        last_cluster[r] = cl
    # Chunked prefill: a prompt's last chunk ran in the step of its first token,
    # its earlier chunks in the steps before, each within the step's token budget
    # less its decodes and the chunks placed there already (first tokens in time
    # order: the engine serves waiting requests first come, first served), and
    # none before the request was sent. A prompt that does not fit marks its steps
    # as unreadable.
    begin = np.concatenate([[-np.inf], end[:-1]])
    for r, cl in firsts:
        left = max(prompt[r] - cached[r], 1.0)
        j = cl
        while left > 0:
            room = budget - x[j, 1] - x[j, 3]
            part = min(left, max(room, 1.0 if j == cl else 0.0))
            x[j, 3] += part
            left -= part
            if left > 0:
                if j == 0 or not begin[j - 1] >= ev.starts[r]:
                    x[j, 3] += left
                    bad[j : cl + 1] = True
                    break
                j -= 1
        # The hits of both tiers cost at admission: the step of the first chunk.
        x[j, 4] += ev.gpu[r]
        x[j, _HOST] += ev.host[r]
        x[j, 5] += 1.0
    x[:, 0] = 1.0
    keep = valid & ~bad
    keep[0] = False
    y = np.diff(end, prepend=np.nan) / 1000.0
    lone_x, lone_y = _lone_prefills(ev, cluster, end, budget)
    x = np.vstack([x[keep], lone_x])
    y = np.concatenate([y[keep], lone_y])
    for j, name in enumerate(TERMS):
        x[:, j] *= _TO_US.get(name, 1.0)
    return StepSamples(x=x, y_us=y)


def _lone_prefills(
    ev: _Events, cluster: npt.NDArray[np.int64], end: FloatArray, budget: int
) -> tuple[FloatArray, FloatArray]:
    """Steps of requests that arrived at an idle engine: sent with no other request
    in flight, their first token alone in its step, their prompt within one step's
    budget. From send to first token is then one step (and the network's share), a
    prefill with no decode: at one lane, the only steps that show the prefill terms."""
    rows_x: list[list[float]] = []
    rows_y: list[float] = []
    first = np.flatnonzero(ev.tok == 0)
    sizes = np.bincount(cluster, minlength=end.size)
    order = np.argsort(ev.starts)
    starts, ends = ev.starts[order], ev.ends[order]
    for i in first:
        r = int(ev.req[i])
        cl = int(cluster[i])
        s = ev.starts[r]
        computed = max(ev.prompt[r] - ev.cached[r], 1.0)
        if sizes[cl] != 1 or computed > budget or not math.isfinite(s):
            continue
        # Others in flight at its send: started before it and not ended by then.
        k = int(np.searchsorted(starts, s, side="left"))
        if np.any(ends[:k] > s):
            continue
        rows_x.append([1.0, 0.0, 0.0, computed, ev.gpu[r], 1.0, ev.host[r]])
        rows_y.append((end[cl] - s) / 1000.0)
    return (
        np.asarray(rows_x, dtype=np.float64).reshape(-1, len(TERMS)),
        np.asarray(rows_y, dtype=np.float64),
    )


# Steps read as lasting no time at all are chunks the client read together, not
# engine steps; past this share of a run's steps, its steps do not resolve the engine.
_COALESCED_SHARE = 0.5


def usable_steps(
    runs: Sequence[Run], samples: Sequence[StepSamples]
) -> tuple[list[StepSamples], list[str]]:
    """Each run's steps of a measurable length (finite, > 0 µs), and warnings (runs
    the self-check flagged client-limited, runs whose chunks mostly arrived
    together).

    Raises:
        CalibrationError: one line naming the runs and why, when every run was
            client-limited, or when too few steps are left to fit.
    """
    limited = [
        run
        for run in runs
        if run.meta.client_check is not None and run.meta.client_check.limited
    ]
    if limited and len(limited) == len(runs):
        why = "; ".join(
            f"{run.path}: {', '.join(run.meta.client_check.reasons) or 'limited'}"
            for run in limited
            if run.meta.client_check is not None
        )
        raise CalibrationError(
            f"every run given was flagged client-limited ({why}): their timings are "
            "the client's, not the server's; rerun with fewer lanes or --workers"
        )
    warnings = [
        f"{run.path} was flagged client-limited "
        f"({', '.join(run.meta.client_check.reasons)}): its steps are fitted, but "
        "may carry the client's delays"
        for run in limited
        if run.meta.client_check is not None
    ]
    kept: list[StepSamples] = []
    counts: list[str] = []
    for run, got in zip(runs, samples, strict=True):
        ok = np.isfinite(got.y_us) & (got.y_us > 0)
        kept.append(StepSamples(x=got.x[ok], y_us=got.y_us[ok]))
        n, used = got.steps, int(ok.sum())
        counts.append(f"{run.path}: {used:,} of {n:,} steps usable")
        if n and (n - used) / n > _COALESCED_SHARE:
            warnings.append(
                f"{run.path}: {n - used:,} of {n:,} steps read as lasting 0 us: the "
                "client read several steps' chunks at once (a loaded host, or a "
                "server faster than the client reads), so its steps are thin"
            )
    total = sum(k.steps for k in kept)
    needed = 2 * (len(TERMS) - 1)  # the host term counts only where hits loaded
    if total < needed:
        raise CalibrationError(
            f"only {total} engine steps of a measurable length could be read off the "
            f"runs' rows (at least {needed} needed; {'; '.join(counts)}): "
            "chunks that arrive together or requests of one output token show no "
            "step; give longer runs, more concurrency, or a server the client can "
            "keep up with"
        )
    return kept, warnings


def fit_steps(samples: StepSamples) -> tuple[dict[str, float], float]:
    """Terms (>= 0) that best explain the steps' durations, by scipy's bounded
    least squares with a soft-L1 loss (a late chunk or a misread cluster is an
    outlier, not a trend); and the median |relative residual| of the steps."""
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    x, y = samples.x, samples.y_us
    # The host term counts only where the runs loaded host hits.
    needed = 2 * (len(TERMS) - (0 if np.any(x[:, _HOST] > 0) else 1))
    if samples.steps < needed:
        raise CalibrationError(
            f"only {samples.steps} engine steps could be read off the runs' rows "
            f"(at least {needed} needed): give longer runs or more "
            "concurrency"
        )
    # Columns scaled to unit size, so one tolerance fits all terms.
    scale = np.maximum(np.abs(x).mean(axis=0), 1e-12)
    xs = x / scale
    used = np.abs(x).sum(axis=0) > 0
    y_scale = float(np.median(y))
    if not (math.isfinite(y_scale) and y_scale > 0):
        raise CalibrationError(
            f"the median engine step read off the runs' rows lasts {y_scale:g} us: "
            "nothing to fit a step time on"
        )
    start = np.zeros(len(TERMS))
    start[0] = y_scale

    def residuals(p: FloatArray) -> FloatArray:
        out: FloatArray = (xs @ p - y) / y_scale
        return out

    fit = least_squares(
        residuals,
        start,
        bounds=(np.zeros(len(TERMS)), np.full(len(TERMS), np.inf)),
        loss="soft_l1",
        f_scale=0.05,
        x_scale="jac",
    )
    p = np.where(used, fit.x, 0.0) / scale
    pred = x @ p
    # Relative to the model's step (> 0): a misread tiny interval stays finite.
    rel = (pred - y) / np.maximum(pred, 1e-9)
    terms = {name: float(p[j]) for j, name in enumerate(TERMS)}
    return terms, float(np.median(np.abs(rel)))


# -- replaying a live run's settings in virtual time -----------------------------


# The intervals behind ``Figures.log_se`` and ``FigureError.sampling``: 95%.
_CONFIDENCE = 0.95
_Z = NormalDist().inv_cdf(0.5 + _CONFIDENCE / 2)


def _no_metrics() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {"scrape_ns": [], "metric": [], "labels": [], "value": []}
    ).astype({"scrape_ns": "int64", "metric": str, "labels": str, "value": float})


def figures_of(df: pd.DataFrame, *, spread: bool = False) -> Figures:
    """A run's figures, by ``analysis``' own definitions (ok, measured rows).
    ``spread``: with each percentile's log standard error (``log_se``)."""
    from analysis import metrics as m
    from analysis.steady import percentile_ci
    from analysis.tiers import tier_rates

    log_se: dict[str, float] = {}

    def quantiles(name: str, values: FloatArray) -> dict[int, float]:
        out = {q: m.percentile(values, q) for q in QUANTILES}
        if spread:
            cis = percentile_ci(values, QUANTILES, confidence=_CONFIDENCE)
            for q, (_p, lo, hi) in zip(QUANTILES, cis, strict=True):
                se = math.log(hi / lo) / (2 * _Z) if lo > 0 and hi > 0 else math.nan
                log_se[f"{name.removesuffix('_ms')}_p{q}_ms"] = se
        return out

    tiers = tier_rates(df, _no_metrics())  # the rows' split only
    return Figures(
        gpu_hit_rate=math.nan if tiers is None else tiers.gpu,
        host_hit_rate=math.nan if tiers is None else tiers.host,
        ttft_ms=quantiles("ttft_ms", m.ttft_ms(df)),
        tpot_ms=quantiles("tpot_ms", m.tpot_ms(df)),
        e2e_ms=quantiles("e2e_ms", m.e2e_ms(df)),
        output_tok_s=m.throughput_tok_s(df).output,
        hit_rate=m.server_hit_rate(df),
        ok=int(m.measured_ok(df).sum()),
        log_se=log_se,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayable:
    """A live run ready to be replayed in virtual time: its trace, its settings,
    and its measured figures."""

    path: Path
    trace: Trace
    config: ReplayConfig
    measured: Figures
    settings: tuple[tuple[str, Any], ...]  # what makes two runs repeats


def replayable(run: Run) -> Replayable:
    """The run's trace (re-read, checked against the hash it had) and replay
    settings, rebuilt from its run.json.

    Raises:
        CalibrationError: the trace is gone or changed, or the settings unreadable.
    """
    from replayer.config import EndpointConfig
    from replayer.records.rundir import trace_content_hash
    from traces.errors import TraceError
    from traces.io import read_trace

    meta = run.meta
    where = run.path
    if not meta.trace.path:
        raise CalibrationError(f"{where}: run.json does not name the trace replayed")
    trace_path = Path(meta.trace.path)
    if not trace_path.exists():
        raise CalibrationError(f"{where}: its trace {trace_path} is gone")
    if meta.trace.content_hash and trace_content_hash(trace_path) != (
        meta.trace.content_hash
    ):
        raise CalibrationError(
            f"{where}: its trace {trace_path} changed since the run (content hash)"
        )
    recorded = meta.config.replay
    if recorded is None:
        raise CalibrationError(f"{where}: run.json settings: no readable config")
    try:
        trace = read_trace(trace_path, mooncake_rows=recorded.mooncake_rows)
    except TraceError as exc:
        raise CalibrationError(f"{where}: its trace: {exc}") from None
    # The run's own settings, less what ties them to one server and process: no
    # URL, key or timeouts; one process; no scrape; the context length is the
    # engine model's (the launcher fills it in virtual time).
    config = replace(
        recorded,
        endpoint=EndpointConfig(
            model=recorded.endpoint.model or meta.model,
            api=recorded.endpoint.api,
            vllm_extras=recorded.endpoint.vllm_extras,
            include_usage=recorded.endpoint.include_usage,
            session_token_header=recorded.endpoint.session_token_header,
        ),
        scrape_interval_s=0.0,
        labels=dict(meta.labels),
        workers=1,
        ray_address=None,
        ray_workers=None,
        sim_args=(),
        max_model_len=None,
        virtual=None,
    )
    prompt = config.prompt
    settings = asdict(replace(config, prompt=replace(prompt, salt="")))
    settings.pop("labels", None)
    return Replayable(
        path=run.path,
        trace=trace,
        config=config,
        measured=figures_of(run.requests, spread=True),
        settings=(
            *sorted((k, repr(v)) for k, v in settings.items()),
            ("trace", str(meta.trace.content_hash)),
        ),
    )


def predict(item: Replayable, model: EngineModel, workdir: Path) -> Figures:
    """``item`` replayed in virtual time on ``model``: its figures."""
    from analysis.load import load_run
    from replayer.launch import replay

    workdir.mkdir(parents=True, exist_ok=True)
    engine = workdir / "ENGINE.json"
    write_engine_model(engine, model)
    out = Path(tempfile.mkdtemp(prefix="virtual-", dir=workdir))
    out.rmdir()
    replay(item.trace, replace(item.config, virtual=str(engine)), out)
    return figures_of(load_run(out).requests)


# -- the fit: steps first, then the runs' own figures -----------------------------

# Figures the refinement matches (log of predicted / measured, each run): the
# middle and the tail of every latency, not the P99 of a short run (one request).
_FIT_QUANTILES = (50, 90)
_FIT_FIGURES = tuple(
    f"{n.removesuffix('_ms')}_p{q}_ms" for n in LATENCIES for q in _FIT_QUANTILES
)
_PRIOR = (
    0.1  # a term's refinement is held to ~10% of the step fit unless the runs insist
)
# A 10% miss on a figure weighs as much as a 10% move of a term; a figure its run
# pins less tightly (a P90 of 40 requests, log standard error above 10%) weighs less,
# so the refinement does not move the terms to fit a short run's noise.
_FIG_SCALE = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """``replayer calibrate``'s answer: the model and how it was found."""

    model: EngineModel
    step_terms: dict[str, float]  # the first estimate (from the steps)
    steps: int  # engine steps read off the rows
    step_residual: float  # median |relative residual| of those steps
    evaluations: int  # virtual replays the refinement ran (per training run)
    fitted: dict[str, Figures]  # run → its figures replayed on the final model
    shape_sources: str  # where each cache-shape value came from
    notes: tuple[str, ...] = ()  # terms the runs could not separate


def _model(
    terms: dict[str, float], shape: CacheShape, server: ServerInfo
) -> EngineModel:
    return EngineModel(steps=StepTerms(**terms), cache=shape, server=server)


def _log_misses(pred: Figures, meas: Figures) -> list[float]:
    a, b = pred.flat(), meas.flat()
    out = []
    for name in _FIT_FIGURES:
        if b[name] > 0 and a[name] > 0 and math.isfinite(a[name] + b[name]):
            se = meas.log_se.get(name, math.nan)
            scale = max(_FIG_SCALE, se) if math.isfinite(se) else _FIG_SCALE
            out.append(math.log(a[name] / b[name]) / scale)
        else:
            out.append(0.0)
    return out


def calibrate(
    paths: Sequence[Path],
    flags: ShapeFlags,
    *,
    refine_evals: int = 0,
    workdir: Path,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Fit the engine model to the live runs at ``paths``.

    1. The steps: every ok row's chunk arrivals give the engine's steps and their
       work (:func:`step_samples`); bounded soft-L1 least squares gives the terms.
    2. The runs: each run is replayed in virtual time with its own settings on the
       candidate terms, and scipy's least squares moves the terms (in log steps,
       held to the step fit by a 10% prior) to match the runs' P50 and P90 TTFT,
       TPOT and E2E, within ``refine_evals`` replays of each run (0: skip).

    Raises:
        CalibrationError: runs that cannot be used; too few steps to fit.
    """
    from scipy.optimize import least_squares

    say = progress or (lambda _m: None)
    # In one order whatever the order given: the budget-bound refinement follows
    # one path of finite-difference steps, and the same runs give the same model.
    runs = load_live_runs(sorted(paths, key=lambda p: str(Path(p).resolve())))
    per_tier = _per_tier(runs)
    shape, sources = cache_shape_of(runs, flags)
    if per_tier and not shape.host_capacity_tokens and _loaded_host_hits(runs):
        raise CalibrationError(
            f"{runs[0].path}: the runs loaded host-tier hits but nothing says the "
            "host tier's size: pass --host-capacity-tokens"
        )
    server = server_info(runs[0])
    samples = [step_samples(r.requests, shape.max_num_batched_tokens) for r in runs]
    samples, warnings = usable_steps(runs, samples)
    both = StepSamples(
        x=np.vstack([s.x for s in samples]),
        y_us=np.concatenate([s.y_us for s in samples]),
    )
    first, step_residual = fit_steps(both)
    unseen = _unseen(both, per_tier=per_tier)
    notes = [*warnings, *unseen]
    say(
        f"steps: {both.steps:,} read off {len(runs)} run(s); median step residual "
        f"{step_residual:.1%}"
    )
    for warning in warnings:
        say(f"warning: {warning}")
    for note in unseen:
        say(f"note: {note}")
    items = [replayable(r) for r in runs]
    free = [name for name in TERMS if first[name] > 0]
    evaluations = 0
    cache: dict[tuple[float, ...], list[Figures]] = {}

    def terms_at(theta: FloatArray) -> dict[str, float]:
        out = dict(first)
        for j, name in enumerate(free):
            out[name] = first[name] * math.exp(float(theta[j]))
        return out

    def replay_all(terms: dict[str, float]) -> list[Figures]:
        nonlocal evaluations
        key = tuple(round(terms[n], 12) for n in TERMS)
        if key not in cache:
            evaluations += 1
            model = _model(terms, shape, server)
            cache[key] = [
                predict(it, model, workdir / f"fit-{evaluations}") for it in items
            ]
        return cache[key]

    best: list[tuple[float, FloatArray]] = []  # the least cost seen, and where

    def residuals(theta: FloatArray) -> FloatArray:
        if evaluations >= refine_evals:
            raise _BudgetSpent
        figs = replay_all(terms_at(theta))
        out: list[float] = []
        for pred, it in zip(figs, items, strict=True):
            out.extend(_log_misses(pred, it.measured))
        out.extend((theta / _PRIOR).tolist())
        res = np.asarray(out, dtype=np.float64)
        cost = float(np.sum(res**2))
        if not best or cost < best[0][0]:
            best[:] = [(cost, np.array(theta, dtype=np.float64))]
        return res

    terms = dict(first)
    if refine_evals > 1 and free:
        theta0 = np.zeros(len(free))
        start_cost = float(np.sum(residuals(theta0) ** 2))
        # The budget counts every replay, the Jacobian's included (scipy's
        # max_nfev does not): when it is spent, the best point seen is kept.
        with contextlib.suppress(_BudgetSpent):
            least_squares(residuals, theta0, method="trf", diff_step=0.05)
        cost, theta = best[0]
        terms = terms_at(theta)
        say(
            f"refined on {len(items)} run(s) in {evaluations} virtual replays each: "
            f"cost {start_cost:.2f} -> {cost:.2f}"
        )
    final = replay_all(terms)
    residual = {
        name: float(
            np.sqrt(
                np.mean(
                    [
                        (p.flat()[name] / it.measured.flat()[name] - 1) ** 2
                        for p, it in zip(final, items, strict=True)
                    ]
                )
            )
        )
        for name in _FIT_FIGURES
    }
    residual["steps_median"] = step_residual
    model = EngineModel(
        steps=StepTerms(**terms),
        cache=shape,
        server=server,
        fit=FitReport(
            method=(
                "scipy.optimize.least_squares: soft-L1 on engine steps read off the "
                "rows' chunk arrivals, then on the runs' P50/P90 TTFT, TPOT and E2E "
                "replayed in virtual time (log terms, 10% prior)"
            ),
            runs=tuple(str(p) for p in paths),
            rows=sum(it.measured.ok for it in items),
            residuals=residual,
            host=_host_fit(both, terms, shape, per_tier=per_tier),
        ),
    )
    return Calibration(
        model=model,
        step_terms=first,
        steps=both.steps,
        step_residual=step_residual,
        evaluations=evaluations,
        fitted={str(it.path): f for it, f in zip(items, final, strict=True)},
        shape_sources=sources,
        notes=tuple(notes),
    )


def _per_tier(runs: Sequence[Run]) -> bool:
    """Whether the runs' rows say which hits came from the host tier.

    Raises:
        CalibrationError: some runs do and some do not (one server's runs say it
            alike: they are of different servers, or of one told differently).
    """
    said = {
        str(r.path): "cached_host_tokens" in r.requests.columns
        and bool(r.requests["cached_host_tokens"].notna().any())
        for r in runs
    }
    if len(set(said.values())) > 1:
        with_split = [p for p, v in said.items() if v]
        without = [p for p, v in said.items() if not v]
        raise CalibrationError(
            f"runs with per-tier hits ({', '.join(with_split)}) and without "
            f"({', '.join(without)}) in one calibration: calibrate each server apart"
        )
    return all(said.values())


def _loaded_host_hits(runs: Sequence[Run]) -> bool:
    return any(
        float(r.requests["cached_host_tokens"].fillna(0).sum()) > 0 for r in runs
    )


# The host tier's load, as the model counts it.
HOST_COST_MODEL = (
    "host_hit_us_per_token x prompt tokens loaded from the host tier in the step "
    "of their request's admission (= bytes per token / host-to-device bandwidth "
    "+ any per-token cost)"
)


def _host_fit(
    samples: StepSamples,
    terms: dict[str, float],
    shape: CacheShape,
    *,
    per_tier: bool,
) -> HostFit:
    """ENGINE.json's ``fit.host``: the host tier's size, the cost model, whether its
    term was fitted (and if not, why), and the residuals of the steps that loaded
    host hits."""
    x, y = samples.x, samples.y_us
    loaded = x[:, _HOST] > 0
    common: dict[str, Any] = {
        "capacity_tokens": shape.host_capacity_tokens,
        "cost_model": HOST_COST_MODEL,
        "steps_with_host_hits": int(loaded.sum()),
        "host_tokens_in_steps": float(x[loaded, _HOST].sum()),
    }
    if not per_tier:
        return HostFit(
            **common,
            fitted=False,
            reason="the runs' rows do not say which hits came from the host tier "
            "(no cached_host_tokens): host_hit_us_per_token not fitted",
        )
    if not loaded.any():
        return HostFit(
            **common,
            fitted=False,
            reason="no step read loaded host hits: host_hit_us_per_token is 0",
        )
    pred = x[loaded] @ np.asarray([terms[n] for n in TERMS], dtype=np.float64)
    rel = np.abs(pred - y[loaded]) / np.maximum(pred, 1e-9)
    return HostFit(
        **common,
        fitted=True,
        median_rel_residual=float(np.median(rel)),
        p90_rel_residual=float(np.percentile(rel, 90)),
    )


def _unseen(samples: StepSamples, *, per_tier: bool = False) -> list[str]:
    """What the steps cannot tell apart: terms whose work never occurs (fitted as
    0), and a decode batch that never changes size (its cost is in the base)."""
    x = samples.x
    notes = []
    if not per_tier:
        notes.append(
            "the runs do not say which hits came from the host tier (no per-tier "
            "usage or counters in the rows): host_hit_us_per_token is not fitted (0)"
        )
    elif not np.any(x[:, _HOST] > 0):
        notes.append(
            "no prompt token loaded from the host tier in the steps read: "
            "host_hit_us_per_token is 0"
        )
    what = {
        "prefill_us_per_token": "no prompt token computed",
        "gpu_hit_us_per_token": "no cached prompt token reported",
        "request_overhead_us": "no admission",
        "decode_us_per_context_token": "no decoding sequence",
    }
    for j, name in enumerate(TERMS):
        if name in what and not np.any(x[:, j] > 0):
            notes.append(f"{what[name]} in the steps read: {name} is 0")
    batch = np.unique(x[:, 1][x[:, 1] > 0])
    if batch.size < 2:
        notes.append(
            "every decode step ran the same number of sequences: decode_per_seq_ms "
            "cannot be told from decode_base_ms (calibrate on two concurrency levels)"
        )
    return notes


# -- error bars: held-out live runs predicted ------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureError:
    """One figure of one held-out setting: predicted against measured."""

    name: str  # e.g. "ttft_p90_ms", "output_tok_s", "hit_rate"
    predicted: float
    measured: float  # the mean over the setting's repeats
    error: float  # relative (predicted / measured - 1); hit rate: points
    # The server's own run-to-run spread over the repeats: (max - min) / mean
    # (hit rate: max - min, points); None with one run.
    spread: float | None = None
    unit: str = "relative"  # or "points"
    # A latency percentile's own sampling error, relative: the half-width of the 95%
    # interval of the repeats' mean, from each run's seeded bootstrap interval (as
    # log standard errors, combined as for a mean). None for other figures.
    sampling: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldoutSetting:
    """Held-out runs with one set of replay settings (repeats), and the figures."""

    runs: tuple[str, ...]
    label: str  # e.g. "concurrency 8"
    figures: tuple[FigureError, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": list(self.runs),
            "label": self.label,
            "figures": {
                f.name: {k: v for k, v in asdict(f).items() if k != "name"}
                for f in self.figures
            },
        }


def _label(item: Replayable) -> str:
    from replayer.config import Lanes, RateArrivals

    s = item.config.schedule
    if isinstance(s, Lanes):
        return f"concurrency {s.concurrency}"
    if isinstance(s, RateArrivals):
        return f"session rate {s.session_rate:g}/s"
    return f"timestamps x{s.speedup:g}"


def holdout(
    model: EngineModel, paths: Sequence[Path], *, workdir: Path
) -> list[HoldoutSetting]:
    """Each held-out live run replayed in virtual time on ``model`` with its own
    settings; repeats (runs of equal settings) are grouped, their measured figures
    averaged and their spread given.

    Raises:
        CalibrationError: runs that cannot be used.
    """
    runs = load_live_runs(paths)
    groups: dict[tuple[tuple[str, Any], ...], list[Replayable]] = {}
    for run in runs:
        item = replayable(run)
        groups.setdefault(item.settings, []).append(item)
    out: list[HoldoutSetting] = []
    for k, items in enumerate(groups.values()):
        pred = predict(items[0], model, workdir / f"holdout-{k}").flat()
        measured = [it.measured.flat() for it in items]
        ses = [it.measured.log_se for it in items]
        figures = []
        for name in [n for n in pred if all(n in m for m in measured)]:
            sampling = None
            if all(name in se for se in ses):
                var = sum(se[name] ** 2 for se in ses) / len(ses) ** 2
                sampling = _Z * math.sqrt(var) if math.isfinite(var) else None
            values = np.asarray([m[name] for m in measured], dtype=np.float64)
            mean = float(np.mean(values))
            points = name.endswith("hit_rate")
            if points:
                error = (pred[name] - mean) * 100
                spread = float(np.ptp(values)) * 100 if values.size > 1 else None
            else:
                error = pred[name] / mean - 1 if mean > 0 else math.nan
                spread = (
                    float(np.ptp(values)) / mean
                    if values.size > 1 and mean > 0
                    else None
                )
            figures.append(
                FigureError(
                    name=name,
                    predicted=pred[name],
                    measured=mean,
                    error=error,
                    spread=spread,
                    unit="points" if points else "relative",
                    sampling=sampling,
                )
            )
        out.append(
            HoldoutSetting(
                runs=tuple(str(it.path) for it in items),
                label=_label(items[0]),
                figures=tuple(figures),
            )
        )
    return out
