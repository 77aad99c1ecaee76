"""The JSON contracts hold byte for byte: `analyze` (--json and the table) over fixed
run directories, `capacity --json`, `trace cache-curve --json` and run.json of
virtual runs give what tests/data/golden/make.py captured; run.json files read and
written back, and capacity.json, are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayer.records import CapacityDoc, RunMeta
from replayer.records.rundir import strict_json
from tests.data.golden.make import INPUTS, OUTPUTS, outputs


def test_json_outputs_match_golden(tmp_path: Path) -> None:
    got = outputs(tmp_path)
    want = {p.name: p.read_text() for p in OUTPUTS.iterdir()}
    assert sorted(got) == sorted(want)
    differ = [name for name in sorted(got) if got[name] != want[name]]
    assert not differ, f"differ from the golden files: {differ}"


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(INPUTS) for p in INPUTS.rglob("run*.json")),
    ids=str,
)
def test_run_json_reads_and_writes_back_unchanged(path: Path) -> None:
    text = (INPUTS / path).read_text()
    meta = RunMeta.from_dict(json.loads(text))
    again = json.dumps(strict_json(meta.as_dict()), indent=2, default=str) + "\n"
    assert again == text


def test_capacity_json_reads_and_writes_back_unchanged() -> None:
    text = (INPUTS / "capacity" / "capacity.json").read_text()
    doc = CapacityDoc.from_dict(json.loads(text))
    assert doc.result is not None
    assert len(doc.cells) == doc.result.cells == 3
    again = json.dumps(strict_json(doc.as_dict()), indent=2, default=str) + "\n"
    assert again == text


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(INPUTS) for p in INPUTS.rglob("run.json")),
    ids=str,
)
def test_run_json_config_reads_as_a_typed_replay_config(path: Path) -> None:
    obj = json.loads((INPUTS / path).read_text())
    config = RunMeta.from_dict(obj).config
    assert config.replay is not None
    recorded = obj["config"]
    assert config.replay.schedule == _schedule(recorded["schedule"])
    assert config.replay.think_scale == recorded["think_scale"]
    assert config.replay.prompt.salt == recorded["prompt"]["salt"]
    assert config.replay.endpoint.model == recorded["endpoint"]["model"]


def _schedule(d: dict[str, object]) -> object:
    from replayer.config import Lanes, RateArrivals, TraceTimestamps

    kinds = {
        "concurrency": Lanes,
        "session_rate": RateArrivals,
        "timestamps": TraceTimestamps,
    }
    rest = {k: v for k, v in d.items() if k != "kind"}
    return kinds[str(d["kind"])](**rest)  # type: ignore[arg-type]


def test_replay_config_round_trips_through_its_metadata() -> None:
    from dataclasses import replace

    from replayer.config import EndpointConfig, RateArrivals, ReplayConfig
    from replayer.errors import ConfigError
    from replayer.records import RecordedConfig
    from traces.materialize import PromptConfig

    config = ReplayConfig(
        endpoint=EndpointConfig(
            base_url="http://u:pw@127.0.0.1:9/v1?api_key=s",
            model="m",
            api="chat",
            api_key=None,
            total_timeout_s=30.0,
            session_token_header="x-session-token",
        ),
        prompt=PromptConfig(api="chat", salt="s", block_tokens=32, tokenizer="t.json"),
        schedule=RateArrivals(session_rate=0.5, arrival="gamma", burstiness=2.0),
        think_scale=0.25,
        think_cap_s=3.0,
        labels={"engine": "vllm"},
        sim_args=("--kv-blocks", "400"),
        on_error="continue",
        session_routing="dynamo-full",
        output_scale=0.5,
        max_output_tokens=64,
        fit_context="clamp",
        max_model_len=4096,
        virtual="ENGINE.json",
    )
    back = ReplayConfig.from_metadata(config.as_metadata())
    # Only what run.json must not hold differs: the URL's credentials and secrets.
    assert back == replace(
        config,
        endpoint=replace(config.endpoint, base_url="http://127.0.0.1:9/v1?api_key=***"),
    )
    keyed = replace(
        config.endpoint, base_url="http://127.0.0.1:9/v1", api_key="sk-secret-42"
    )
    recorded = RecordedConfig.of(replace(config, endpoint=keyed))
    assert recorded.api_key_set
    assert "sk-secret-42" not in json.dumps(recorded.as_dict())
    assert RecordedConfig.from_dict(recorded.as_dict()).api_key_set
    with pytest.raises(ConfigError, match="recorded config"):
        ReplayConfig.from_metadata({"think_scale": -1})
    with pytest.raises(ConfigError, match="schedule kind"):
        ReplayConfig.from_metadata({"schedule": {"kind": "bursty"}})
    assert RecordedConfig.from_dict({"schedule": {"kind": "x"}}).replay is None
