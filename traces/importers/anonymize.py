"""Anonymization by construction: what of an agent's log may reach an imported trace
(numbers and allow-listed values only).
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

_FAMILY = re.compile(
    r"(claude|gpt|chatgpt|o\d+|codex|gemini|gemma|qwen\d*(\.\d+)?|qwq|deepseek|"
    r"llama\d*(\.\d+)?|mistral|mixtral|codestral|devstral|glm|kimi|grok|minimax|"
    r"phi\d*)"
)
_VERSION = re.compile(r"v?\d+(\.\d+)*[a-z]?")
_WORDS = frozenset(
    {
        "opus",
        "sonnet",
        "haiku",
        "instant",
        "mini",
        "nano",
        "pro",
        "max",
        "turbo",
        "preview",
        "flash",
        "lite",
        "latest",
        "codex",
        "chat",
        "coder",
        "instruct",
        "high",
        "low",
        "medium",
        "xhigh",
        "fast",
        "thinking",
        "reasoner",
        "plus",
        "vision",
        "exp",
        "spark",
        "oss",
        "r1",
        "v3",
        "k2",
        "air",
        "large",
        "small",
        "base",
    }
)
_PROVIDERS = frozenset(
    {"anthropic", "openai", "google", "qwen", "deepseek-ai", "meta-llama", "mistralai"}
)
_MAX_MODEL_CHARS = 80

STOP_REASONS = frozenset(
    {
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
)
SUBAGENT_TYPES = frozenset(
    {
        # Claude Code's built-in agents; user-defined agents are named by their users.
        "general-purpose",
        "Explore",
        "Plan",
        "statusline-setup",
        "output-style-setup",
        "claude-code-guide",
        # Codex's built-in agent roles.
        "default",
        "explorer",
        "worker",
    }
)
CUSTOM_SUBAGENT = "custom"
STATUSES = frozenset(
    {
        "completed",
        "success",
        "failed",
        "error",
        "cancelled",
        "interrupted",
        "killed",
        "running",
        "async_launched",
    }
)


def is_public_model_name(name: str) -> bool:
    """True when ``name`` is made only of model-family, tier and version parts."""
    if not name or len(name) > _MAX_MODEL_CHARS:
        return False
    low = name.lower()
    head, sep, rest = low.partition("/")
    if sep:
        if head not in _PROVIDERS:
            return False
        low = rest
    parts = low.split("-")
    if not _FAMILY.fullmatch(parts[0]):
        return False
    return all(p in _WORDS or _VERSION.fullmatch(p) for p in parts[1:])


class Anonymizer:
    """Pseudonyms and allow-lists for one import; the salt lives only in memory.

    Nothing is copied from a log into a trace except numbers (token counts, durations
    relative to the session start) and values that pass an allow-list:

    * ids (session ids, thread ids) become keyed hashes (HMAC-SHA256 with a secret salt
      drawn per import and never written anywhere), so two imports of one log do not
      even share pseudonyms; subagents are numbered ``agent_001``, ``agent_002``, ...
      per parent;
    * a model name is kept only when every dash-separated part is a known family, a
      known tier word or a version number (``claude-opus-4-5-20251101``, ``gpt-5.4``);
      anything else becomes ``model-<keyed hash>``;
    * stop reasons, subagent types and statuses pass only from fixed vocabularies;
    * text, paths, tool names and inputs, user and project names never leave the parser
      (with ``--tokenizer``, text is turned into token ids whose block hashes are keyed
      by the same salt, and only the block ids are written).
    """

    def __init__(self, salt: bytes | None = None) -> None:
        # A fresh secret per import unless a test pins one.
        self._salt = salt if salt is not None else secrets.token_bytes(32)

    @property
    def key(self) -> bytes:
        """The secret, for keyed block hashes (BLAKE2b keys are at most 64 bytes)."""
        return hashlib.sha256(b"block-key\0" + self._salt).digest()

    def pseudonym(self, kind: str, raw: str, chars: int = 16) -> str:
        """A keyed hash of ``raw`` (hex), stable within this import only."""
        msg = kind.encode() + b"\0" + raw.encode("utf-8", "surrogatepass")
        return hmac.new(self._salt, msg, hashlib.sha256).hexdigest()[:chars]

    def model(self, raw: object) -> str | None:
        """The model name if it is a public one, else a pseudonym; None if absent."""
        if not isinstance(raw, str) or not raw:
            return None
        if is_public_model_name(raw):
            return raw
        return f"model-{self.pseudonym('model', raw, 8)}"

    @staticmethod
    def stop(raw: object) -> str | None:
        """A stop reason from the fixed vocabulary, else None."""
        return raw if isinstance(raw, str) and raw in STOP_REASONS else None

    @staticmethod
    def subagent_type(raw: object) -> str | None:
        """A built-in subagent type; ``custom`` for user-defined ones; None if none."""
        if not isinstance(raw, str) or not raw:
            return None
        return raw if raw in SUBAGENT_TYPES else CUSTOM_SUBAGENT

    @staticmethod
    def status(raw: object) -> str | None:
        """A subagent status from the fixed vocabulary, else None."""
        return raw if isinstance(raw, str) and raw in STATUSES else None
