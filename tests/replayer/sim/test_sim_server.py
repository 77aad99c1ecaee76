"""The simulator over real HTTP on loopback: cache accounting, tokenization, streaming
shapes, errors and /metrics."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from replayer.sim import SimConfig, make_app
from traces.textrule import chat_to_token_ids, text_for_tokens, text_to_token_ids


async def test_server_cache_cold_warm_and_partial_prefix(start_sim) -> None:
    async with start_sim(block_size=4) as sim:
        prompt = list(range(1000, 1042))  # 10 full blocks + 2 tokens
        cold = await sim.completion(prompt)
        assert cold.usage["prompt_tokens"] == 42
        assert cold.cached_tokens == 0
        warm = await sim.completion(prompt)
        assert warm.cached_tokens == 40
        shared = await sim.completion([*prompt[:22], *range(5000, 5020)])
        assert shared.cached_tokens == 20  # 22 shared tokens = 5 full blocks
        unrelated = await sim.completion(list(range(7000, 7042)))
        assert unrelated.cached_tokens == 0


async def test_server_cache_recomputes_last_token_like_vllm(start_sim) -> None:
    async with start_sim(block_size=4) as sim:
        prompt = list(range(1000, 1040))  # exactly 10 blocks
        await sim.completion(prompt)
        again = await sim.completion(prompt)
        # The last token is recomputed for its logits, so its block is not a hit.
        assert again.cached_tokens == 36


async def test_server_cache_evicts_under_small_capacity(start_sim) -> None:
    async with start_sim(block_size=4, kv_capacity_tokens=64, max_model_len=60) as sim:
        a = list(range(1000, 1042))
        b = list(range(2000, 2042))
        await sim.completion(a)
        await sim.completion(b)  # needs 11 of 16 blocks: 5 of A's evicted, tail first
        again = await sim.completion(a)
        assert again.cached_tokens == 20


async def test_server_host_tier_hits_after_gpu_eviction(start_sim) -> None:
    async with start_sim(
        block_size=4, kv_capacity_tokens=64, max_model_len=60, host_capacity_tokens=64
    ) as sim:
        a = list(range(1000, 1042))
        await sim.completion(a)
        await sim.completion(list(range(2000, 2042)))
        again = await sim.completion(a)
        assert again.cached_tokens == 40  # 5 blocks from the GPU tier + 5 from host


async def test_server_prompt_forms_agree(start_sim) -> None:
    ids = list(range(1000, 1100))
    async with start_sim() as sim:
        as_ids = await sim.completion(ids)
        as_nested = await sim.completion([ids])
        as_text = await sim.completion(text_for_tokens(ids))
        as_text_list = await sim.completion([text_for_tokens(ids)])
    for result in (as_ids, as_nested, as_text, as_text_list):
        assert result.status == 200
        assert result.usage["prompt_tokens"] == 100
    assert as_nested.cached_tokens == 96  # same token ids as the first request
    assert as_text.cached_tokens == 96  # the text rule maps the words back to them


async def test_server_chat_prompt_tokens_follow_the_textrule(start_sim) -> None:
    messages = [
        {"role": "system", "content": text_for_tokens(range(1000, 1300))},
        {"role": "user", "content": "fix the failing test please"},
        {"role": "assistant", "content": [{"type": "text", "text": "done so"}]},
        {"role": "tool", "content": None},
    ]
    async with start_sim() as sim:
        result = await sim.chat(messages, max_tokens=5, ignore_eos=True)
    assert result.usage["prompt_tokens"] == len(chat_to_token_ids(messages))
    assert result.role_chunks == 1
    assert len(result.chunks) == 5
    assert result.finish_reason == "length"
    assert result.done


async def test_server_streams_one_token_per_chunk_exactly_max_tokens(start_sim) -> None:
    async with start_sim() as sim:
        result = await sim.completion([5000] * 20, max_tokens=50, ignore_eos=True)
    assert len(result.chunks) == 50
    assert result.usage["completion_tokens"] == 50
    assert result.usage["total_tokens"] == 70
    text = "".join(result.chunks)
    assert len(text_to_token_ids(text)) == 50  # each chunk is one word of the rule
    assert result.role_chunks == 0
    assert result.done
    assert result.finish_reason == "length"


async def test_server_eos_respects_min_tokens(start_sim) -> None:
    async with start_sim(mean_output_tokens=5, seed=3) as sim:
        free = [await sim.completion([7] * 10, max_tokens=100) for _ in range(20)]
        floored = [
            await sim.completion([7] * 10, max_tokens=100, min_tokens=40)
            for _ in range(20)
        ]
    lengths = [r.usage["completion_tokens"] for r in free]
    assert min(lengths) >= 1
    assert sum(lengths) / len(lengths) < 30  # stopped at the seeded EOS
    assert any(r.finish_reason == "stop" for r in free)
    assert all(40 <= r.usage["completion_tokens"] <= 100 for r in floored)


async def test_server_non_streaming_responses(start_sim) -> None:
    async with start_sim() as sim:
        chat = await sim.chat(
            [{"role": "user", "content": "hello"}],
            stream=False,
            max_completion_tokens=7,
            ignore_eos=True,
        )
        comp = await sim.completion([1000] * 40, stream=False, max_tokens=3)
    assert chat.status == 200
    assert chat.body["object"] == "chat.completion"
    message = chat.body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert len(message["content"].split()) == 7
    assert chat.usage["prompt_tokens"] == 2
    assert chat.usage["completion_tokens"] == 7
    assert comp.body["object"] == "text_completion"
    assert (
        len(comp.body["choices"][0]["text"].split()) == comp.usage["completion_tokens"]
    )


async def test_server_errors_have_openai_shape(start_sim) -> None:
    async with start_sim(max_model_len=100, kv_capacity_tokens=200) as sim:
        bad_json = await sim.post_raw("/v1/completions", b"{not json")
        unknown = await sim.completion([1, 2], model="gpt-none")
        missing = await sim.post_raw("/v1/chat/completions", b'{"messages": []}')
        too_long = await sim.completion(list(range(101)))
        too_long_with_output = await sim.completion(list(range(90)), max_tokens=20)
        no_messages = await sim.chat([])
        bad_prompt = await sim.completion([1, "x"])
        bad_max = await sim.completion([1], max_tokens=0)
        min_over_max = await sim.completion([1], max_tokens=2, min_tokens=3)
        no_route = await sim.post_raw("/v1/embeddings", b"{}")
    for result, status in (
        (bad_json, 400),
        (unknown, 404),
        (missing, 404),
        (too_long, 400),
        (too_long_with_output, 400),
        (no_messages, 400),
        (bad_prompt, 400),
        (bad_max, 400),
        (min_over_max, 400),
        (no_route, 404),
    ):
        assert result.status == status
        error = result.body["error"]
        assert set(error) >= {"message", "type", "code"}
        assert error["code"] == status
        assert error["message"]
    assert "maximum context length is 100" in too_long.body["error"]["message"]


async def test_server_accept_any_model_echoes_the_name(start_sim) -> None:
    async with start_sim(accept_any_model=True) as sim:
        result = await sim.completion([1, 2, 3], model="Qwen/Qwen3-8B", stream=False)
    assert result.status == 200
    assert result.body["model"] == "Qwen/Qwen3-8B"


async def test_server_models_and_health(start_sim) -> None:
    async with start_sim(model="my-model") as sim:
        async with sim.session.get(sim.url + "/v1/models") as resp:
            models = await resp.json()
        async with sim.session.get(sim.url + "/health") as resp:
            assert resp.status == 200
    assert models["data"][0]["id"] == "my-model"
    assert models["data"][0]["owned_by"] == "replayer-sim"


async def test_server_metrics_parse_and_match_usage(start_sim) -> None:
    async with start_sim(block_size=4) as sim:
        results = []
        for base in (1000, 1000, 2000, 1000):
            results.append(
                await sim.completion(list(range(base, base + 50)), max_tokens=3)
            )
        results.append(await sim.chat([{"role": "user", "content": "a b c"}]))
        samples = await sim.metrics()
    prompt = sum(r.usage["prompt_tokens"] for r in results)
    cached = sum(r.cached_tokens for r in results)
    generated = sum(r.usage["completion_tokens"] for r in results)
    assert cached > 0
    assert samples["vllm:prefix_cache_queries_total"] == prompt
    assert samples["vllm:prefix_cache_hits_total"] == cached
    assert samples["vllm:prompt_tokens_total"] == prompt
    assert samples["vllm:generation_tokens_total"] == generated
    assert samples["vllm:num_requests_running"] == 0
    assert samples["vllm:num_requests_waiting"] == 0
    assert samples["vllm:kv_cache_usage_perc"] == 0.0
    assert samples["vllm:time_to_first_token_seconds_count"] == len(results)
    assert samples["vllm:time_to_first_token_seconds_bucket[+Inf]"] == len(results)
    assert samples["vllm:e2e_request_latency_seconds_count"] == len(results)


async def test_server_client_disconnect_frees_the_sequence(start_sim) -> None:
    async with start_sim(
        SimConfig.fast(decode_base_ms=5.0, kv_capacity_tokens=600_000)
    ) as sim:
        async with sim.session.post(
            sim.url + "/v1/completions",
            json={
                "model": "sim",
                "prompt": [1] * 100,
                "max_tokens": 10_000,
                "ignore_eos": True,
                "stream": True,
            },
        ) as resp:
            await resp.content.readline()
            during = await sim.metrics()
            resp.close()
        for _ in range(100):
            after = await sim.metrics()
            if after["vllm:num_requests_running"] == 0:
                break
            await asyncio.sleep(0.02)
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:kv_cache_usage_perc"] > 0
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0


async def test_make_app_serves_with_aiohttp_client(aiohttp_client) -> None:
    client = await aiohttp_client(make_app(SimConfig.fast()))
    resp = await client.post(
        "/v1/completions", json={"model": "sim", "prompt": "bada kefi", "max_tokens": 2}
    )
    assert resp.status == 200
    body = await resp.json()
    assert body["usage"]["prompt_tokens"] == 2


async def test_server_large_text_prompt_is_tokenized_off_loop(start_sim) -> None:
    ids = list(range(1000, 1000 + 60_000))
    async with start_sim() as sim:
        result = await sim.chat(
            [{"role": "user", "content": text_for_tokens(ids)}], max_tokens=2
        )
    assert result.usage["prompt_tokens"] == 60_001


async def test_server_client_leaving_during_prefill_aborts_it(start_sim) -> None:
    config = SimConfig.fast(prefill_us_per_token=1000.0, max_num_batched_tokens=64)
    async with start_sim(config) as sim:
        body = {"model": "sim", "prompt": list(range(1000, 3000)), "stream": False}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await sim.session.post(sim.url + "/v1/completions", json=body)
        for _ in range(100):
            after = await sim.metrics()
            if after["vllm:num_requests_running"] == 0:
                break
            await asyncio.sleep(0.02)
    assert after["vllm:num_requests_running"] == 0  # not the full 2 s of prefill
    assert after["vllm:request_success_total"] == 0


async def test_server_disconnect_fault_without_streaming(start_sim) -> None:
    async with start_sim(disconnect_rate=1.0) as sim:
        with pytest.raises(aiohttp.ClientError):
            await sim.completion([1, 2, 3], stream=False, max_tokens=4)
        samples = await sim.metrics()
    assert samples["vllm:num_requests_running"] == 0


@pytest.mark.parametrize("route", ["/reset_prefix_cache", "/flush_cache"])
async def test_server_prefix_cache_reset_drops_cached_blocks(start_sim, route) -> None:
    async with start_sim(block_size=4) as sim:
        prompt = list(range(1000, 1042))
        await sim.completion(prompt)
        assert (await sim.completion(prompt)).cached_tokens == 40
        async with sim.session.post(sim.url + route) as resp:
            assert resp.status == 200
            assert (await resp.json())["dropped_blocks"] >= 10
        assert (await sim.completion(prompt)).cached_tokens == 0
