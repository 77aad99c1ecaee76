"""Nothing a replayer starts outlives it: kill -9 of `replayer run --workers 2`, of a
plain `replayer run` and of `replayer capacity` (each with the built-in sim) leaves no
process of the run within seconds, and the part files written stay readable. The
`--ray` case is in test_ray_workers.py, beside its cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.orphans import GONE_WITHIN_S, command, kill_9_mid_run, long_trace


def _is_sim(pids: dict[int, int]) -> bool:
    return any("--accept-any-model" in command(p) for p in pids)


def _has_workers(pids: dict[int, int]) -> bool:
    return sum("spawn_main" in command(p) for p in pids) >= 2 and _is_sim(pids)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["run", "--workers", "2", "--concurrency", "2"], _has_workers),
        (["run", "--concurrency", "2"], _is_sim),
        (
            ["capacity", "--slo", "ttft=60s", "--duration", "30", "--max-cells", "2"],
            _is_sim,
        ),
    ],
    ids=["workers", "plain", "capacity"],
)
@pytest.mark.timeout(150)
def test_kill_9_of_the_parent_leaves_no_process_of_the_run(
    tmp_path: Path,
    args: list[str],
    expect: Callable[[dict[int, int]], bool],
) -> None:
    trace = long_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    command_line = [args[0], str(trace), *args[1:], "--out", str(out), "--quiet",
                    "--sim-args", "--speed 1"]  # fmt: skip
    _seen, left = kill_9_mid_run(command_line, out, expect=expect)
    assert left == [], f"alive {GONE_WITHIN_S} s after kill -9: {left}"
