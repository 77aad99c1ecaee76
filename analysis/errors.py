"""Exceptions of ``analysis``: input it cannot analyse, rooted at :class:`AnalysisError`
(independent of ``replayer.errors`` and ``traces.errors``). A metric with no data is
NaN, not an error. See docs/metrics.md."""

from __future__ import annotations


class AnalysisError(Exception):
    """Root of every error ``analysis`` raises on purpose; the message names the input
    and the fix.

    * AnalysisError
      x SloError           malformed --slo objectives (unknown metric, bad duration)

    AnalysisError itself: a run directory, sweep folder, trace or column that cannot be
    analysed (missing, corrupt, empty).
    """


class SloError(AnalysisError):
    """An objective that cannot be parsed (unknown metric, bad duration)."""
