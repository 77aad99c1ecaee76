"""Prompt materialization: determinism, sharing, exact counts, chat messages."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.builders import request, session
from traces.errors import TraceError
from traces.materialize import Materializer, PromptConfig
from traces.model import Session
from traces.textrule import chat_to_token_ids


def _session(
    *reqs: tuple[list[int], int], block_size: int = 4, out: int = 4
) -> Session:
    """Session "s": one request per (hash ids, input tokens); 4 system tokens."""
    return session(
        "s",
        [request(ids, input_tokens=n, out=out) for ids, n in reqs],
        block_size=block_size,
        system_tokens=4,
    )


def _ids(
    m: Materializer, s: Session, i: int, ns: str = "s", replay: int = 0
) -> list[int]:
    frag = m.prompt(s, i, ns, replay=replay).fragment
    return list(orjson.loads(b"{" + frag + b"}")["prompt"])


def test_materialize_equal_hash_ids_equal_tokens() -> None:
    s = _session(([1, 2, 3], 14), ([1, 2, 9], 12))
    m = Materializer(PromptConfig(salt="x"))
    a, b = _ids(m, s, 0), _ids(m, s, 1)
    assert len(a) == 14
    assert len(b) == 12
    assert a[:8] == b[:8]
    assert a[8:12] != b[8:12]
    assert all(1000 <= t < 30000 for t in a + b)


def test_materialize_deterministic_and_salted() -> None:
    s = _session(([1, 2], 8))
    one = _ids(Materializer(PromptConfig(salt="x")), s, 0)
    assert one == _ids(Materializer(PromptConfig(salt="x")), s, 0)
    assert one != _ids(Materializer(PromptConfig(salt="y")), s, 0)
    m = Materializer(PromptConfig(salt="x"))
    assert _ids(m, s, 0, replay=1) != one
    assert _ids(m, s, 0, ns="other") != one


def test_materialize_partial_block_is_head_of_full_block() -> None:
    full = _session(([5, 6], 8), block_size=4)
    part = _session(([5, 6], 6), block_size=4)  # Mooncake-style: tail block hashed
    m = Materializer(PromptConfig(salt="x"))
    assert _ids(m, part, 0) == _ids(m, full, 0)[:6]


def test_materialize_block_tokens_and_max_input() -> None:
    s = _session(([1, 2, 3], 14), block_size=4)
    m = Materializer(PromptConfig(salt="x", block_tokens=2))
    p = m.prompt(s, 0, "s")
    assert p.prompt_tokens == 7  # 3 blocks x 2 + tail 2 -> 1
    m = Materializer(PromptConfig(salt="x", max_input_tokens=9))
    p = m.prompt(s, 0, "s")
    assert p.prompt_tokens == 9
    assert p.dropped_tokens == 5
    assert m.sent_tokens(s, s.requests[0]) == (9, 5)
    assert _ids(m, s, 0) == _ids(Materializer(PromptConfig(salt="x")), s, 0)[:9]


def test_materialize_chat_counts_match_shared_text_rule() -> None:
    s = _session(([1, 2], 10), ([1, 2, 3, 4], 19), ([1, 2, 3, 4, 5, 6], 26))
    m = Materializer(PromptConfig(api="chat", salt="x"))
    prev = None
    for i, req in enumerate(s.requests):
        p = m.prompt(s, i, "s")
        msgs = orjson.loads(b"{" + p.fragment + b"}")["messages"]
        assert len(chat_to_token_ids(msgs)) == p.prompt_tokens == req.input_tokens
        assert msgs[0]["role"] == "system"
        assert msgs[-1]["role"] == "user"
        if prev is not None:  # earlier messages repeat byte for byte
            assert msgs[: len(prev) - 1] == prev[:-1]
        prev = msgs


def test_materialize_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="token id range"):
        PromptConfig(token_min=5, token_max=5)
    with pytest.raises(ValueError, match="block_tokens"):
        PromptConfig(block_tokens=0)


def test_materialize_tokenizer_text_is_exact_in_model_tokens(shared_data: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_data.parent / "models" / "tiny-random-llama" / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"no tokenizer at {path}")
    tok = tokenizers.Tokenizer.from_file(str(path))
    s = _session(([1, 2], 10), ([1, 2, 3, 4], 19), block_size=4)
    m = Materializer(PromptConfig(api="chat", salt="x", tokenizer=str(path)))
    prev = None
    for i, req in enumerate(s.requests):
        p = m.prompt(s, i, "s")
        msgs = orjson.loads(b"{" + p.fragment + b"}")["messages"]
        counted = sum(
            len(tok.encode(msg["content"], add_special_tokens=False).ids)
            for msg in msgs
        )
        assert counted == p.prompt_tokens == req.input_tokens
        if prev is not None:
            assert msgs[: len(prev) - 1] == prev[:-1]
        prev = msgs


def test_materialize_bad_tokenizer_is_a_trace_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TraceError, match="tokenizer"):
        Materializer(PromptConfig(api="chat", tokenizer=str(bad)))


def test_materialize_reused_history_equals_a_fresh_build(weka_dir: Path) -> None:
    """A turn built on the joined history of an earlier one (a root and its
    subagents interleaved, so the recent prompts differ) is byte for byte what a
    materializer that never saw that history builds."""
    from traces import read_trace

    trace = read_trace(weka_dir)
    trees = sorted(trace.sessions, key=lambda s: -len(s.subagents))[:2]
    turns = [
        (s, i, root.hash_namespace())
        for root in trees
        for s, _ in root.walk()
        for i in range(min(len(s.requests), 12))
    ]
    # Interleave: every session's turn k before any session's turn k + 1.
    turns.sort(key=lambda t: t[1])
    config = PromptConfig(salt="x", max_input_tokens=40_000)
    shared = Materializer(config)
    for s, i, ns in turns:
        got = shared.prompt(s, i, ns)
        want = Materializer(config).prompt(s, i, ns)
        assert got == want
    assert shared.hits > shared.misses  # the histories were reused, not rebuilt
