"""The host tier's what-if in virtual time: `capacity --host-tier` without a host tier
and with each size, `trace cache-curve --engine` with the host tier's hit, and the
one-line refusals of bad sizes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from replayer.cli import main
from replayer.studies.hosttier import parse_host_sizes
from tests.builders import weka_cut

MODEL = [
    "--block-size", "16", "--kv-capacity-tokens", "12288", "--max-model-len", "4096",
    "--decode-base-ms", "6", "--prefill-us-per-token", "40",
    "--host-bytes-per-token", "131072", "--host-bandwidth-gbs", "8",
]  # fmt: skip
SHAPE = [
    "--block-tokens", "2", "--max-input-tokens", "3000",
    "--think-scale", "0.01", "--think-cap", "0.1",
]  # fmt: skip


@pytest.fixture(scope="module")
def small_weka(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return weka_cut(weka_dir, tmp_path_factory.mktemp("weka-whatif"), 6)


def test_capacity_with_and_without_a_host_tier(
    small_weka: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cap"
    result = CliRunner().invoke(
        main,
        [
            "capacity", str(small_weka), "--virtual", "sim",
            "--sim-args", shlex.join(MODEL), *SHAPE, "--loop",
            "--slo", "ttft=1s", "--duration", "6", "--warmup", "0.5",
            "--max-level", "32", "--host-tier", "32K", "--out", str(out),
            "--quiet", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    none, tier = doc["host_tiers"]
    assert (none["host_capacity_tokens"], tier["host_capacity_tokens"]) == (0, 32768)
    assert none["host_hit"] == 0.0
    assert tier["host_hit"] > tier["gpu_hit"]  # past the GPU's knee, the host serves
    assert tier["max_level"] > none["max_level"] >= 1
    for t in doc["host_tiers"]:
        assert t["capacity"]["result"]["max_concurrency"] == t["max_level"]
        assert (out / t["folder"] / "capacity.json").is_file()
        assert t["hit"] == pytest.approx(t["gpu_hit"] + t["host_hit"])
    saved = json.loads((out / "host_tier.json").read_text())
    assert [t["max_level"] for t in saved["host_tiers"]] == [
        none["max_level"],
        tier["max_level"],
    ]


def test_cache_curve_gives_the_engines_host_hit_beside_the_gpus(
    small_weka: Path,
) -> None:
    args = shlex.join([*MODEL, "--host-capacity-tokens", "32768"])
    result = CliRunner().invoke(
        main,
        [
            "trace", "cache-curve", str(small_weka), "--concurrency", "8",
            "--block-tokens", "2", "--engine", "sim", "--sim-args", args, "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    budgets = json.loads(result.stdout)["budgets"]
    served = [b for b in budgets if b["engine_hit_rate"] is not None]
    assert served
    for b in served:
        assert b["engine_gpu_hit_rate"] + b["engine_host_hit_rate"] == pytest.approx(
            b["engine_hit_rate"]
        )
    assert any(b["engine_host_hit_rate"] > 0 for b in served)


def test_cache_curve_without_a_host_tier_has_no_tier_keys(small_weka: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "trace", "cache-curve", str(small_weka), "--concurrency", "2",
            "--block-tokens", "2", "--engine", "sim",
            "--sim-args", shlex.join(MODEL), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for b in json.loads(result.stdout)["budgets"]:
        assert "engine_host_hit_rate" not in b


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--virtual", "sim", "--host-tier", "0"], "must be a whole number of tokens"),
        (["--virtual", "sim", "--host-tier", "64Q"], "is not a size in tokens"),
        (["--virtual", "sim", "--host-tier", "64K,,1M"], "is not a size in tokens"),
        (["--virtual", "sim", "--host-tier", "0.3K"], "whole number"),
        (["--host-tier", "64K"], "add --virtual ENGINE.json"),
        (
            [
                "--virtual",
                "sim",
                "--sim-args",
                "--host-dialect trtllm",
                "--host-tier",
                "64K",
            ],
            "host_dialect must be one of vllm, sglang",
        ),
    ],
)
def test_bad_host_tier_input_is_one_line_and_exit_2(
    small_weka: Path, tmp_path: Path, flags: list[str], says: str
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "capacity", str(small_weka), "--slo", "ttft=1s", "--duration", "2",
            "--out", str(tmp_path / "cap"), "--quiet", *flags,
        ],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("Error: "), line
    assert "\n" not in line
    assert says in line


def test_parse_host_sizes() -> None:
    assert parse_host_sizes("65536,64K, 1.5M,2g,64K") == (65536, 1572864, 1 << 31)
