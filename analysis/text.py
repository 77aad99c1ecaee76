"""Plain-text tables of summaries (one column per run), sweeps and comparisons.
Rendering only: summaries in, a string out; the CLI prints it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from analysis.results import Validity
from analysis.summary import Summary
from replayer.records.capacity import CapacityDoc, SloCheck

Getter = Callable[[Summary], Any]


def _steady(metric: str, stat: str) -> Getter:
    """A figure of the steady-state window (``window``'s or a latency's)."""

    def get(s: Summary) -> Any:
        return (
            None
            if s.steady_state is None
            else getattr(getattr(s.steady_state, metric), stat)
        )

    return get


def _ci(metric: str) -> Getter:
    """The steady-state p90 CI of ``metric`` as "[low, high]"."""

    def cell(s: Summary) -> Any:
        if s.steady_state is None:
            return None
        lo, hi = getattr(s.steady_state, metric).ci.p90
        return f"[{fmt_value(lo, 'num')}, {fmt_value(hi, 'num')}]"

    return cell


def _check(figure: str, stat: str) -> Getter:
    """A figure of the client self-check."""

    def get(s: Summary) -> Any:
        c = s.client_check
        if c is None:
            return None
        if figure in ("pool_wait_ms", "slot_wait_ms", "connect_ms"):
            return getattr(getattr(c, figure), stat)
        return c.figure(figure).get(stat)

    return get


def _per_gpu(kind: str) -> Getter:
    def get(s: Summary) -> Any:
        per_gpu = s.throughput_tok_s.per_gpu
        return None if per_gpu is None else getattr(per_gpu, kind)

    return get


def _goodput(name: str) -> Getter:
    def get(s: Summary) -> Any:
        return None if s.goodput is None else getattr(s.goodput, name)

    return get


def fmt_value(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if kind == "text":
        return str(value)
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "int":
        return f"{int(value):,}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3g}"


ROWS: tuple[tuple[str, Getter, str], ...] = (
    ("requests", lambda s: s.counts.requests, "int"),
    ("ok", lambda s: s.counts.ok, "int"),
    ("warm-up (excluded)", lambda s: s.counts.warmup, "int"),
    ("measured ok", lambda s: s.counts.measured_ok, "int"),
    ("TTFT p50 (ms)", lambda s: s.ttft_ms.p50, "num"),
    ("TTFT p90 (ms)", lambda s: s.ttft_ms.p90, "num"),
    ("TTFT p99 (ms)", lambda s: s.ttft_ms.p99, "num"),
    ("TPOT p50 (ms)", lambda s: s.tpot_ms.p50, "num"),
    ("TPOT p90 (ms)", lambda s: s.tpot_ms.p90, "num"),
    ("ITL p50 (ms)", lambda s: s.itl_ms.p50, "num"),
    ("ITL p90 (ms)", lambda s: s.itl_ms.p90, "num"),
    ("  chunk gaps of 0 ns (coalesced)", lambda s: s.itl_coalesced_share, "pct"),
    ("ITL spread p50 (ms)", lambda s: s.itl_spread_ms.p50, "num"),
    ("ITL spread p90 (ms)", lambda s: s.itl_spread_ms.p90, "num"),
    ("E2E p50 (ms)", lambda s: s.e2e_ms.p50, "num"),
    ("E2E p90 (ms)", lambda s: s.e2e_ms.p90, "num"),
    ("TTFT from scheduled p90 (ms)", lambda s: s.queued_ttft_ms.p90, "num"),
    ("E2E from scheduled p90 (ms)", lambda s: s.queued_e2e_ms.p90, "num"),
    ("steady window start (s)", _steady("window", "start_s"), "num"),
    ("steady window end (s)", _steady("window", "end_s"), "num"),
    ("steady TTFT p90 (ms)", _steady("ttft_ms", "p90"), "num"),
    ("  95% CI", _ci("ttft_ms"), "text"),
    ("steady TTFT from sched. p90 (ms)", _steady("queued_ttft_ms", "p90"), "num"),
    ("steady TPOT p90 (ms)", _steady("tpot_ms", "p90"), "num"),
    ("  95% CI", _ci("tpot_ms"), "text"),
    ("steady E2E p90 (ms)", _steady("e2e_ms", "p90"), "num"),
    ("  95% CI", _ci("e2e_ms"), "text"),
    ("interactivity p50 (tok/s/user)", lambda s: s.interactivity_tok_s.p50, "num"),
    ("interactivity p90 (tok/s/user)", lambda s: s.interactivity_tok_s.p90, "num"),
    (
        "E2E-norm interactivity (tok/s/user)",
        lambda s: s.e2e_norm_interactivity_tok_s,
        "num",
    ),
    ("throughput input (tok/s)", lambda s: s.throughput_tok_s.input, "num"),
    ("throughput output (tok/s)", lambda s: s.throughput_tok_s.output, "num"),
    ("throughput total (tok/s)", lambda s: s.throughput_tok_s.total, "num"),
    ("output tok/s per GPU", _per_gpu("output"), "num"),
    ("total tok/s per GPU", _per_gpu("total"), "num"),
    ("goodput (fraction)", _goodput("fraction"), "pct"),
    ("goodput (req/s)", _goodput("requests_s"), "num"),
    ("dispatch lag p50 (ms)", lambda s: s.dispatch_lag_ms.p50, "num"),
    ("dispatch lag p99 (ms)", lambda s: s.dispatch_lag_ms.p99, "num"),
    ("cache hit: server", lambda s: s.cache_hit_rate.server, "pct"),
    ("cache hit: prometheus", lambda s: s.cache_hit_rate.prometheus, "pct"),
    ("cache hit: agent's provider (log)", lambda s: s.cache_hit_rate.provider, "pct"),
    ("cache hit: GPU tier", lambda s: _tier(s, "gpu"), "pct"),
    ("cache hit: host tier", lambda s: _tier(s, "host"), "pct"),
    ("cache hit: tiers' overall", lambda s: _tier(s, "overall"), "pct"),
    ("cache hit: ideal (trace)", lambda s: s.cache_hit_rate.ideal, "pct"),
    (
        "cache hit: LRU estimate",
        lambda s: (
            None if s.cache_hit_rate.lru is None else s.cache_hit_rate.lru.hit_rate
        ),
        "pct",
    ),
    (
        "requests missing ideal hit",
        lambda s: s.cache_misses.requests_with_miss,
        "int",
    ),
    (
        "TTFT p90, full hit (ms)",
        lambda s: s.cache_misses.ttft_p90_ms_full_hit,
        "num",
    ),
    (
        "TTFT p90, with miss (ms)",
        lambda s: s.cache_misses.ttft_p90_ms_with_miss,
        "num",
    ),
    ("session trees", lambda s: s.session_trees.trees, "int"),
    ("tree wall p50 (ms)", lambda s: s.session_trees.wall_ms.p50, "num"),
    ("tree wall p90 (ms)", lambda s: s.session_trees.wall_ms.p90, "num"),
    (
        "critical-path TTFT p90 (ms)",
        lambda s: s.session_trees.critical_path_ttft_ms.p90,
        "num",
    ),
    ("join wait share of wall", lambda s: s.session_trees.join_wait_share, "pct"),
    ("client: loop lag p99 (ms)", _check("loop_lag_ms", "p99"), "num"),
    ("client: loop CPU p50 (of a core)", _check("loop_cpu_share", "p50"), "pct"),
    ("pool wait p99 (slot + connect, ms)", _check("pool_wait_ms", "p99"), "num"),
    ("client: slot wait p99 (ms)", _check("slot_wait_ms", "p99"), "num"),
    ("server: connect p99 (ms)", _check("connect_ms", "p99"), "num"),
)


def _tier(s: Summary, name: str) -> float | None:
    """A per-tier hit rate of the run (None: no split in its rows or counters)."""
    return None if s.cache_tiers is None else getattr(s.cache_tiers, name)


def client_notes(summaries: Sequence[Summary]) -> list[str]:
    """One plain line per run that the client, not the server, limited; one per
    thing the server did that the self-check saw (a slow accept), said as the
    server's."""
    notes = []
    for s in summaries:
        check = s.client_check
        if check is None:
            continue
        notes += [f"{s.run.name}: {note}" for note in check.server_notes]
        if check.limited:
            notes.append(
                f"{s.run.name}: CLIENT-LIMITED: the replayer, not the server, "
                f"limited this run ({'; '.join(check.reasons)}); its "
                "latencies include the client's own delays: rerun with more "
                "--workers or --ray, or on cores the server does not use"
            )
    return notes


