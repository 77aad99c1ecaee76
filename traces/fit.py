"""Calibration: fit a :class:`GeneratorConfig` to a real trace, each size and gap as an
empirical quantile table (its KS distance is what ``bench/bench_generate.py`` reports).
Owns no I/O. See docs/traces.md#synthetic-traces."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from traces.distributions import Empirical, ks_distance
from traces.errors import TraceError
from traces.generate import GeneratorConfig
from traces.model import Session, Trace

_COMPACTION_DROP = 0.8  # a context shrinking below 80% of the previous one = compaction


def _median_int(values: Iterable[int | None], default: int) -> int:
    arr = np.array([v for v in values if v is not None], dtype=np.float64)
    return int(np.median(arr)) if arr.size else default


def _most_common(values: Iterable[str | None], default: str) -> str:
    counts = Counter(v for v in values if v)
    return counts.most_common(1)[0][0] if counts else default


def _fit(values: Iterable[float], default: float) -> Empirical:
    arr = np.fromiter(values, dtype=np.float64)
    return Empirical.fit(arr) if arr.size else Empirical(values=(default,))


def _growth(
    sessions: list[Session],
) -> tuple[list[float], list[float], list[float]]:
    """Per-turn tool results, and context sizes before/after each compaction."""
    tool: list[float] = []
    before: list[float] = []
    after: list[float] = []
    for s in sessions:
        for a, b in zip(s.requests, s.requests[1:], strict=False):
            if b.input_tokens < _COMPACTION_DROP * a.input_tokens:
                before.append(a.input_tokens)
                after.append(b.input_tokens)
            else:
                tool.append(max(0, b.input_tokens - a.input_tokens - a.output_tokens))
    return tool, before, after


def _api_time(requests: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(base_s, s_per_output_token, sigma) by least squares on (out, api_time)."""
    if len(requests) < 2:
        return 1.5, 0.02, 0.3
    out = np.array([o for o, _ in requests], dtype=np.float64)
    api = np.array([a for _, a in requests], dtype=np.float64)
    design = np.column_stack([np.ones_like(out), out])
    (base, per_token), *_ = np.linalg.lstsq(design, api, rcond=None)
    base, per_token = max(float(base), 0.05), max(float(per_token), 0.0)
    pred = base + per_token * out
    ok = api > 0
    sigma = float(np.std(np.log(api[ok] / pred[ok]))) if ok.any() else 0.3
    return base, per_token, sigma


def fit_config(trace: Trace, *, name: str = "calibrated") -> GeneratorConfig:
    """A generator config whose corpora match ``trace``'s distributions."""
    roots = list(trace.sessions)
    subs = [(root, sub) for root in roots for sub in root.subagents]
    threads = [s for s, _ in trace.all_sessions()]
    requests = [r for s in threads for r in s.requests]
    if not requests:
        raise TraceError("the trace holds no requests: nothing to fit")
    with_sub = [r for r in roots if r.subagents]
    groups = [Counter(sub.anchor_index for sub in r.subagents) for r in with_sub]
    background = [
        r for r in with_sub if any(sub.join_index is None for sub in r.subagents)
    ]
    prefix = (
        _median_int((r.system_tokens for r in roots), 0),
        _median_int((r.tool_tokens for r in roots), 0),
    )
    sub_prefix = (
        _median_int((s.session.system_tokens for _, s in subs), 0),
        (_median_int((s.session.tool_tokens for _, s in subs), 0)),
    )
    tool, before, after = _growth(threads)
    max_in = max((r.input_tokens for r in requests), default=1)
    base, per_token, sigma = _api_time(
        [(r.output_tokens, r.api_time_s) for r in requests if r.api_time_s is not None]
    )
    starts = sorted(r.start_s for r in roots if r.start_s is not None)
    rate = (
        (len(starts) - 1) / (starts[-1] - starts[0])
        if len(starts) == len(roots) and len(starts) > 1 and starts[-1] > starts[0]
        else None
    )
    return GeneratorConfig(
        name=name,
        default_sessions=len(roots),
        block_size=Counter(s.block_size for s in threads).most_common(1)[0][0],
        model=_most_common((r.model for s in roots for r in s.requests), "model"),
        subagent_model=_most_common(
            (r.model for _, sub in subs for r in sub.session.requests), "model"
        ),
        subagent_types=tuple(
            t
            for t, _ in Counter(
                s.subagent_type or "agent" for _, s in subs
            ).most_common()
        )
        or ("agent",),
        requests_per_session=_fit((r.request_count() for r in roots), 1),
        subagent_session_fraction=len(with_sub) / len(roots),
        subagent_groups_per_session=_fit((len(g) for g in groups), 1),
        agents_per_group=_fit((n for g in groups for n in g.values()), 1),
        subagent_turns=_fit((len(s.session.requests) for _, s in subs), 1),
        background_fraction=len(background) / len(with_sub) if with_sub else 0.0,
        system_tokens=prefix[0],
        tool_tokens=prefix[1],
        subagent_system_tokens=sub_prefix[0],
        subagent_tool_tokens=sub_prefix[1],
        global_prefix=any(r.hash_id_scope == "global" for r in roots),
        first_message_tokens=_fit(
            (
                max(0, r.requests[0].input_tokens - sum(prefix))
                for r in roots
                if r.requests
            ),
            0,
        ),
        subagent_first_message_tokens=_fit(
            (
                max(0, s.session.requests[0].input_tokens - sum(sub_prefix))
                for _, s in subs
                if s.session.requests
            ),
            0,
        ),
        tool_result_tokens=_fit(tool, 1000),
        compaction_threshold_tokens=_fit(before, 2 * max_in),
        compacted_tokens=_fit(after, sum(prefix) + 1),
        input_tokens=_fit((r.input_tokens for r in requests), 1),
        max_context_tokens=max_in,
        output_tokens=_fit((r.output_tokens for r in requests), 1),
        think_time_s=_fit((r.think_time_s for s in threads for r in s.requests[1:]), 0),
        api_time_base_s=base,
        api_time_s_per_output_token=per_token,
        api_time_sigma=sigma,
        session_rate_per_s=rate,
    )


def distribution_samples(trace: Trace) -> dict[str, np.ndarray]:
    """The samples calibration is judged on: every request's input and output tokens,
    and the think time of every request after a session's first (as ``trace stats``)."""
    threads = [s for s, _ in trace.all_sessions()]
    reqs = [r for s in threads for r in s.requests]
    return {
        "input_tokens": np.array([r.input_tokens for r in reqs], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens for r in reqs], dtype=np.int64),
        "think_time_s": np.array(
            [r.think_time_s for s in threads for r in s.requests[1:]], dtype=np.float64
        ),
    }


def ks_distances(real: Trace, generated: Trace) -> dict[str, float]:
    """Two-sample KS distance per :func:`distribution_samples` key."""
    a, b = distribution_samples(real), distribution_samples(generated)
    return {key: ks_distance(a[key], b[key]) for key in a}
