"""One row per request: :class:`RequestRecord` and ``RECORD_SCHEMA`` (field name =
column name), statuses and the one TPOT definition. See docs/run-directory.md."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

import pyarrow as pa

RequestStatus = Literal[
    "ok", "http_error", "timeout", "client_error", "cancelled", "skipped"
]
STATUSES: tuple[str, ...] = get_args(RequestStatus)


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """What happened to one trace request during a run."""

    run_id: str
    worker_id: int = 0
    session_id: str  # the (sub)session this request belongs to
    root_session_id: str  # the root of its session tree
    parent_session_id: str | None = None  # None for a root session
    agent_depth: int = 0  # 0 root, 1 subagent, 2 subagent of a subagent ...
    request_index: int  # position within its session
    scheduled_ns: int  # when the trace wanted it sent (run-relative)
    start_ns: int | None = None  # when its bytes were sent; None if never sent
    first_token_ns: int | None = None  # first chunk carrying content (or reasoning)
    end_ns: int | None = None  # last byte of the response / the failure
    ttft_ns: int | None = None  # first_token_ns - start_ns
    e2e_ns: int | None = None  # end_ns - start_ns
    tpot_ns: int | None = None  # see tpot_ns(); None if < 2 tokens or not ok
    chunk_times_ns: list[int] = field(
        default_factory=list
    )  # content chunk arrivals, from start_ns
    trace_input_tokens: int  # the trace's `in`
    prompt_tokens: int  # tokens we sent (after --block-tokens / --max-input-tokens)
    dropped_input_tokens: int = 0  # trimmed by --max-input-tokens
    server_prompt_tokens: int | None = None  # usage.prompt_tokens
    trace_output_tokens: int  # the trace's `out`
    requested_output_tokens: int  # max_tokens sent
    # Output cut so prompt + output fit max_model_len (--fit-context clamp).
    dropped_output_tokens: int = 0
    output_tokens: int | None = None  # received: usage.completion_tokens, else chunks
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    ideal_cached_tokens: int  # infinite-prefix-cache hit the trace allows (sent tokens)
    status: RequestStatus = "ok"
    http_status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    retries: int = 0  # connection attempts retried before any byte was sent
    # Getting a connection, = slot_wait_ns + connect_ns; None: not sent.
    pool_wait_ns: int | None = None
    # Its parts (None: not sent, or a client that does not measure them): queued
    # for a free slot under the client's own cap, and opening a new connection
    # (the server's accept: a slow-accepting server shows here, not above).
    slot_wait_ns: int | None = None
    connect_ns: int | None = None
    inflight_at_send: int = 0  # requests in flight (all workers' view of this one)
    lanes_at_send: int = 0  # live session trees when it was sent
    warmup: bool = False  # started inside the warm-up window
    primer: bool = False  # a max_tokens=1 request priming a mid-session start
    replay_index: int = 0  # which replay of its tree (the cache-bust marker's)
    # --live-assistant: prompt tokens sent minus those the recorded replies would
    # have taken (None: the history was the trace's).
    live_drift_tokens: int | None = None
    # Of cached_tokens, the hits found on the GPU and those loaded from a host tier
    # (None: the server does not say; analysis may fill them from its counters).
    cached_gpu_tokens: int | None = None
    cached_host_tokens: int | None = None


RECORD_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("worker_id", pa.int32()),
        ("session_id", pa.string()),
        ("root_session_id", pa.string()),
        ("parent_session_id", pa.string()),
        ("agent_depth", pa.int32()),
        ("request_index", pa.int32()),
        ("scheduled_ns", pa.int64()),
        ("start_ns", pa.int64()),
        ("first_token_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("ttft_ns", pa.int64()),
        ("e2e_ns", pa.int64()),
        ("tpot_ns", pa.int64()),
        ("chunk_times_ns", pa.list_(pa.int64())),
        ("trace_input_tokens", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("dropped_input_tokens", pa.int64()),
        ("server_prompt_tokens", pa.int64()),
        ("trace_output_tokens", pa.int64()),
        ("requested_output_tokens", pa.int64()),
        ("dropped_output_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("ideal_cached_tokens", pa.int64()),
        ("status", pa.string()),
        ("http_status", pa.int32()),
        ("error_type", pa.string()),
        ("error_message", pa.string()),
        ("retries", pa.int32()),
        ("pool_wait_ns", pa.int64()),
        ("slot_wait_ns", pa.int64()),
        ("connect_ns", pa.int64()),
        ("inflight_at_send", pa.int32()),
        ("lanes_at_send", pa.int32()),
        ("warmup", pa.bool_()),
        ("primer", pa.bool_()),
        ("replay_index", pa.int32()),
        ("live_drift_tokens", pa.int64()),
        ("cached_gpu_tokens", pa.int64()),
        ("cached_host_tokens", pa.int64()),
    ]
)

RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
FAILED_STATUSES = ("http_error", "timeout", "client_error")  # sent, and failed

RUN_METADATA_KEY = b"replayer.run"  # Parquet key-value metadata: RunMeta as JSON


def tpot_ns(e2e_ns: int, ttft_ns: int, output_tokens: int) -> int:
    """Time per output token after the first: (E2E - TTFT) / (output_tokens - 1).

    The project's one TPOT definition (vLLM's, SGLang's and AIPerf's): the engine
    fills the ``tpot_ns`` column with it and analysis reads that column. Needs
    ``output_tokens >= 2``.
    """
    return (e2e_ns - ttft_ns) // (output_tokens - 1)


def records_to_table(records: list[RequestRecord]) -> pa.Table:
    """Rows → an Arrow table with RECORD_SCHEMA."""
    columns = {name: [getattr(r, name) for r in records] for name in RECORD_FIELDS}
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)
