"""Engine fixtures: a replay in virtual time (FakeClock + FakeChatClient, no HTTP),
which writes a real run directory."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from replayer.config import EndpointConfig, ReplayConfig
from replayer.play.progress import RunSummary
from replayer.runner.local import replay_trace
from tests.fakes import FakeChatClient, FakeClock
from traces.materialize import PromptConfig
from traces.model import Trace


@dataclass
class FakeRun:
    """A finished virtual-time replay: its rows (sorted by start), summary, client."""

    rows: pd.DataFrame
    summary: RunSummary
    client: FakeChatClient
    run_dir: Path


def engine_config(url: str = "http://127.0.0.1:9", **kw: Any) -> ReplayConfig:
    """A ReplayConfig for tests: salt "test", no scraping, rare flushes."""
    api = kw.pop("api", "completions")
    return ReplayConfig(
        endpoint=EndpointConfig(
            base_url=url, model="fake-model", api=api, api_key=kw.pop("api_key", None)
        ),
        prompt=PromptConfig(api=api, salt="test"),
        flush_interval_s=kw.pop("flush_interval_s", 60.0),
        scrape_interval_s=0.0,
        **kw,
    )


ReplayFake = Callable[..., Awaitable[FakeRun]]


@pytest.fixture
def replay_fake(tmp_path: Path) -> ReplayFake:
    """``await replay_fake(trace, client=dict(...), **config)`` → FakeRun."""
    runs = iter(range(1_000))

    async def run(
        trace: Trace, *, client: dict[str, Any] | None = None, **config: Any
    ) -> FakeRun:
        clock = FakeClock()
        fake = FakeChatClient(clock, **(client or {}))
        run_dir = tmp_path / f"run{next(runs)}"
        summary = await replay_trace(
            trace, engine_config(**config), run_dir, clock=clock, client=fake
        )
        rows = pd.read_parquet(run_dir / "requests").sort_values(
            ["start_ns", "session_id", "request_index"], na_position="last"
        )
        return FakeRun(
            rows=rows.reset_index(drop=True),
            summary=summary,
            client=fake,
            run_dir=run_dir,
        )

    return run
