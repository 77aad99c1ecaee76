"""Plain-text tables of summaries (one column per run), sweeps and comparisons.

Rendering only: dicts in, a string out; the CLI prints it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

Getter = Callable[[dict[str, Any]], Any]


def _get(*keys: str) -> Getter:
    def get(d: dict[str, Any]) -> Any:
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d

    return get


def _ci(metric: str) -> Getter:
    """The steady-state p90 CI of ``metric`` as "[low, high]"."""
    get = _get("steady_state", metric, "ci", "p90")

    def cell(d: dict[str, Any]) -> Any:
        ci = get(d)
        if not ci:
            return None
        return f"[{fmt_value(ci[0], 'num')}, {fmt_value(ci[1], 'num')}]"

    return cell


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
    ("requests", _get("requests"), "int"),
    ("ok", _get("ok"), "int"),
    ("warm-up (excluded)", _get("warmup"), "int"),
    ("measured ok", _get("measured_ok"), "int"),
    ("TTFT p50 (ms)", _get("ttft_ms", "p50"), "num"),
    ("TTFT p90 (ms)", _get("ttft_ms", "p90"), "num"),
    ("TTFT p99 (ms)", _get("ttft_ms", "p99"), "num"),
    ("TPOT p50 (ms)", _get("tpot_ms", "p50"), "num"),
    ("TPOT p90 (ms)", _get("tpot_ms", "p90"), "num"),
    ("ITL p50 (ms)", _get("itl_ms", "p50"), "num"),
    ("ITL p90 (ms)", _get("itl_ms", "p90"), "num"),
    ("  chunk gaps of 0 ns (coalesced)", _get("itl_coalesced_share"), "pct"),
    ("ITL spread p50 (ms)", _get("itl_spread_ms", "p50"), "num"),
    ("ITL spread p90 (ms)", _get("itl_spread_ms", "p90"), "num"),
    ("E2E p50 (ms)", _get("e2e_ms", "p50"), "num"),
    ("E2E p90 (ms)", _get("e2e_ms", "p90"), "num"),
    ("TTFT from scheduled p90 (ms)", _get("queued_ttft_ms", "p90"), "num"),
    ("E2E from scheduled p90 (ms)", _get("queued_e2e_ms", "p90"), "num"),
    ("steady window start (s)", _get("steady_state", "window", "start_s"), "num"),
    ("steady window end (s)", _get("steady_state", "window", "end_s"), "num"),
    ("steady TTFT p90 (ms)", _get("steady_state", "ttft_ms", "p90"), "num"),
    ("  95% CI", _ci("ttft_ms"), "text"),
    (
        "steady TTFT from sched. p90 (ms)",
        _get("steady_state", "queued_ttft_ms", "p90"),
        "num",
    ),
    ("steady TPOT p90 (ms)", _get("steady_state", "tpot_ms", "p90"), "num"),
    ("  95% CI", _ci("tpot_ms"), "text"),
    ("steady E2E p90 (ms)", _get("steady_state", "e2e_ms", "p90"), "num"),
    ("  95% CI", _ci("e2e_ms"), "text"),
    ("interactivity p50 (tok/s/user)", _get("interactivity_tok_s", "p50"), "num"),
    ("interactivity p90 (tok/s/user)", _get("interactivity_tok_s", "p90"), "num"),
    (
        "E2E-norm interactivity (tok/s/user)",
        _get("e2e_norm_interactivity_tok_s"),
        "num",
    ),
    ("throughput input (tok/s)", _get("throughput_tok_s", "input"), "num"),
    ("throughput output (tok/s)", _get("throughput_tok_s", "output"), "num"),
    ("throughput total (tok/s)", _get("throughput_tok_s", "total"), "num"),
    ("output tok/s per GPU", _get("throughput_tok_s", "per_gpu", "output"), "num"),
    ("total tok/s per GPU", _get("throughput_tok_s", "per_gpu", "total"), "num"),
    ("goodput (fraction)", _get("goodput", "fraction"), "pct"),
    ("goodput (req/s)", _get("goodput", "requests_s"), "num"),
    ("dispatch lag p50 (ms)", _get("dispatch_lag_ms", "p50"), "num"),
    ("dispatch lag p99 (ms)", _get("dispatch_lag_ms", "p99"), "num"),
    ("cache hit: server", _get("cache_hit_rate", "server"), "pct"),
    ("cache hit: prometheus", _get("cache_hit_rate", "prometheus"), "pct"),
    ("cache hit: agent's provider (log)", _get("cache_hit_rate", "provider"), "pct"),
    ("cache hit: ideal (trace)", _get("cache_hit_rate", "ideal"), "pct"),
    ("cache hit: LRU estimate", _get("cache_hit_rate", "lru"), "pct"),
    ("requests missing ideal hit", _get("cache_misses", "requests_with_miss"), "int"),
    ("TTFT p90, full hit (ms)", _get("cache_misses", "ttft_p90_ms_full_hit"), "num"),
    ("TTFT p90, with miss (ms)", _get("cache_misses", "ttft_p90_ms_with_miss"), "num"),
    ("session trees", _get("session_trees", "trees"), "int"),
    ("tree wall p50 (ms)", _get("session_trees", "wall_ms", "p50"), "num"),
    ("tree wall p90 (ms)", _get("session_trees", "wall_ms", "p90"), "num"),
    (
        "critical-path TTFT p90 (ms)",
        _get("session_trees", "critical_path_ttft_ms", "p90"),
        "num",
    ),
    ("join wait share of wall", _get("session_trees", "join_wait_share"), "pct"),
    ("client: loop lag p99 (ms)", _get("client_check", "loop_lag_ms", "p99"), "num"),
    (
        "client: loop CPU p50 (of a core)",
        _get("client_check", "loop_cpu_share", "p50"),
        "pct",
    ),
    (
        "pool wait p99 (slot + connect, ms)",
        _get("client_check", "pool_wait_ms", "p99"),
        "num",
    ),
    ("client: slot wait p99 (ms)", _get("client_check", "slot_wait_ms", "p99"), "num"),
    ("server: connect p99 (ms)", _get("client_check", "connect_ms", "p99"), "num"),
)


def client_notes(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """One plain line per run that the client, not the server, limited; one per
    thing the server did that the self-check saw (a slow accept), said as the
    server's."""
    notes = []
    for s in summaries:
        check = s.get("client_check") or {}
        notes += [
            f"{s['run']['name']}: {note}" for note in check.get("server_notes") or ()
        ]
        if check.get("limited"):
            notes.append(
                f"{s['run']['name']}: CLIENT-LIMITED: the replayer, not the server, "
                f"limited this run ({'; '.join(check.get('reasons', []))}); its "
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


def summary_rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """[label, cell per run] for each figure of :data:`ROWS` that some run has."""
    body = []
    for label, get, kind in ROWS:
        cells = [fmt_value(get(s), kind) for s in summaries]
        if all(c == "-" for c in cells) and kind != "int":
            continue
        body.append([label, *cells])
    return body


def format_summaries(summaries: Sequence[dict[str, Any]]) -> str:
    """The `analyze` table: one row per figure, one column per run."""
    header = ["", *(s["run"]["name"] for s in summaries)]
    body = summary_rows(summaries)
    for status in summaries[0]["errors"] if summaries else ():
        cells = [fmt_value(s["errors"].get(status, 0), "int") for s in summaries]
        if any(c != "0" for c in cells):
            body.insert(2, [f"  {status}", *cells])
    notes = [
        f"{s['run']['name']}: {p}"
        for s in summaries
        for p in s["run"].get("problems", [])
    ]
    notes += [
        f"{s['run']['name']}: incomplete run: "
        + (s["run"].get("incomplete_reason") or "no end time")
        for s in summaries
        if not s["run"].get("complete", True)
    ]
    notes += client_notes(summaries)
    # The verdict line is for runs of the AgentX profile; `--json` has it for all.
    notes += [
        _verdict_line(s)
        for s in summaries
        if "valid" in s and "not_agentx_profile" not in s.get("invalid_reasons", [])
    ]
    return "\n".join([_grid(header, body), *notes])


def _verdict_line(s: dict[str, Any]) -> str:
    """One line: the AgentX verdict of a run, its window and its headline."""
    win = s.get("window") or {}
    head = s.get("agentx") or {}
    hit = head.get("prefix_hit") or {}
    verdict = (
        "valid"
        if s["valid"]
        else "not valid (" + ", ".join(s.get("invalid_reasons", [])) + ")"
    )
    return (
        f"{s['run']['name']}: AgentX {verdict}; window "
        f"{fmt_value(win.get('start_s'), 'num')}-{fmt_value(win.get('end_s'), 'num')}"
        f" s, coverage {fmt_value(win.get('coverage'), 'pct')}; E2E-norm "
        f"interactivity {fmt_value(head.get('e2e_norm_interactivity_tok_s'), 'num')}"
        f" tok/s/user; prefix hit server {fmt_value(hit.get('server'), 'pct')} vs "
        f"theoretical {fmt_value(hit.get('theoretical'), 'pct')}"
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


def format_positions(summary: dict[str, Any]) -> str:
    """The by-turn and by-subagent-depth tables of one run (latencies in ms)."""
    parts = []
    for key, title in (("by_turn", "turn"), ("by_depth", "subagent depth")):
        rows = summary.get(key) or []
        cols = [c for c in _POSITION_COLUMNS if any(c[1] in r for r in rows)]
        if not rows:
            continue
        header = [title, *(c[0] for c in cols)]
        body = [
            [str(r["group"]), *(fmt_value(r.get(k), kind) for _, k, kind in cols)]
            for r in rows
        ]
        parts.append(_grid(header, body))
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
