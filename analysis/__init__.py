"""Offline analysis of run directories: metrics, summaries, comparisons and reports.
Imports ``traces`` and ``replayer.records`` only (no aiohttp); names load on first use,
so ``import analysis.heap`` imports no pandas or Arrow. See docs/architecture.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.compare import compare_runs
    from analysis.errors import AnalysisError, SloError
    from analysis.load import Run, Sweep, load_run, load_sweep
    from analysis.metrics import percentile
    from analysis.sessions import session_trees
    from analysis.slo import Slo, parse_slo
    from analysis.summary import Summary, summarize
    from analysis.sweep import pareto_front, sweep_table

# Each public name: the module that defines it.
_WHERE = {
    "AnalysisError": "analysis.errors",
    "Run": "analysis.load",
    "Slo": "analysis.slo",
    "SloError": "analysis.errors",
    "Summary": "analysis.summary",
    "Sweep": "analysis.load",
    "compare_runs": "analysis.compare",
    "load_run": "analysis.load",
    "load_sweep": "analysis.load",
    "pareto_front": "analysis.sweep",
    "parse_slo": "analysis.slo",
    "percentile": "analysis.metrics",
    "session_trees": "analysis.sessions",
    "summarize": "analysis.summary",
    "sweep_table": "analysis.sweep",
}

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


if not TYPE_CHECKING:  # to a type checker, only the names above exist

    def __getattr__(name: str) -> Any:
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module 'analysis' has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        globals()[name] = value  # the next lookup is a plain one
        return value


def __dir__() -> list[str]:
    return sorted(
        {n for n in globals() if not n.startswith("_")} - _PLUMBING | set(_WHERE)
    )


_PLUMBING = {"Any", "TYPE_CHECKING", "annotations", "importlib"}
