"""The clock-free core: vLLM v1's scheduling (chunked prefill, allocation as tokens are
computed, preemption of the newest), prefix hits and the step-time model."""

from __future__ import annotations

import pytest

from replayer.sim import SimConfig
from replayer.sim.cache import block_hashes
from replayer.sim.core import CoreRequest, Scheduler


def _req(base: int, prompt: int, out: int, bs: int) -> CoreRequest:
    return CoreRequest(prompt, out, block_hashes(list(range(base, base + prompt)), bs))


def _drain(core: Scheduler) -> list[float]:
    steps = []
    while (result := core.step()) is not None:
        steps.append(result.duration_us)
    return steps


def test_chunked_prefill_then_one_token_a_step_exact_step_times() -> None:
    cfg = SimConfig.fast(
        block_size=16,
        max_num_batched_tokens=1000,
        prefill_us_per_token=10.0,
        decode_base_ms=1.0,
        decode_per_seq_ms=0.5,
        decode_us_per_context_token=0.1,
        request_overhead_us=300.0,
    )
    core = Scheduler(cfg)
    req = _req(0, 2500, 3, 16)
    core.add(req)
    first = core.step()
    assert first is not None
    assert first.emitted == []
    assert first.prefill_tokens == 1000
    assert first.duration_us == pytest.approx(1000 + 10 * 1000 + 300)
    second = core.step()
    assert second is not None
    assert second.emitted == []
    assert second.duration_us == pytest.approx(1000 + 10 * 1000)
    third = core.step()
    assert third is not None
    assert third.emitted == [req]
    assert third.duration_us == pytest.approx(1000 + 10 * 500)
    decode = core.step()
    assert decode is not None
    assert decode.decode_seqs == 1
    assert decode.duration_us == pytest.approx(1000 + 500 + 0.1 * 2501)
    assert _drain(core) == [pytest.approx(1000 + 500 + 0.1 * 2502)]
    assert req.finished
    assert req.generated == 3
    assert core.pool.num_free == core.pool.num_blocks


def test_second_identical_prompt_hits_all_full_blocks_but_the_last_token() -> None:
    core = Scheduler(SimConfig.fast(block_size=16))
    a = _req(0, 64, 2, 16)
    core.add(a)
    _drain(core)
    b = _req(0, 64, 2, 16)
    core.add(b)
    _drain(core)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 48  # the last token is recomputed: 3 of 4 blocks
    assert core.stats.prefix_cache_hits_tokens == 48
    assert core.stats.prefix_cache_queries_tokens == 128


def test_blocks_are_allocated_as_computed_and_the_newest_is_preempted() -> None:
    # 20 blocks of 4 tokens. Two 32-token prompts take 8 blocks each; decoding 20
    # tokens each would need 13 each: the newer one is preempted, then recomputed.
    cfg = SimConfig.fast(block_size=4, kv_capacity_tokens=80, max_model_len=60)
    core = Scheduler(cfg)
    old, new = _req(0, 32, 20, 4), _req(1000, 32, 20, 4)
    core.add(old)
    core.add(new)
    core.step()
    assert len(core.running) == 2  # both admitted: nothing reserved for outputs
    _drain(core)
    assert old.finished
    assert new.finished
    assert (old.generated, new.generated) == (20, 20)
    assert old.preemptions == 0
    assert new.preemptions >= 1
    assert core.stats.preemptions == new.preemptions
    # The first admission's hits are what the request reports.
    assert new.cached_tokens == 0
    assert core.stats.requests_success == 2


