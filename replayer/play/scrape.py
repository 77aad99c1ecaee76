"""Scrapes the server's Prometheus ``/metrics`` during a run, raw, into
``server_metrics.parquet`` (parsed at the end). See docs/run-directory.md."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq

from replayer.clock import Clock
from replayer.config import EndpointConfig, public_url
from replayer.errors import RecorderError
from replayer.records import (
    SERVER_METRICS_RAW_DIR,
    SERVER_METRICS_RAW_SCHEMA,
    SERVER_METRICS_SCHEMA,
    ScrapeAccount,
    server_metrics_table,
)


class MetricsScraper:
    """Polls ``<root>/metrics``; stops quietly if the server has none.

    Scrapes the server's Prometheus ``/metrics`` during a run. Bodies are kept raw (no
    parsing on the event loop: tens of ms for vLLM's body would delay every stream's
    stamps) and written every flush interval to ``server_metrics/raw-*.parquet``; at the
    end of the run they are parsed, part by part, into ``server_metrics.parquet`` (long
    format: scrape_ns, metric, labels, value) and the raw parts removed. Memory stays
    bounded by one interval of scrapes; a kill -9 loses at most the last one.
    """

    def __init__(
        self,
        endpoint: EndpointConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        t0_ns: int,
        *,
        run_dir: Path,
        worker_id: int = 0,
        flush_interval_s: float = 2.0,
    ) -> None:
        self.url = endpoint.metrics_url()
        self.session = session
        self.clock = clock
        self.t0_ns = t0_ns
        self.raw_dir = run_dir / SERVER_METRICS_RAW_DIR
        self.final_path = run_dir / "server_metrics.parquet"
        self.worker_id = worker_id
        self.flush_interval_s = flush_interval_s
        self._pending: list[tuple[int, str]] = []  # event loop only
        self._seq = 0
        self.available: bool | None = None
        self.scrapes = 0
        self.errors = 0
        self.unparsed = 0

    async def scrape_once(self) -> None:
        now = self.clock.now_ns() - self.t0_ns
        try:
            async with asyncio.timeout(5.0):
                async with self.session.get(self.url) as resp:
                    if resp.status != 200:
                        if self.available is None:
                            self.available = False
                        self.errors += 1
                        return
                    text = await resp.text(errors="replace")
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.errors += 1
            return
        if "# TYPE" not in text and "# HELP" not in text and "{" not in text:
            self.errors += 1  # not Prometheus text
            return
        self.available = True
        self.scrapes += 1
        self._pending.append((now, text))

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Scrape every ``interval_s`` until ``stop`` is set (and once more then),
        writing what was scraped every flush interval."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self.flush_interval_s
        while True:
            await self.scrape_once()
            if self.available is False or stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            if stop.is_set():
                await self.scrape_once()
                break
            if loop.time() >= next_flush:
                next_flush = loop.time() + self.flush_interval_s
                await self.flush()

    async def flush(self) -> None:
        """Write the scrapes taken since the last flush as one raw part (kept for
        the next flush when the disk refuses them)."""
        batch, self._pending = self._pending, []
        if batch and not await asyncio.to_thread(self._write_raw, batch):
            self._pending = batch + self._pending

    def _write_raw(self, batch: list[tuple[int, str]]) -> bool:
        now, bodies = zip(*batch, strict=True)
        table = pa.table(
            [pa.array(now, pa.int64()), pa.array(bodies, pa.string())],
            schema=SERVER_METRICS_RAW_SCHEMA,
        )
        path = self.raw_dir / f"raw-{self.worker_id:03d}-{self._seq:05d}.parquet"
        tmp = path.with_name("." + path.name + ".tmp")
        try:
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp, compression="zstd")
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self.errors += 1
            return False
        self._seq += 1
        return True

    def finish(self) -> None:
        """At the end of the run: parse the raw parts, part by part, into
        ``server_metrics.parquet`` and remove them (nothing when nothing was
        scraped). Call after the last :meth:`flush`."""
        parts = (
            sorted(self.raw_dir.glob("raw-*.parquet")) if self.raw_dir.is_dir() else []
        )
        if not parts:
            return
        tmp = self.final_path.with_name("." + self.final_path.name + ".tmp")
        try:
            with pq.ParquetWriter(
                tmp, SERVER_METRICS_SCHEMA, compression="zstd"
            ) as out:
                for part in parts:
                    table, bad = server_metrics_table(pq.read_table(part))
                    self.unparsed += bad
                    out.write_table(table)
            tmp.replace(self.final_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise RecorderError(
                f"{self.final_path}: cannot write: {exc.strerror or exc} "
                f"(the raw scrapes stay in {self.raw_dir})"
            ) from exc
        shutil.rmtree(self.raw_dir, ignore_errors=True)

    def account(self) -> ScrapeAccount:
        """What run.json says about the scrapes."""
        return ScrapeAccount(
            url=public_url(self.url),
            available=self.available,
            scrapes=self.scrapes,
            errors=self.errors,
            unparsed=self.unparsed,
        )
