"""Calibration: a config fitted to the real Weka sample generates look-alike traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from replayer.cli import main
from traces.distributions import ks_distance
from traces.fit import fit_config
from traces.generate import GeneratorConfig, generate_trace
from traces.io import read_trace
from traces.model import Trace

KS_GOAL = 0.05


def _columns(trace: Trace) -> dict[str, np.ndarray]:
    threads = [s for s, _ in trace.all_sessions()]
    reqs = [r for s in threads for r in s.requests]
    return {
        "input": np.array([r.input_tokens for r in reqs]),
        "output": np.array([r.output_tokens for r in reqs]),
        "think": np.array([r.think_time_s for s in threads for r in s.requests[1:]]),
    }


@pytest.fixture(scope="module")
def weka(weka_dir: Path) -> Trace:
    return read_trace(weka_dir)


def test_fit_weka_generates_matching_distributions(weka: Trace) -> None:
    config = fit_config(weka)
    real = _columns(weka)
    for seed in (0, 1):
        fake = _columns(generate_trace(config, sessions=60, seed=seed))
        for key in real:
            assert ks_distance(real[key], fake[key]) <= KS_GOAL, key


def test_fit_weka_structure(weka: Trace) -> None:
    config = fit_config(weka)
    assert config.default_sessions == 30
    assert config.subagent_session_fraction == pytest.approx(9 / 30)
    assert config.block_size == 64
    assert not config.global_prefix
    assert config.session_rate_per_s is None
    generated = generate_trace(config, sessions=30, seed=0)
    assert sum(1 for s in generated.sessions if s.subagents) == 9
    assert GeneratorConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_cli_generate_calibrate_from_and_save(tmp_path: Path, weka_dir: Path) -> None:
    cfg = tmp_path / "fit.json"
    out = tmp_path / "cal.jsonl.gz"
    result = CliRunner().invoke(
        main,
        [
            *("generate", "-o", str(out), "--calibrate-from", str(weka_dir)),
            *("--save-config", str(cfg), "--sessions", "10"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "calibrated" in result.output
    assert len(read_trace(out)) == 10
    assert json.loads(cfg.read_text())["name"] == "calibrated"
