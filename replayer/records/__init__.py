"""The run-directory contract, shared by the engine (writes) and ``analysis``
(reads): rows, run.json and server metrics; see docs/run-directory.md.
Import-light: pyarrow, no aiohttp."""

from __future__ import annotations

from replayer.records.meta import (
    STEADY_METHOD,
    ModeInfo,
    RunCounts,
    RunMeta,
    SteadyWindow,
    TraceInfo,
    steady_window,
)
from replayer.records.rows import (
    FAILED_STATUSES,
    RECORD_FIELDS,
    RECORD_SCHEMA,
    RUN_METADATA_KEY,
    STATUSES,
    RequestRecord,
    Status,
    records_to_table,
    tpot_ns,
)
from replayer.records.server_metrics import (
    SERVER_METRICS_RAW_DIR,
    SERVER_METRICS_RAW_SCHEMA,
    SERVER_METRICS_SCHEMA,
    parse_metrics,
    server_metrics_table,
)

__all__ = [
    "FAILED_STATUSES",
    "RECORD_FIELDS",
    "RECORD_SCHEMA",
    "RUN_METADATA_KEY",
    "SERVER_METRICS_RAW_DIR",
    "SERVER_METRICS_RAW_SCHEMA",
    "SERVER_METRICS_SCHEMA",
    "STATUSES",
    "STEADY_METHOD",
    "ModeInfo",
    "RequestRecord",
    "RunCounts",
    "RunMeta",
    "Status",
    "SteadyWindow",
    "TraceInfo",
    "parse_metrics",
    "records_to_table",
    "server_metrics_table",
    "steady_window",
    "tpot_ns",
]