def _grid(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = []
    for r in [header, *body]:
        first = r[0].ljust(widths[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))
        lines.append(f"{first}  {rest}".rstrip())
    return "\n".join(lines)


def summary_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    """[label, cell per run] for each figure of :data:`ROWS` that some run has."""
    body = []
    for label, get, kind in ROWS:
        cells = [fmt_value(get(s), kind) for s in summaries]
        if all(c == "-" for c in cells) and kind != "int":
            continue
        body.append([label, *cells])
    return body


def format_summaries(summaries: Sequence[Summary]) -> str:
    """The `analyze` table: one row per figure, one column per run."""
    header = ["", *(s.run.name for s in summaries)]
    body = summary_rows(summaries)
    for status in summaries[0].counts.errors if summaries else ():
        cells = [fmt_value(s.counts.errors.get(status, 0), "int") for s in summaries]
        if any(c != "0" for c in cells):
            body.insert(2, [f"  {status}", *cells])
    notes = [f"{s.run.name}: {p}" for s in summaries for p in s.run.problems]
    notes += [
        f"{s.run.name}: incomplete run: " + (s.run.incomplete_reason or "no end time")
        for s in summaries
        if not s.run.complete
    ]
    notes += client_notes(summaries)
    notes += [
        f"{s.run.name}: virtual time on {s.run.virtual}: every figure is predicted "
        "by the engine model, not measured on a server"
        for s in summaries
        if s.run.virtual is not None
    ]
    # The verdict line is for runs of the AgentX profile; `--json` has it for all.
    notes += [
        _verdict_line(s, s.validity)
        for s in summaries
        if s.validity is not None
        and "not_agentx_profile" not in s.validity.invalid_reasons
    ]
    return "\n".join([_grid(header, body), *notes])


def _verdict_line(s: Summary, v: Validity) -> str:
    """One line: the AgentX verdict of a run, its window and its headline."""
    win = v.window
    verdict = "valid" if v.valid else "not valid (" + ", ".join(v.invalid_reasons) + ")"
    return (
        f"{s.run.name}: AgentX {verdict}; window "
        f"{fmt_value(win.start_s, 'num')}-{fmt_value(win.end_s, 'num')}"
        f" s, coverage {fmt_value(win.coverage, 'pct')}; E2E-norm "
        f"interactivity {fmt_value(s.e2e_norm_interactivity_tok_s, 'num')}"
        f" tok/s/user; prefix hit server {fmt_value(s.cache_hit_rate.server, 'pct')}"
        f" vs theoretical {fmt_value(s.cache_hit_rate.ideal, 'pct')}"
    )


_POSITION_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("requests", "requests", "int"),
    ("TTFT p50", "ttft_ms_p50", "num"),
    ("TTFT p90", "ttft_ms_p90", "num"),
    ("E2E p90", "e2e_ms_p90", "num"),
    ("prompt", "prompt_tokens_mean", "int"),
    ("hit server", "hit_rate_server", "pct"),
    ("hit ideal", "hit_rate_ideal", "pct"),
    ("hit LRU", "hit_rate_lru", "pct"),
)


