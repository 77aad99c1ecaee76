"""What a run has done so far: the counters (one event loop, no locks), the live
status line on stderr, and the :class:`ReplayOutcome` a finished replay returns."""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replayer.clock import Clock
from replayer.records import (
    ClientCheck,
    RequestStatus,
    RunCounts,
    SteadyWindow,
    steady_window,
)
from replayer.records.parts import read_request_parts
from traces.stats import percentiles

_RECENT_TTFTS = 5000  # the status line's P90 is over the latest requests: bounded


@dataclass(slots=True)
class RunCounters:
    """Counts and load of one process's run; mutated on its event loop only."""

    inflight: int = 0  # requests sent and not yet ended
    lanes: int = 0  # live session trees
    by_status: dict[str, int] = field(default_factory=dict)  # rows put, per status
    not_streamed: int = 0  # ok rows whose server ignored "stream": true
    short_output: int = 0  # ok rows with fewer output tokens than max_tokens
    output_tokens: int = 0  # received, ok rows
    session_tokens_echoed: int = 0  # requests that echoed a --session-token-header
    recent_ttfts_ns: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=_RECENT_TTFTS)
    )
    # Each sent request's wait for a pooled connection ...
    pool_waits_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    # ... and its two parts, where the client measures them (same order, both
    # arrays or neither): queued for a slot (the self-check's P99: the client's
    # own cap) and connecting (the server's accept: reported, never flagged).
    slot_waits_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    connects_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    # ... and how late it was sent: start_ns - scheduled_ns (same order).
    dispatch_lags_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    # ... and two of its parts, where the session stamps them (same order, both or
    # neither): the wake-up's lateness (the loop) and building the prompt (with its
    # wait for the build thread).
    wake_lags_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    build_waits_ns: array.array[int] = field(default_factory=lambda: array.array("q"))
    client_limit: str | None = None  # the self-check's latest reason, if any

    def count(self, status: RequestStatus) -> None:
        """One row recorded with ``status``."""
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """What a worker reports to its supervisor (plain values: pickled or sent
        over Ray)."""
        return {
            "inflight": self.inflight,
            "lanes": self.lanes,
            "by_status": dict(self.by_status),
            "output_tokens": self.output_tokens,
            "ttfts_ns": list(self.recent_ttfts_ns)[-500:],
            "client_limit": self.client_limit,
        }

    @classmethod
    def merged(cls, snapshots: dict[int, dict[str, Any]]) -> RunCounters:
        """Workers' latest snapshots as one (the status line of the whole run)."""
        total = cls()
        for k, s in sorted(snapshots.items()):
            total.inflight += s["inflight"]
            total.lanes += s["lanes"]
            total.output_tokens += s["output_tokens"]
            for status, count in s["by_status"].items():
                total.by_status[status] = total.by_status.get(status, 0) + count
            total.recent_ttfts_ns.extend(s["ttfts_ns"])
            if s["client_limit"] and total.client_limit is None:
                total.client_limit = f"worker {k}: {s['client_limit']}"
        return total

    def counts(self, trace_requests: int) -> RunCounts:
        """The run.json ``counts``."""
        return RunCounts.of(
            self.by_status,
            trace_requests=trace_requests,
            not_streamed=self.not_streamed,
            short_output=self.short_output,
        )


PLAIN_INTERVAL_S = 10.0  # the status line's period when stderr is not a terminal


