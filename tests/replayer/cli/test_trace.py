"""`replayer trace stats|validate|convert`: exit codes, one line per problem, never a
traceback; one run goes through a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from replayer.cli import main

_GOOD = {
    "id": "s1",
    "block_size": 64,
    "requests": [{"t": 0, "type": "n", "in": 130, "out": 5, "hash_ids": [1, 2]}],
}


def _invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result


def _bad_folder(tmp_path: Path) -> Path:
    bad = json.loads(json.dumps(_GOOD))
    bad["requests"].append({"t": 0, "type": "n", "in": -5, "out": 1, "hash_ids": [1.5]})
    (tmp_path / "a.json").write_text(json.dumps(bad))
    (tmp_path / "b.jsonl").write_text(json.dumps(_GOOD) + "\n{oops\n")
    return tmp_path


def test_cli_trace_validate_prints_every_problem_and_exits_1(tmp_path: Path) -> None:
    folder = _bad_folder(tmp_path)
    result = _invoke("trace", "validate", folder)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert f"{folder / 'a.json'}, session s1, request 1, field 'in': " in lines[0]
    assert any(
        ln.startswith(f"{folder / 'a.json'}, session s1, request 1, field 'hash_ids'")
        for ln in lines
    )
    assert any(ln.startswith(f"{folder / 'b.jsonl'}:2: malformed JSON") for ln in lines)
    # b.jsonl line 1 repeats session s1 from a.json.
    assert any("duplicate session id" in ln for ln in lines)
    assert len(lines) == 4


def test_cli_trace_validate_good_trace_exits_0(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_GOOD))
    result = _invoke("trace", "validate", tmp_path / "t.json")
    assert result.exit_code == 0
    assert result.stdout.startswith("ok: 1 sessions, 1 requests")


@pytest.mark.parametrize("think", [1e308, 2**63 + 5])
@pytest.mark.parametrize("command", ["stats", "run"])
def test_cli_trace_absurd_think_time_is_refused_naming_where(
    tmp_path: Path, think: float, command: str
) -> None:
    bad = json.loads(json.dumps(_GOOD))
    bad["requests"].append({**bad["requests"][0], "t": 1, "think_time": think})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(bad))
    argv: list[str | Path] = (
        ["trace", "stats", path] if command == "stats" else ["run", path]
    )
    if command == "run":
        argv += ["--virtual", "sim", "--quiet", "--out", tmp_path / "run"]
    result = _invoke(*argv)
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {path}, session s1, request 1, field 'think_time': must be <= "
        f"100,000,000 (~3 years; got {think:.6g})\n"
    )
    assert not (tmp_path / "run").exists()
    assert _invoke("trace", "validate", path).exit_code == 1


def test_cli_trace_stats_on_bad_file_is_one_line_exit_2(tmp_path: Path) -> None:
    result = _invoke("trace", "stats", _bad_folder(tmp_path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: ")


@pytest.mark.parametrize("command", ["stats", "validate", "convert"])
def test_cli_trace_missing_path_exits_2(tmp_path: Path, command: str) -> None:
    args = ["trace", command, tmp_path / "nope.json"]
    result = _invoke(
        *args, *(["-o", tmp_path / "o.jsonl"] if command == "convert" else [])
    )
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_cli_trace_validate_unreadable_and_empty(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    result = _invoke("trace", "validate", tmp_path / "empty.jsonl")
    assert result.exit_code == 1
    assert result.stdout.strip() == f"{tmp_path / 'empty.jsonl'}: empty file"
    # A folder without trace files: a one-line error, not a traceback.
    (tmp_path / "nothing").mkdir()
    result = _invoke("trace", "validate", tmp_path / "nothing")
    assert result.exit_code == 2
    assert "holds no trace files" in result.stderr


def test_cli_trace_stats_json_contract(weka_dir: Path) -> None:
    result = _invoke("trace", "stats", weka_dir, "--json")
    assert result.exit_code == 0
    d = json.loads(result.stdout)
    for key in ("sessions", "requests", "sessions_with_subagents", "subagent_sessions"):
        assert isinstance(d[key], int)
    for key in ("input_tokens", "output_tokens"):
        assert set(d[key]) >= {"mean", "p50", "p90", "p99", "max"}
    assert 0 < d["ideal_cache_hit_rate"] < 1
    assert d["sessions"] == 30


def test_cli_trace_convert_then_stats_agree(weka_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.parquet"
    result = _invoke("trace", "convert", weka_dir, "-o", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out} (30 sessions")
    a = json.loads(_invoke("trace", "stats", weka_dir, "--json").stdout)
    b = json.loads(_invoke("trace", "stats", out, "--json").stdout)
    assert a.pop("source_format") == "weka"
    assert b.pop("source_format") == "parquet"
    assert a == b


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_cli_trace_real_subprocess(tmp_path: Path) -> None:
    folder = _bad_folder(tmp_path)
    bad = _run("trace", "validate", folder)
    assert bad.returncode == 1
    assert len(bad.stdout.splitlines()) == 4
    stats = _run("trace", "stats", folder)
    assert stats.returncode == 2
    assert len(stats.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("source", ["bailian", "burstgpt"])
def test_cli_trace_import_of_an_impossible_file_name(
    tmp_path: Path, source: str
) -> None:
    # Found by the CLI fuzz test: a NUL in the name was a ValueError traceback.
    res = _invoke("trace", "import", source, "a\x00b", "-o", tmp_path / "t.jsonl")
    assert res.exit_code == 2
    assert "not a file name" in res.output
