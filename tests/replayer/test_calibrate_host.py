"""The host tier calibrated against a hidden truth: the live simulator with a host
tier whose load costs a seeded bytes-per-token over a seeded bandwidth, in either
dialect, fitted from two levels and three others predicted (one past the GPU knee)."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from replayer.cli import main
from tests.builders import weka_cut
from tests.replayer.test_calibrate import TRUTH

# The step terms of the GPU-only hidden truth.
STEPS = TRUTH
# The hidden truth of the host tier: KV bytes a token (a 7-8B model's 64-160 KiB)
# over a host-to-device bandwidth of 6-12 GB/s, drawn from a seed the fit never
# sees; the fit reads the rows only.
_DICE = random.Random(36)
HOST_BYTES = _DICE.choice([65536, 98304, 131072, 163840])
HOST_GBS = round(_DICE.uniform(6.0, 12.0), 3)
HOST_US = HOST_BYTES / (HOST_GBS * 1e3)  # what one token's load costs, µs
# 12,288 GPU tokens and a 36,864-token host tier: 4 lanes of ~3,000-token prompts fit
# on the GPU, 9 and 12 lanes only with the host tier, which then serves most hits.
# Levels about the GPU's knee (3-8) are left out: there a live client's own send
# delays reorder arrivals from run to run, and a P90 TTFT sits between the cold and
# the warm prompts (its 95% interval +-30-50%; docs/engine-model.md).
SIM_ARGS = [
    "--block-size", "16", "--kv-capacity-tokens", "12288", "--max-model-len", "4096",
    "--host-capacity-tokens", "36864", "--host-hit-us-per-token", "0",
    "--host-bytes-per-token", str(HOST_BYTES), "--host-bandwidth-gbs", str(HOST_GBS),
    *(a for k, v in STEPS.items() for a in (f"--{k.replace('_', '-')}", str(v))),
]  # fmt: skip
TRAIN = (2, 10)
HOLDOUT = (1, 9, 12)
PAST_KNEE = 12


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def small_weka(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return weka_cut(weka_dir, tmp_path_factory.mktemp("weka-host"), 6)


def live(trace: Path, lanes: int, out: Path, dialect: str) -> Path:
    """A live run against the simulator: 6 s of load after a 0.5 s warm-up, its
    lanes kept busy (--loop), so that a P90 rests on a few hundred requests."""
    args = [*SIM_ARGS, "--host-dialect", dialect]
    result = _invoke(
        [
            "run", str(trace), "--concurrency", str(lanes), "--quiet",
            "--block-tokens", "2", "--max-input-tokens", "3000",
            "--think-scale", "0.01", "--think-cap", "0.1",
            "--warmup", "0.5", "--duration", "6", "--loop",
            "--sim-args", shlex.join(args), "--out", str(out),
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_calibrate_recovers_the_host_cost_and_predicts_each_tier(
    small_weka: Path, tmp_path: Path, dialect: str
) -> None:
    runs = {
        c: live(small_weka, c, tmp_path / f"c{c}", dialect) for c in (*TRAIN, *HOLDOUT)
    }
    engine = tmp_path / "ENGINE.json"
    args = ["calibrate", *(str(runs[c]) for c in TRAIN), "-o", str(engine), "--json"]
    for c in HOLDOUT:
        args += ["--holdout", str(runs[c])]
    result = _invoke(args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    fitted = json.loads(engine.read_text())
    host = fitted["fit"]["host"]
    assert host["fitted"], host
    assert host["capacity_tokens"] == 36864
    assert fitted["cache"]["host_capacity_tokens"] == 36864
    fitted_us = fitted["steps"]["host_hit_us_per_token"]
    assert fitted_us == pytest.approx(HOST_US, rel=0.10)
    assert host["median_rel_residual"] < 0.10
    for held in doc["holdout"]:
        figs = held["figures"]
        for name in ("ttft_p90_ms", "e2e_p90_ms"):
            assert abs(figs[name]["error"]) <= 0.10, (held["label"], name, figs[name])
        for name in ("gpu_hit_rate", "host_hit_rate", "hit_rate"):
            assert abs(figs[name]["error"]) <= 2.0, (held["label"], name, figs[name])
    past = next(h for h in doc["holdout"] if h["label"] == f"concurrency {PAST_KNEE}")
    tiers = past["figures"]
    assert tiers["host_hit_rate"]["measured"] > tiers["gpu_hit_rate"]["measured"]
