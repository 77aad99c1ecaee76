"""Pure metric functions on request-row DataFrames; each docstring gives its formula and
population ("measured": not ``warmup``). Latencies in ms (``_ms``), rates in tokens/s,
as vLLM/SGLang/AIPerf define them. See docs/metrics.md."""

from __future__ import annotations

import json
import math

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analysis.results import Counts, Goodput, Latency, Rates, Throughput
from analysis.slo import Slo as Slo  # apart: the command line parses SLOs early
from analysis.slo import parse_slo as parse_slo
from replayer.records import FAILED_STATUSES, STATUSES
from traces.stats import PERCENTILE_METHOD
from traces.stats import percentiles as percentiles  # the one definition

FloatArray = npt.NDArray[np.float64]
NAN = float("nan")
_NS_PER_MS = 1e6
_NS_PER_S = 1e9
# Statuses of rows that were sent and ended (an SLO can fail on them); "skipped" rows
# were never sent and "cancelled" ones were cut by the end of the run.
_ATTEMPTED = ("ok", *FAILED_STATUSES)


def percentile(values: npt.ArrayLike, q: float) -> float:
    """One percentile (q in [0, 100]) by :func:`traces.stats.percentiles`: numpy's
    linear interpolation, NaNs dropped, NaN for no data. Population: the caller's."""
    return percentiles(values, [q])[0]


def percentile_rows(x: FloatArray, q: float) -> FloatArray:
    """The q-th percentile (q in [0, 100]) of each row of ``x`` (along the last axis),
    by the same method as :func:`percentile`. For resampled matrices: no NaN
    handling (a NaN in a row gives NaN), every row non-empty."""
    out: FloatArray = np.percentile(x, q, axis=-1, method=PERCENTILE_METHOD)
    return out


def describe(values: npt.ArrayLike, *, scratch: bool = False) -> Latency:
    """Mean, p50, p90, p99 and count of ``values`` (NaNs dropped). ``scratch``:
    ``values`` is the caller's to spend (reordered in place: no copy of 28M ITL
    gaps just to find three of them)."""
    arr = np.asarray(values, dtype=np.float64)
    nan = np.isnan(arr)
    if nan.any():
        arr = arr[~nan]
        scratch = True
    mean = float(arr.mean()) if arr.size else NAN  # before any reordering
    p50, p90, p99 = percentiles(arr, [50, 90, 99], scratch=scratch)
    return Latency(mean=mean, p50=p50, p90=p90, p99=p99, count=int(arr.size))


NUMERIC_COLUMNS = (
    "agent_depth",
    "request_index",
    "scheduled_ns",
    "start_ns",
    "end_ns",
    "ttft_ns",
    "e2e_ns",
    "tpot_ns",
    "prompt_tokens",
    "server_prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "ideal_cached_tokens",
)


MEASURED_OK = "measured_ok"  # numeric_view's column of the latency population


