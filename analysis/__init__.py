"""Offline analysis of run directories: metrics, summaries, comparisons and reports.

Imports ``traces`` and ``replayer.records`` only; never aiohttp.
"""

from __future__ import annotations

from analysis.compare import compare_runs
from analysis.errors import AnalysisError, SloError
from analysis.load import Run, Sweep, load_run, load_sweep
from analysis.metrics import Slo, parse_slo, percentile
from analysis.sessions import session_trees
from analysis.summary import Summary, summarize
from analysis.sweep import pareto_front, sweep_table

__all__ = [
    "AnalysisError",
    "Run",
    "Slo",
    "SloError",
    "Summary",
    "Sweep",
    "compare_runs",
    "load_run",
    "load_sweep",
    "pareto_front",
    "parse_slo",
    "percentile",
    "session_trees",
    "summarize",
    "sweep_table",
]
