"""`replayer run --ray` on a real two-node Ray cluster on this machine (two nodes of
`ray.cluster_utils.Cluster`, one CPU and a 100 MB object store each, no dashboard,
every listener on loopback): the same rows as one process, from both nodes; an actor
killed mid-run ends the run with one line and the other actor's rows stay readable.
`replayer sweep --ray` and `replayer capacity --ray` run each level or cell there,
one actor per lane up to one per node.

Loopback only: Ray 2.60 listens on loopback only when a node's IP is exactly
127.0.0.1 (else its GCS and raylets listen on every interface). `ray start
--node-ip-address 127.0.0.1` swaps that for the machine's routable address unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which in turn stops `ray start --address` from
adding a node; so the nodes are `Cluster` nodes given 127.0.0.1
(``tests.ray_cluster``), and the driver (`replayer run`, `sweep` or `capacity`,
which inherit the variable) finds its node there. The tests check that every
listening socket of the cluster's processes (actors included, mid-run) is on
loopback."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.builders import growing_session, trace_of
from tests.processes import REPLAYER, run_cli
from tests.ray_cluster import (
    ClusterDidNotStart,
    beyond_loopback,
    listening,
    loopback_cluster,
    ray_pids,
    replay_actors,
)
from traces.io import write_trace

pytest.importorskip("ray", reason="the Ray tests need the [ray] extra (or [test])")
# Each test waits up to 240 s for one command, the first also for the cluster.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[Any]:
    """Two Ray nodes on this machine, on loopback (a ``Cluster``). Stopped after the
    module. Skips the module, saying why, when the host is too loaded for the
    nodes to register within a deadline that grows with its load."""
    try:
        with loopback_cluster(2) as cluster:
            yield cluster
    except ClusterDidNotStart as exc:
        pytest.skip(str(exc))


@pytest.fixture
def ray_cluster(ray_nodes: Any) -> str:
    """The two nodes' address."""
    return str(ray_nodes.address)


def _assert_loopback_only(cluster: Any) -> None:
    """Nothing of the cluster's (GCS, raylets, agents, workers) listens beyond
    loopback."""
    listeners = listening(ray_pids(cluster))
    assert listeners
    assert beyond_loopback(listeners) == {}, listeners


_cli = functools.partial(run_cli, timeout=240)


def _trace(path: Path, sessions: int, turns: int, out: int) -> Path:
    trace = trace_of(
        *(
            growing_session(f"s{k}", turns, think=0.02, out=out, block_size=16)
            for k in range(sessions)
        )
    )
    return write_trace(trace, path)


def test_ray_two_nodes_give_the_rows_of_one_process(
    ray_nodes: Any, ray_cluster: str, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=8, turns=6, out=8)
    common = ["--concurrency", "4", "--quiet", "--sim-args", "--speed 50"]
    # Paths relative to where the command runs: the actors must not read them
    # relative to Ray's own working directory.
    ray = _cli("run", trace.name, "--ray", ray_cluster, "--out", "ray", *common,
               cwd=tmp_path)  # fmt: skip
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
    _assert_loopback_only(ray_nodes)


def test_ray_killed_actor_ends_the_run_with_one_line_and_keeps_rows(
    ray_nodes: Any, ray_cluster: str, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=4, turns=40, out=50)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*REPLAYER, "run", str(trace), "--ray", ray_cluster, "--concurrency", "2",
         "--out", str(run_dir), "--quiet", "--sim-args", "--speed 1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its simulator goes down with it
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            parts = list((run_dir / "requests").glob("part-*.parquet"))
            if {p.name[:8] for p in parts} == {"part-000", "part-001"}:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        pids = replay_actors(ray_pids(ray_nodes))
        assert len(pids) == 2
        # The actors mid-run listen on loopback too (their core workers' gRPC).
        _assert_loopback_only(ray_nodes)
        os.kill(pids[1], signal.SIGKILL)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
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


def test_ray_actor_count_is_one_per_node_and_at_most_one_per_lane() -> None:
    from replayer.config import EndpointConfig, Lanes, RateArrivals, ReplayConfig
    from replayer.runner.ray_actors import actor_count

    def config(**fields: Any) -> ReplayConfig:
        return ReplayConfig(endpoint=EndpointConfig(), **fields)

    assert actor_count(config(schedule=Lanes(concurrency=1)), 2) == 1
    assert actor_count(config(schedule=Lanes(concurrency=2)), 2) == 2
    assert actor_count(config(schedule=Lanes(concurrency=8)), 3) == 3
    assert actor_count(config(schedule=RateArrivals(session_rate=0.5)), 2) == 2
    # A count the user asked for stands (check_split refuses an idle actor).
    asked = config(schedule=Lanes(concurrency=1), ray_workers=4)
    assert actor_count(asked, 2) == 4


