"""Builders of run and sweep directories in the layout the replay engine writes.

Fixtures hand out factories: ``make_record(**fields)`` (a RequestRecord with dull
defaults, from ``tests.builders``), ``make_run_dir(path, records, ...)`` and
``make_sweep_dir(path, levels)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replayer.records import RequestRecord, records_to_table
from tests.builders import make_record, timed_record


def run_meta(**overrides: Any) -> dict[str, Any]:
    """A run.json as the engine writes it; ``overrides`` replace top-level keys."""
    meta: dict[str, Any] = {
        "run_id": "run-test",
        "tool": "agentic-trace-replayer",
        "tool_version": "0.1.0",
        "start_unix_ns": 1_700_000_000_000_000_000,
        "end_unix_ns": 1_700_000_010_000_000_000,
        "duration_s": 10.0,
        "trace": {
            "path": None,
            "content_hash": "x",
            "format": "native",
            "sessions": 1,
            "requests": 1,
            "ideal_cache_hit_rate": 0.5,
            "block_size": 64,
        },
        "endpoint": "http://127.0.0.1:8000",
        "model": "sim",
        "api": "completions",
        "simulated": True,
        "mode": {
            "kind": "concurrency",
            "concurrency": 1,
            "session_rate": None,
            "speedup": None,
        },
        "warmup_s": 0,
        "duration_limit_s": None,
        "measure_start_ns": 0,
        "labels": {
            "engine": None,
            "engine_version": None,
            "tp": None,
            "ep": None,
            "gpus": None,
        },
        "seed": 0,
        "salt": "s",
        "block_tokens": None,
        "config": {},
        "counts": {},
        "sim": None,
    }
    meta.update(overrides)
    return meta


def write_run_dir(
    path: Path,
    records: Sequence[RequestRecord],
    *,
    meta: dict[str, Any] | None = None,
    server_metrics: Sequence[tuple[int, str, dict[str, str], float]] | None = None,
    parts: int = 2,
    write_run_json: bool = True,
) -> Path:
    """Write ``records`` as ``parts`` part files (some may be empty) + run.json."""
    meta = run_meta() if meta is None else meta
    reqdir = path / "requests"
    reqdir.mkdir(parents=True, exist_ok=True)
    table = records_to_table(list(records))
    table = table.replace_schema_metadata({"replayer.run": json.dumps(meta)})
    per = -(-len(records) // parts) if records else 0
    for k in range(parts):
        chunk = table.slice(k * per, per) if per else table.slice(0, 0)
        pq.write_table(chunk, reqdir / f"part-{k % 2}-{k:05d}.parquet")
    if write_run_json:
        (path / "run.json").write_text(json.dumps(meta))
    if server_metrics is not None:
        sm = pa.table(
            {
                "scrape_ns": pa.array([r[0] for r in server_metrics], pa.int64()),
                "metric": pa.array([r[1] for r in server_metrics], pa.string()),
                "labels": pa.array(
                    [json.dumps(r[2]) for r in server_metrics], pa.string()
                ),
                "value": pa.array([r[3] for r in server_metrics], pa.float64()),
            }
        )
        pq.write_table(sm, path / "server_metrics.parquet")
    return path


def write_sweep_dir(
    path: Path, levels: dict[str, Sequence[RequestRecord]], **kwargs: Any
) -> Path:
    """A sweep folder: one run dir per level (``cN`` → concurrency N) + sweep.json."""
    path.mkdir(parents=True, exist_ok=True)
    for name, records in levels.items():
        conc = int(name.lstrip("c")) if name.lstrip("c").isdigit() else None
        mode = {
            "kind": "concurrency",
            "concurrency": conc,
            "session_rate": None,
            "speedup": None,
        }
        write_run_dir(path / name, records, meta=run_meta(mode=mode), **kwargs)
    (path / "sweep.json").write_text(json.dumps({"levels": list(levels)}))
    return path


@pytest.fixture
def make_run_dir() -> Callable[..., Path]:
    """Factory: ``make_run_dir(path, records, meta=, server_metrics=, parts=2)``."""
    return write_run_dir


@pytest.fixture
def make_sweep_dir() -> Callable[..., Path]:
    """Factory: ``make_sweep_dir(path, {"c1": records, "c2": records})``."""
    return write_sweep_dir


@pytest.fixture
def rec() -> Callable[..., RequestRecord]:
    """Factory: ``rec(**fields)`` → a RequestRecord with dull defaults."""
    return make_record


@pytest.fixture
def timed() -> Callable[..., RequestRecord]:
    """Factory: ``timed(start_ms=, ttft_ms=, e2e_ms=, out=, **fields)``."""
    return timed_record


@pytest.fixture
def make_meta() -> Callable[..., dict[str, Any]]:
    """Factory: ``make_meta(**top_level_overrides)`` → a run.json dict."""
    return run_meta