def numeric_view(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its nullable integer columns as float64 (NaN for null),
    ``warmup`` as plain bool, and a ``measured_ok`` column (:func:`measured_ok`,
    which then reads it): converted once, so that many metrics on a 10M-row frame
    do not convert the same columns again. Same values, same populations. Plain
    numpy columns (a compact frame's, ``analysis.load.compact_column``) stay as
    they are: :func:`column` converts them as it reads them."""
    out = {
        name: (
            column(df, name)
            if name in NUMERIC_COLUMNS and not isinstance(df[name].dtype, np.dtype)
            else is_warmup(df)
            if name == "warmup"
            else df[name]
        )
        for name in df.columns
        if name != MEASURED_OK
    }
    if "status" in df.columns and "warmup" in df.columns:
        out[MEASURED_OK] = has_status(df, "ok") & ~is_warmup(df)
    return pd.DataFrame(out, index=df.index, copy=False)


def column(df: pd.DataFrame, name: str) -> FloatArray:
    """A numeric column as float64 with NaN for null (a float64 column itself, not
    a copy: callers do not write into it)."""
    series = df[name]
    if isinstance(series.dtype, np.dtype) and series.dtype.kind in "iuf":
        # No nulls but NaN: numpy's cast, without pandas' NA pass (3x faster).
        values: FloatArray = series.to_numpy().astype(np.float64, copy=False)
        return values
    return series.to_numpy(dtype=np.float64, na_value=np.nan)


def plain_column(df: pd.DataFrame, name: str) -> npt.NDArray[np.number] | None:
    """The column's numpy values when it is a plain numeric one (no nulls but NaN),
    else None (:func:`column` converts it)."""
    series = df[name]
    if isinstance(series.dtype, np.dtype) and series.dtype.kind in "iuf":
        values: npt.NDArray[np.number] = series.to_numpy()
        return values
    return None


_BLOCK = 1 << 17  # rows taken at a time: the narrow column's kept rows stay in cache


def kept_column(
    df: pd.DataFrame, name: str, keep: npt.NDArray[np.bool_], scale: float = 1.0
) -> FloatArray:
    """``column(df, name)[keep] / scale`` (no division for a scale of 1), the same
    floats: the rows are taken before the cast, a block at a time, and each block
    cast inside the division into the result, so no copy of the whole column (nor
    of its kept rows in the narrow dtype) is made on the way."""
    raw = plain_column(df, name)
    if raw is None:
        values = column(df, name)[keep]
        if scale != 1.0:
            values /= scale
        return values
    out: FloatArray = np.empty(int(np.count_nonzero(keep)), dtype=np.float64)
    at = 0
    for row in range(0, raw.size, _BLOCK):
        taken = raw[row : row + _BLOCK][keep[row : row + _BLOCK]]
        if scale == 1.0:
            out[at : at + taken.size] = taken
        else:
            part = out[at : at + taken.size]
            np.true_divide(taken, scale, out=part, dtype=np.float64)
        at += taken.size
    return out


def kept_difference(
    df: pd.DataFrame, a: str, b: str, keep: npt.NDArray[np.bool_], scale: float
) -> FloatArray:
    """``(column(df, a) - column(df, b))[keep] / scale``, the same floats (each
    column cast to float64 before the subtraction, as there), from the kept rows
    only."""
    out = kept_column(df, a, keep)
    raw_b = plain_column(df, b)
    if raw_b is None:
        out -= column(df, b)[keep]
    else:  # the other column's kept rows cast inside the subtraction, a block at a time
        at = 0
        for row in range(0, raw_b.size, _BLOCK):
            taken = raw_b[row : row + _BLOCK][keep[row : row + _BLOCK]]
            part = out[at : at + taken.size]
            np.subtract(part, taken, out=part, dtype=np.float64)
            at += taken.size
    out /= scale
    return out


def _drop_nan(v: FloatArray) -> FloatArray:
    nan = np.isnan(v)
    return v[~nan] if nan.any() else v


def is_warmup(df: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Rows started inside the warm-up window (a null flag counts as measured)."""
    return df["warmup"].fillna(False).to_numpy(dtype=bool)


def has_status(df: pd.DataFrame, *statuses: str) -> npt.NDArray[np.bool_]:
    """Rows whose ``status`` is one of ``statuses``."""
    status = df["status"]
    if isinstance(status.dtype, pd.CategoricalDtype):
        # Look the codes up in a table: isin on 10M categoricals is ~10x slower.
        lut = np.zeros(len(status.cat.categories) + 1, dtype=bool)
        idx = status.cat.categories.get_indexer(pd.Index(list(statuses)))
        lut[idx[idx >= 0]] = True
        found: npt.NDArray[np.bool_] = lut[status.array.codes]  # -1 (null): False
        return found
    return status.isin(statuses).to_numpy(dtype=bool)


def measured_ok(df: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """The latency population: ``status == "ok"`` and not warm-up (a fresh array:
    callers may narrow it in place)."""
    flag = df[MEASURED_OK] if MEASURED_OK in df.columns else None
    if flag is not None and flag.dtype == bool:  # numeric_view's, rows filtered alike
        return flag.to_numpy(dtype=bool, copy=True)  # (not after a concat with NaN)
    return has_status(df, "ok") & ~is_warmup(df)


def counts(df: pd.DataFrame) -> Counts:
    """Row counts. Population: all rows.

    ``requests`` all rows; ``ok`` rows with status ok; ``errors`` rows per non-ok
    status (every status listed, zeros included); ``warmup`` rows flagged warm-up
    (any status); ``measured_ok`` = ok and not warm-up (the latency population).
    """
    status = df["status"].astype("category")
    n_by_code = np.bincount(
        status.cat.codes.to_numpy() + 1, minlength=len(status.cat.categories) + 1
    )[1:]  # code -1 (null) dropped
    by_status = dict(zip(status.cat.categories, n_by_code.tolist(), strict=True))
    warm = is_warmup(df)
    return Counts(
        requests=len(df),
        ok=int(by_status.get("ok", 0)),
        errors={s: int(by_status.get(s, 0)) for s in STATUSES if s != "ok"},
        warmup=int(warm.sum()),
        measured_ok=int(measured_ok(df).sum()),
    )


def ttft_ms(df: pd.DataFrame) -> FloatArray:
    """Time to first token per request, ms.

    Formula: ttft_ns / 1e6, where ttft_ns = first_token_ns - start_ns (first chunk
    carrying content). Population: ok, measured rows with a TTFT.
    """
    return _drop_nan(kept_column(df, "ttft_ns", measured_ok(df), _NS_PER_MS))


def e2e_ms(df: pd.DataFrame) -> FloatArray:
    """End-to-end latency per request, ms.

    Formula: e2e_ns / 1e6 (end_ns - start_ns). Population: ok, measured rows.
    """
    return _drop_nan(kept_column(df, "e2e_ns", measured_ok(df), _NS_PER_MS))


def queued_ttft_ms(df: pd.DataFrame) -> FloatArray:
    """Queue-inclusive time to first token per request, ms: from when the session
    wanted to send, so client queueing (``--max-inflight``, a saturated client, a
    late dispatch) counts, as a user waiting on the agent would see it.

    Formula: (first_token_ns - scheduled_ns) / 1e6 = TTFT + dispatch lag.
    Population: that of :func:`ttft_ms` (ok, measured rows with a first token).
    """
    keep = measured_ok(df)
    return _drop_nan(
        kept_difference(df, "first_token_ns", "scheduled_ns", keep, _NS_PER_MS)
    )


def queued_e2e_ms(df: pd.DataFrame) -> FloatArray:
    """Queue-inclusive end-to-end latency per request, ms.

    Formula: (end_ns - scheduled_ns) / 1e6 = E2E + dispatch lag. Population: that
    of :func:`e2e_ms` (ok, measured rows).
    """
    keep = measured_ok(df)
    return _drop_nan(kept_difference(df, "end_ns", "scheduled_ns", keep, _NS_PER_MS))


def row_tpot_ms(df: pd.DataFrame) -> FloatArray:
    """Time per output token after the first of every row, ms (NaN where unknown).

    Formula: tpot_ns / 1e6; the engine fills tpot_ns with
    ``replayer.records.tpot_ns`` = (E2E - TTFT) / (output_tokens - 1), output_tokens
    = received, and leaves it null below 2 output tokens and on failed rows.
    Population: all rows, in row order (callers filter).
    """
    v: FloatArray = column(df, "tpot_ns") / _NS_PER_MS
    return v


def tpot_ms(df: pd.DataFrame) -> FloatArray:
    """Time per output token after the first, per request, ms.

    Formula: :func:`row_tpot_ms`, (E2E - TTFT) / (output_tokens - 1) / 1e6.
    Population: ok, measured rows with a TPOT (output_tokens ≥ 2).
    """
    return _drop_nan(kept_column(df, "tpot_ns", measured_ok(df), _NS_PER_MS))


def _kept_gaps(
    df: pd.DataFrame,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Chunk gaps of ok, measured rows, ns, row after row (a row with fewer than two
    chunks gives none), and where each row's gaps begin in that array."""
    return kept_gaps(pa.array(df["chunk_times_ns"]), measured_ok(df))


def kept_gaps(
    chunks: pa.Array | pa.ChunkedArray, keep: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`_kept_gaps` of the rows of an Arrow list column ``chunks`` where
    ``keep``. Works on the flat Arrow chunk values with one per-chunk mask: no
    per-chunk row ids and no copy of the list column (memory-bound on 10M rows)."""
    lengths = pc.fill_null(pc.list_value_length(chunks), 0).to_numpy()
    values = pc.list_flatten(chunks).to_numpy()  # null lists contribute nothing
    n_gaps = np.maximum(lengths[keep].astype(np.int64) - 1, 0)
    gap_start = np.cumsum(n_gaps) - n_gaps
    if values.size < 2:
        return np.zeros(0, dtype=np.int64), gap_start
    # Gap k joins values k and k+1: kept when value k is in a kept row and is not
    # its row's last (the gap would cross into the next row).
    inside = np.repeat(keep, lengths)
    ends = np.cumsum(lengths)
    inside[ends[lengths > 0] - 1] = False
    gaps = np.diff(values)[inside[:-1]]
    return gaps, gap_start


def itl_ms(df: pd.DataFrame) -> FloatArray:
    """Inter-token latencies, ms, pooled over requests (as vLLM's benchmark does).

    Formula: every gap chunk_times_ns[k+1] - chunk_times_ns[k] between consecutive
    content chunks of one request, / 1e6. Population: ok, measured rows; a row with
    fewer than two chunks contributes no gap. A chunk carrying several tokens counts
    as one gap (what a user sees).
    """
    gaps: FloatArray = _kept_gaps(df)[0] / _NS_PER_MS
    return gaps


def itl_coalesced_share(df: pd.DataFrame, itl: FloatArray | None = None) -> float:
    """Share of chunk gaps that are 0 ns: chunks that arrived in one network read
    and share its stamp. A large share means :func:`itl_ms` percentiles sit at 0
    and say little; read :func:`itl_spread_ms` beside them.

    Formula: (gaps == 0) / gaps, over the gaps of :func:`itl_ms` (``itl``: those
    gaps, when the caller has them). Population: that of :func:`itl_ms`. NaN with no
    gap.
    """
    gaps = itl_ms(df) if itl is None else itl
    return float((gaps == 0).mean()) if gaps.size else NAN


def itl_spread_ms(df: pd.DataFrame) -> FloatArray:
    """Inter-token latency with each network read's wait spread over the chunks it
    delivered, ms: honest where chunks arrive coalesced.

    Formula: for each read after a request's first (chunks sharing a stamp), (its
    stamp - the previous read's stamp) / (chunks in it), once per chunk. Chunks that
    came with the first one contribute nothing (TTFT covers them). The mean equals
    that of :func:`itl_ms` over the same span; the percentiles no longer collapse to
    0. Population: ok, measured rows.
    """
    return itl_and_spread_ms(df)[1]


def itl_and_spread_ms(df: pd.DataFrame) -> tuple[FloatArray, FloatArray]:
    """(:func:`itl_ms`, :func:`itl_spread_ms`) from one pass over the chunks. With
    no 0 ns gap every read is one chunk and both are the same array (the same
    object: callers may describe it once)."""
    return itl_and_spread(*_kept_gaps(df))


def itl_and_spread(
    gaps: npt.NDArray[np.int64], gap_start: npt.NDArray[np.int64]
) -> tuple[FloatArray, FloatArray]:
    """:func:`itl_and_spread_ms` from :func:`kept_gaps`' gaps and row starts."""
    itl: FloatArray = gaps / _NS_PER_MS
    zero = np.flatnonzero(gaps == 0)
    if zero.size == 0:
        return itl, itl
    # In gap space a read after the row's first begins at a nonzero gap (its wait)
    # and goes on over the run of 0 ns gaps after it; 0 ns gaps before the row's
    # first nonzero one are chunks of the first read (no entry). Work on the 0 ns
    # gaps only: a run of them is owned by the gap just before it.
    head = np.ones(zero.size, dtype=bool)
    head[1:] = np.diff(zero) != 1
    owner = (zero - 1)[np.flatnonzero(head)[np.cumsum(head) - 1]]
    row_first = gap_start[np.searchsorted(gap_start, zero, side="right") - 1]
    joined = owner >= row_first
    reads, extra = _runs(owner[joined])
    spread: FloatArray = itl.copy()
    spread[reads] = itl[reads] / (extra + 1)  # its wait over its chunks
    spread[zero[joined]] = spread[owner[joined]]
    if not joined.all():
        spread = np.delete(spread, zero[~joined])
    return itl, spread


def _runs(
    values: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """``np.unique(values, return_counts=True)`` of non-decreasing ``values``:
    from where each run of equal values begins, with no sort."""
    if values.size == 0:
        return values, np.zeros(0, dtype=np.intp)
    begins = np.empty(values.size, dtype=bool)
    begins[0] = True
    np.not_equal(values[1:], values[:-1], out=begins[1:])
    at = np.flatnonzero(begins)
    return values[at], np.diff(at, append=values.size)


def interactivity_tok_s(df: pd.DataFrame) -> dict[str, float]:
    """Per-user decode speed, tok/s/user: interactivity = 1 / TPOT.

    Formula: pN = 1000 / P_N(tpot_ms). Higher percentiles are the *slow* end: p90 is
    the speed that 90% of requests reach or beat (AgentX reports the P90 of the
    latency and inverts it, as for :func:`e2e_norm_interactivity_tok_s`).
    Population: that of :func:`tpot_ms`.
    """
    p50, p90 = percentiles(tpot_ms(df), [50, 90])
    return {"p50": _inverse(p50, 1000.0), "p90": _inverse(p90, 1000.0)}


def e2e_per_token_s(df: pd.DataFrame) -> FloatArray:
    """End-to-end latency per output token, per request, s.

    Formula: E2E_i / OSL_i, E2E = e2e_ns / 1e9, OSL = output_tokens received.
    Population: ok, measured rows with output_tokens ≥ 1 and an E2E.
    """
    keep = measured_ok(df)
    keep &= column(df, "output_tokens") >= 1
    v = kept_column(df, "e2e_ns", keep, _NS_PER_S)
    v /= kept_column(df, "output_tokens", keep)
    return _drop_nan(v)


def e2e_norm_interactivity_tok_s(df: pd.DataFrame) -> float:
    """AgentX headline: E2E-normalized interactivity, tok/s/user.

    Formula: 1 / P90(E2E_i / OSL_i) (:func:`e2e_per_token_s`), E2E in seconds, OSL =
    output_tokens received. Population: that of :func:`e2e_per_token_s` (ok, measured
    rows with output_tokens ≥ 1 and an E2E).
    """
    return _inverse(percentile(e2e_per_token_s(df), 90), 1.0)


def _inverse(x: float, scale: float) -> float:
    return scale / x if x > 0 and math.isfinite(x) else NAN


def measured_window_s(df: pd.DataFrame) -> float:
    """Length of the measured window, s: last end_ns - first start_ns.

    Population: ok, measured rows. NaN with no such row (or zero length).
    """
    keep = measured_ok(df)
    if not keep.any():
        return NAN
    # fmin/fmax skip NaN (null) instants; all NaN gives NaN, and NaN > x is False.
    start = _kept_extreme(df, "start_ns", keep, np.fmin)
    end = _kept_extreme(df, "end_ns", keep, np.fmax)
    return float(end - start) / _NS_PER_S if end > start else NAN


def _kept_extreme(
    df: pd.DataFrame, name: str, keep: npt.NDArray[np.bool_], ufunc: np.ufunc
) -> float:
    """``ufunc.reduce(kept_column(df, name, keep))`` (np.fmin or np.fmax; ``keep``
    not all False), the same float: a plain integer column's least or greatest
    kept value found in place and then cast (the cast keeps the order), with no
    float64 copy of its kept rows."""
    raw = plain_column(df, name)
    if raw is None or raw.dtype.kind not in "iu":
        return float(ufunc.reduce(kept_column(df, name, keep)))
    limits = np.iinfo(raw.dtype.name)
    if ufunc is np.fmin:
        return float(np.min(raw, where=keep, initial=limits.max))
    return float(np.max(raw, where=keep, initial=limits.min))


def throughput_tok_s(df: pd.DataFrame, gpus: int | None = None) -> Throughput:
    """Token throughput, tok/s: tokens / (last end - first start).

    Formula: input = Σ prompt_tokens (sent), output = Σ output_tokens (received),
    total = input + output, each over :func:`measured_window_s`; ``per_gpu`` divides
    each by ``gpus`` (present only when ``gpus`` is given). ``requests`` is the
    request rate. Population: ok, measured rows (warm-up and errored rows are
    excluded; :func:`counts` counts them).
    """
    keep = measured_ok(df)
    window = measured_window_s(df)
    tin = float(np.nansum(kept_column(df, "prompt_tokens", keep)))
    tout = float(np.nansum(kept_column(df, "output_tokens", keep)))
    return Throughput(
        input=tin / window,
        output=tout / window,
        total=(tin + tout) / window,
        requests=int(keep.sum()) / window,
        window_s=window,
        per_gpu=Rates(input=tin / window / gpus, output=tout / window / gpus,
                      total=(tin + tout) / window / gpus)
        if gpus
        else None,
    )  # fmt: skip


def goodput(df: pd.DataFrame, slo: Slo) -> Goodput:
    """Requests meeting every objective in ``slo``.

    Formula: good = ok rows with TTFT ≤ slo.ttft, TPOT ≤ slo.tpot (each row's
    :func:`row_tpot_ms`, the TPOT that :func:`tpot_ms` reports; rows with < 2 output
    tokens pass this one) and E2E ≤ slo.e2e; ``fraction`` = good / attempted;
    ``requests_s`` = good / :func:`measured_window_s`; ``output_tok_s`` = Σ
    output_tokens of good rows / the same window. Population: measured rows that were
    sent and ended (ok, http_error, timeout, client_error); a failed row is not good.
    """
    measured = ~is_warmup(df)
    attempted = measured & has_status(df, *_ATTEMPTED)
    good = measured & has_status(df, "ok")
    ttft = column(df, "ttft_ns") / _NS_PER_MS
    e2e = column(df, "e2e_ns") / _NS_PER_MS
    out = column(df, "output_tokens")
    if slo.ttft_ms is not None:
        good &= ttft <= slo.ttft_ms
    if slo.e2e_ms is not None:
        good &= e2e <= slo.e2e_ms
    if slo.tpot_ms is not None:
        good &= (out < 2) | (row_tpot_ms(df) <= slo.tpot_ms)
    n_att = int(attempted.sum())
    n_good = int(good.sum())
    window = measured_window_s(df)
    return Goodput(
        slo=slo.as_dict(),
        requests=n_good,
        attempted=n_att,
        fraction=n_good / n_att if n_att else NAN,
        requests_s=n_good / window,
        output_tok_s=float(np.nansum(out[good])) / window,
    )


def dispatch_lag_ms(df: pd.DataFrame) -> FloatArray:
    """Client dispatch lag per request, ms: how late the replayer sent it.

    Formula: (start_ns - scheduled_ns) / 1e6. Population: measured rows that were
    sent (start_ns not null, status not "skipped"), any other status.
    """
    keep = ~is_warmup(df) & ~has_status(df, "skipped")
    return _drop_nan(kept_difference(df, "start_ns", "scheduled_ns", keep, 1.0)) / (
        _NS_PER_MS
    )


def server_prompt(
    df: pd.DataFrame, keep: npt.NDArray[np.bool_] | None = None
) -> FloatArray:
    """The server's prompt length where it reported one, else the tokens we sent
    (of the rows where ``keep``, default all)."""
    if keep is None:
        server = column(df, "server_prompt_tokens")
        return np.where(np.isnan(server), column(df, "prompt_tokens"), server)
    server = kept_column(df, "server_prompt_tokens", keep)
    nan = np.isnan(server)
    if nan.all():  # none reported (a column of nulls): ours
        return kept_column(df, "prompt_tokens", keep)
    return np.where(nan, kept_column(df, "prompt_tokens", keep), server)


def hit_rate(hits: npt.ArrayLike, prompt: npt.ArrayLike) -> float:
    """A prefix-cache hit rate: every hit rate of ``analysis`` (server, ideal, LRU;
    per run and per session tree) is this ratio on its own population.

    Formula: Σ hits / Σ prompt over the rows whose ``hits`` is known (not NaN).
    Population: the rows passed (``hits[i]`` and ``prompt[i]`` are one row's). NaN
    ("unavailable", never 0) when no row knows its hits or the prompts sum to 0.
    """
    h = np.asarray(hits, dtype=np.float64)
    p = np.asarray(prompt, dtype=np.float64)
    known = ~np.isnan(h)
    if not known.all():  # else the rows as they are: no copies
        h, p = h[known], p[known]
    del known
    # nansum's sum of the NaN-zeroed copy, which is the sum itself with no NaN.
    denom = float(np.nansum(p) if np.isnan(p).any() else p.sum())
    return float(h.sum()) / denom if denom > 0 else NAN


def server_hit_rate(df: pd.DataFrame) -> float:
    """Server-reported prefix-cache hit rate.

    Formula: Σ cached_tokens / Σ prompt (the server's usage.prompt_tokens when
    reported, else prompt_tokens sent), by :func:`hit_rate`. Population: ok,
    measured rows that report cached_tokens. NaN ("unavailable") when no row reports
    it, never 0.
    """
    keep = measured_ok(df)
    return hit_rate(kept_column(df, "cached_tokens", keep), server_prompt(df, keep))


def ideal_hit_rate(df: pd.DataFrame) -> float:
    """The trace's ideal (infinite prefix cache) hit rate for the rows that ran.

    Formula: Σ ideal_cached_tokens / Σ prompt_tokens, by :func:`hit_rate`.
    Population: ok, measured rows (with an ideal_cached_tokens).
    """
    keep = measured_ok(df)
    return hit_rate(
        kept_column(df, "ideal_cached_tokens", keep),
        kept_column(df, "prompt_tokens", keep),
    )


def lru_hit_rate(df: pd.DataFrame, lru: npt.NDArray[np.float64]) -> float:
    """Estimated hit rate of an LRU prefix cache of a given size.

    Formula: Σ LRU hit tokens / Σ prompt_tokens (sent), by :func:`hit_rate`; ``lru``
    holds each row's LRU hit tokens (``analysis.cache.lru_cached_tokens``, NaN for
    rows not simulated). Population: ok, measured rows that were simulated.
    """
    keep = measured_ok(df)
    return hit_rate(lru[keep], column(df, "prompt_tokens")[keep])


PROM_CACHE_CONFIG = "vllm:cache_config_info"


def server_block_tokens(server_metrics: pd.DataFrame) -> int | None:
    """The server's KV-cache block size in tokens, from vLLM's
    ``vllm:cache_config_info{block_size=...}`` (None when not exposed)."""
    rows = server_metrics[server_metrics["metric"] == PROM_CACHE_CONFIG]
    for labels in rows["labels"].drop_duplicates():
        value = json.loads(labels).get("block_size")
        if value is not None and str(value).isdigit() and int(value) > 0:
            return int(value)
    return None


PROM_HITS = "vllm:prefix_cache_hits_total"
PROM_QUERIES = "vllm:prefix_cache_queries_total"


def counter_delta(
    server_metrics: pd.DataFrame, metric: str, since_ns: int = 0
) -> float:
    """Increase of a Prometheus counter over the run, summed over label sets.

    Formula: value at the last scrape - value at the baseline scrape, per label set,
    summed; the baseline is the last scrape at or before ``since_ns`` (else the
    first). Counter resets are not corrected. NaN when the metric was not scraped.
    """
    rows = server_metrics[server_metrics["metric"] == metric]
    if rows.empty:
        return NAN
    total = 0.0
    for _, g in rows.groupby("labels", sort=False):
        g = g.sort_values("scrape_ns")
        before = g[g["scrape_ns"] <= since_ns]
        base = before.iloc[-1] if not before.empty else g.iloc[0]
        total += float(g["value"].iloc[-1] - base["value"])
    return total


def prometheus_hit_rate(server_metrics: pd.DataFrame, since_ns: int = 0) -> float:
    """Prefix-cache hit rate from the server's own counters.

    Formula: Δ vllm:prefix_cache_hits_total / Δ vllm:prefix_cache_queries_total
    (see :func:`counter_delta`; ``since_ns`` = end of warm-up). Population: every
    request the server saw between the two scrapes. NaN when unavailable.
    """
    hits = counter_delta(server_metrics, PROM_HITS, since_ns)
    queries = counter_delta(server_metrics, PROM_QUERIES, since_ns)
    return hits / queries if queries > 0 else NAN
