"""Scrapes the server's Prometheus ``/metrics`` during a run into
``server_metrics.parquet`` (long format: scrape_ns, metric, labels, value)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from replayer.clock import Clock
from replayer.config import EndpointConfig
from replayer.errors import RecorderError
from replayer.records import SERVER_METRICS_SCHEMA


def parse_metrics(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels JSON, value) for every sample in a Prometheus text body."""
    out: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = json.dumps(dict(sorted(sample.labels.items())))
            out.append((sample.name, labels, float(sample.value)))
    return out


class MetricsScraper:
    """Polls ``<base>/metrics``; stops quietly if the server has none."""

    def __init__(
        self,
        endpoint: EndpointConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        t0_ns: int,
    ) -> None:
        self.url = endpoint.metrics_url()
        self.session = session
        self.clock = clock
        self.t0_ns = t0_ns
        # Raw bodies, parsed only when written: parsing in the event loop (tens of ms
        # for vLLM's /metrics) would delay the timestamps of the run's streams.
        self.bodies: list[tuple[int, str]] = []
        self.available: bool | None = None
        self.errors = 0

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
        self.bodies.append((now, text))

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Scrape every ``interval_s`` until ``stop`` is set (and once more then)."""
        while True:
            await self.scrape_once()
            if self.available is False or stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            if stop.is_set():
                await self.scrape_once()
                return

    def rows(self) -> list[tuple[int, str, str, float]]:
        """(scrape_ns, metric, labels JSON, value) for every sample scraped."""
        rows: list[tuple[int, str, str, float]] = []
        for now, text in self.bodies:
            try:
                samples = parse_metrics(text)
            except ValueError:
                self.errors += 1
                continue
            rows.extend((now, name, labels, value) for name, labels, value in samples)
        return rows

    def write(self, run_dir: Path) -> None:
        """Write ``server_metrics.parquet`` (nothing when no sample was taken)."""
        rows = self.rows()
        if not rows:
            return
        cols = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [
                pa.array(c, type=f.type)
                for c, f in zip(cols, SERVER_METRICS_SCHEMA, strict=True)
            ],
            schema=SERVER_METRICS_SCHEMA,
        )
        path = run_dir / "server_metrics.parquet"
        try:
            pq.write_table(table, path, compression="zstd")
        except OSError as exc:
            raise RecorderError(f"{path}: cannot write: {exc.strerror or exc}") from exc