def format_positions(summary: Summary) -> str:
    """The by-turn and by-subagent-depth tables of one run (latencies in ms)."""
    parts = []
    for rows, title in (
        (summary.by_turn, "turn"),
        (summary.by_depth, "subagent depth"),
    ):
        cols = [
            c
            for c in _POSITION_COLUMNS
            if any(getattr(r, c[1]) is not None for r in rows)
        ]
        if not rows:
            continue
        header = [title, *(c[0] for c in cols)]
        body = [
            [r.group, *(fmt_value(getattr(r, k), kind) for _, k, kind in cols)]
            for r in rows
        ]
        parts.append(_grid(header, body))
    return "\n\n".join(parts)


# Session trees listed under `analyze`'s per-tier table, the most requests first.
TIER_TREES_LISTED = 10


def format_tiers(summary: Summary) -> str:
    """One run's hits per tier over time (its send times in equal intervals) and
    per session tree (the ones with the most requests)."""
    t = summary.cache_tiers
    if t is None:
        return ""
    parts = []
    if t.over_time is not None and not t.over_time.empty:
        header = ["sent (s)", "requests", "GPU hit", "host hit", "overall",
                  "ideal", "GPU KV", "host KV"]  # fmt: skip
        body = [
            [f"{r.start_s:,.1f}-{r.end_s:,.1f}", fmt_value(r.requests, "int"),
             *(fmt_value(getattr(r, c), "pct") for c in
               ("gpu", "host", "overall", "ideal", "gpu_kv_usage", "host_kv_usage"))]
            for r in t.over_time.itertuples()
        ]  # fmt: skip
        parts.append(f"hits per tier over time ({t.source})\n" + _grid(header, body))
    if t.by_tree is not None and not t.by_tree.empty:
        trees = t.by_tree.sort_values("requests", ascending=False)
        header = ["session tree", "requests", "GPU hit", "host hit", "overall",
                  "ideal"]  # fmt: skip
        body = [
            [str(r.root_session_id), fmt_value(r.requests, "int"),
             *(fmt_value(getattr(r, c), "pct")
               for c in ("gpu", "host", "overall", "ideal"))]
            for r in trees.head(TIER_TREES_LISTED).itertuples()
        ]  # fmt: skip
        shown = min(len(trees), TIER_TREES_LISTED)
        parts.append(
            f"hits per tier by session tree ({shown} of {len(trees)}, the most "
            "requests first)\n" + _grid(header, body)
        )
    return "\n\n".join(parts)


