"""ParquetRecorder: rows go into memory with a non-blocking put(); one writer task
flushes them to a new part file every few seconds (a killed run loses at most the last
interval; every part file is a complete Parquet file). Always flushes on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow.parquet as pq

from replayer.errors import RecorderError
from replayer.records import RequestRecord, records_to_table

RUN_METADATA_KEY = b"replayer.run"


class ParquetRecorder:
    """Collects RequestRecords and writes ``requests/part-<worker>-<seq>.parquet``."""

    def __init__(
        self,
        run_dir: Path,
        *,
        worker_id: int = 0,
        flush_interval_s: float = 2.0,
        flush_rows: int = 5000,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.dir = run_dir / "requests"
        self.worker_id = worker_id
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self._pending: list[RequestRecord] = []
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        # Flushes run in worker threads; one at a time, each to its own file.
        self._lock = threading.Lock()
        self._metadata = metadata or {}
        self.rows_written = 0
        self.max_pending = 0  # peak queue depth: reported, never blocks the timed path
        self.flush_errors = 0

    def put(self, record: RequestRecord) -> None:
        """Queue a row; never blocks."""
        self._pending.append(record)
        n = len(self._pending)
        self.max_pending = max(self.max_pending, n)
        if n >= self.flush_rows:
            self._wake.set()

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the run metadata stored in part files written from now on."""
        self._metadata = metadata

    async def __aenter__(self) -> ParquetRecorder:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RecorderError(
                f"{self.dir}: cannot create run directory: {exc.strerror or exc}"
            ) from exc
        self._task = asyncio.get_running_loop().create_task(
            self._writer(), name="recorder"
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Let the writer finish the flush it may be in (a thread cannot be cancelled),
        # then write what is left. Runs to the end even when the run was cancelled.
        self._closing = True
        self._wake.set()
        cancelled = False
        if self._task is not None:
            try:
                await _finish(self._task)
            except asyncio.CancelledError:
                cancelled = True
        final = asyncio.ensure_future(asyncio.to_thread(self._flush_sync, True))
        try:
            await _finish(final)
        except asyncio.CancelledError:
            cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    async def _writer(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await asyncio.to_thread(self._flush_sync, False)

    def _flush_sync(self, final: bool) -> None:
        with self._lock:
            self._flush_locked(final)

    def _flush_locked(self, final: bool) -> None:
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        table = records_to_table(rows)
        meta = {RUN_METADATA_KEY: json.dumps(self._metadata, default=str).encode()}
        table = table.replace_schema_metadata(meta)
        path = self.dir / f"part-{self.worker_id:03d}-{self._seq:05d}.parquet"
        tmp = path.with_name("." + path.name + ".tmp")
        try:
            pq.write_table(table, tmp, compression="zstd")
            tmp.replace(path)
        except OSError as exc:
            # Keep the rows: the next flush retries; the final one reports.
            self._pending = rows + self._pending
            self.flush_errors += 1
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if final:
                raise RecorderError(
                    f"{path}: cannot write {len(self._pending)} rows "
                    f"({exc.strerror or exc}); {self._rescue()}"
                ) from exc
            return
        self._seq += 1
        self.rows_written += len(rows)

    def _rescue(self) -> str:
        """Last resort for rows the run directory refused: the temp folder."""
        rows, self._pending = self._pending, []
        run_id = rows[0].run_id if rows else "run"
        name = f"replayer-rescue-{run_id}-{self.worker_id:03d}-{self._seq:05d}.parquet"
        rescue = Path(tempfile.gettempdir()) / name
        try:
            pq.write_table(records_to_table(rows), rescue, compression="zstd")
        except OSError as exc:
            self._pending = rows
            return f"saving them to {rescue} failed too ({exc.strerror or exc})"
        self.rows_written += len(rows)
        return f"they were saved to {rescue}"


async def _finish(task: asyncio.Future[None]) -> None:
    """Await ``task`` to its end even if we are cancelled meanwhile; then re-raise."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError
