"""A sweep: one replay per concurrency level against one endpoint, each level an
ordinary run directory in one sweep folder (``sweep.json`` lists them in order), with
a fresh cache-bust salt per level so no level is served from another's cache."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from replayer.config import Lanes, ReplayConfig
from replayer.launch import replay, running_endpoint
from replayer.play.progress import ReplayOutcome
from replayer.records.rundir import new_run_id, write_json_atomic


def with_fresh_salt(config: ReplayConfig) -> ReplayConfig:
    """``config`` with a new cache-bust salt, so that this replay is served from no
    earlier one's cache; without cache-bust (salt "") it stays as it is."""
    salt = config.prompt.salt and new_run_id()
    return replace(config, prompt=replace(config.prompt, salt=salt))


def run_sweep(
    trace_path: Path,
    config: ReplayConfig,
    levels: Sequence[int],
    out: Path,
    *,
    progress: TextIO | None = None,
) -> Iterator[tuple[str, ReplayOutcome]]:
    """Replay ``trace_path`` at each concurrency level into ``out/c<N>``; yields
    (level name, summary) as each finishes. The built-in simulator, when the config
    names no endpoint, is started once for the whole sweep."""
    names = [f"c{n}" for n in levels]
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "sweep.json", {"levels": names})
    with running_endpoint(config) as (resolved, _sim):
        for name, n in zip(names, levels, strict=True):
            level = with_fresh_salt(replace(resolved, schedule=Lanes(concurrency=n)))
            yield name, replay(trace_path, level, out / name, progress=progress)
