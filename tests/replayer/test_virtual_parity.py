"""The live simulator and the virtual mode are one engine on two clocks: on the real
Weka sample (session trees with subagents) at 1, 8 and 16 lanes, 16 past the KV
cache's size, the requests' cached tokens agree (exactly at one lane; see the test
for more) and so do the P90 latencies (within 5%)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from analysis.load import load_run
from traces import read_trace
from traces.io import write_trace
from traces.model import Session, Trace

REPLAYER = [sys.executable, "-m", "replayer"]
pytestmark = pytest.mark.timeout(600)

# Steps long against the live path's own few ms a request (HTTP, parsing), a KV of
# 12,800 tokens in 32-token blocks: about six 2,000-token prompts, so 8 lanes press
# on it and 16 oversubscribe it (prefixes evicted before their next turn).
SIM = (
    "--kv-capacity-tokens 12800 --max-model-len 4096 --block-size 32 "
    "--decode-base-ms 20 --decode-per-seq-ms 0.5 --prefill-us-per-token 150"
)
TURNS = 4  # per session, subagents too
OUTPUT = 4  # tokens per request
KEY = ["session_id", "request_index", "replay_index"]


def _cut(s: Session) -> Session:
    """The first TURNS requests of ``s`` (output cut to OUTPUT tokens), and the
    subagents they spawn, cut the same way."""
    requests = tuple(
        replace(r, output_tokens=min(r.output_tokens, OUTPUT))
        for r in list(s.requests)[:TURNS]
    )
    subagents = tuple(
        replace(
            sub,
            session=_cut(sub.session),
            join_index=sub.join_index
            if sub.join_index is not None and sub.join_index < TURNS
            else None,
        )
        for sub in s.subagents
        if sub.anchor_index < TURNS - 1
    )
    return replace(s, requests=requests, subagents=subagents)


@pytest.fixture(scope="module")
def trace(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    real = read_trace(weka_dir)
    trees = sorted(real.sessions, key=lambda s: -len(s.subagents))[:16]
    cut = Trace(sessions=tuple(_cut(s) for s in trees), source_format="weka")
    assert sum(1 for t in cut.sessions for _ in t.walk()) > len(trees)  # subagents
    return write_trace(cut, tmp_path_factory.mktemp("parity") / "trace.jsonl")


def _replay(trace: Path, out: Path, lanes: int, *extra: str) -> pd.DataFrame:
    r = subprocess.run(
        [
            *REPLAYER, "run", str(trace), "--concurrency", str(lanes),
            "--think-scale", "0", "--max-input-tokens", "2000", "--salt", "parity",
            "--quiet", "--sim-args", SIM, "--out", str(out), *extra,
        ],
        capture_output=True, text=True, timeout=500, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = load_run(out).requests
    assert (rows["status"] == "ok").all()
    return rows


def _p90(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].astype(float).quantile(0.9))


# The live run is the reference only while the host keeps up with the modeled steps
# (20 ms and more): a client stalled for half a step can send a reply a step later
# than virtual time does (the self-check's loop lag in run.json tells), and at the
# KV's knee one such request moves evictions. Quiet, the lag stays under ~8 ms; beside
# two processes churning memory it reached 20-56 ms, and 1-7 of 128 requests' cached
# tokens differed. A live run that disagrees is replayed only when it lagged more
# than QUIET_LAG_MS, up to LIVE_TRIES runs in all; a quiet one fails at once.
QUIET_LAG_MS = 10.0
LIVE_TRIES = 3


def _disagreement(
    live: pd.DataFrame, virtual: pd.DataFrame, lanes: int, lag: float
) -> tuple[str, bool]:
    """What the two runs measured, and whether they agree."""
    both = live.merge(virtual, on=KEY, suffixes=("_live", "_virtual"))
    assert len(both) == len(live) == len(virtual)
    differ = both[both["cached_tokens_live"] != both["cached_tokens_virtual"]]
    hit = {
        name: rows["cached_tokens"].sum() / rows["prompt_tokens"].sum()
        for name, rows in (("live", live), ("virtual", virtual))
    }
    said = (
        f"c{lanes}: {len(both)} requests, cached tokens differ on {len(differ)}; "
        f"hit live {hit['live']:.3f}, virtual {hit['virtual']:.3f}; live client "
        f"loop lag max {lag:.1f} ms"
    )
    # Exact at one lane. With more, a live request that reaches the server late
    # (its client stalled) can land one step from where the virtual one does; at
    # the KV's knee that moves an eviction. At 8 lanes none of 128 did on a quiet
    # machine, and up to 10 (8%) on a loaded CI host, while the hit rates stayed
    # within a point. So past one lane: at most a tenth of the requests, and the
    # hit rates within a point.
    allowed = 0 if lanes == 1 else len(both) // 10
    agree = len(differ) <= allowed and abs(hit["virtual"] - hit["live"]) <= 0.01
    for column in ("ttft_ns", "e2e_ns"):
        measured, predicted = _p90(live, column), _p90(virtual, column)
        said += f"; P90 {column} live {measured / 1e6:.1f} ms"
        said += f" virtual {predicted / 1e6:.1f} ms"
        agree = agree and abs(predicted - measured) <= 0.05 * measured
    return said, agree


@pytest.mark.parametrize("lanes", [1, 8, 16])
def test_live_and_virtual_agree(trace: Path, tmp_path: Path, lanes: int) -> None:
    virtual = _replay(trace, tmp_path / "virtual", lanes, "--virtual", "sim")
    tries = []
    for k in range(LIVE_TRIES):
        out = tmp_path / f"live{k}"
        live = _replay(trace, out, lanes)
        meta = json.loads((out / "run.json").read_text())
        lag = float(meta["client_check"]["loop_lag_ms"]["max"])
        said, agree = _disagreement(live, virtual, lanes, lag)
        tries.append(said)
        if agree or lag <= QUIET_LAG_MS:
            break
    assert agree, " | ".join(tries)
