"""Pure SSE parsing on bytes: the byte framer and the event parser."""

from __future__ import annotations

import pytest

from replayer.play.sse import EventFramer, event_data, parse_event, usage_counts


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
    # Choices that are not a list of objects: an error, not an ok chunk of no tokens.
    for data in (b'{"choices":"notalist"}', b'{"choices": [1]}', b'{"choices":{}}'):
        error = parse_event([b"data: " + data]).error
        assert error is not None, data
        assert error.startswith("malformed SSE chunk"), data
    assert parse_event([b'data: {"choices":[],"usage":{}}']).error is None


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

    from replayer.play.sse import parse_chunk

    assert parse_event([b"data: " + data]) == parse_chunk(orjson.loads(data))


TOKEN = b'data: {"choices":[{"index":0,"text":"t"}]}'


def _feed(framer: EventFramer, data: bytes, now: int) -> list[tuple[int, bool, bool]]:
    return [(stamp, ev.has_content, ev.done) for stamp, ev in framer.feed(data, now)]


def test_sse_framer_stamps_each_event_with_its_first_bytes_arrival() -> None:
    f = EventFramer()
    # One read with two events: both carry that read's stamp.
    assert _feed(f, TOKEN + b"\n\n" + TOKEN + b"\n\n", 10) == [
        (10, True, False),
        (10, True, False),
    ]
    # An event split over three reads keeps the stamp of its first byte.
    assert _feed(f, TOKEN[:7], 20) == []
    assert _feed(f, TOKEN[7:] + b"\n", 30) == []
    assert _feed(f, b"\n" + TOKEN, 40) == [(20, True, False)]
    # The rest of the last read starts the next event at that read's stamp.
    assert _feed(f, b"\n\ndata: [DONE]\n\n", 50) == [
        (40, True, False),
        (50, False, True),
    ]


def test_sse_framer_crlf_comments_and_blank_lines() -> None:
    f = EventFramer()
    data = b": ping\r\n\r\n\r\n" + TOKEN + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    assert _feed(f, data, 5) == [(5, False, False), (5, True, False), (5, False, True)]


def test_sse_framer_stopping_early_keeps_the_rest() -> None:
    f = EventFramer()
    events = f.feed(TOKEN + b"\n\n" + TOKEN + b"\n\n", 1)
    assert next(events)[1].has_content
    events.close()  # the consumer stopped after the first event
    assert [ev.has_content for _, ev in f.feed(b"", 2)] == [True]


def test_sse_framer_finish_reads_an_unterminated_tail() -> None:
    f = EventFramer()
    assert _feed(f, TOKEN + b"\n\ndata: [DONE]", 1) == [(1, True, False)]
    tail = f.finish()
    assert tail is not None
    assert tail.done
    assert f.finish() is None
