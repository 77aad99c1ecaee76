"""Exceptions of ``analysis``: input it cannot analyse. A metric with no data is not an
error (it is NaN, "unavailable"); a bug is any other exception.

* AnalysisError
  x SloError           malformed --slo objectives (unknown metric, bad duration)

AnalysisError itself: a run directory, sweep folder, trace or column that cannot be
analysed (missing, corrupt, empty).

Independent of ``replayer.errors`` and ``traces.errors``: the command line catches each
root and prints the message as one line.
"""

from __future__ import annotations


class AnalysisError(Exception):
    """Root of every error ``analysis`` raises on purpose; the message names the input
    and the fix."""


class SloError(AnalysisError):
    """An objective that cannot be parsed (unknown metric, bad duration)."""
