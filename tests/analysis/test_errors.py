"""The analysis exception tree: its own root, apart from the engine's."""

from __future__ import annotations

import analysis
from analysis.errors import AnalysisError, SloError
from replayer.errors import ReplayerError
from traces.errors import TraceError


def test_analysis_error_is_its_own_root() -> None:
    assert not issubclass(AnalysisError, ReplayerError)
    assert not issubclass(AnalysisError, TraceError)
    assert AnalysisError.__mro__[1] is Exception
    assert issubclass(SloError, AnalysisError)


def test_analysis_reexports_its_errors() -> None:
    assert analysis.AnalysisError is AnalysisError
    assert analysis.SloError is SloError
