"""`replayer run --ray` on a real two-node Ray cluster on this machine (`ray start
--head` and a second `ray start --address`, one CPU and a 100 MB object store each,
no dashboard): the same rows as one process, from both nodes; an actor killed
mid-run ends the run with one line and the other actor's rows stay readable."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tests.builders import growing_session, trace_of
from traces.io import write_trace

pytest.importorskip("ray", reason="the Ray tests need the [ray] extra (or [test])")

REPLAYER = [sys.executable, "-m", "replayer"]
RAY = str(Path(sys.executable).with_name("ray"))
SMALL_NODE = ["--num-cpus", "1", "--object-store-memory", "100000000"]
SMALL_NODE += ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray(*args: str) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([RAY, *args], check=True, capture_output=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """Two Ray nodes on this machine; their address. Stopped after the module."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    try:
        _ray("start", "--head", "--port", str(port), "--include-dashboard=false",
             *SMALL_NODE)  # fmt: skip
        _ray("start", "--address", address, *SMALL_NODE)
        yield address
    finally:
        _ray("stop")


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REPLAYER, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _trace(path: Path, sessions: int, turns: int, out: int) -> Path:
    trace = trace_of(
        *(
            growing_session(f"s{k}", turns, think=0.02, out=out, block_size=16)
            for k in range(sessions)
        )
    )
    return write_trace(trace, path)


def test_ray_two_nodes_give_the_rows_of_one_process(
    ray_cluster: str, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=8, turns=6, out=8)
    common = ["--concurrency", "4", "--quiet", "--sim-args", "--speed 50"]
    ray = _cli("run", str(trace), "--ray", ray_cluster, "--out", str(tmp_path / "ray"),
               *common)  # fmt: skip
    assert ray.returncode == 0, ray.stderr
    one = _cli("run", str(trace), "--out", str(tmp_path / "one"), *common)
    assert one.returncode == 0, one.stderr
    keys = ["session_id", "request_index"]
    by_ray = pd.read_parquet(tmp_path / "ray" / "requests")
    by_one = pd.read_parquet(tmp_path / "one" / "requests")
    assert not by_ray.duplicated(keys).any()
    assert set(map(tuple, by_ray[keys].to_numpy())) == set(
        map(tuple, by_one[keys].to_numpy())
    )
    assert len(by_ray) == 48
    assert (by_ray["status"] == "ok").all()
    # Two actors, one per node, each owning whole session trees.
    assert sorted(by_ray["worker_id"].unique()) == [0, 1]
    assert by_ray.groupby("root_session_id")["worker_id"].nunique().max() == 1
    meta = json.loads((tmp_path / "ray" / "run.json").read_text())
    actors = meta["ray"]["actors"]
    assert len({a["node_id"] for a in actors}) == 2
    assert all(isinstance(a["clock_offset_ns"], int) for a in actors)
    assert meta["counts"]["ok"] == 48
    assert meta["mode"]["concurrency"] == 4
    assert [
        json.loads((tmp_path / "ray" / f"run-worker-{k:03d}.json").read_text())["mode"][
            "concurrency"
        ]
        for k in range(2)
    ] == [2, 2]  # the global concurrency, split exactly
    assert "limited" in meta["client_check"]


def _actor_pids() -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(b"ray::ReplayActor"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return sorted(pids)


def test_ray_killed_actor_ends_the_run_with_one_line_and_keeps_rows(
    ray_cluster: str, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=4, turns=40, out=50)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*REPLAYER, "run", str(trace), "--ray", ray_cluster, "--concurrency", "2",
         "--out", str(run_dir), "--quiet", "--sim-args", "--speed 1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            parts = list((run_dir / "requests").glob("part-*.parquet"))
            if {p.name[:8] for p in parts} == {"part-000", "part-001"}:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        pids = _actor_pids()
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Ray actor" in lines[0]
    assert "died" in lines[0]
    assert " on node " in lines[0]
    df = pd.read_parquet(run_dir / "requests")
    assert sorted(df["worker_id"].unique()) == [0, 1]  # the dead one's flushed rows
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["error"].startswith("Ray actor")
    (died,) = [x for x in meta["ray"]["lost"] if x["status"] == "died"]
    assert died["unfinished_sessions"]
    analyzed = _cli("analyze", str(run_dir), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert json.loads(analyzed.stdout)["ok"] > 0
