"""The trace model, readers/writers, validation and statistics.

Imports neither ``replayer`` nor ``analysis``.
"""

from __future__ import annotations

from traces.errors import Problem, TraceError, TraceFormatError
from traces.io import check_trace, read_trace, write_trace
from traces.model import Request, Session, Subagent, Trace
from traces.stats import TraceStats, ideal_cached_tokens, trace_stats
from traces.table import RequestRows, RequestTable

__all__ = [
    "Problem",
    "Request",
    "RequestRows",
    "RequestTable",
    "Session",
    "Subagent",
    "Trace",
    "TraceError",
    "TraceFormatError",
    "TraceStats",
    "check_trace",
    "ideal_cached_tokens",
    "read_trace",
    "trace_stats",
    "write_trace",
]
