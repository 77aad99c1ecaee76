"""ChatHashes: a chat prompt's token count and block hashes, reused from a recent
prompt's messages, equal a full tokenization's, whatever came before."""

from __future__ import annotations

import random
from typing import Any

import pytest

from replayer.sim.cache import block_hashes
from replayer.sim.prompts import ChatHashes
from traces.textrule import chat_to_token_ids, text_for_tokens


def _message(rng: random.Random) -> dict[str, Any]:
    role = rng.choice(["system", "user", "assistant", "tool", "narrator"])
    text = text_for_tokens(
        rng.randrange(1000, 1100) for _ in range(rng.randrange(0, 40))
    )
    if rng.random() < 0.1:
        return {"role": role, "content": [{"type": "text", "text": text}]}
    return {"role": role, "content": text}


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_chat_hashes_equal_full_tokenization_over_growing_sessions(bs: int) -> None:
    rng = random.Random(bs)
    chats = ChatHashes(bs, max_bytes=1 << 20)
    sessions: list[list[dict[str, Any]]] = [[_message(rng)] for _ in range(4)]
    for _ in range(300):
        k = rng.randrange(len(sessions))
        history = sessions[k]
        roll = rng.random()
        if roll < 0.05 and len(history) > 1:  # an earlier message edited
            history[rng.randrange(len(history))] = _message(rng)
        elif roll < 0.1:  # a fork: a prefix of another session
            history = [dict(m) for m in history[: rng.randrange(1, len(history) + 1)]]
            sessions.append(history)
        history.extend(_message(rng) for _ in range(rng.randrange(1, 4)))
        # Each request is a fresh parse (equal messages, other objects), often
        # ending in content of its own that the next turn does not re-send.
        sent = [dict(m) for m in history]
        if rng.random() < 0.5:
            sent.append(_message(rng))
        tokens, hashes = chats.hash(sent)
        ids = chat_to_token_ids(sent)
        assert tokens == len(ids)
        assert hashes.tolist() == block_hashes(ids, bs)
    assert chats.reused_blocks > chats.hashed_blocks  # most blocks were not hashed
