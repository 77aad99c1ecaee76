"""The synthetic generator: presets hit their statistics, output is deterministic,
valid Weka and self-consistent (hash-id chains, timelines, subagent spawn/join)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from replayer.cli import main
from traces.distributions import Empirical, LogNormal, draw, ks_distance, norm_ppf
from traces.errors import TraceError
from traces.generate import PRESETS, GeneratorConfig, generate_trace
from traces.io import read_trace, write_trace
from traces.model import Session, Trace
from traces.stats import trace_stats

# Published AgentX v1.0 figures the agentx preset must reproduce (within 5%).
AGENTX_TARGETS = {
    "input p50": 142_016,
    "input p90": 550_000,
    "output p50": 444,
    "think p50": 2.3,
    "think p90": 37.5,
    "sessions with subagents": 0.44,
    "requests per session p50": 67,
}


@pytest.fixture(scope="module")
def agentx_small() -> Trace:
    # 25 trees (~5.9K requests): big enough for every percentile, stats in ~3 s.
    return generate_trace(PRESETS["agentx"], sessions=25, seed=7)


def _threads(trace: Trace) -> list[Session]:
    return [s for s, _ in trace.all_sessions()]


def test_generate_agentx_matches_published_stats(agentx_small: Trace) -> None:
    st = trace_stats(agentx_small)
    got = {
        "input p50": st.input_tokens["p50"],
        "input p90": st.input_tokens["p90"],
        "output p50": st.output_tokens["p50"],
        "think p50": st.think_time_s["p50"],
        "think p90": st.think_time_s["p90"],
        "sessions with subagents": st.sessions_with_subagents / st.sessions,
        "requests per session p50": st.requests_per_session["p50"],
    }
    for key, target in AGENTX_TARGETS.items():
        assert got[key] == pytest.approx(target, rel=0.05), key
    assert st.ideal_cache_hit_rate >= 0.95
    assert 950_000 <= st.input_tokens["max"] <= 1_000_000  # capped near 1M


def test_generate_agentx_full_size_request_count() -> None:
    trace = generate_trace(PRESETS["agentx"], sessions=393, seed=0)
    assert 90_000 <= trace.request_count() <= 110_000


def test_generate_same_seed_same_bytes(tmp_path: Path) -> None:
    for name in ("demo", "agentx"):
        a, b, c = (tmp_path / f"{name}{i}.jsonl" for i in range(3))
        write_trace(generate_trace(PRESETS[name], sessions=3, seed=11), a)
        write_trace(generate_trace(PRESETS[name], sessions=3, seed=11), b)
        write_trace(generate_trace(PRESETS[name], sessions=3, seed=12), c)
        assert a.read_bytes() == b.read_bytes()
        assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_generate_file_reads_back_equal(tmp_path: Path, suffix: str) -> None:
    config = replace(PRESETS["agentx"], session_rate_per_s=0.2)
    trace = generate_trace(config, sessions=4, seed=3)
    path = write_trace(trace, tmp_path / f"t{suffix}")
    assert read_trace(path).sessions == trace.sessions


def _key_sets(objs: list[dict]) -> dict[str, set[frozenset[str]]]:
    out: dict[str, set[frozenset[str]]] = {"session": set(), "n": set(), "sub": set()}

    def entries(reqs: list[dict]) -> None:
        for r in reqs:
            if r["type"] == "subagent":
                out["sub"].add(frozenset(r))
                entries(r["requests"])
            elif r["type"] == "n":
                out["n"].add(frozenset(r))

    for obj in objs:
        out["session"].add(frozenset(obj))
        entries(obj["requests"])
    return out


def test_generate_local_native_has_weka_key_sets(
    tmp_path: Path, weka_dir: Path
) -> None:
    real = [orjson.loads(p.read_bytes()) for p in sorted(weka_dir.glob("*.json"))]
    path = write_trace(
        generate_trace(PRESETS["agentx"], sessions=6, seed=1), tmp_path / "g.jsonl"
    )
    ours = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert _key_sets(ours) == _key_sets(real)
    # Arrival times add exactly one session key, start_t.
    timed = generate_trace(
        replace(PRESETS["demo"], session_rate_per_s=1.0), sessions=2, seed=1
    )
    write_trace(timed, tmp_path / "t.jsonl")
    first = orjson.loads((tmp_path / "t.jsonl").read_bytes().splitlines()[0])
    (session_keys,) = _key_sets(real)["session"]
    assert set(first) == session_keys | {"start_t"}


def _check_tree(root: Session, *, dropped: bool) -> None:
    bs = root.block_size
    for s, _ in root.walk():
        for prev, cur in zip(s.requests, s.requests[1:], strict=False):
            assert cur.t_s == pytest.approx(
                prev.t_s + prev.api_time_s + cur.think_time_s, abs=1e-6
            )
            if cur.input_tokens >= prev.input_tokens:  # no compaction in between
                assert np.array_equal(cur.hash_ids[: prev.hash_ids.size], prev.hash_ids)
        for r in s.requests:
            assert r.hash_ids.size == r.input_tokens // bs
    for sub in root.subagents:
        anchor = root.requests[sub.anchor_index]
        spawn = anchor.t_s + anchor.api_time_s
        # Dropped requests can leave a later spawn than the (new) anchor's end.
        assert sub.t_s >= spawn - 1e-6 if dropped else sub.t_s == pytest.approx(spawn)
        if sub.join_index is not None:
            join = root.requests[sub.join_index]
            assert sub.join_index == sub.anchor_index + 1
            assert join.t_s >= sub.t_s + sub.duration_ms / 1000 - 1e-6


@pytest.mark.parametrize("preset", ["agentx", "agentx-256k", "demo"])
def test_generate_trees_are_consistent(preset: str) -> None:
    config = replace(PRESETS[preset], background_fraction=0.5)
    trace = generate_trace(config, sessions=12, seed=5)
    for root in trace.sessions:
        _check_tree(root, dropped=config.drop_requests_over_tokens is not None)
    assert any(sub.join_index is None for r in trace.sessions for sub in r.subagents)
    assert any(
        sub.join_index is not None for r in trace.sessions for sub in r.subagents
    )


def test_generate_agentx_256k_drops_long_requests(agentx_small: Trace) -> None:
    trace = generate_trace(PRESETS["agentx-256k"], sessions=25, seed=7)
    ins = [r.input_tokens for s in _threads(trace) for r in s.requests]
    assert max(ins) <= 256_000
    assert len(ins) < agentx_small.request_count()


def test_generate_global_prefix_is_shared_across_sessions() -> None:
    config = replace(PRESETS["demo"], global_prefix=True)
    trace = generate_trace(config, sessions=5, seed=2)
    prefix_blocks = (config.system_tokens + config.tool_tokens) // config.block_size
    heads = {tuple(s.requests[0].hash_ids[:prefix_blocks]) for s in trace.sessions}
    assert len(heads) == 1
    assert {s.hash_id_scope for s in trace.sessions} == {"global"}
    # Outside the prefix no block is shared between sessions.
    tails = [
        set(s.requests[-1].hash_ids[prefix_blocks:].tolist()) for s in trace.sessions
    ]
    assert sum(len(t) for t in tails) == len(set().union(*tails))
    assert (
        trace_stats(trace).ideal_cache_hit_rate
        > trace_stats(
            generate_trace(PRESETS["demo"], sessions=5, seed=2)
        ).ideal_cache_hit_rate
    )


def test_generate_local_ids_start_at_one_per_tree() -> None:
    trace = generate_trace(PRESETS["demo"], sessions=3, seed=4)
    for s in trace.sessions:
        assert s.requests[0].hash_ids[0] == 1
        assert s.start_s is None


def test_generate_demo_preset_is_small() -> None:
    trace = generate_trace(
        PRESETS["demo"], sessions=PRESETS["demo"].default_sessions, seed=0
    )
    assert 6 <= len(trace) <= 8
    assert all(4 <= s.request_count() <= 12 for s in trace.sessions)
    assert 1 <= sum(1 for s in trace.sessions if s.subagents) <= 2
    ins = [r.input_tokens for s in _threads(trace) for r in s.requests]
    assert min(ins) >= 2000
    assert max(ins) <= 30_000
    joins = {
        (s.session_id, sub.join_index) for s in trace.sessions for sub in s.subagents
    }
    for s in trace.sessions:
        for i, r in enumerate(s.requests):
            if (s.session_id, i) not in joins:  # joins also wait for their subagents
                assert r.think_time_s <= 2.0


def test_generate_arrivals_are_increasing() -> None:
    config = replace(PRESETS["demo"], session_rate_per_s=2.0)
    starts = [s.start_s for s in generate_trace(config, sessions=200, seed=1).sessions]
    assert starts[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(starts))
    assert 199 / starts[-1] == pytest.approx(2.0, rel=0.2)


def test_generator_config_json_round_trip() -> None:
    for config in PRESETS.values():
        text = json.dumps(config.to_dict())
        assert GeneratorConfig.from_dict(json.loads(text)) == config


def test_generator_config_rejects_bad_values() -> None:
    with pytest.raises(TraceError, match="unknown fields"):
        GeneratorConfig.from_dict({"nope": 1})
    with pytest.raises(TraceError, match="output_tokens"):
        GeneratorConfig.from_dict({"output_tokens": {"kind": "weird"}})
    with pytest.raises(TraceError, match="subagent_session_fraction"):
        GeneratorConfig.from_dict({"subagent_session_fraction": 2})
    with pytest.raises(ValueError, match="sessions must be >= 1"):
        generate_trace(PRESETS["demo"], sessions=0, seed=0)


def test_distributions_quantiles_and_ks() -> None:
    u = np.array([0.025, 0.5, 0.9, 0.999])
    assert norm_ppf(u) == pytest.approx([-1.959964, 0.0, 1.281552, 3.090232], abs=1e-6)
    rng = np.random.default_rng(0)
    x = draw(LogNormal(median=2.3, sigma=2.18), rng, 2000)
    assert np.percentile(x, [50, 90]) == pytest.approx([2.3, 37.5], rel=0.02)
    assert ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_distance([1, 2], [3, 4]) == 1.0
    assert ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5
    e = Empirical.fit(np.arange(101))
    assert e.ppf(np.array([0.0, 0.5, 1.0])) == pytest.approx([0, 50, 100])


# ----------------------------------------------------------------------------- CLI


def test_cli_generate_demo_writes_a_readable_trace(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    result = CliRunner().invoke(main, ["generate", "-o", str(out), "--preset", "demo"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: 7 sessions")
    assert len(result.output.splitlines()) == 1
    assert len(read_trace(out)) == 7


def test_cli_generate_json_and_config_round_trip(tmp_path: Path) -> None:
    runner = CliRunner()
    cfg = tmp_path / "cfg.json"
    args = ["generate", "--sessions", "3", "--seed", "9", "--json"]
    first = runner.invoke(
        main, [*args, "-o", str(tmp_path / "a.jsonl"), "--save-config", str(cfg)]
    )
    assert first.exit_code == 0, first.output
    stats = json.loads(first.stdout)
    assert stats["sessions"] == 3
    assert {"input_tokens", "ideal_cache_hit_rate"} <= set(stats)
    again = runner.invoke(
        main, [*args, "-o", str(tmp_path / "b.jsonl"), "--config", str(cfg)]
    )
    assert again.exit_code == 0, again.output
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_cli_generate_options_reach_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    result = CliRunner().invoke(
        main,
        [
            *("generate", "-o", str(out), "--preset", "demo", "--global-prefix"),
            *("--session-rate", "0.5", "--sessions", "4"),
        ],
    )
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert {s.hash_id_scope for s in trace.sessions} == {"global"}
    assert all(s.start_s is not None for s in trace.sessions)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", "demo", "--config", "CFG"], "only one of"),
        (["--config", "CFG"], "unknown fields"),
        (["--sessions", "0"], "--sessions"),
        (["--preset", "demo", "-o", "x.txt"], "unknown output format"),
    ],
)
def test_cli_generate_errors_are_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"bogus": 1}')
    args = ["generate", "-o", str(tmp_path / "x.jsonl")]
    args += [
        str(cfg) if a == "CFG" else str(tmp_path / a) if a == "x.txt" else a
        for a in extra
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
