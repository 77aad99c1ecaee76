"""The AgentX validity verdict of one run and its measured window, and if it fails, why
(short tags, as AIPerf's ``submission_invalid_reasons``). Pure.
See docs/agentx.md#the-verdict-and-the-headline."""

from __future__ import annotations

import math
import re

import numpy as np
import numpy.typing as npt
import pandas as pd

from analysis import metrics as m
from analysis.results import Gates, LiveDrift, Validity, ValidityWindow
from replayer.records import FAILED_STATUSES, RunMeta

MAX_CONTEXT_OVERFLOW = 0.01  # share of sent requests rejected for their length
MIN_WINDOW_S = 900.0  # the measured window's length
# The last TTFT or ITL observation must fall this far into the window (liveness).
# AgentX's harness checked 98% up to v1.0.4 and 95% from v1.0.5 on ("sparse
# low-concurrency profile tails"); we follow its current value.
MIN_METRIC_COVERAGE = 0.95
MAX_ERROR_RATE = 0.10  # failed / (ok + failed) over the window

# How vLLM, SGLang and OpenAI word a prompt longer than the model's context.
_OVERFLOW = re.compile(
    r"context length|context window|maximum context|too long|exceeds? the max|"
    r"max_model_len|prompt is too long|input length",
    re.I,
)


