"""Calibration: a config fitted to the real Weka sample generates look-alike traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from replayer.cli import main
from traces.fit import fit_config, ks_distances
from traces.generate import GeneratorConfig, generate_trace
from traces.io import read_trace
from traces.model import Trace

KS_GOAL = 0.05


@pytest.fixture(scope="module")
def weka(weka_dir: Path) -> Trace:
    return read_trace(weka_dir)


def test_fit_weka_generates_matching_distributions(weka: Trace) -> None:
    config = fit_config(weka)
    for seed in (0, 1):
        ks = ks_distances(weka, generate_trace(config, sessions=60, seed=seed))
        assert set(ks) == {"input_tokens", "output_tokens", "think_time_s"}
        for key, distance in ks.items():
            assert distance <= KS_GOAL, key


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
