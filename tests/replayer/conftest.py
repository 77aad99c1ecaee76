"""Engine fixtures: a replay in virtual time (tests/fakes.py's FakeClock and
FakeChatClient, no HTTP), which writes a real run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import ReplayFake, replay_in_fakes


@pytest.fixture
def replay_fake(tmp_path: Path) -> ReplayFake:
    """``await replay_fake(trace, client=dict(...), **config)`` → FakeRun."""
    return replay_in_fakes(tmp_path)