def context_overflows(df: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Rows the server rejected because the prompt did not fit its context:
    an HTTP 400/413/422 whose message says so."""
    status = df["http_status"].to_numpy(dtype=float, na_value=np.nan)
    out = np.isin(status, (400, 413, 422)) & m.has_status(df, "http_error")
    rows = np.flatnonzero(out)
    if rows.size:  # the regex only on the few rejected rows, not on every message
        message = df["error_message"].iloc[rows].astype("string").fillna("")
        out[rows] = message.str.contains(_OVERFLOW).to_numpy(dtype=bool)
    return out


def block_ideal_hit_rate(df: pd.DataFrame, block_tokens: int | None) -> float:
    """The theoretical hit at the server's KV block size: a prefix cache holds whole
    blocks and always computes a prompt's last token.

    Formula: Σ floor(min(ideal_cached_tokens, P - 1) / B) * B / Σ P, with P the
    server's prompt tokens (else the sent ones) and B ``block_tokens``. Population:
    ok, measured rows. NaN without a block size.
    """
    if not block_tokens:
        return math.nan
    keep = m.measured_ok(df)
    prompt = m.server_prompt(df, keep)
    hits = m.kept_column(df, "ideal_cached_tokens", keep)  # a copy: worked in place
    np.minimum(hits, prompt - 1, out=hits)
    np.maximum(hits, 0, out=hits)
    np.divide(hits, block_tokens, out=hits)
    np.floor(hits, out=hits)
    hits *= block_tokens
    return m.hit_rate(hits, prompt)


def live_drift(df: pd.DataFrame) -> LiveDrift | None:
    """How far --live-assistant prompts drifted from the trace's, over the window.

    Formula: per request, live_drift_tokens = tokens sent - tokens the recorded
    replies would have taken; ``share`` = Σ drift / Σ (prompt_tokens - drift).
    Population: ok, measured rows with a drift. None for a run without live replies.
    """
    if "live_drift_tokens" not in df.columns:
        return None
    drift = m.column(df, "live_drift_tokens")
    keep = m.measured_ok(df) & ~np.isnan(drift)
    if not keep.any():
        return None
    d = drift[keep]
    recorded = m.kept_column(df, "prompt_tokens", keep) - d
    return LiveDrift(
        requests=int(keep.sum()),
        mean_tokens=float(d.mean()),
        p90_abs_tokens=m.percentile(np.abs(d), 90),
        share=float(d.sum() / recorded.sum()) if recorded.sum() else math.nan,
    )


def window(df: pd.DataFrame, meta: RunMeta) -> ValidityWindow:
    """The measured window, s from the run's start: it opens at ``run.json``
    ``measure_start_ns`` and closes at ``--duration`` after that (or, without one,
    at the last measured end). ``coverage`` = (last TTFT or ITL observation in it
    - its start) / its length."""
    start = meta.measure_start_ns / 1e9
    if meta.protocol is not None:
        length = meta.protocol.window_s
    elif meta.duration_limit_s is not None:  # older runs: from the run's start
        length = meta.duration_limit_s - start
    else:
        length = None
    measured = ~m.is_warmup(df) & m.has_status(df, "ok", *FAILED_STATUSES)
    ends = m.kept_column(df, "end_ns", measured)
    ends = ends[~np.isnan(ends)]
    last_end = float(ends.max()) / 1e9 if ends.size else math.nan
    if length is None:
        length = last_end - start if math.isfinite(last_end) else math.nan
    observed = _last_observation_s(df, measured)
    coverage = (observed - start) / length if length and length > 0 else math.nan
    return ValidityWindow(
        start_s=start,
        end_s=start + length,
        length_s=float(length),
        coverage=min(coverage, 1.0) if math.isfinite(coverage) else math.nan,
    )


def _last_observation_s(df: pd.DataFrame, rows: npt.NDArray[np.bool_]) -> float:
    """The latest TTFT or ITL observation among ``rows``, s from the run's start: a
    first token, or the end of an ok stream of two tokens or more (its last chunk).
    A mask, not a row copy: copying the frame costs seconds at 10M rows."""
    raw = m.plain_column(df, "output_tokens")  # compared as it is: no float copy
    tokens = raw if raw is not None else m.column(df, "output_tokens")
    streamed = (m.has_status(df, "ok") & (tokens >= 2))[rows]
    last = m.kept_column(df, "end_ns", rows)
    np.copyto(last, m.kept_column(df, "first_token_ns", rows), where=~streamed)
    return float(np.nanmax(last)) / 1e9 if np.isfinite(last).any() else math.nan


def verdict(df: pd.DataFrame, meta: RunMeta, *, block_ideal: float) -> Validity:
    """``valid``, ``invalid_reasons`` (tags) and the figures each gate judged;
    ``block_ideal`` (:func:`block_ideal_hit_rate`) rides along.

    Gates: the AgentX profile was used; the run finished (not interrupted, not
    aborted); context overflows <= 1% of sent requests (all phases); the window is
    >= 900 s; its last TTFT/ITL observation is >= 95% into it; its error rate is
    <= 10%.
    """
    win = window(df, meta)
    sent = m.has_status(df, "ok", *FAILED_STATUSES)
    overflow = float(context_overflows(df).sum() / sent.sum()) if sent.any() else 0.0
    measured = ~m.is_warmup(df)
    ok = int((m.has_status(df, "ok") & measured).sum())
    failed = int((m.has_status(df, *FAILED_STATUSES) & measured).sum())
    error_rate = failed / (ok + failed) if ok + failed else math.nan
    protocol = meta.protocol
    reasons = []
    if protocol is None or protocol.profile != "agentx":
        reasons.append("not_agentx_profile")
    if not meta.complete or meta.interrupted:
        reasons.append("run_cancelled")
    if protocol is not None and protocol.aborted:
        reasons.append("run_aborted")
    if overflow > MAX_CONTEXT_OVERFLOW:
        reasons.append("context_overflow_rate_exceeded")
    if not win.length_s >= MIN_WINDOW_S:
        reasons.append("window_too_short")
    if not win.coverage >= MIN_METRIC_COVERAGE:
        reasons.append("insufficient_metric_coverage")
    if not error_rate <= MAX_ERROR_RATE:
        reasons.append("error_rate_exceeded")
    return Validity(
        valid=not reasons,
        invalid_reasons=tuple(reasons),
        window=win,
        live_drift=live_drift(df),
        gates=Gates(
            context_overflow_rate=overflow,
            window_s=win.length_s,
            metric_coverage=win.coverage,
            error_rate=error_rate,
        ),
        block_ideal=block_ideal,
    )
