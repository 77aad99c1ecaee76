"""The GPU bench's kept runs (bench/gpu/runs) re-checked and re-calibrated on the CPU:
the table is produced and its errors stay within what bench/gpu/RESULTS-gpu.md says."""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "bench" / "gpu" / "runs"

# Per kept run set and regime: the fitted levels, the held-out labels, and the
# bounds RESULTS-gpu.md states for each held-out setting's |error| (relative, or
# points for the hit rate), a little above the figures it gives.
EXPECTED = {
    "sim-rehearsal": {
        "gpu": {
            "fit": [2, 12],
            "host_tokens": 0,
            "held": ["concurrency 4", "concurrency 8", "concurrency 16"],
            # RESULTS-gpu.md: worst |error| 28.1% (TTFT P90), 36.0% (E2E P90), 2.9 pt.
            "bounds": {"ttft_p90_ms": 0.35, "e2e_p90_ms": 0.45, "hit_rate": 4.0},
        },
        "offload": {
            "fit": [2, 12],
            "host_tokens": 1_048_576,
            "held": ["concurrency 4", "concurrency 8", "concurrency 16"],
            # RESULTS-gpu.md: worst 107.0% (TTFT P90 at 8), 75.7% (E2E P90), 4.7 pt.
            "bounds": {"ttft_p90_ms": 1.25, "e2e_p90_ms": 0.9, "hit_rate": 6.0},
        },
    },
}


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_bench", REPO / "bench" / "gpu" / "gpu_bench.py"
    )
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("run_set", "regime"),
    [(s, r) for s, regimes in EXPECTED.items() for r in regimes],
)
def test_kept_runs_recalibrate_within_stated_bounds(
    run_set: str, regime: str, weka_dir: Path, tmp_path: Path
) -> None:
    want = EXPECTED[run_set][regime]
    src = RUNS / run_set / regime
    assert src.is_dir(), f"{src} is not kept"
    work = tmp_path / regime
    shutil.copytree(src, work)
    bench = _bench()

    # The measurement checks read the kept raw /metrics dumps.
    checks = [
        bench.check_run(p) for p in sorted(work.iterdir()) if (p / "run.json").exists()
    ]
    finished = [c for c in checks if c["status_counts"].get("cancelled", 0) == 0]
    assert finished, "no drain-finished run to compare Σ cached_tokens on"
    for c in finished:
        assert c["cached_equals_counter"], c["run"]
    for c in checks:  # every first token is in the server's TTFT histogram once
        assert c["ttft_client_count"] == c["ttft_server_count"] > 0, c["run"]
        assert c["max_prompt_tokens"] > 100_000, c["run"]  # full-length contexts

    result = bench.predict_regime(
        work, want["fit"], weka_dir, host_tokens=want["host_tokens"],
        engine_out=tmp_path / "engine.json",
    )  # fmt: skip
    table = bench.table([result])
    assert table.count("\n") == 1 + len(want["held"])
    labels = [s["label"] for s in result["holdout"]]
    assert labels == want["held"]
    for setting in result["holdout"]:
        assert len(setting["runs"]) == 2, setting["label"]  # each level run twice
        for name, bound in want["bounds"].items():
            err = setting["figures"][name]["error"]
            assert err is not None, (setting["label"], name)
            assert math.isfinite(err), (setting["label"], name)
            assert abs(err) <= bound, (setting["label"], name, err)