def format_sweep(table: pd.DataFrame) -> str:
    """The per-level sweep table with the Pareto front marked."""
    unit = "output tok/s/GPU" if bool(table["per_gpu"].all()) else "output tok/s"
    header = ["level", "concurrency", "E2E-norm interactivity", unit,
              "TTFT p90 (ms)", "E2E p90 (ms)", "Pareto"]  # fmt: skip
    body = [
        [
            str(r.level),
            fmt_value(r.concurrency, "int"),
            fmt_value(r.interactivity_tok_s, "num"),
            fmt_value(r.throughput_tok_s, "num"),
            fmt_value(r.ttft_p90_ms, "num"),
            fmt_value(r.e2e_p90_ms, "num"),
            "*" if r.pareto else "",
        ]
        for r in table.itertuples()
    ]
    return _grid(header, body)


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The `compare` table: A, B, B - A with its 95% CI and the verdict for B."""
    header = ["figure", "A", "B", "B - A", "95% CI", "B is"]
    body = [
        [
            f"{r['metric']} {r['stat']}",
            fmt_value(r["a"], "num"),
            fmt_value(r["b"], "num"),
            fmt_value(r["delta"], "num"),
            f"[{fmt_value(r['ci_low'], 'num')}, {fmt_value(r['ci_high'], 'num')}]",
            r["verdict"],
        ]
        for r in rows
    ]
    return _grid(header, body)


def _slo_misses(checks: Sequence[SloCheck], percentile: float) -> str:
    """The SLO checks a cell missed, "ttft p90 3.97 s > 2 s", or its figures."""
    missed = [c for c in checks if not c.passed] or list(checks)
    return "; ".join(
        f"{c.metric.removesuffix('_ms')} p{percentile:g} {_seconds(c.value_ms)} "
        f"{'>' if not c.passed else '<='} {_seconds(c.target_ms)}"
        for c in missed
    )


def _seconds(ms: float) -> str:
    if not math.isfinite(ms):
        return "-"
    return f"{ms / 1000:,.2f} s" if ms >= 1000 else f"{ms:,.1f} ms"


def capacity_headline(doc: CapacityDoc) -> str | None:
    """What a capacity answer is, said first: None for a live search; for a
    virtual one, that it was predicted, and what the live check (``--confirm``)
    made of it: "predicted 7, refuted live at 7: ttft p90 3.97 s > 2 s; hit 9.0%
    live against 61.7% predicted"."""
    result = doc.result
    if result is None or result.source != "virtual":
        return None
    best = f"{result.max_level:g}"
    model = doc.search.virtual or "an engine model"
    confirm = doc.confirm
    if confirm is None:
        return (
            f"predicted {best} in virtual time on {model}: not measured "
            "(--confirm checks it live)"
        )
    pct = doc.search.percentile
    for row in confirm.levels:
        guess, live = row.predicted, row.measured
        if guess is not None and guess.passed == live.passed:
            continue
        said = "FAIL" if not live.passed else "pass"
        hit = ""
        if live.hit is not None and guess is not None and guess.hit is not None:
            hit = f"; hit {live.hit:.1%} live against {guess.hit:.1%} predicted"
        return (
            f"predicted {best}, refuted live at {row.level:g} ({said}: "
            f"{_slo_misses(live.checks, pct)}{hit}): the virtual answer does not "
            "hold; recalibrate (replayer calibrate) before trusting it"
        )
    levels = ", ".join(
        f"{row.level:g} {'pass' if row.measured.passed else 'FAIL'}"
        for row in confirm.levels
    )
    return f"predicted {best}, confirmed live ({levels})"
