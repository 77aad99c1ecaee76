"""ParquetRecorder: rows go into memory with a non-blocking put(); one writer task
flushes them to a new part file every flush interval. See docs/run-directory.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pyarrow.parquet as pq

from replayer.errors import RecorderError
from replayer.records import RUN_METADATA_KEY, RequestRecord, RunMeta, records_to_table
from replayer.records.parts import (
    compact_parts,
    part_name,
    part_write_options,
    write_part,
)


class ParquetRecorder:
    """Collects RequestRecords and writes ``requests/part-<worker>-<seq>.parquet``.

    ParquetRecorder: rows go into memory with a non-blocking put(); one writer task
    flushes them to a new part file every few seconds (a killed run loses at most the
    last interval; every part file is a complete Parquet file). Always flushes on exit,
    then, at the end of a run that ended as planned, joins the parts into large
    ones (``compact_parts``).

    One owner per mutable thing: the pending rows belong to the event loop (``put`` and
    the writer task swap the whole list there); a flush thread gets a batch of its own
    and only writes files, one flush at a time.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        worker_id: int = 0,
        flush_interval_s: float = 2.0,
        flush_rows: int = 5000,
        metadata: RunMeta | None = None,
        compact: bool = True,
    ) -> None:
        self.dir = run_dir / "requests"
        self.worker_id = worker_id
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self._pending: list[RequestRecord] = []  # loop thread only
        self._retry: list[RequestRecord] = []  # rows a failed flush gave back
        self._seq = 0  # next part file; only the (single) flushing thread moves it
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._metadata = b"{}"
        if metadata is not None:
            self.set_metadata(metadata)
        self.rows_written = 0
        self.max_pending = 0  # peak queue depth: reported, never blocks the timed path
        self.flush_errors = 0
        self.compact = compact
        self.parts_compacted = 0

    def put(self, record: RequestRecord) -> None:
        """Queue a row; never blocks."""
        self._pending.append(record)
        n = len(self._pending)
        self.max_pending = max(self.max_pending, n)
        if n >= self.flush_rows:
            self._wake.set()

    def set_metadata(self, metadata: RunMeta) -> None:
        """Replace the run metadata stored in part files written from now on."""
        self._metadata = json.dumps(metadata.as_dict(), default=str).encode()

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
        # then write what is left, even when the run was cancelled or the writer
        # failed; the writer's error surfaces after the final flush.
        self._closing = True
        self._wake.set()
        cancelled = False
        writer_error: BaseException | None = None
        if self._task is not None:
            try:
                await _finish(self._task)
            except asyncio.CancelledError:
                cancelled = True
            except Exception as err:
                writer_error = err
        batches = [b for b in (self._retry, self._pending) if b]
        self._retry, self._pending = [], []
        final = asyncio.ensure_future(asyncio.to_thread(self._final, batches))
        try:
            await _finish(final)
        except asyncio.CancelledError:
            cancelled = True
        if writer_error is not None:
            raise writer_error
        # Joined only at the end of a run that ended as planned: a stopped or
        # failed one keeps its parts (``replayer compact`` joins them later).
        if exc_type is None and not cancelled and self.compact and self._seq > 1:
            try:
                await self._compact()
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    async def _compact(self) -> None:
        """Join this worker's parts into large ones (``compact_parts``): a run's
        thousands of small parts read several times slower. Every row is already
        on disk; a cancel stops it after the part it is in."""
        stop = threading.Event()

        def join() -> None:
            self.parts_compacted = compact_parts(
                self.dir, self.worker_id, self._seq, self._metadata, stop=stop
            )

        await _finish(asyncio.ensure_future(asyncio.to_thread(join)), stop.set)

    async def _writer(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            batch = self._retry + self._pending
            self._retry, self._pending = [], []
            if batch:
                try:
                    failed = await asyncio.to_thread(self._write, batch, self._metadata)
                except Exception:
                    self._retry = batch  # the final flush still tries them
                    raise
                # Kept for the next flush; rows put meanwhile are in _pending.
                self._retry = failed

    def _write(self, rows: list[RequestRecord], metadata: bytes) -> list[RequestRecord]:
        """Write one part file; the rows back when the disk refused them."""
        try:
            self._write_part(rows, metadata)
        except OSError:
            self.flush_errors += 1
            return rows
        return []

    def _write_part(self, rows: list[RequestRecord], metadata: bytes) -> None:
        table = records_to_table(rows).replace_schema_metadata(
            {RUN_METADATA_KEY: metadata}
        )
        write_part(table, self.dir / part_name(self.worker_id, self._seq))
        self._seq += 1
        self.rows_written += len(rows)

    def _final(self, batches: list[list[RequestRecord]]) -> None:
        """The last flush: each batch to its part file, else to the temp folder."""
        refused: list[RequestRecord] = []
        error: OSError | None = None
        for rows in batches:
            try:
                self._write_part(rows, self._metadata)
            except OSError as exc:
                self.flush_errors += 1
                refused.extend(rows)
                error = exc
        if refused and error is not None:
            path = self.dir / part_name(self.worker_id, self._seq)
            raise RecorderError(
                f"{path}: cannot write {len(refused)} rows "
                f"({error.strerror or error}); {self._rescue(refused)}"
            ) from error

    def _rescue(self, rows: list[RequestRecord]) -> str:
        """Last resort for rows the run directory refused: the temp folder."""
        run_id = rows[0].run_id if rows else "run"
        name = f"replayer-rescue-{run_id}-{self.worker_id:03d}-{self._seq:05d}.parquet"
        rescue = Path(tempfile.gettempdir()) / name
        try:
            table = records_to_table(rows)
            pq.write_table(table, rescue, **part_write_options(table.column_names))
        except OSError as exc:
            return f"saving them to {rescue} failed too ({exc.strerror or exc})"
        self.rows_written += len(rows)
        return f"they were saved to {rescue}"


async def _finish(
    task: asyncio.Future[None], on_cancel: Callable[[], None] | None = None
) -> None:
    """Await ``task`` to its end even if we are cancelled meanwhile (``on_cancel``
    called at each cancel); then re-raise."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
            if on_cancel is not None:
                on_cancel()
    task.result()
    if cancelled:
        raise asyncio.CancelledError
