"""SimConfig validation and the fast() preset."""

from __future__ import annotations

import dataclasses

import pytest

from replayer.errors import ConfigError
from replayer.sim import SimConfig


def test_config_fast_has_zero_delays_and_keeps_overrides() -> None:
    config = SimConfig.fast(block_size=4, decode_base_ms=1.0)
    assert config.prefill_us_per_token == 0.0
    assert config.decode_per_seq_ms == 0.0
    assert config.decode_base_ms == 1.0
    assert config.block_size == 4


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"block_size": 0}, "block_size must be >= 1"),
        ({"speed": 0.0}, "speed must be > 0"),
        ({"fail_rate": 1.5}, "fail_rate must be in"),
        ({"prefill_us_per_token": -1.0}, "prefill_us_per_token must be >= 0"),
        ({"kv_capacity_tokens": 10}, "kv_capacity_tokens must be >= max_model_len"),
        ({"model": ""}, "model must be non-empty"),
    ],
)
def test_config_rejects_bad_values(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimConfig(**knobs)


def test_config_is_frozen_and_keyword_only() -> None:
    config = SimConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        SimConfig("sim")  # type: ignore[misc]
