"""A capacity search: the most concurrent session trees (or the highest session arrival
rate) a server holds within an SLO. A study: it wires the engine (``replay``) and
``analysis``. See docs/capacity.md#how-many-agents-does-this-server-hold."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from analysis import metrics as m
from analysis.load import load_run
from analysis.steady import COLUMNS, SloVerdict, slo_verdict
from replayer.clock import MonotonicClock
from replayer.config import Lanes, RateArrivals, ReplayConfig, public_url
from replayer.errors import ConfigError
from replayer.launch import replay, running_endpoint
from replayer.play.client import Client
from replayer.records import SimRecord
from replayer.records.capacity import (
    CacheResets,
    CapacityCell,
    CapacityDoc,
    CapacityResult,
    ClientLimit,
    Confirmation,
    ConfirmCell,
    ConfirmLevel,
    FirstFailure,
    SearchSettings,
)
from replayer.records.rundir import write_json_atomic
from replayer.runner.local import run_async
from replayer.studies.sweep import with_fresh_salt

DEFAULT_CELL_S = 60.0
SearchStatus = Literal["found", "ceiling", "budget", "interrupted", "running"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacitySearch:
    """What to search and when a cell passes.

    The search ramps up geometrically from ``start`` (times ``growth``) until a level
    fails, then bisects between the highest level that passed and the lowest that
    failed: to one session tree for concurrency, to ``rate_resolution`` (relative) for
    rates. A level of 0 passes by definition, so a failing first level is bisected down
    to 1 (or, for rates, down to ``start / 64``), and a server that cannot hold even
    that reports 0 with the reasons.

    Every cell is an ordinary run directory in the capacity folder (``capacity.json``:
    the search, its cells in the order they ran and the result, rewritten after every
    cell; ``sweep.json``: the cells by level, so ``analyze``, ``report`` and ``compare``
    read the folder as a sweep). Every cell replays with a fresh cache-bust salt, so no
    cell is served from an earlier one's cache; ``reset_cache`` also asks the server to
    drop its prefix cache between cells (vLLM's ``/reset_prefix_cache``, SGLang's
    ``/flush_cache``). Lanes and arrivals recycle the trace's trees (``loop``) for the
    cell's duration, then in-flight requests finish.

    A cell passes (``analysis.steady.slo_verdict``) when, over its steady-state window,
    the chosen percentile of each SLO metric is within its target (TTFT and E2E
    queue-inclusive: measured from when the session wanted to send), at least one
    request succeeded, and its error rate is at most ``max_error_rate``. A cell whose CI
    contains a target is "borderline" and, with ``widen_borderline``, is run again for
    twice the duration; the wider cell's verdict stands. A budget of cells or of time
    ends the search early with the best bounds found so far.

    A cell the self-check flags client-limited (``run.json`` ``client_check``: the
    replayer, not the server, set its latencies) is evidence of nothing about the
    server: neither a pass nor a server failure. It bounds the search from above like a
    failure (a higher level asks more of the client), and an answer bounded so is a
    lower bound set by the client. When the cells disagree within their own CIs (a level
    that fails and passes widened, a borderline verdict at either bound, a failure below
    a pass), the result gives the range of levels the evidence supports
    (``answer_range``) beside the one number.
    """

    slo: m.Slo
    percentile: float = 90.0  # of each SLO metric over the steady-state window
    rate: bool = False  # search the session rate (RateArrivals) instead of lanes
    start: float = 1.0  # first level (concurrency, or session trees per second)
    growth: float = 2.0  # ramp factor until a level fails
    max_level: float | None = None  # never run above this
    rate_resolution: float = 0.1  # rate bisection stops at hi / lo <= 1 + this
    max_cells: int | None = None  # budget: cells run (widened ones included)
    max_time_s: float | None = None  # budget from server ready: no cell ends after
    max_error_rate: float = 0.1  # a cell with more failed requests fails
    reset_cache: bool = False  # ask the server to drop its prefix cache per cell
    widen_borderline: bool = True  # run a borderline cell again, twice as long
    gpus: int | None = None  # for the per-GPU figure

    def __post_init__(self) -> None:
        if not 0 < self.percentile < 100:
            raise ConfigError(f"percentile must be in (0, 100), got {self.percentile}")
        if self.start <= 0 or (not self.rate and self.start != int(self.start)):
            raise ConfigError(
                f"the first level must be a positive level, got {self.start}"
            )
        if self.growth <= 1:
            raise ConfigError(f"growth must be > 1, got {self.growth}")
        if self.max_level is not None and self.max_level < self.start:
            raise ConfigError(
                f"the highest level ({self.max_level:g}) is below the first "
                f"({self.start:g})"
            )


def _name(level: float, rate: bool) -> str:
    return f"r{level:.4g}" if rate else f"c{int(level)}"


class _Search:
    """The bounds and the next level to try."""

    def __init__(self, search: CapacitySearch) -> None:
        self.s = search
        self.passed = 0.0  # highest passing level (0 passes by definition)
        self.failed: float | None = None  # lowest failing level
        self.client: float | None = None  # lowest client-limited level

    def record(self, level: float, ok: bool, *, client_limited: bool = False) -> None:
        if client_limited:
            if self.client is None or level < self.client:
                self.client = level
        elif ok:
            self.passed = max(self.passed, level)
        elif self.failed is None or level < self.failed:
            self.failed = level

    @property
    def upper(self) -> float | None:
        """The lowest level above the answer that did not pass: failed, or set by
        the client."""
        bounds = [b for b in (self.failed, self.client) if b is not None]
        return min(bounds) if bounds else None

    @property
    def client_bound(self) -> bool:
        """The answer's upper bound is a client-limited cell, not a failure."""
        return self.client is not None and self.client == self.upper

    def next_level(self) -> float | None:
        """The next level to run, or None when the bounds are as close as asked."""
        s, lo, hi = self.s, self.passed, self.upper
        if hi is None:  # still ramping
            if s.max_level is not None and lo >= s.max_level:
                return None
            nxt = max(lo * s.growth, s.start)
            if not s.rate:
                nxt = max(math.ceil(nxt), int(lo) + 1)
            return min(nxt, s.max_level) if s.max_level is not None else nxt
        if not s.rate:
            return None if hi - lo <= 1 else float((int(lo) + int(hi)) // 2)
        if lo == 0:
            return None if hi <= s.start / 64 else hi / 2
        return None if hi / lo <= 1 + s.rate_resolution else math.sqrt(lo * hi)

    @property
    def status(self) -> SearchStatus:
        if self.upper is None:
            return "ceiling" if self.next_level() is None else "running"
        return "found" if self.next_level() is None else "running"


def _cell_config(
    config: ReplayConfig, level: float, search: CapacitySearch, duration_s: float
) -> ReplayConfig:
    schedule = config.schedule
    if search.rate:
        base = (
            schedule
            if isinstance(schedule, RateArrivals)
            else RateArrivals(session_rate=level)
        )
        schedule = replace(base, session_rate=level)
    else:
        schedule = Lanes(concurrency=int(level))
    return with_fresh_salt(
        replace(config, schedule=schedule, duration_s=duration_s, loop=True)
    )


def _judge(
    run_dir: Path, search: CapacitySearch, error_rate: float | None
) -> SloVerdict:
    run = load_run(run_dir, columns=COLUMNS)
    verdict = slo_verdict(
        m.numeric_view(run.requests), search.slo, percentile=search.percentile
    )
    if error_rate is not None and error_rate > search.max_error_rate:
        verdict = replace(
            verdict,
            passed=False,
            reasons=(
                *verdict.reasons,
                f"error rate {error_rate:.1%} > {search.max_error_rate:.1%}",
            ),
        )
    return verdict


def run_capacity(
    trace_path: Path,
    config: ReplayConfig,
    search: CapacitySearch,
    out: Path,
    *,
    progress: Any = None,
    on_cell: Callable[[CapacityCell], None] | None = None,
) -> CapacityDoc:
    """Search the capacity of the server ``config`` names (the built-in simulator,
    started once, when it names none); returns ``capacity.json``'s content, which
    is also written after every cell. ``on_cell`` sees each cell as it finishes.

    Raises:
        KeyboardInterrupt: after capacity.json says "interrupted".
        ReplayerError, TraceError: as ``replay`` does (bad input, no server).
    """
    out.mkdir(parents=True, exist_ok=True)
    duration = config.duration_s or DEFAULT_CELL_S
    bounds = _Search(search)
    cells: list[CapacityCell] = []
    doc = CapacityDoc(
        search=SearchSettings(
            mode="session_rate" if search.rate else "concurrency",
            slo=search.slo.as_dict(),
            percentile=search.percentile,
            start=search.start,
            growth=search.growth,
            max_level=search.max_level,
            cell_duration_s=duration,
            max_cells=search.max_cells,
            max_time_s=search.max_time_s,
            max_error_rate=search.max_error_rate,
            reset_cache=search.reset_cache,
            widen_borderline=search.widen_borderline,
            gpus=search.gpus,
            virtual=config.virtual,
        )
    )
    stopped: str | None = None
    unsettled: list[str] = []  # virtual knee levels whose verdict moved with the window

    def save(status: SearchStatus) -> CapacityDoc:
        nonlocal doc
        result = _result(search, bounds, cells, status, stopped)
        if config.virtual is not None:
            result = replace(
                result,
                source="virtual",
                thin=result.thin or bool(unsettled),
                thin_because=(*result.thin_because, *unsettled),
            )
        doc = replace(doc, cells=tuple(cells), result=result)
        by_level = sorted(cells, key=lambda c: (c.level, c.duration_s or 0.0))
        write_json_atomic(out / "sweep.json", {"levels": [c.name for c in by_level]})
        write_json_atomic(out / "capacity.json", doc.as_dict())
        return doc

    with running_endpoint(config) as (resolved, sim):
        t0 = time.monotonic()  # the time budget counts cells, not starting the sim
        level = bounds.next_level()
        try:
            while level is not None:
                cell_s = duration
                widened_from: str | None = None
                while True:
                    if search.max_cells is not None and len(cells) >= search.max_cells:
                        stopped = f"--max-cells {search.max_cells} reached"
                    elif (
                        search.max_time_s is not None
                        and time.monotonic() - t0 + cell_s > search.max_time_s
                    ):
                        stopped = (
                            f"--max-time {search.max_time_s:g} s: the next cell "
                            f"({cell_s:g} s) would end after it"
                        )
                    if stopped:
                        return save("budget")
                    # A virtual cell starts on a fresh engine: nothing to reset.
                    if cells and search.reset_cache and resolved.virtual is None:
                        doc = replace(
                            doc, reset_cache=_reset(resolved, doc.reset_cache)
                        )
                    name = _name(level, search.rate) + ("-wide" if widened_from else "")
                    cell = _play_cell(
                        trace_path,
                        _cell_config(resolved, level, search, cell_s),
                        search,
                        out / name,
                        level=level,
                        widened_from=widened_from,
                        progress=progress,
                        sim=sim,
                    )
                    limited = cell.client_limited
                    cells.append(cell)
                    save("running")
                    if on_cell is not None:
                        on_cell(cell)
                    if not (
                        cell.borderline
                        and search.widen_borderline
                        and not widened_from
                        and not limited  # a longer run cannot free the client
                    ):
                        break
                    widened_from, cell_s = name, cell_s * 2
                bounds.record(level, cell.passed, client_limited=limited)
                level = bounds.next_level()
            if resolved.virtual is not None and bounds.status == "found":
                unsettled.extend(
                    _settle_knee(trace_path, resolved, search, bounds, cells, out, sim)
                )
        except KeyboardInterrupt:
            save("interrupted")
            raise
    return save(bounds.status)


def _settle_knee(
    trace_path: Path,
    config: ReplayConfig,
    search: CapacitySearch,
    bounds: _Search,
    cells: list[CapacityCell],
    out: Path,
    sim: SimRecord | None,
) -> list[str]:
    """A virtual search's two levels at the knee (the answer and the lowest
    failure), each replayed again on a window twice as long (seconds of virtual
    time): near the knee a cell's own steady state can need more than the cell
    had. Appends the longer cells (their verdict stands, as a widened cell's
    does); returns, for each level whose verdict moved with the window, why the
    answer is thin."""
    why: list[str] = []
    for level in (bounds.passed, bounds.failed):
        if not level:
            continue
        last = [c for c in cells if c.level == level][-1]
        if last.client_limited:
            continue
        span = 2 * (last.duration_s or DEFAULT_CELL_S)
        name = _name(level, search.rate) + "-long"
        cell = _play_cell(
            trace_path,
            _cell_config(config, level, search, span),
            search,
            out / name,
            level=level,
            widened_from=last.name,
            progress=None,
            sim=sim,
        )
        cells.append(cell)
        if cell.passed != last.passed:
            verdict = {True: "pass", False: "FAIL"}
            why.append(
                f"the virtual verdict at {_name(level, search.rate)} moves with the "
                f"window ({verdict[last.passed]} at {last.duration_s or 0:g} s, "
                f"{verdict[cell.passed]} at {span:g} s): give --duration {span:g} "
                "or more"
            )
    return why


def _play_cell(
    trace_path: Path,
    config: ReplayConfig,
    search: CapacitySearch,
    run_dir: Path,
    *,
    level: float,
    widened_from: str | None,
    progress: Any,
    sim: SimRecord | None,
) -> CapacityCell:
    """Replay one cell into ``run_dir`` and judge it: capacity.json's cell."""
    summary = replay(trace_path, config, run_dir, progress=progress, sim=sim)
    verdict = _judge(run_dir, search, summary.counts.error_rate)
    limited = summary.client_limited
    return CapacityCell(
        name=run_dir.name,
        level=level,
        duration_s=config.duration_s,
        widened_from=widened_from,
        # A client-limited cell never passes: its latencies are the replayer's;
        # "slo_pass" keeps what the SLO said.
        passed=verdict.passed and not limited,
        slo_pass=verdict.passed,
        client_limited=limited,
        client_reasons=summary.client_check.reasons
        if limited and summary.client_check is not None
        else (),
        borderline=verdict.borderline,
        requests=summary.requests,
        ok=summary.ok,
        error_rate=summary.counts.error_rate,
        window=verdict.window,
        window_requests=verdict.requests,
        checks=verdict.checks,
        reasons=verdict.reasons,
    )


def confirm_capacity(
    trace_path: Path,
    config: ReplayConfig,
    search: CapacitySearch,
    out: Path,
    doc: CapacityDoc,
    *,
    progress: Any = None,
    on_cell: Callable[[CapacityCell], None] | None = None,
) -> CapacityDoc:
    """Replay a virtual search's answer and the level above it live, against the
    server ``config`` names (the built-in simulator when none), and set the
    document's ``confirm``: each level's predicted cell beside the measured one.
    Writes capacity.json again; returns the document."""
    result = doc.result
    assert result is not None
    levels = [lv for lv in (result.max_level, result.next_level) if lv]
    predicted: dict[float, CapacityCell] = {}
    for cell in doc.cells:  # the last (widest) cell of each level
        predicted[cell.level] = cell
    duration = config.duration_s or DEFAULT_CELL_S
    rows: list[ConfirmLevel] = []
    spans: list[float] = []
    with running_endpoint(config) as (resolved, sim):
        for level in levels:
            name = "confirm-" + _name(level, search.rate)
            # Like with like: the live cell runs as long as the virtual cell whose
            # verdict stands (a widened or knee-settling one runs longer).
            guess = predicted.get(level)
            span = (guess.duration_s if guess else None) or duration
            spans.append(span)
            cell = _play_cell(
                trace_path,
                _cell_config(resolved, level, search, span),
                search,
                out / name,
                level=level,
                widened_from=None,
                progress=progress,
                sim=sim,
            )
            measured = ConfirmCell(
                name=cell.name,
                passed=cell.passed,
                client_limited=cell.client_limited,
                ok=cell.ok,
                checks=cell.checks,
                hit=_hit(out / name),
            )
            rows.append(
                ConfirmLevel(
                    level=level,
                    predicted=None
                    if guess is None
                    else ConfirmCell(
                        name=guess.name,
                        passed=guess.passed,
                        client_limited=None,
                        ok=guess.ok,
                        checks=guess.checks,
                        hit=_hit(out / guess.name),
                    ),
                    measured=measured,
                )
            )
            if on_cell is not None:
                on_cell(cell)
    doc = replace(
        doc,
        confirm=Confirmation(
            endpoint=public_url(config.endpoint.base_url),  # None: the built-in sim
            cell_duration_s=max(spans, default=duration),
            levels=tuple(rows),
            agrees=all(
                r.predicted is not None and r.predicted.passed == r.measured.passed
                for r in rows
            ),
        ),
    )
    write_json_atomic(out / "capacity.json", doc.as_dict())
    return doc


def _hit(run_dir: Path) -> float | None:
    """The server's prefix-cache hit over a run's successful measured rows."""
    cols = ("status", "warmup", "prompt_tokens", "cached_tokens")
    rows = m.numeric_view(load_run(run_dir, columns=cols).requests)
    ok = rows[rows["measured_ok"]]
    prompt = float(ok["prompt_tokens"].sum())
    cached = float(ok["cached_tokens"].fillna(0).clip(lower=0).sum())
    return None if prompt <= 0 else cached / prompt


def _reset(config: ReplayConfig, resets: CacheResets | None) -> CacheResets:
    async def reset() -> str | None:
        async with Client(config.endpoint, MonotonicClock(), limit=1) as client:
            return await client.reset_cache()

    url = run_async(reset)
    account = resets or CacheResets(url=url)
    return replace(
        account,
        url=account.url or url,
        resets=account.resets + (1 if url else 0),
        failed=account.failed + (0 if url else 1),
    )


def _result(
    search: CapacitySearch,
    bounds: _Search,
    cells: list[CapacityCell],
    status: SearchStatus,
    stopped: str | None,
) -> CapacityResult:
    best = bounds.passed
    limit = bounds.failed
    # The cells that decided the bounds (the last run at each level: a widened one).
    at: dict[float, CapacityCell] = {}
    for c in cells:
        at[c.level] = c
    failing = at.get(limit) if limit is not None else None
    server = [c for c in cells if not c.client_limited]
    first_fail = next((c for c in server if not c.passed), None)
    client = at.get(bounds.client) if bounds.client is not None else None
    value: float = best if search.rate else int(best)
    low, high, because = _answer_range(server, best)
    if not search.rate:
        low, high = int(low), int(high)
    return CapacityResult(
        status=status,
        rate=search.rate,
        max_level=value,
        per_gpu=value / search.gpus if search.gpus else None,
        next_level=limit,
        cells=len(cells),
        borderline_cells=sum(1 for c in cells if c.borderline),
        failed_because=failing.reasons if failing else (),
        first_failure=FirstFailure(name=first_fail.name, reasons=first_fail.reasons)
        if first_fail
        else None,
        stopped_because=stopped,
        client_limited_cells=tuple(c.name for c in cells if c.client_limited),
        # The answer's bound above is a client-limited cell: the server may hold
        # more; the client could not tell.
        lower_bound_by_client=bounds.client_bound,
        client_limit=ClientLimit(
            name=client.name, level=client.level, reasons=client.client_reasons
        )
        if client is not None and bounds.client_bound
        else None,
        answer_range=(low, high),
        thin=bool(because),
        thin_because=tuple(because),
    )


def _answer_range(
    cells: list[CapacityCell], best: float
) -> tuple[float, float, list[str]]:
    """The levels the cells' evidence supports as the answer (low, high), and why
    the range is wider than ``best`` (empty: it is exactly ``best``).

    A level is *solid* when the cell that decided it (the last run there: a
    widened one) is not borderline (its CI does not contain the target). Low: the
    highest level up to which every level run is a solid pass (0 if none). High:
    the highest level not a solid failure below the lowest solid failure.
    Client-limited cells are not given here: they are no evidence about the
    server.
    """
    levels: dict[float, list[CapacityCell]] = {}
    for c in cells:
        levels.setdefault(c.level, []).append(c)

    def solid(group: list[CapacityCell], ok: bool) -> bool:
        return group[-1].passed is ok and not group[-1].borderline

    low = 0.0
    for level in sorted(levels):
        if not solid(levels[level], True):
            break
        low = level
    fails = [lv for lv, g in levels.items() if solid(g, False)]
    ceiling = min(fails) if fails else math.inf
    maybe = [lv for lv, g in levels.items() if lv < ceiling and not solid(g, False)]
    high = max([best, *maybe])
    low = min(low, best)
    if low == high:
        return low, high, []
    # What the range rests on: every cell run inside it.
    because = [
        f"{c.name} {'passed' if c.passed else 'failed'}"
        + (" within its CI" if c.borderline else "")
        for c in sorted(cells, key=lambda c: (c.level, c.duration_s or 0.0))
        if low < c.level <= high
    ]
    return low, high, because
