"""The one rule that turns token ids into text and back, shared by the prompt
materializer (text mode) and the simulated endpoint, so both count a text prompt's
tokens alike. See docs/engine-model.md."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)
_BASE = len(_SYLLABLES)  # 80
_SYLLABLE_INDEX = {s: i for i, s in enumerate(_SYLLABLES)}

# Token ids below 1000 are never produced by the materializer; the role markers live
# there so that they can never collide with content tokens.
ROLE_TOKEN_IDS: Mapping[str, int] = {
    "system": 1,
    "user": 2,
    "assistant": 3,
    "tool": 4,
    "developer": 5,
}
CHAT_TOKENS_PER_MESSAGE = 1  # the role marker
_UNKNOWN_ROLE_TOKEN_ID = 6
_UNKNOWN_WORD_BASE = 1 << 40  # keeps hashed foreign words away from spelled ids


@lru_cache(maxsize=1 << 16)
def word_for_token(token_id: int) -> str:
    """The word that spells ``token_id`` (``token_id >= 0``)."""
    if token_id < 0:
        raise ValueError(f"token ids are non-negative (got {token_id})")
    digits = []
    while True:
        token_id, d = divmod(token_id, _BASE)
        digits.append(_SYLLABLES[d])
        if token_id == 0:
            break
    return "".join(reversed(digits))


def token_for_word(word: str) -> int:
    """Inverse of :func:`word_for_token`; a word it did not write hashes (crc32)."""
    if len(word) % 2 == 0 and word:
        value = 0
        for i in range(0, len(word), 2):
            d = _SYLLABLE_INDEX.get(word[i : i + 2])
            if d is None:
                break
            value = value * _BASE + d
        else:
            if not (len(word) > 2 and word[:2] == _SYLLABLES[0]):  # canonical form only
                return value
    return _UNKNOWN_WORD_BASE + zlib.crc32(word.encode())


def text_for_tokens(token_ids: Iterable[int]) -> str:
    """Words for ``token_ids`` joined by single spaces.

    Shared by the prompt materializer (text mode) and the simulated endpoint, so a text
    prompt's token count, as the simulator counts it, is exactly what the replayer
    intended. A token is one whitespace-separated word; a word spells its token id in
    base-80 syllables (consonant + vowel), so the mapping is a bijection on the words it
    writes. A chat prompt is, per message, one role token followed by the content's
    tokens.
    """
    return " ".join(word_for_token(int(t)) for t in token_ids)


def text_to_token_ids(text: str) -> list[int]:
    """Token ids of ``text`` under the rule (one per whitespace-separated word)."""
    return [token_for_word(w) for w in text.split()]


def chat_to_token_ids(messages: Sequence[Mapping[str, object]]) -> list[int]:
    """Token ids of a chat prompt: per message, its role token then its content.

    ``content`` may be a string or a list of OpenAI content parts (``{"type": "text",
    "text": ...}``); parts of other types contribute no tokens.
    """
    ids: list[int] = []
    for message in messages:
        role = message.get("role")
        ids.append(ROLE_TOKEN_IDS.get(str(role), _UNKNOWN_ROLE_TOKEN_ID))
        ids.extend(text_to_token_ids(_content_text(message.get("content"))))
    return ids


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content)
