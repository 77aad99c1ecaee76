"""Fixtures for trace tests: a hypothesis strategy for random valid traces.

Handed out as a fixture (tests draw from it with ``st.data()``) so that test modules
share it without importing each other.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from traces.model import Request, Session, Subagent, Trace

# No '/': subagent session ids are '<parent>/<agent_id>' and must stay unique.
_NAMES = st.text(alphabet="abcdefgh_-.: 0123456789é", min_size=1, max_size=8)
_EXTRA_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.integers(0, 9), max_size=3),
)
_TIMES = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
_OPT_TIMES = st.none() | _TIMES
# Small id pools make prefixes shared between requests likely; the extremes check
# that int64 survives every format.
_IDS = st.integers(0, 12) | st.sampled_from([-(2**63), 2**63 - 1, 2**40, -1])


# Unknown fields; x/y/z names never collide with a Weka field.
_EXTRA = st.dictionaries(
    st.text(alphabet="xyzXYZ_", min_size=1, max_size=5), _EXTRA_VALUES, max_size=2
)
_TYPES = st.lists(st.sampled_from(["text", "tool_use", "tool_result", "image"]))


@st.composite
def requests(draw: st.DrawFn, block_size: int, t_s: float) -> Request:
    """One valid request: hash ids cover full blocks only or also the partial tail."""
    n_blocks = draw(st.integers(0, 6))
    partial = draw(st.integers(0, block_size - 1))
    tail_hashed = partial > 0 and n_blocks > 0 and draw(st.booleans())
    in_tokens = (n_blocks - (1 if tail_hashed else 0)) * block_size + partial
    kind = draw(st.sampled_from(["n", "s"]))
    think = draw(_TIMES)
    # The gap's parts, when known: tool + human within the gap.
    tool = draw(st.none() | st.floats(0, think))
    human = draw(st.none() | st.floats(0, think - (tool or 0.0)))
    return Request(
        input_tokens=in_tokens,
        output_tokens=draw(st.integers(0, 5000)),
        hash_ids=np.array(
            draw(st.lists(_IDS, min_size=n_blocks, max_size=n_blocks)), dtype=np.int64
        ),
        t_s=t_s,
        think_time_s=think,
        api_time_s=draw(_OPT_TIMES),
        ttft_s=draw(_OPT_TIMES) if kind == "s" else None,
        kind=kind,
        model=draw(st.none() | _NAMES),
        stop=draw(st.none() | st.sampled_from(["end_turn", "tool_use", "max_tokens"])),
        input_types=tuple(draw(_TYPES)),
        output_types=tuple(draw(_TYPES)),
        extra=draw(_EXTRA),
        tool_wait_s=tool,
        human_wait_s=human,
    )


@st.composite
def sessions(
    draw: st.DrawFn,
    session_id: str,
    block_size: int,
    scope: str,
    depth: int,
    subagent: bool,
) -> Session:
    """A session tree; times never go backwards in any one list of entries."""
    n = draw(st.integers(0, 4))
    times = sorted(draw(st.lists(_TIMES, min_size=n, max_size=n)))
    reqs = tuple(draw(requests(block_size, t)) for t in times)
    subs: list[Subagent] = []
    if depth < 2:
        anchors = draw(st.lists(st.integers(-1, n - 1), max_size=3))
        spawns = []
        for anchor in anchors:
            lo = times[anchor] if anchor >= 0 else 0.0
            hi = times[anchor + 1] if anchor + 1 < n else lo + 100.0
            spawns.append((anchor, draw(st.floats(lo, hi, allow_nan=False))))
        # Listing order = (anchor, spawn time): entry times never go backwards.
        for k, (anchor, spawn_t) in enumerate(sorted(spawns)):
            agent_id = f"a{k}{draw(_NAMES)}"
            subs.append(
                Subagent(
                    session=draw(
                        sessions(
                            f"{session_id}/{agent_id}",
                            block_size,
                            "local",
                            depth + 1,
                            True,
                        )
                    ),
                    anchor_index=anchor,
                    join_index=anchor + 1 if anchor + 1 < n else None,
                    agent_id=agent_id,
                    t_s=spawn_t,
                    subagent_type=draw(st.none() | _NAMES),
                    duration_ms=draw(
                        st.none() | st.integers(0, 10**7).map(float) | _TIMES
                    ),
                    total_tokens=draw(st.none() | st.integers(0, 10**6)),
                    tool_use_count=draw(st.none() | st.integers(0, 50)),
                    status=draw(st.none() | st.sampled_from(["completed", "failed"])),
                    extra=draw(_EXTRA),
                )
            )
    return Session(
        session_id=session_id,
        requests=reqs,
        subagents=tuple(subs),
        block_size=block_size,
        hash_id_scope=scope,  # type: ignore[arg-type]
        start_s=None if subagent else draw(st.none() | _TIMES),
        models=tuple(draw(st.lists(_NAMES, max_size=2))),
        tool_tokens=draw(st.none() | st.integers(0, 10**5)),
        system_tokens=draw(st.none() | st.integers(0, 10**5)),
        extra={} if subagent else draw(_EXTRA),
    )


@st.composite
def traces(draw: st.DrawFn, max_sessions: int = 4) -> Trace:
    """A random valid trace: unique ids, local/global scopes, subagent trees."""
    n = draw(st.integers(1, max_sessions))
    ids = draw(st.lists(_NAMES, min_size=n, max_size=n, unique=True))
    roots = tuple(
        draw(
            sessions(
                sid,
                draw(st.sampled_from([1, 4, 64, 512])),
                draw(st.sampled_from(["local", "global"])),
                0,
                False,
            )
        )
        for sid in ids
    )
    return Trace(sessions=roots)


@pytest.fixture(scope="session")
def trace_strategy() -> st.SearchStrategy[Trace]:
    """Random valid traces (draw with ``data.draw(trace_strategy)``): a trace holds
    at least one request, though a session may hold none."""
    return traces().filter(lambda t: t.request_count() > 0)
