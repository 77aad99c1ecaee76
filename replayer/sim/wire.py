"""The OpenAI wire format as the simulator speaks it: request parsing and validation
(text by ``traces.textrule``, the materializer's rule), error bodies, pre-encoded SSE
chunks. See docs/replaying.md ("Against the built-in simulator")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import orjson

from replayer.sim.config import SimConfig
from traces.textrule import chat_to_token_ids, text_to_token_ids, word_for_token

Kind = Literal["chat", "completions"]

# vLLM's error types by status; ``code`` carries the status, as vLLM's does.
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
}
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI legacy completions default


class ApiError(Exception):
    """A request the simulator answers with an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` for ``status``."""
    error = {
        "message": message,
        "type": _ERROR_TYPES.get(status, "Error"),
        "param": None,
        "code": status,
    }
    return orjson.dumps({"error": error})


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    kind: Kind
    model: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


def parse_request(body: bytes, kind: Kind, config: SimConfig) -> GenerateRequest:
    """Validate ``body`` and tokenize its prompt.

    Raises:
        ApiError: 400 for malformed or too long requests, 404 for a wrong model.
    """
    data = load_body(body)
    _check_model(data, config)  # a wrong model is a 404 whatever the prompt
    if kind == "chat":
        prompt_ids = _chat_prompt(data.get("messages"))
    else:
        prompt_ids = _completion_prompt(data.get("prompt"))
    return check_request(data, kind, config, prompt_ids, len(prompt_ids))


def load_body(body: bytes) -> dict[str, Any]:
    """The body's JSON object (400 when it is not one)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    return data


def check_request(
    data: dict[str, Any],
    kind: Kind,
    config: SimConfig,
    prompt_ids: list[int],
    prompt_len: int,
) -> GenerateRequest:
    """Validate everything but the prompt's content (``prompt_len`` tokens, whose
    ids are ``prompt_ids``, or [] when the caller keeps them)."""
    model = _check_model(data, config)
    if data.get("n", 1) != 1:
        raise ApiError(400, "the simulator supports only n=1")
    if kind == "chat":
        max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    else:
        max_tokens = data.get("max_tokens", _COMPLETIONS_DEFAULT_MAX_TOKENS)
    if max_tokens is None:  # chat default, as vLLM: whatever room the context leaves
        max_tokens = max(1, config.max_model_len - prompt_len)
    _check_int(max_tokens, "max_tokens", 1)
    min_tokens = data.get("min_tokens", 0)
    _check_int(min_tokens, "min_tokens", 0)
    if min_tokens > max_tokens:
        raise ApiError(
            400, f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})"
        )
    if prompt_len + max_tokens > config.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {config.max_model_len} tokens. "
            f"However, you requested {prompt_len + max_tokens} tokens ({prompt_len} "
            f"in the messages, {max_tokens} in the completion). Please reduce the "
            "length of the messages or completion.",
        )
    stream = _bool(data, "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object")
    return GenerateRequest(
        kind=kind,
        model=model,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(data, "ignore_eos"),
        stream=stream,
        include_usage=stream and _bool(options, "include_usage"),
    )


def _check_model(data: dict[str, Any], config: SimConfig) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            404, f"'model' is required; this simulator serves {config.model!r}"
        )
    if model != config.model and not config.accept_any_model:
        raise ApiError(404, f"The model `{model}` does not exist.")
    return model


def _chat_prompt(messages: Any) -> list[int]:
    return chat_to_token_ids(_check_messages(messages))


def chat_messages(data: dict[str, Any], config: SimConfig) -> list[dict[str, Any]]:
    """A chat body's messages, checked as :func:`parse_request` checks them (the
    model first), for a caller that tokenizes them itself.

    Raises:
        ApiError: as :func:`parse_request`.
    """
    _check_model(data, config)
    return _check_messages(data.get("messages"))


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'")
    return messages


def _completion_prompt(prompt: Any) -> list[int]:
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and isinstance(prompt[0], str | list)
    ):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = text_to_token_ids(prompt)
    elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
        ids = prompt
        if ids and min(ids) < 0:
            raise ApiError(400, "token ids in 'prompt' must be >= 0")
    else:
        raise ApiError(
            400,
            "'prompt' must be a string, a list of token ids, or a list holding one of "
            "those (batched prompts are not simulated)",
        )
    if not ids:
        raise ApiError(400, "'prompt' must not be empty")
    return ids


def _check_int(value: Any, name: str, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum} (got {value!r})")


def _bool(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean (got {value!r})")
    return value


# Output words: token ids in the materializer's content range, pre-encoded once.
_WORD_TABLE_SIZE = 4096


@cache
def word_table() -> tuple[bytes, ...]:
    """Encoded words the simulator generates (index with ``(offset + i) % size``)."""
    return tuple(
        word_for_token(1000 + (k * 7919) % 29000).encode()
        for k in range(_WORD_TABLE_SIZE)
    )


class ChunkEncoder:
    """Pre-encoded SSE chunks of one response; a content chunk carries one token."""

    def __init__(self, kind: Kind, request_id: str, model: str, created: int) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = orjson.dumps(
            {"id": request_id, "object": obj, "created": created, "model": model}
        )[:-1]
        self._head = b"data: " + head + b',"choices":[{"index":0,'
        if kind == "chat":
            self._open = self._head + b'"delta":{"content":"'
            self._close = b'"},"logprobs":null,"finish_reason":'
        else:
            self._open = self._head + b'"text":"'
            self._close = b'","logprobs":null,"finish_reason":'

    def role_chunk(self) -> bytes:
        """vLLM's first chat chunk: the assistant role with empty content."""
        return (
            self._head
            + b'"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def content_chunk(self, text: bytes, finish_reason: str | None) -> bytes:
        reason = (
            b"null" if finish_reason is None else b'"' + finish_reason.encode() + b'"'
        )
        return self._open + text + self._close + reason + b"}]}\n\n"

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The include_usage chunk: empty choices and the usage object."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        chunk = {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def full_response(
        self, text: str, finish_reason: str, usage: dict[str, Any]
    ) -> bytes:
        """The non-streaming response body."""
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            obj = "text_completion"
        return orjson.dumps(
            {
                "id": self.request_id,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )


DONE = b"data: [DONE]\n\n"


def usage_body(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    host_tokens: int | None = None,
    dialect: str = "vllm",
) -> dict[str, Any]:
    """OpenAI usage with ``prompt_tokens_details.cached_tokens`` (GPU + host hits);
    with ``host_tokens`` (a host tier) also the split, as vLLM says it
    (``local_cached_tokens``, ``external_cached_tokens``) or as SGLang does
    (``cached_tokens_details``: ``device``, ``host``)."""
    details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if host_tokens is not None:
        gpu = cached_tokens - host_tokens
        if dialect == "sglang":
            details["cached_tokens_details"] = {"device": gpu, "host": host_tokens}
        else:
            details["local_cached_tokens"] = gpu
            details["external_cached_tokens"] = host_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": details,
    }
