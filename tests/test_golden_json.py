"""The JSON contracts hold: `analyze` (--json and the table) over fixed run
directories, `capacity --json`, `trace cache-curve --json` and run.json of virtual
runs keep every key and line that tests/data/golden/make.py captured (added ones are
fine); run.json files read and written back, and capacity.json, are unchanged."""

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
    differ = {
        name: why
        for name in sorted(got)
        if (why := _kept(name, want[name], got[name])) is not None
    }
    assert not differ, f"differ from the golden files: {differ}"


def _kept(name: str, want: str, got: str) -> str | None:
    """Why ``got`` breaks the contract ``want`` states, or None: every JSON key the
    golden file has keeps its value (added keys are fine); every line of a text
    output is still there, in order (added lines are fine)."""
    if name.endswith(".json"):
        return _kept_json(json.loads(want), json.loads(got), "")
    lines = iter(got.splitlines())
    for line in want.splitlines():
        if not any(line == have for have in lines):
            return f"line lost or changed: {line!r}"
    return None


def _kept_json(want: object, got: object, where: str) -> str | None:
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{where or '/'}: not an object"
        for key, value in want.items():
            if key not in got:
                return f"{where}/{key}: key lost"
            if (why := _kept_json(value, got[key], f"{where}/{key}")) is not None:
                return why
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where}: list changed length"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if (why := _kept_json(a, b, f"{where}[{i}]")) is not None:
                return why
        return None
    return None if want == got else f"{where}: {want!r} -> {got!r}"


def test_golden_check_fails_on_a_lost_key_or_a_changed_value() -> None:
    want = '{"a": {"b": 1, "c": [1, 2]}, "d": "x"}'
    assert (
        _kept("f.json", want, '{"a": {"b": 1, "c": [1, 2], "e": 0}, "d": "x"}') is None
    )
    assert _kept("f.json", want, '{"a": {"c": [1, 2]}, "d": "x"}') == "/a/b: key lost"
    assert _kept("f.json", want, '{"a": {"b": 2, "c": [1, 2]}, "d": "x"}') is not None
    assert _kept("f.json", want, '{"a": {"b": 1, "c": [1]}, "d": "x"}') is not None
    assert _kept("f.txt", "x\ny\n", "x\nnew\ny\n") is None
    assert _kept("f.txt", "x\ny\n", "y\nx\n") is not None


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
    # Every key it had, unchanged; keys added since (the result's source, the
    # search's engine model) are fine.
    assert _kept("capacity.json", text, again) is None
    assert json.loads(again)["result"]["source"] == "live"  # it does not say


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
