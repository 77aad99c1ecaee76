"""Output lengths for small engines (docs/replaying.md, "Output length"):
--output-scale and --max-output-tokens, the server's max_model_len read from
/v1/models, and --fit-context clamp, through the real CLI against the built-in
simulator (live and in virtual time)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner, Result

from replayer.cli import main
from tests.builders import growing_session, trace_of
from tests.fakes import FakeLLM, serve_in_thread
from traces.io import write_trace

LIMIT = 4096
SCALE, CAP = 0.5, 1800


def _trace(path: Path) -> Path:
    """2 sessions of 10 growing turns over 256-token blocks (514 to 2,818 tokens),
    4,000 output tokens each: scaled by 0.5 and capped at 1,800, the last three
    turns of each pass 4,096."""
    return write_trace(
        trace_of(
            *(growing_session(f"s{k}", 10, out=4000, block_size=256) for k in range(2))
        ),
        path,
    )


def _run(tmp_path: Path, name: str, *flags: str) -> tuple[Result, pd.DataFrame]:
    out = tmp_path / name
    res = CliRunner().invoke(
        main,
        [
            "run", str(_trace(tmp_path / "t.jsonl")), "--concurrency", "2",
            "--think-scale", "0", "--output-scale", str(SCALE),
            "--max-output-tokens", str(CAP), "--on-error", "continue",
            "--out", str(out), *flags,
        ],
    )  # fmt: skip
    assert res.exit_code in (0, 1), res.output
    rows = pd.read_parquet(out / "requests")
    return res, rows


def _full(rows: pd.DataFrame) -> pd.Series:
    """Each row's output length after --output-scale and --max-output-tokens."""
    return (rows.trace_output_tokens * SCALE).round().astype(int).clip(1, CAP)


def _meta(tmp_path: Path, name: str) -> dict[str, object]:
    meta = json.loads((tmp_path / name / "run.json").read_text())
    assert isinstance(meta, dict)
    return meta


@pytest.mark.parametrize("where", ["live", "virtual"])
def test_fit_context_clamp_fits_every_request_and_counts_the_drop(
    tmp_path: Path, where: str
) -> None:
    sim = ["--sim-args", f"--max-model-len {LIMIT} --speed 1000"]
    if where == "virtual":
        sim = ["--virtual", "sim", "--sim-args", f"--max-model-len {LIMIT}"]
    res, rows = _run(tmp_path, "clamp", "--fit-context", "clamp", *sim)
    assert res.exit_code == 0, res.output
    assert len(rows) == 20
    assert (rows.status == "ok").all()  # no 400 for length
    full = _full(rows)
    past = rows.prompt_tokens + full > LIMIT
    assert past.sum() == 6  # the last three turns of each session
    assert (
        rows.dropped_output_tokens == (rows.prompt_tokens + full - LIMIT).clip(0)
    ).all()
    assert (rows.requested_output_tokens + rows.dropped_output_tokens == full).all()
    assert (rows.prompt_tokens + rows.requested_output_tokens <= LIMIT).all()
    assert (rows.output_tokens == rows.requested_output_tokens).all()
    assert (rows.dropped_output_tokens[~past] == 0).all()
    assert f"{past.sum()} of 20 requests cannot fit" in res.output
    meta = _meta(tmp_path, "clamp")
    config = meta["config"]
    assert isinstance(config, dict)
    assert config["max_model_len"] == LIMIT
    assert config["fit_context"] == "clamp"
    assert config["output_scale"] == SCALE
    assert config["max_output_tokens"] == CAP


def test_fit_context_off_still_sends_what_cannot_fit(tmp_path: Path) -> None:
    res, rows = _run(
        tmp_path, "off", "--sim-args", f"--max-model-len {LIMIT} --speed 1000"
    )
    full = _full(rows)
    past = rows.prompt_tokens + full > LIMIT
    assert past.sum() == 6
    # Sent as they are: the server's 400 stays an error; the rest are whole.
    assert (rows.http_status[past] == 400).all()
    assert (rows.status[~past] == "ok").all()
    assert (rows.requested_output_tokens == full).all()
    assert (rows.dropped_output_tokens == 0).all()
    assert "6 of 20 requests cannot fit the server's context" in res.output
    assert "--fit-context clamp" in res.output
    meta = _meta(tmp_path, "off")
    warnings = meta["warnings"]
    assert isinstance(warnings, list)
    assert any("6 of 20 requests cannot fit" in w for w in warnings)