class Progress:
    """A live status line on stderr (each second on a terminal, else every 10 s)."""

    def __init__(
        self,
        counters: RunCounters,
        clock: Clock,
        t0_ns: int,
        total: int,
        stream: TextIO,
        *,
        loop: bool = False,  # --loop: the trace over again, so no fixed total
    ) -> None:
        self.counters = counters
        self.clock = clock
        self.t0_ns = t0_ns
        self.total = total
        self.loop = loop
        self.stream = stream
        self.tty = stream.isatty()

    def line(self) -> str:
        c = self.counters
        n = c.counts(self.total)
        elapsed = (self.clock.now_ns() - self.t0_ns) / 1e9
        (p90_ns,) = percentiles(c.recent_ttfts_ns, [90]) if c.recent_ttfts_ns else [0]
        p90 = f"{p90_ns / 1e6:,.0f} ms" if c.recent_ttfts_ns else "-"
        rate = c.output_tokens / elapsed if elapsed > 0 else 0.0
        if self.loop:
            passes = n.requests / self.total if self.total else 0.0
            done = f"{n.requests:,} ({passes:,.2f} passes of {self.total:,})"
        else:
            done = f"{n.requests:,}/{self.total:,}"
        return (
            f"[{elapsed:7.1f}s] done {done}  in flight "
            f"{c.inflight}  lanes {c.lanes}  failed {n.failed}  skipped {n.skipped}"
            f"  P90 TTFT {p90}  {rate:,.0f} out tok/s"
            + (f"  CLIENT-LIMITED: {c.client_limit}" if c.client_limit else "")
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Print until ``stop`` is set."""
        interval = 1.0 if self.tty else PLAIN_INTERVAL_S
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
            if self.tty:
                self.stream.write("\r\x1b[2K" + self.line())
            elif not stop.is_set():
                self.stream.write(self.line() + "\n")
            self.stream.flush()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class StatusLine:
    """The status line of a run of several workers, printed by their supervisor
    from the workers' reports: redrawn each second on a terminal, else one plain
    line every ``interval_s`` (a log file gets lines, not carriage returns)."""

    def __init__(
        self,
        stream: TextIO,
        clock: Clock,
        *,
        interval_s: float = PLAIN_INTERVAL_S,
    ) -> None:
        self.stream = stream
        self.clock = clock
        self.tty = stream.isatty()
        self.interval_ns = int((1.0 if self.tty else interval_s) * 1e9)
        self.last_ns = clock.now_ns()
        self.drawn = False

    def tick(
        self,
        counters: Callable[[], RunCounters],
        t0_ns: int,
        total: int,
        *,
        loop: bool = False,
    ) -> None:
        """Print the line if it is due (``t0_ns`` 0: the run has not started);
        ``total`` and ``loop`` as :class:`Progress`'s."""
        now = self.clock.now_ns()
        if t0_ns <= 0 or now - self.last_ns < self.interval_ns:
            return
        self.last_ns = now
        line = Progress(
            counters(), self.clock, t0_ns, total, self.stream, loop=loop
        ).line()
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a redrawn line."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOutcome:
    """What a finished (or interrupted) replay did, as ``replay()`` returns it: counts
    and a few headline figures read back from the part files. ``analysis``'s
    ``Summary`` is the full analysis of a run directory."""

    run_dir: Path
    run_id: str
    counts: RunCounts
    duration_s: float
    interrupted: bool
    p90_ttft_ms: float | None  # ok, measured rows
    output_tok_s: float  # ok rows' output tokens / duration
    warnings: tuple[str, ...] = ()  # about the setup (run.json ``warnings``)
    steady: SteadyWindow | None = None  # None: no request ended
    client_check: ClientCheck | None = None  # run.json ``client_check``

    @property
    def client_limited(self) -> bool:
        """The self-check found the client, not the server, limiting the run."""
        return bool(self.client_check and self.client_check.limited)

    @property
    def requests(self) -> int:
        return self.counts.requests

    @property
    def ok(self) -> int:
        return self.counts.ok

    @property
    def failed(self) -> int:
        return self.counts.failed

    @property
    def skipped(self) -> int:
        return self.counts.skipped

    def one_line(self) -> str:
        ttft = "-" if self.p90_ttft_ms is None else f"{self.p90_ttft_ms:,.1f} ms"
        cancelled = (
            f", {self.counts.cancelled:,} cancelled" if self.counts.cancelled else ""
        )
        return (
            f"{self.requests:,} requests ({self.ok:,} ok, {self.failed:,} failed, "
            f"{self.skipped:,} skipped{cancelled}) in {self.duration_s:,.1f} s; "
            f"P90 TTFT {ttft}; {self.output_tok_s:,.0f} output tok/s → {self.run_dir}"
        )


def replay_outcome(
    run_dir: Path,
    *,
    run_id: str,
    counts: RunCounts,
    duration_s: float,
    interrupted: bool,
    warnings: tuple[str, ...] = (),
    client_check: ClientCheck | None = None,
    worker_id: int | None = None,
) -> ReplayOutcome:
    """The outcome of a replay into ``run_dir``, from its part files (every
    worker's, or worker ``worker_id``'s own: the others may still be joining
    theirs): the headline figures come from what was recorded, never from
    in-memory lists."""
    p90: float | None = None
    out_tokens = 0.0
    steady: SteadyWindow | None = None
    # Part by part (not pyarrow.dataset: its import alone, with pandas, costs a
    # virtual replay of the Weka sample about 0.3 s).
    columns = ["status", "ttft_ns", "output_tokens", "warmup", "start_ns", "end_ns"]
    tables = read_request_parts(
        run_dir, lambda part: pq.ParquetFile(part).read(columns=columns), worker_id
    )
    if tables:
        table = pa.concat_tables(tables)
        sent = table.filter(pc.invert(pc.equal(table["status"], "skipped")))
        steady = steady_window(
            sent["start_ns"].to_numpy(),
            sent["end_ns"].to_numpy(),
        )
        ok = table.filter(pc.equal(table["status"], "ok"))
        out_tokens = float(pc.sum(ok["output_tokens"]).as_py() or 0)
        measured = ok.filter(pc.invert(pc.fill_null(ok["warmup"], False)))
        ttft = measured["ttft_ns"].drop_null()
        if len(ttft):
            (p90_ns,) = percentiles(ttft.to_numpy(), [90])
            p90 = p90_ns / 1e6
    return ReplayOutcome(
        run_dir=run_dir,
        run_id=run_id,
        counts=counts,
        duration_s=duration_s,
        interrupted=interrupted,
        p90_ttft_ms=p90,
        output_tok_s=out_tokens / duration_s if duration_s > 0 else 0.0,
        warnings=warnings,
        steady=steady,
        client_check=client_check,
    )
