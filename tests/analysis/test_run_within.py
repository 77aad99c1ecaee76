"""analysis.summary.run_within: summarize's parts on two threads within a memory
budget, results in order, the first error raised."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from analysis.summary import run_within


def _jobs(
    sizes: list[int], log: list[tuple[str, int]]
) -> list[tuple[float, Callable[[], int]]]:
    lock = threading.Lock()

    def job(i: int) -> Callable[[], int]:
        def run() -> int:
            with lock:
                log.append(("start", i))
            time.sleep(0.02)
            with lock:
                log.append(("end", i))
            return i * 10

        return run

    return [(size, job(i)) for i, size in enumerate(sizes)]


def test_results_in_order_and_the_budget_held() -> None:
    sizes = [60, 50, 10, 30, 20, 5]
    log: list[tuple[str, int]] = []
    assert run_within(_jobs(sizes, log), budget=70, workers=2) == [
        0,
        10,
        20,
        30,
        40,
        50,
    ]
    running: set[int] = set()
    overlapped = False
    for event, i in log:
        if event == "start":
            running.add(i)
            assert len(running) == 1 or sum(sizes[j] for j in running) <= 70
            overlapped |= len(running) == 2
        else:
            running.discard(i)
    assert overlapped  # two ran at once where they fit


def test_one_worker_runs_them_in_order() -> None:
    log: list[tuple[str, int]] = []
    run_within(_jobs([5, 90, 1], log), budget=10, workers=1)
    assert [i for event, i in log if event == "start"] == [0, 1, 2]


def test_the_first_error_is_raised() -> None:
    def fail() -> int:
        raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        run_within([(1, fail), (1, lambda: 2)], budget=10, workers=2)
