"""Replays of real Weka sessions against llama.cpp's server (the xllamacpp wheel,
SmolLM2-135M-Instruct GGUF, 4 slots of 4,096 tokens), through both APIs.

llama.cpp reuses the longest common prefix of a slot's cached tokens (token-granular,
no blocks) and reports it as ``usage.prompt_tokens_details.cached_tokens``; its
counters are ``llamacpp:prompt_tokens_cached_total`` (reused) and
``llamacpp:prompt_tokens_total`` (processed, cached ones excluded). It has no TTFT
histogram.

Started by `bash .ci/engines.sh -- pytest -m e2e tests/e2e`; skipped without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import Engine
from tests.e2e.helpers import last_scrape, replay, report, scrape, total, weka_subset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# This engine prefills ~100-150 tok/s here: two real sessions (20 requests), prompts
# cut at 2,000 tokens, 8 output tokens.
SESSIONS = ("trace_0208", "trace_0718")
OUT_CAP = 8
SHRINK = ("--block-tokens", "1", "--max-input-tokens", "1200", "--concurrency", "2")


@pytest.fixture(scope="module")
def subset(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llamacpp-trace") / "subset.jsonl"
    return weka_subset(weka_dir, SESSIONS, OUT_CAP, out)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_llamacpp_replay(
    llamacpp: Engine, subset: Path, tmp_path: Path, tokenizer_json: Path, api: str
) -> None:
    before = scrape(llamacpp.url)
    extra = ("--tokenizer", str(tokenizer_json)) if api == "chat" else ()
    run = replay(
        llamacpp.url, llamacpp.model, subset, tmp_path / "run", "--api", api,
        *SHRINK, "--engine", "llamacpp", *extra,
    )  # fmt: skip
    rows = run.rows.sort_values("start_ns", kind="stable")
    bad = rows[rows["status"] != "ok"]
    assert bad.empty, bad[["status", "error_type", "error_message"]].to_string()
    assert len(rows) == 20
    # llama.cpp honours ignore_eos + min_tokens: exact output lengths.
    assert (rows["output_tokens"] == rows["requested_output_tokens"]).all()

    # It reports cached tokens, and they add up to its own counter; the processed
    # counter excludes them.
    assert rows["cached_tokens"].notna().all()
    after = last_scrape(run.metrics)
    cached = int(rows["cached_tokens"].sum())
    prompt = int(rows["server_prompt_tokens"].sum())
    name = "llamacpp:prompt_tokens_cached_total"
    assert cached == total(after, name) - total(before, name)
    name = "llamacpp:prompt_tokens_total"
    assert prompt - cached == total(after, name) - total(before, name)

    # Token-granular prefix reuse: our ideal (1-token blocks here) is what it can hit,
    # less the last token of a fully cached prompt (always recomputed). In chat mode
    # the template's role tokens before the first differing word match too, so it
    # hits a few tokens more than our ideal, which counts message content only.
    ideal = np.minimum(rows["ideal_cached_tokens"], rows["server_prompt_tokens"] - 1)
    if api == "completions":
        assert (rows["cached_tokens"] <= ideal + 1).all()  # +1: a chance equal token
        assert cached >= 0.95 * ideal.sum()
    else:
        assert cached >= 0.95 * ideal.sum()
        assert (rows["cached_tokens"] <= rows["ideal_cached_tokens"] + 64).all()
    report(
        f"llamacpp-{api}",
        requests=len(rows),
        hit_rate_achieved=round(cached / prompt, 4),
        hit_rate_ideal_ours=round(
            int(rows["ideal_cached_tokens"].sum()) / int(rows["prompt_tokens"].sum()), 4
        ),
        p90_ttft_ms_ours=round(float(np.percentile(rows["ttft_ns"], 90)) / 1e6, 1),
        retries=int(rows["retries"].sum()) if "retries" in rows else None,
    )
