"""`--config FILE` through the real command (subprocesses): TOML option values, a
run's run.json replayed again against another server, and a bad file as one line,
exit status 2, naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.builders import growing_session, trace_of
from tests.processes import run_cli
from traces.io import write_trace

_cli = run_cli


def _trace(tmp_path: Path) -> Path:
    trace = trace_of(
        *(growing_session(f"s{k}", 3, think=0.05, block_size=16) for k in range(2))
    )
    return write_trace(trace, tmp_path / "t.jsonl")


def _config(run_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((run_dir / "run.json").read_text())["config"]
    return config


def test_cli_config_toml_sets_options_and_typed_flags_win(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        "concurrency = 2\nthink-scale = 0.5\nthink_cap = 2\nblock-tokens = 8\n"
        'virtual = "sim"\nquiet = true\nno-replay-markers = true\n'
        'label = ["team=kv", "rack=7"]\nengine = "vllm"\ntp = 2\n'
        'sim-args = ["--speed", "50"]\napi = "chat"\n'
    )
    out = tmp_path / "run"
    res = _cli(
        "run", str(_trace(tmp_path)), "--config", str(toml), "--think-scale", "0.25",
        "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    cfg = _config(out)
    assert cfg["think_scale"] == 0.25  # typed beats the file's 0.5
    assert cfg["think_cap_s"] == 2.0
    assert cfg["schedule"] == {"kind": "concurrency", "concurrency": 2}
    assert cfg["prompt"]["block_tokens"] == 8
    assert cfg["prompt"]["replay_markers"] is False
    assert cfg["endpoint"]["api"] == "chat"
    assert cfg["virtual"] == "sim"
    assert cfg["sim_args"] == ["--speed", "50"]
    assert (
        cfg["labels"] | {"team": "kv", "rack": "7", "engine": "vllm", "tp": 2}
        == (cfg["labels"])
    )


@pytest.mark.timeout(180)
def test_cli_config_run_json_reproduces_a_run_against_another_server(
    tmp_path: Path,
) -> None:
    from replayer.sim.process import running_sim

    trace = _trace(tmp_path)
    first = tmp_path / "first"
    res = _cli(
        "run", str(trace), "--concurrency", "2", "--think-scale", "0.5",
        "--think-cap", "1", "--block-tokens", "8", "--api", "chat",
        "--max-input-tokens", "4000", "--token-range", "2000-9000", "--seed", "3",
        "--no-vllm-extras", "--read-timeout", "30", "--session-routing", "sglang",
        "--start-ratio", "0.2-0.6", "--on-error", "continue", "--loop",
        "--duration", "2", "--drain", "cancel", "--engine", "sim", "--tp", "2",
        "--label", "team=kv", "--quiet", "--out", str(first),
        "--sim-args", "--speed 50",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    with running_sim(["--speed", "50"]) as url:
        again = tmp_path / "again"
        res = _cli(
            "run", str(trace), "--config", str(first / "run.json"),
            "--endpoint", url, "--out", str(again),
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    old, new = _config(first), _config(again)
    # Endpoint-derived: the server's URL, and the built-in simulator's options
    # (which no server behind --endpoint takes).
    # (The two servers may have had the same port, which the system may reuse.)
    old["endpoint"].pop("base_url")
    assert new["endpoint"].pop("base_url") == url
    assert old.pop("sim_args") == ["--speed", "50"]
    assert new.pop("sim_args") == []
    assert new == old
    assert json.loads((again / "run.json").read_text())["simulated"] is False


def test_cli_config_run_json_serves_sweep_and_capacity(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    first = tmp_path / "first"
    res = _cli(
        "run", str(trace), "--virtual", "sim", "--concurrency", "2",
        "--think-scale", "0.5", "--block-tokens", "8", "--seed", "5", "--quiet",
        "--out", str(first),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    old = _config(first)
    sweep = tmp_path / "sweep"
    res = _cli(
        "sweep", str(trace), "--config", str(first), "--concurrency", "1",
        "--out", str(sweep),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    cap = tmp_path / "cap"
    res = _cli(
        "capacity", str(trace), "--config", str(first / "run.json"), "--slo",
        "ttft=100s", "--max-cells", "1", "--duration", "1", "--out", str(cap),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for run_dir in (sweep / "c1", next(cap.glob("c*/"))):
        cfg = _config(run_dir)
        for field in ("think_scale", "seed", "virtual", "prompt"):
            if field == "prompt":  # a study draws a fresh salt per level
                assert cfg[field].pop("salt") != old[field]["salt"]
                assert cfg[field] == {
                    k: v for k, v in old[field].items() if k != "salt"
                }
            else:
                assert cfg[field] == old[field]
        assert cfg["schedule"] == {"kind": "concurrency", "concurrency": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("concurency = 2", "unknown key 'concurency' (did you mean 'concurrency'?)"),
        ('concurrency = "two"', "'concurrency': expected an integer, got a string"),
        ("think-scale = true", "'think-scale': expected a number, got a boolean"),
        ("loop = 1", "'loop': expected true or false"),
        ("concurrency = 0", "'concurrency': 0 is not in the range"),
        ('api = "nope"', "'api': 'nope' is not one of"),
        ("[endpoint]\nurl = 1", "'endpoint': expected a string, got a table"),
        ("concurrency = [", "not TOML"),
        ('api-key = "sk-file-secret-7"', "'api-key': an API key is never read"),
    ],
)
def test_cli_config_bad_toml_is_one_line_exit_2(
    tmp_path: Path, text: str, expected: str
) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(text + "\n")
    out = tmp_path / "run"
    res = _cli(
        "run", str(_trace(tmp_path)), "--config", str(toml), "--virtual", "sim",
        "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith(f"Error: {toml}: {expected}"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "sk-file-secret-7" not in res.stdout + res.stderr
    assert not out.exists()


def test_cli_config_bad_run_json_is_one_line_exit_2(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    for body, expected in [
        ('{"config": {"schedule": {}, "warp": 1}}', "config.warp: a field no option"),
        ('{"config": {"schedule": {}, "think_scale": "x"}}', "'config.think_scale'"),
        ("[1, 2]", "expected a JSON object"),
        ("{nope", "not JSON"),
    ]:
        path = tmp_path / "run.json"
        path.write_text(body)
        res = _cli("run", str(trace), "--config", str(path), "--virtual", "sim")
        assert res.returncode == 2, body
        assert res.stderr.startswith(f"Error: {path}: "), res.stderr
        assert expected in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_cli_config_api_key_comes_from_the_environment_never_the_files(
    tmp_path: Path,
) -> None:
    secret = "sk-env-secret-8"
    toml = tmp_path / "c.toml"
    toml.write_text('api-key-env = "MY_KEY"\nvirtual = "sim"\nquiet = true\n')
    first = tmp_path / "first"
    res = _cli(
        "run", str(_trace(tmp_path)), "--config", str(toml), "--out", str(first),
        env={"MY_KEY": secret},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert _config(first)["endpoint"]["api_key_set"] is True
    again = tmp_path / "again"
    res = _cli(
        "run", str(_trace(tmp_path)), "--config", str(first), "--out", str(again),
        env={"MY_KEY": secret, "OPENAI_API_KEY": ""},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert _config(again)["endpoint"]["api_key_set"] is False  # no key is recorded
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_cli_config_a_typed_choice_replaces_the_files(tmp_path: Path) -> None:
    # A typed --session-rate replaces the file's lanes, and --session-routing its
    # header, instead of clashing with them; what they do not contradict stays.
    toml = tmp_path / "c.toml"
    toml.write_text(
        'concurrency = 2\nvirtual = "sim"\nquiet = true\nsession-header = "x-a"\n'
    )
    out = tmp_path / "run"
    res = _cli(
        "run", str(_trace(tmp_path)), "--config", str(toml), "--session-rate", "50",
        "--session-routing", "dynamo", "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    cfg = _config(out)
    assert cfg["schedule"]["kind"] == "session_rate"
    assert cfg["session_header"] == "x-dynamo-session-id"
    assert cfg["virtual"] == "sim"  # not contradicted: kept