def _nodes_of_rows(run_dir: Path) -> set[str]:
    """The Ray nodes whose actors wrote ``run_dir``'s rows (run.json ``ray.actors``
    maps each worker id to its node)."""
    actors = json.loads((run_dir / "run.json").read_text())["ray"]["actors"]
    node = {a["worker_id"]: a["node_id"] for a in actors}
    df = pd.read_parquet(run_dir / "requests", columns=["worker_id"])
    return {node[int(k)] for k in df["worker_id"].unique()}


def _study(
    command: str, cluster: str, tmp_path: Path, turns: int, *args: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`replayer COMMAND` (sweep or capacity) with ``args`` on the cluster: four
    sessions of ``turns`` turns, no think time, against the built-in sim at 50x."""
    trace = _trace(tmp_path / "t.jsonl", sessions=4, turns=turns, out=8)
    out = tmp_path / command
    r = _cli(command, str(trace), *args, "--ray", cluster, "--out", str(out),
             "--think-scale", "0", "--quiet", "--sim-args", "--speed 50")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out, r


def test_ray_sweep_runs_each_level_on_the_cluster(
    ray_nodes: Any, ray_cluster: str, tmp_path: Path
) -> None:
    out, _ = _study("sweep", ray_cluster, tmp_path, 4, "--concurrency", "1,2")
    assert json.loads((out / "sweep.json").read_text()) == {"levels": ["c1", "c2"]}
    keys = ["session_id", "request_index"]
    for level, n in (("c1", 1), ("c2", 2)):
        df = pd.read_parquet(out / level / "requests")
        assert len(df) == 16
        assert not df.duplicated(keys).any()
        assert (df["status"] == "ok").all()
        meta = json.loads((out / level / "run.json").read_text())
        assert meta["mode"]["concurrency"] == n
        assert meta["counts"]["ok"] == 16
        # One actor per lane, at most one per node: c1 on one node, c2 on both.
        assert len(meta["ray"]["actors"]) == n
        assert sorted(df["worker_id"].unique()) == list(range(n))
        assert len(_nodes_of_rows(out / level)) == n
    analyzed = _cli("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    doc = json.loads(analyzed.stdout)
    assert [s["requests"] for s in doc["runs"]] == [16, 16]
    (sweep,) = doc["sweeps"]
    assert len(sweep["levels"]) == 2
    _assert_loopback_only(ray_nodes)


def test_ray_capacity_runs_its_cells_on_the_cluster(
    ray_nodes: Any, ray_cluster: str, tmp_path: Path
) -> None:
    cells = ["--max-cells", "2", "--duration", "1", "--no-widen", "--json"]
    out, r = _study("capacity", ray_cluster, tmp_path, 6, "--slo", "ttft=100s", *cells)
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "capacity.json").read_text())
    assert [c["name"] for c in doc["cells"]] == ["c1", "c2"]
    assert doc["result"]["status"] == "budget"
    assert doc["result"]["max_concurrency"] == 2
    keys = ["session_id", "replay_index", "request_index"]
    for cell in doc["cells"]:
        run_dir = out / cell["name"]
        df = pd.read_parquet(run_dir / "requests")
        assert len(df) == cell["requests"] > 0
        assert (df["status"] == "ok").sum() == cell["ok"] > 0
        assert not df.duplicated(keys).any()
        meta = json.loads((run_dir / "run.json").read_text())
        assert meta["mode"]["concurrency"] == cell["level"]
        assert len(_nodes_of_rows(run_dir)) == cell["level"]
    _assert_loopback_only(ray_nodes)


@pytest.mark.timeout(180)
def test_ray_kill_9_of_the_driver_stops_its_actors_and_sim(
    ray_nodes: Any, ray_cluster: str, tmp_path: Path
) -> None:
    from tests.orphans import command, kill_9_mid_run, long_trace, started_at

    def expect(pids: dict[int, int]) -> bool:
        sim = any("--accept-any-model" in command(p) for p in pids)
        return sim and len(replay_actors(list(pids))) == 2

    trace = long_trace(tmp_path / "t.jsonl")
    out = tmp_path / "run"
    _seen, left = kill_9_mid_run(
        ["run", str(trace), "--ray", ray_cluster, "--concurrency", "2",
         "--out", str(out), "--quiet", "--sim-args", "--speed 1"],
        out,
        expect=expect,
        also=lambda: started_at(replay_actors(ray_pids(ray_nodes))),
    )  # fmt: skip
    assert left == [], f"alive after the driver's kill -9: {left}"
    # The cluster is the user's: its own processes (GCS, raylets, agents) stay.
    nodes = [
        info.process
        for node in ray_nodes.list_all_nodes()
        for infos in node.all_processes.values()
        for info in infos
    ]
    assert nodes
    assert all(p.poll() is None for p in nodes)