@pytest.mark.parametrize("policy", ["vllm", "vllm-chunk"])
def test_admission_waits_for_the_whole_prompt_under_vllm(policy: str) -> None:
    # 25 blocks of 4 tokens, 16-token steps. A 60-token prompt runs (15 blocks);
    # a second 60-token prompt's first chunk (4 blocks) fits in the 10 left, the
    # whole prompt (15) does not: vLLM (scheduler_reserve_full_isl, its default)
    # keeps it waiting; admitted on its first chunk, it runs out of blocks
    # mid-prefill and preempts.
    cfg = SimConfig.fast(
        block_size=4, kv_capacity_tokens=100, max_model_len=80,
        max_num_batched_tokens=16, policy=policy,
    )  # fmt: skip
    core = Scheduler(cfg)
    first, second = _req(0, 60, 8, 4), _req(1000, 60, 8, 4)
    core.add(first)
    for _ in range(4):  # the first prompt's four chunks
        core.step()
    core.add(second)
    core.step()
    if policy == "vllm":
        assert core.running == [first]
        assert list(core.waiting) == [second]
    else:
        assert core.running == [first, second]
    _drain(core)
    assert (first.generated, second.generated) == (8, 8)
    assert (core.stats.preemptions > 0) == (policy == "vllm-chunk")


def test_reserve_policy_never_preempts_and_admits_one_at_a_time() -> None:
    cfg = SimConfig.fast(
        block_size=4, kv_capacity_tokens=80, max_model_len=60, policy="reserve"
    )
    core = Scheduler(cfg)
    old, new = _req(0, 32, 20, 4), _req(1000, 32, 20, 4)
    core.add(old)
    core.add(new)
    core.step()
    assert core.running == [old]  # 13 blocks reserved: the other 13 do not fit
    _drain(core)
    assert core.stats.preemptions == 0
    assert (old.generated, new.generated) == (20, 20)


def test_max_num_seqs_caps_the_batch_and_arrival_order_holds() -> None:
    core = Scheduler(SimConfig.fast(block_size=4, max_num_seqs=2))
    reqs = [_req(i * 100, 8, 5, 4) for i in range(5)]
    for r in reqs:
        core.add(r)
    result = core.step()
    assert result is not None
    assert core.running == reqs[:2]
    order = []
    while (result := core.step()) is not None:
        order += [r for r in result.emitted if r.finished]
        assert len(core.running) <= 2
    assert order == reqs


def test_abort_frees_blocks_and_a_waiting_abort_leaves_the_queue() -> None:
    core = Scheduler(SimConfig.fast(block_size=4, max_num_seqs=1))
    a, b = _req(0, 40, 50, 4), _req(500, 40, 50, 4)
    core.add(a)
    core.add(b)
    core.step()
    core.abort(b)
    assert list(core.waiting) == []
    core.abort(a)
    assert core.idle
    assert core.pool.num_free == core.pool.num_blocks
    core.abort(a)  # no-op once finished


def test_host_tier_hits_cost_their_load_time() -> None:
    cfg = SimConfig.fast(
        block_size=4,
        kv_capacity_tokens=64,
        max_model_len=40,
        host_capacity_tokens=400,
        host_hit_us_per_token=2.0,
        prefill_us_per_token=10.0,
    )
    core = Scheduler(cfg)
    first = _req(0, 40, 1, 4)
    core.add(first)
    _drain(core)
    core.add(_req(5000, 40, 1, 4))  # pushes most of the first prompt to the host
    _drain(core)
    again = _req(0, 40, 1, 4)
    core.add(again)
    steps = _drain(core)
    assert again.host_hit_tokens > 0
    assert again.cached_tokens == 36
    computed = 40 - 36
    gpu = again.cached_tokens - again.host_hit_tokens
    assert steps == [pytest.approx(2.0 * again.host_hit_tokens + 10.0 * computed)]
    assert gpu >= 0


def test_a_request_admitted_later_in_the_same_step_hits_the_blocks_just_scheduled() -> (
    None
):
    """vLLM caches a request's full blocks when it schedules them (allocate_slots), so
    a twin admitted next in the same step hits them, as it would one step later."""
    core = Scheduler(SimConfig.fast(block_size=16, max_num_batched_tokens=4096))
    first, twin = _req(0, 200, 2, 16), _req(0, 200, 2, 16)
    core.add(first)
    core.add(twin)
    result = core.step()
    assert result is not None
    assert first.cached_tokens == 0
    assert twin.cached_tokens == 192  # 12 full blocks (the last token recomputed)
    assert result.prefill_tokens == 200 + 8