def test_output_scale_and_cap_apply_before_min_tokens(tmp_path: Path) -> None:
    # A roomy context: nothing is clamped; each request asks for its scaled, capped
    # length, min_tokens (ignore_eos) the same.
    res, rows = _run(
        tmp_path, "scaled", "--fit-context", "clamp", "--sim-args", "--speed 1000"
    )
    assert res.exit_code == 0, res.output
    assert (rows.status == "ok").all()
    assert (rows.requested_output_tokens == _full(rows)).all()
    assert (rows.output_tokens == CAP).all()
    assert (rows.dropped_output_tokens == 0).all()
    assert "cannot fit" not in res.output


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--output-scale", "0"], "--output-scale"),
        (["--max-output-tokens", "0"], "--max-output-tokens"),
        (["--fit-context", "trim"], "--fit-context"),
    ],
)
def test_bad_output_flags_are_usage_errors(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    res = CliRunner().invoke(
        main,
        [
            "run",
            str(_trace(tmp_path / "t.jsonl")),
            "--out",
            str(tmp_path / "r"),
            *flags,
        ],
    )
    assert res.exit_code == 2
    assert says in res.output
    assert not (tmp_path / "r").exists()


def test_fit_context_clamp_says_when_the_server_has_no_max_model_len(
    tmp_path: Path,
) -> None:
    fake = FakeLLM()  # its /v1/models lists no max_model_len
    with serve_in_thread(fake) as url:
        res, rows = _run(
            tmp_path, "nolen", "--fit-context", "clamp", "--endpoint", url,
            "--model", "fake-model",
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "does not report its max_model_len" in res.output
    assert (rows.requested_output_tokens == _full(rows)).all()
    assert (rows.dropped_output_tokens == 0).all()
    meta = _meta(tmp_path, "nolen")
    config = meta["config"]
    assert isinstance(config, dict)
    assert config["max_model_len"] is None


def test_fit_context_clamp_leaves_room_for_a_chat_template(tmp_path: Path) -> None:
    # A chat server whose template adds 30 tokens and 5 a message to the prompt
    # the replayer counts: clamped to max_model_len - our count alone, the longest
    # prompts would still get a 400. The clamp leaves room for the template as the
    # server's usage reports teach it (before the first: 32 + 8 a message).
    fake = FakeLLM(max_model_len=LIMIT, template_base=30, template_per_message=5)
    with serve_in_thread(fake) as url:
        res, rows = _run(
            tmp_path, "chat", "--fit-context", "clamp", "--endpoint", url,
            "--model", "fake-model", "--api", "chat",
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(rows) == 20
    assert (rows.status == "ok").all()  # no 400 for length
    assert (rows.server_prompt_tokens > rows.prompt_tokens).all()
    assert (rows.server_prompt_tokens + rows.requested_output_tokens <= LIMIT).all()
    full = _full(rows)
    assert (rows.requested_output_tokens + rows.dropped_output_tokens == full).all()
    # Past our count alone (what the clamp looked at before the template): these
    # would have been 400s.
    assert (rows.prompt_tokens + full > LIMIT).sum() == 6
    past = rows.server_prompt_tokens + full > LIMIT
    assert (rows.dropped_output_tokens[past] > 0).all()
    # Once learned, the room left is the template's exactly: the requests that
    # needed a cut fill the context to the last token, bar the first turns.
    late = past & (rows.request_index >= 2)
    assert late.any()
    assert (
        rows.server_prompt_tokens[late] + rows.requested_output_tokens[late] == LIMIT
    ).all()
    assert (rows.dropped_output_tokens[~past] == 0).all()
