"""Fixtures shared by all test packages: where the real sample traces live."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# pytest (prepend import mode) puts tests/ first on sys.path, where tests/traces and
# tests/replayer would be picked up as namespace packages ahead of the editable
# install's finder (which comes after the path finder). The repository root on the
# path makes `import traces` find the real package; test_layout checks that it does.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The real traces sit beside the repository (../shared/data), never inside it.
SHARED_DATA = REPO / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``<repo>/../shared/data``; skips the test when the sample data is absent."""
    if not (SHARED_DATA / "weka").is_dir():
        pytest.skip(f"real sample traces not found at {SHARED_DATA.resolve()}")
    return SHARED_DATA.resolve()


@pytest.fixture(scope="session")
def weka_dir(shared_data: Path) -> Path:
    """The folder of 30 real Weka/AgentX session files."""
    return shared_data / "weka"


@pytest.fixture(scope="session")
def mooncake_file(shared_data: Path) -> Path:
    """The real Mooncake conversation trace (JSONL, one request per line)."""
    path = shared_data / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"Mooncake sample not found at {path}")
    return path
