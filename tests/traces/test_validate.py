"""Validation: every problem of a bad trace is found and located (file, line or
session, request index, field); nothing half-loaded is returned."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from traces import Problem, TraceFormatError, check_trace, read_trace


def _req(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"t": 0.0, "type": "n", "in": 130, "out": 5}
    base["hash_ids"] = [1, 2]  # 130 // 64 = 2 full blocks
    return {**base, **over}


def _session(
    sid: str = "s1", reqs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"id": sid, "block_size": 64, "requests": reqs or [_req()]}


def _problems(path: Path) -> list[Problem]:
    trace, problems = check_trace(path)
    assert (trace is None) == bool(problems)
    return problems


def _write(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize(
    ("request_fields", "field", "reason"),
    [
        ({"in": None}, "in", "missing"),
        ({"in": "130"}, "in", "expected an integer"),
        ({"out": -1}, "out", "must be >= 0"),
        ({"out": 1.5}, "out", "expected an integer"),
        ({"hash_ids": [1, 2, 3, 4]}, "hash_ids", "do not fit in=130"),
        ({"hash_ids": [1, 2.5]}, "hash_ids", "got float 2.5 at position 1"),
        ({"hash_ids": [1.0, 2.0]}, "hash_ids", "got float"),
        ({"hash_ids": [2**63, 1]}, "hash_ids", "outside int64"),
        ({"hash_ids": "1,2"}, "hash_ids", "expected a list"),
        ({"type": "x"}, "type", "expected 'n', 's' or 'subagent'"),
        ({"t": "now"}, "t", "expected a number"),
        ({"api_time": -3}, "api_time", "must be >= 0"),
        # Finite but absurd: stats printed 300 digits, a replay wrapped the gap to 0.
        ({"think_time": 1e308}, "think_time", "must be <= 100,000,000"),
        ({"think_time": 2**63 + 5}, "think_time", "must be <= 100,000,000"),
        ({"t": 1e308}, "t", "must be <= 100,000,000"),
        ({"tool_wait": 1e300}, "tool_wait", "must be <= 100,000,000"),
        ({"input_types": [1]}, "input_types", "list of strings"),
    ],
)
def test_validate_bad_request_field_is_located(
    tmp_path: Path, request_fields: dict[str, Any], field: str, reason: str
) -> None:
    bad = {k: v for k, v in _req(**request_fields).items() if v is not None}
    path = _write(tmp_path / "s.json", _session(reqs=[_req(), bad]))
    (problem,) = _problems(path)
    assert (problem.path, problem.session_id, problem.request_index) == (
        path,
        "s1",
        "1",
    )
    assert problem.field == field
    assert reason in problem.reason
    assert str(problem).startswith(f"{path}, session s1, request 1, field '{field}': ")


def test_validate_collects_every_problem_not_just_the_first(tmp_path: Path) -> None:
    sub = {"t": 1.0, "type": "subagent", "agent_id": "x", "requests": [_req(out=-2)]}
    reqs = [_req(**{"in": -1}), sub, _req(t=5.0, hash_ids=[1.5]), _req(t=2.0)]
    path = _write(tmp_path / "s.json", _session(reqs=reqs))
    got = {(p.request_index, p.field) for p in _problems(path)}
    # A bad `in` is not reported again as hash ids that do not fit it.
    assert got == {("0", "in"), ("1.0", "out"), ("2", "hash_ids"), ("3", "t")}
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert len(info.value.problems) == 4
    assert "(and 3 more problems)" in str(info.value)


def test_validate_time_going_backwards(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.json", _session(reqs=[_req(t=10.0), _req(t=9.0)]))
    (problem,) = _problems(path)
    assert (problem.request_index, problem.field) == ("1", "t")
    assert "backwards" in problem.reason


def test_validate_malformed_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    text = json.dumps(_session(), indent=2).replace('"out": 5', '"out": 5,,')
    path.write_text(text)
    (problem,) = _problems(path)
    bad_line = next(i for i, ln in enumerate(text.splitlines(), 1) if ",," in ln)
    assert problem.line == bad_line
    assert "malformed JSON" in problem.reason


def test_validate_jsonl_bad_line_among_good_ones(tmp_path: Path) -> None:
    lines = [json.dumps(_session(f"s{i}")) for i in range(4)]
    lines[2] = lines[2][:-5]  # truncated object on line 3
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (problem,) = _problems(path)
    assert problem.line == 3
    assert str(problem).startswith(f"{path}:3")


def test_validate_duplicate_session_ids_name_the_file(tmp_path: Path) -> None:
    _write(tmp_path / "a.json", _session("dup"))
    second = _write(tmp_path / "b.json", _session("dup"))
    (problem,) = _problems(tmp_path)
    assert (problem.path, problem.session_id, problem.field) == (second, "dup", "id")
    assert "duplicate session id" in problem.reason


@pytest.mark.parametrize("content", [b"", b"  \n\n"])
def test_validate_empty_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    (problem,) = _problems(path)
    assert problem.reason == "empty file"


def test_validate_bad_gzip_is_a_problem_of_that_file(tmp_path: Path) -> None:
    _write(tmp_path / "good.json", _session())
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b"x" * 100)[:20])
    (problem,) = _problems(tmp_path)
    assert problem.path == bad
    assert "gzip" in problem.reason


def test_validate_session_level_fields(tmp_path: Path) -> None:
    obj = {**_session(), "block_size": 0, "hash_id_scope": "world"}
    got = {p.field for p in _problems(_write(tmp_path / "s.json", obj))}
    assert {"block_size", "hash_id_scope"} <= got


def test_validate_mooncake_line_problems(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}
    bad = {**good, "output_length": -3, "hash_ids": [1, 2, 3]}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    got = {(p.line, p.field) for p in _problems(path)}
    assert got == {(2, "output_length"), (2, "hash_ids")}


def test_validate_mooncake_absurd_timestamp(tmp_path: Path) -> None:
    row = {"timestamp": 1e308, "input_length": 600, "output_length": 3}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (problem,) = _problems(path)
    assert (problem.line, problem.field) == (1, "timestamp")


def test_validate_subagent_absurd_duration_ms(tmp_path: Path) -> None:
    sub = {"t": 1.0, "type": "subagent", "agent_id": "x", "requests": [_req()]}
    reqs = [_req(), {**sub, "duration_ms": 1e308}, _req(t=2.0)]
    (problem,) = _problems(_write(tmp_path / "s.json", _session(reqs=reqs)))
    assert (problem.request_index, problem.field) == ("1", "duration_ms")


@pytest.mark.parametrize(
    "obj",
    [_session() | {"requests": []}, [_session() | {"requests": []}]],
    ids=["session", "list"],
)
def test_validate_trace_of_no_requests(tmp_path: Path, obj: object) -> None:
    path = _write(tmp_path / "s.json", obj)
    (problem,) = _problems(path)
    assert (problem.path, problem.reason) == (path, "trace holds no requests")


def test_validate_real_weka_sample_is_clean(weka_dir: Path) -> None:
    assert _problems(weka_dir) == []
