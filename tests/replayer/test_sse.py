"""Pure SSE parsing on bytes."""

from __future__ import annotations

import pytest

from replayer.sse import event_data, parse_event, usage_counts


def test_sse_done_and_comments() -> None:
    assert parse_event([b"data: [DONE]"]).done
    assert parse_event([b"data:[DONE]"]).done
    ev = parse_event([b": ping"])
    assert not ev.done
    assert not ev.has_content
    assert event_data([b": c", b"event: x", b"data: 1"]) == b"1"


def test_sse_role_only_chunk_has_no_content() -> None:
    ev = parse_event([b'data: {"choices":[{"delta":{"role":"assistant"}}]}'])
    assert not ev.has_content


def test_sse_content_reasoning_and_text() -> None:
    for delta in (
        b'{"content":"x"}',
        b'{"reasoning_content":"x"}',
        b'{"reasoning":"x"}',
    ):
        line = b'data: {"choices":[{"delta":' + delta + b"}]}"
        assert parse_event([line]).has_content
    assert (
        parse_event(
            [b'data: {"choices":[{"text":"hi","finish_reason":"length"}]}']
        ).finish_reason
        == "length"
    )
    assert not parse_event(
        [b'data: {"choices":[{"delta":{"content":""}}]}']
    ).has_content


def test_sse_usage_chunk() -> None:
    ev = parse_event(
        [
            b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,'
            b'"prompt_tokens_details":{"cached_tokens":8}}}'
        ]
    )
    assert usage_counts(ev.usage) == (10, 3, 8)
    assert usage_counts({"prompt_tokens": 10, "completion_tokens": 3}) == (10, 3, None)
    assert usage_counts({"prompt_tokens_details": None}) == (None, None, None)
    assert usage_counts(None) == (None, None, None)


def test_sse_error_and_malformed() -> None:
    assert parse_event([b'data: {"error":{"message":"bad"}}']).error == "bad"
    assert parse_event([b"data: {not json"]).error is not None
    assert not parse_event([b"data: [1,2]"]).has_content


def test_sse_multiline_data_joined() -> None:
    ev = parse_event([b'data: {"choices":[{"delta":', b'data: {"content":"y"}}]}'])
    assert ev.has_content


@pytest.mark.parametrize(
    "data",
    [
        b'{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"t"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"say \\"content\\":\\"\\""}}]}',
        b'{"choices":[{"index":0,"text":"","finish_reason":null}]}',
        b'{"choices":[{"index":0,"text":" a"}]}',
        b'{"choices": [{"index": 0, "delta": {"content": ""}}]}',
        b'{"choices":[{"delta":{"content":"z"},"finish_reason":"length"}]}',
        b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}',
        b'{"choices":[{"delta":{"content":"\\u00e9"}}],"usage":null}',
    ],
)
def test_sse_quick_path_agrees_with_full_parse(data: bytes) -> None:
    import orjson

    from replayer.sse import parse_chunk

    assert parse_event([b"data: " + data]) == parse_chunk(orjson.loads(data))
