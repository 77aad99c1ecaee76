"""Exceptions of ``analysis``: input it cannot analyse, rooted at :class:`AnalysisError`
(independent of ``replayer.errors`` and ``traces.errors``). A metric with no data is
NaN, not an error. See docs/metrics.md."""

from __future__ import annotations


class AnalysisError(Exception):
    """Root of every error ``analysis`` raises on purpose; the message names the input
    and the fix.

    * AnalysisError
      x SloError           malformed --slo objectives (unknown metric, bad duration)
      x HistoryError       the results store: a corrupt or locked database, a run
                           directory it cannot record, a query it cannot answer

    AnalysisError itself: a run directory, sweep folder, trace or column that cannot be
    analysed (missing, corrupt, empty).
    """


class SloError(AnalysisError):
    """An objective that cannot be parsed (unknown metric, bad duration)."""


class HistoryError(AnalysisError):
    """The results store (``analysis.history``): a database that cannot be opened
    (corrupt, locked by another process, another version's), a run directory that
    cannot be recorded, or a query that would mix runs that do not compare."""
