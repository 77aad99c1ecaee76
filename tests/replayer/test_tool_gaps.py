"""Tool time apart from human time in a replay: `--think-scale 0 --tool-scale 1`
keeps an imported session's tool waits and drops its human waits, in virtual time
and against the simulated endpoint on 127.0.0.1; the scales land in run.json."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from tests.builders import session, trace_of
from tests.processes import run_cli
from traces.importers import import_logs
from traces.io import read_trace, write_trace
from traces.model import Request
from traces.sendorder import send_order


def _rows(run_dir: Path) -> pd.DataFrame:
    rows = pd.read_parquet(run_dir / "requests")
    return rows.sort_values("request_index").reset_index(drop=True)


def _replay(command: str, trace: Path, out: Path, *flags: str) -> None:
    done = run_cli(command, str(trace), *flags, "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr


def _waits_ns(rows: pd.DataFrame) -> list[int]:
    """Each request's wait after the previous one ended (the first: from 0)."""
    ends = [0, *rows["end_ns"].tolist()[:-1]]
    return [int(s) - int(e) for s, e in zip(rows["scheduled_ns"], ends, strict=True)]


def test_claude_session_keeps_tool_waits_in_virtual_time(
    shared_data: Path, tmp_path: Path
) -> None:
    log = shared_data / "tracelab" / "claude" / "trace.json"
    trace = write_trace(
        import_logs("claude-code", [log], salt=b"k").trace, tmp_path / "c.jsonl"
    )
    reqs = list(read_trace(trace).sessions[0].requests)
    run_dir = tmp_path / "run"
    flags = ("--virtual", "sim", "--block-tokens", "16")
    _replay("run", trace, run_dir, *flags, "--think-scale", "0", "--tool-scale", "1")
    rows = _rows(run_dir)
    assert (rows["status"] == "ok").all()
    assert len(rows) == len(reqs) == 10
    # Each request is due its tool wait after the previous one ended, to the ns:
    # 19.291 s of tools before request 1, none of the user's 19.913 s before 5.
    # (A gap is whole ns, cut down: 19.291 s is 19,290,999,999.99... ns in binary.)
    want = [round((r.tool_wait_s or 0.0) * 1e9) for r in reqs]
    want[0] = 0
    waits = _waits_ns(rows)
    assert np.abs(np.subtract(waits, want)).max() <= 1
    assert abs(waits[1] - 19_291_000_000) <= 1
    assert waits[5] == 0
    assert reqs[5].human_wait_s == 19.913
    config = json.loads((run_dir / "run.json").read_text())["config"]
    assert (config["think_scale"], config["tool_scale"]) == (0.0, 1.0)
    # --tool-scale 0.5 --think-scale 1: half the tool time, all the user's.
    half = tmp_path / "half"
    _replay("run", trace, half, *flags, "--tool-scale", "0.5")
    waits = _waits_ns(_rows(half))
    assert abs(waits[1] - 9_645_500_000) <= 1
    assert abs(waits[5] - 19_913_000_000) <= 1


def test_send_order_model_and_engine_wait_the_same_gaps(
    shared_data: Path, tmp_path: Path
) -> None:
    # One gap rule: the offline send-order model (trace cache-curve's) and the
    # engine wait the same gap before each request of the imported Claude Code
    # session, under a think scale, a cap and a tool scale at once.
    log = shared_data / "tracelab" / "claude" / "trace.json"
    imported = import_logs("claude-code", [log], salt=b"k").trace
    trace = write_trace(imported, tmp_path / "c.jsonl")
    scales = {"think_scale": 0.5, "think_cap_s": 5.0, "tool_scale": 2.0}
    run_dir = tmp_path / "run"
    _replay(
        "run", trace, run_dir, "--virtual", "sim", "--block-tokens", "16",
        "--think-scale", "0.5", "--think-cap", "5", "--tool-scale", "2",
    )  # fmt: skip
    engine = _waits_ns(_rows(run_dir))
    sent = sorted(send_order(read_trace(trace), concurrency=1, **scales),
                  key=lambda s: s.index)  # fmt: skip
    model = [0.0] + [b.send_s - a.end_s for a, b in itertools.pairwise(sent)]
    assert len(engine) == len(model) == 10
    assert np.abs(np.subtract(engine, np.multiply(model, 1e9))).max() <= 1e3
    # The rule did scale both parts apart: tools doubled, the user's halved then
    # capped (19.913 s -> 5 s).
    assert abs(engine[1] - 2 * 19_291_000_000) <= 1e3
    assert abs(engine[5] - 5_000_000_000) <= 1e3


def _parted(think: float, tool: float, human: float, blocks: int) -> Request:
    return Request(
        input_tokens=blocks * 64,
        output_tokens=4,
        hash_ids=np.arange(1, blocks + 1, dtype=np.int64),
        think_time_s=think,
        tool_wait_s=tool,
        human_wait_s=human,
    )


def test_tool_gaps_in_start_times_against_the_simulator(tmp_path: Path) -> None:
    """The built-in simulated endpoint (an HTTP server on 127.0.0.1), wall clock:
    the human minute and the other 20 s are gone, the tool gaps stay."""
    trace = trace_of(
        session(
            "s",
            [
                _parted(0.0, 0.0, 0.0, 1),
                _parted(60.0, 0.3, 59.7, 2),  # a tool, then the user for a minute
                _parted(20.2, 0.2, 0.0, 3),  # a tool, then 20 s of other time
            ],
            block_size=64,
        )
    )
    path = write_trace(trace, tmp_path / "t.jsonl")
    run_dir = tmp_path / "run"
    scales = ("--think-scale", "0", "--tool-scale", "1")
    _replay("run", path, run_dir, *scales, "--sim-args", "--speed 50")
    rows = _rows(run_dir)
    assert (rows["status"] == "ok").all()
    waits = np.array(_waits_ns(rows)[1:])
    assert np.abs(waits - [300_000_000, 200_000_000]).max() <= 1
    assert (rows["start_ns"] >= rows["scheduled_ns"]).all()
    config = json.loads((run_dir / "run.json").read_text())["config"]
    assert config["tool_scale"] == 1.0
    # A sweep takes the flag too, and records it per level.
    sweep = tmp_path / "sw"
    levels = ("--concurrency", "1,2", "--virtual", "sim")
    _replay("sweep", path, sweep, *levels, "--think-scale", "0", "--tool-scale", "0")
    for level in ("c1", "c2"):
        meta = json.loads((sweep / level / "run.json").read_text())
        assert meta["config"]["tool_scale"] == 0.0
        assert _waits_ns(_rows(sweep / level))[1:] == [0, 0]
