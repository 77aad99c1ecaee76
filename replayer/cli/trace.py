"""`replayer trace stats|validate|convert|import|cache-curve`."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from replayer.cli.errors import errors_as_messages
from replayer.cli.output import echo_json
from replayer.cli.params import (
    BLOCK_TOKENS,
    FACTOR,
    LANES,
    MAX_RATE,
    SECONDS,
    TOKENS,
    Quantity,
    ShellArgs,
    count,
    int_list,
    mooncake_rows_option,
)

if TYPE_CHECKING:
    from traces.cache_curve import CacheCurve
    from traces.io import OutFormat
    from traces.model import Trace
    from traces.mooncake import MooncakeRows


@click.group()
def trace() -> None:
    """Inspect, validate and convert trace files (Weka/AgentX, Mooncake, native)."""


_TRACE_PATH = click.Path(exists=True, path_type=Path)


def read_warned(path: Path, mooncake_rows: MooncakeRows) -> Trace:
    """The trace at ``path``, what the reading noticed printed as warnings."""
    from traces.io import read_trace

    notes: list[str] = []
    loaded = read_trace(path, mooncake_rows=mooncake_rows, notes=notes)
    for note in notes:
        click.echo(f"warning: {note}", err=True)
    return loaded


@trace.command("stats")
@click.argument("path", type=_TRACE_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@mooncake_rows_option
def trace_stats_cmd(path: Path, as_json: bool, mooncake_rows: MooncakeRows) -> None:
    """Statistics of the trace at PATH (a file or a folder; the format is detected)."""
    from traces.stats import trace_stats

    with errors_as_messages():
        stats = trace_stats(read_warned(path, mooncake_rows))
    if as_json:
        echo_json(stats.as_dict())
        return
    click.echo(format_stats(stats.as_dict(), path))


def format_stats(d: dict[str, Any], path: Path) -> str:
    """The human-readable `trace stats` table."""
    lines = [
        f"trace            {path}  ({d['source_format']})",
        f"sessions         {d['sessions']:,}  ({d['sessions_with_subagents']:,} with "
        f"subagents, {d['subagent_sessions']:,} subagent sessions)",
        f"requests         {d['requests']:,}",
        f"input tokens     {d['total_input_tokens']:,}",
        f"output tokens    {d['total_output_tokens']:,}",
        f"ideal cache hit  {d['ideal_cache_hit_rate']:.2%}",
        f"block size       {', '.join(map(str, d['block_sizes']))} tokens "
        f"({'/'.join(d['hash_id_scopes'])} hash ids)",
        "gap parts        "
        + (
            f"known for {d['gaps_with_parts']:,} gaps: tool time "
            f"{d['tool_time_share']:.1%} of their time"
            if d["gaps_with_parts"]
            else "not known (one think gap a request)"
        ),
        "",
        f"{'per request':<22}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}",
    ]
    rows = [
        ("input tokens", "input_tokens"),
        ("output tokens", "output_tokens"),
        ("think time (s)", "think_time_s"),
    ]
    if d["gaps_with_parts"]:  # the gaps' parts, where the trace knows them
        rows += [
            ("  tool wait (s)", "tool_wait_s"),
            ("  non-tool wait (s)", "non_tool_wait_s"),
            ("    human wait (s)", "human_wait_s"),
            ("    other (s)", "other_wait_s"),
        ]
    rows.append(("requests per session", "requests_per_session"))
    for label, key in rows:
        row = d[key]
        cells = "".join(
            f"{'-':>12}" if not math.isfinite(row[k]) else f"{row[k]:>12,.1f}"
            for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{label:<22}{cells}")
    return "\n".join(lines)


@trace.command("validate")
@click.argument("path", type=_TRACE_PATH)
@mooncake_rows_option
def trace_validate_cmd(path: Path, mooncake_rows: MooncakeRows) -> None:
    """Check the trace at PATH; print every problem, one per line; exit 1 if any."""
    from traces.io import check_trace

    notes: list[str] = []
    with errors_as_messages():
        loaded, problems = check_trace(path, mooncake_rows=mooncake_rows, notes=notes)
    for note in notes:
        click.echo(f"warning: {note}", err=True)
    for problem in problems:
        click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem(s) found", err=True)
        raise SystemExit(1)
    assert loaded is not None
    click.echo(
        f"ok: {len(loaded):,} sessions, {loaded.request_count():,} requests "
        f"({loaded.source_format})"
    )


@trace.command("convert")
@click.argument("path", type=_TRACE_PATH)
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output file: .jsonl / .jsonl.gz (native) or .parquet (fast reload).",
)
@click.option(
    "--to",
    "to",
    type=click.Choice(("native", "agentic-mooncake")),  # = traces.io.OUT_FORMATS
    default="native",
    show_default=True,
    help="agentic-mooncake: Dynamo's agentic Mooncake rows (.jsonl), for "
    "`python -m dynamo.replay --trace-format agentic_mooncake`.",
)
@mooncake_rows_option
def trace_convert_cmd(
    path: Path, out: Path, to: OutFormat, mooncake_rows: MooncakeRows
) -> None:
    """Convert the trace at PATH to native JSONL, a Parquet trace store or Dynamo's
    agentic Mooncake rows."""
    from traces.io import write_trace

    with errors_as_messages():
        loaded = read_warned(path, mooncake_rows)
        write_trace(loaded, out, to=to)
    click.echo(
        f"wrote {out} ({len(loaded):,} sessions, {loaded.request_count():,} requests)"
    )
    if to == "agentic-mooncake":
        sizes = {s.block_size for s, _ in loaded.all_sessions()}
        click.echo(
            f"replay it with: python -m dynamo.replay {shlex.quote(str(out))} "
            f"--trace-format agentic_mooncake --trace-block-size {sizes.pop()}"
        )


_LOG_SOURCES = ("claude-code", "codex", "tracelab")  # = traces.importers.SOURCES
_TRACE_SOURCES = ("bailian", "burstgpt")  # public traces: traces.bailian, .burstgpt


@trace.command("import")
@click.argument("source", type=click.Choice(_LOG_SOURCES + _TRACE_SOURCES))
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output trace: .jsonl / .jsonl.gz (native) or .parquet.",
)
@click.option(
    "--block-size",
    type=BLOCK_TOKENS,
    help="Tokens per hash block [default: 64; bailian: the trace's 16].",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A local tokenizer.json: block ids from real token ids (claude-code, codex; "
    "needs the 'tokenizers' package).",
)
def trace_import_cmd(
    source: str,
    paths: tuple[str, ...],
    out: Path,
    block_size: int | None,
    tokenizer: Path | None,
) -> None:
    """Import SOURCE logs at PATHS (files, folders or globs) as an anonymized trace.

    claude-code, codex: the agents' own session logs (a live log is fine); tracelab:
    TraceLab round rows; bailian, burstgpt: those public traces (one file). The
    output holds no text, paths, tool inputs or ids from the logs.
    """
    from traces.io import write_trace

    with errors_as_messages():
        loaded, summary, notes = _import(source, paths, block_size, tokenizer)
        write_trace(loaded, out)
    click.echo(f"wrote {out}: {summary}")
    for line in notes:
        click.echo(line, err=True)


def _import(
    source: str, paths: tuple[str, ...], block_size: int | None, tokenizer: Path | None
) -> tuple[Trace, str, list[str]]:
    """(trace, one-line summary, notes for stderr) of one `trace import`."""
    if source in _LOG_SOURCES:
        from traces.importers import DEFAULT_BLOCK_SIZE, import_logs

        res = import_logs(
            source,
            paths,
            block_size=block_size or DEFAULT_BLOCK_SIZE,
            tokenizer=tokenizer,
        )
        rep = res.report
        summary = (
            f"{rep.sessions:,} sessions ({rep.subagent_sessions:,} subagent sessions), "
            f"{rep.calls:,} calls from {len(rep.files):,} files; "
            f"hash ids: {rep.hash_rule}"
        )
        return res.trace, summary, rep.summary_lines()
    if tokenizer is not None:
        raise click.UsageError(
            f"--tokenizer does not apply to {source} traces (no text)"
        )
    if len(paths) != 1:
        raise click.UsageError(
            f"{source} takes one trace file (got {len(paths)} paths)"
        )
    if source == "bailian":
        if block_size is not None:
            raise click.UsageError("bailian traces come with their own 16-token blocks")
        from traces.bailian import read_bailian

        loaded = read_bailian(paths[0])
    else:
        from traces.burstgpt import DEFAULT_BLOCK_SIZE, read_burstgpt

        loaded = read_burstgpt(paths[0], block_size=block_size or DEFAULT_BLOCK_SIZE)
    return loaded, f"{len(loaded):,} sessions, {loaded.request_count():,} requests", []


_GIB = 1 << 30
KNEE_POINTS = 0.05  # = traces.cache_curve.KNEE_POINTS (not imported at startup)


def _token_list(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[int] | None:
    if value is None:
        return None
    return int_list(value, minimum=0, example="131072,262144")


@trace.command("cache-curve")
@click.argument("path", type=_TRACE_PATH)
@click.option(
    "--concurrency",
    type=LANES,
    default=1,
    show_default=True,
    help="Live session trees, as `replayer run --concurrency`.",
)
@click.option(
    "--think-scale",
    type=FACTOR,
    default=1.0,
    show_default=True,
    help="Multiplies the trace's think gaps, as `replayer run --think-scale`.",
)
@click.option(
    "--think-cap",
    type=SECONDS,
    help="Caps each (scaled) think gap, seconds, as `replayer run --think-cap`.",
)
@click.option(
    "--tool-scale",
    type=FACTOR,
    default=1.0,
    show_default=True,
    help="Multiplies the gaps' tool time, as `replayer run --tool-scale`.",
)
@click.option(
    "--max-inflight",
    type=count(1),
    help="Cap on requests in flight, as `replayer run --max-inflight`.",
)
@click.option(
    "--budgets",
    callback=_token_list,
    help="KV budgets in tokens, comma-separated [default: 20, geometric up to "
    "where LRU stops gaining].",
)
@click.option(
    "--block-tokens",
    type=BLOCK_TOKENS,
    help="Server tokens per trace block, as `replayer run --block-tokens` "
    "[default: the trace's block size].",
)
@click.option(
    "--bytes-per-token",
    type=count(1),
    help="KV bytes per token: budgets are shown in GiB too.",
)
@click.option(
    "--server-kv-tokens",
    type=TOKENS,
    help="The server's KV size in tokens: which side of the knee it sits.",
)
@click.option(
    "--server-kv-gib",
    type=Quantity(min=0, max=MAX_RATE),
    help="The server's KV size in GiB (needs --bytes-per-token).",
)
@click.option(
    "--engine",
    metavar="ENGINE.json|sim",
    help="Also the engine model's hit at each budget (`replayer calibrate`'s "
    "ENGINE.json, or sim: the built-in simulator's): the trace replayed at "
    "--concurrency in virtual time with the KV set to the budget, where running "
    "requests pin their blocks, admission waits and preemption recomputes. One "
    "virtual replay per budget: give a few --budgets for a large trace.",
)
@click.option(
    "--sim-args",
    "sim_args",
    type=ShellArgs(),
    default="",
    help="With --engine: options that override the engine model (as `run "
    "--virtual --sim-args`; --kv-capacity-tokens is the budget's).",
)
@mooncake_rows_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def trace_cache_curve_cmd(
    path: Path,
    concurrency: int,
    think_scale: float,
    think_cap: float | None,
    tool_scale: float,
    max_inflight: int | None,
    budgets: list[int] | None,
    block_tokens: int | None,
    bytes_per_token: int | None,
    server_kv_tokens: int | None,
    server_kv_gib: float | None,
    engine: str | None,
    sim_args: tuple[str, ...],
    mooncake_rows: MooncakeRows,
    as_json: bool,
) -> None:
    """Prefix-cache hit rate against KV budget for the trace at PATH, its requests
    interleaved as a replay at --concurrency would send them (subagents beside their
    parent): LRU, Belady (the optimum) and the infinite-cache ceiling (`trace
    stats`' ideal hit), and the knee: the budget where LRU falls 5 points below the
    ceiling.

    The model assumes the requests in flight fit in the KV cache beside what is
    reused. It reports what they hold (in flight: the 90th percentile over requests
    of the prompt + output tokens in flight at each send) and flags KV sizes below
    it: there a server pins the running prompts, queues the rest, and hits less than
    this LRU. --max-inflight keeps it small."""
    from traces.cache_curve import cache_curve

    if server_kv_gib is not None:
        if server_kv_tokens is not None:
            raise click.UsageError(
                "give --server-kv-tokens or --server-kv-gib, not both"
            )
        if bytes_per_token is None:
            raise click.UsageError("--server-kv-gib needs --bytes-per-token")
        server_kv_tokens = int(server_kv_gib * _GIB // bytes_per_token)
    with errors_as_messages():
        curve = cache_curve(
            read_warned(path, mooncake_rows),
            concurrency=concurrency,
            think_scale=think_scale,
            think_cap_s=think_cap,
            budgets_tokens=budgets,
            block_tokens=block_tokens,
            server_kv_tokens=server_kv_tokens,
            max_inflight=max_inflight,
            tool_scale=tool_scale,
        )
    d = curve_dict(curve, bytes_per_token)
    if engine is not None:
        from replayer.studies.kvcurve import engine_curve

        overrides = list(sim_args)
        with errors_as_messages():
            points = engine_curve(
                path,
                engine,
                [p["tokens"] for p in d["budgets"]],
                concurrency=concurrency,
                think_scale=think_scale,
                think_cap_s=think_cap,
                tool_scale=tool_scale,
                max_inflight=max_inflight,
                block_tokens=block_tokens,
                sim_args=overrides,
            )
        d["engine"] = {"source": engine, "sim_args": shlex.join(sim_args)}
        for entry, point in zip(d["budgets"], points, strict=True):
            entry["engine_hit_rate"] = point.hit_rate
            entry["engine_preemptions"] = point.preemptions
            entry["engine_refused"] = point.refused
            if point.host_hit_rate is not None and point.hit_rate is not None:
                # The engine's host tier: its hit beside the GPU's (they sum).
                entry["engine_gpu_hit_rate"] = point.hit_rate - point.host_hit_rate
                entry["engine_host_hit_rate"] = point.host_hit_rate
    elif sim_args:
        raise click.UsageError("--sim-args override --engine's model: add --engine")
    if as_json:
        echo_json(d)
        return
    click.echo(format_curve(d, path))


def curve_dict(curve: CacheCurve, bytes_per_token: int | None) -> dict[str, Any]:
    """JSON-ready form; the keys are the `trace cache-curve --json` contract."""

    def gib(tokens: int | None) -> float | None:
        if tokens is None or bytes_per_token is None:
            return None
        return tokens * bytes_per_token / _GIB

    server = None
    if curve.server is not None and curve.server_kv_tokens is not None:
        side = curve.server_above_knee
        server = {
            "kv_tokens": curve.server_kv_tokens,
            "kv_gib": gib(curve.server_kv_tokens),
            "lru_hit_rate": curve.server.lru_hit_rate,
            "belady_hit_rate": curve.server.belady_hit_rate,
            "side": None if side is None else ("above" if side else "below"),
            "below_inflight": curve.below_inflight(curve.server_kv_tokens),
        }
    return {
        "concurrency": curve.concurrency,
        "think_scale": curve.think_scale,
        "think_cap_s": curve.think_cap_s,
        "tool_scale": curve.tool_scale,
        "max_inflight": curve.max_inflight,
        "block_tokens": curve.block_tokens,
        "bytes_per_token": bytes_per_token,
        "requests": curve.requests,
        "input_tokens": curve.input_tokens,
        "ceiling_hit_rate": curve.ceiling_hit_rate,
        "lru_unbounded_hit_rate": curve.lru_unbounded_hit_rate,
        "inflight_tokens": curve.inflight_tokens,
        "budgets": [
            {
                "tokens": p.budget_tokens,
                "gib": gib(p.budget_tokens),
                "lru_hit_rate": p.lru_hit_rate,
                "belady_hit_rate": p.belady_hit_rate,
                "below_inflight": curve.below_inflight(p.budget_tokens),
            }
            for p in curve.points
        ],
        "knee": None
        if curve.knee_tokens is None
        else {
            "tokens": curve.knee_tokens,
            "gib": gib(curve.knee_tokens),
            "points_below_ceiling": KNEE_POINTS * 100,
        },
        "server": server,
    }


def _engine_cell(hit: float | None, refused: int) -> str:
    text = "-" if hit is None else _pct(hit)
    return f"{text + ('†' if refused else ' '):>10}"


def format_curve(d: dict[str, Any], path: Path) -> str:
    """The human-readable `trace cache-curve` table."""
    with_gib = d["bytes_per_token"] is not None
    ceiling = d["ceiling_hit_rate"]
    cap = d["max_inflight"]
    inflight = d["inflight_tokens"]
    engine = d.get("engine")
    tiers = any("engine_host_hit_rate" in b for b in d["budgets"])
    lines = [
        f"trace        {path}  ({d['requests']:,} requests, concurrency "
        f"{d['concurrency']}"
        + ("" if cap is None else f", at most {cap} in flight")
        + f", think scale {d['think_scale']:g}"
        + ("" if d["tool_scale"] == 1 else f", tool scale {d['tool_scale']:g}")
        + f", {d['block_tokens']} tokens per block)",
        f"ceiling      {_pct(ceiling)}  (infinite KV = the ideal hit)",
        f"in flight    ~{inflight:,} tokens  (p90 of the prompt + output tokens in "
        "flight at a send)",
        "",
        f"{'KV tokens':>14}"
        + (f"{'GiB':>10}" if with_gib else "")
        + f"{'LRU':>9}{'Belady':>9}{'ceiling':>9}"
        + (f"{'engine':>9} " if engine else "")
        + (f"{'GPU':>8}{'host':>8}" if tiers else ""),
    ]
    for b in d["budgets"]:
        gib = f"{b['gib']:>10.2f}" if with_gib else ""
        hit = b.get("engine_hit_rate")
        lines.append(
            f"{b['tokens']:>14,}{gib}{_pct(b['lru_hit_rate']):>9}"
            f"{_pct(b['belady_hit_rate']):>9}{_pct(ceiling):>9}"
            + (_engine_cell(hit, b.get("engine_refused", 0)) if engine else "")
            + (
                f"{_pct(b.get('engine_gpu_hit_rate')):>8}"
                f"{_pct(b.get('engine_host_hit_rate')):>8}"
                if tiers
                else ""
            )
            + ("  *" if b["below_inflight"] else "")
        )
    knee = d["knee"]
    lines.append("")
    if engine:
        lines.append(
            f"engine       {engine['source']}: the engine model's hit, replayed at "
            "this concurrency in virtual time (running requests pin their blocks)"
        )
        if tiers:
            lines.append(
                "GPU, host    of the engine hit, those found on the GPU and those "
                "loaded from its host tier"
            )
        if any(b.get("engine_refused") for b in d["budgets"]):
            lines.append(
                "†            requests longer than that KV refused (HTTP 400, as the "
                "server would): the hit is over the rest"
            )
    if any(b["below_inflight"] for b in d["budgets"]):
        lines.append(
            "* below the in-flight tokens: a server pins the running prompts and "
            "queues the rest there, and hits less than this LRU model"
        )
    if knee is None:
        lines.append(
            "knee         none: LRU never comes within 5 points of the ceiling"
        )
    else:
        lines.append(
            f"knee         {_tokens(knee['tokens'], knee['gib'])}: LRU is 5 points "
            "below the ceiling there, further below with less KV"
        )
    server = d["server"]
    if server is not None:
        at = _tokens(server["kv_tokens"], server["kv_gib"])
        hits = (
            f"LRU {_pct(server['lru_hit_rate'])}, Belady "
            f"{_pct(server['belady_hit_rate'])}"
        )
        if server["side"] == "above":
            lines.append(f"server       {at}: at or above the knee ({hits})")
        elif server["side"] == "below":
            lines.append(
                f"server       {at}: below the knee ({hits}); the knee needs "
                f"{knee['tokens'] / max(server['kv_tokens'], 1):.1f}x its KV"
            )
        else:
            lines.append(f"server       {at}: {hits}")
        if server["below_inflight"]:
            lines.append(
                f"warning      the server's KV ({server['kv_tokens']:,} tokens) is "
                f"below what the requests in flight hold (~{inflight:,} tokens): it "
                "will queue them and hit less than predicted; lower the concurrency "
                "or --max-inflight, or shrink contexts with --block-tokens"
            )
    return "\n".join(lines)


def _pct(rate: float | None) -> str:
    return "-" if rate is None or not math.isfinite(rate) else f"{rate:.1%}"


def _tokens(tokens: int, gib: float | None) -> str:
    return f"{tokens:,} tokens" + (f" ({gib:.2f} GiB)" if gib is not None else "")
