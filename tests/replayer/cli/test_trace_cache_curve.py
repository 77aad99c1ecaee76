"""`replayer trace cache-curve`: the table, the `--json` keys, the knee and the server's
side of it, and one-line errors, through the real command."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from replayer.cli import main

# Session A: [1,2] 20 tok, [1,2,3] 30 tok, [1,2,3,4] 35 tok; session B: [1,2,3] 30,
# [1..5] 50; 10-token blocks. At concurrency 2 with no think time LRU hits 20, 40,
# 80 tokens of 165 at 4, 5, 8 blocks; the knee is 8 blocks (tests/traces/
# test_cache_curve.py works these by hand).
_A = {
    "id": "A",
    "block_size": 10,
    "requests": [
        {"t": 0, "type": "n", "in": 20, "out": 1, "hash_ids": [1, 2], "api_time": 1},
        {"t": 1, "type": "n", "in": 30, "out": 1, "hash_ids": [1, 2, 3], "api_time": 1},
        {"t": 2, "type": "n", "in": 35, "out": 1, "hash_ids": [1, 2, 3, 4],
         "api_time": 1},
    ],
}  # fmt: skip
_B = {
    "id": "B",
    "block_size": 10,
    "requests": [
        {"t": 0, "type": "n", "in": 30, "out": 1, "hash_ids": [1, 2, 3],
         "api_time": 1.5},
        {"t": 1.5, "type": "n", "in": 50, "out": 1, "hash_ids": [1, 2, 3, 4, 5],
         "api_time": 1.5},
    ],
}  # fmt: skip


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_A) + "\n" + json.dumps(_B) + "\n")
    return path


def _invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


_BASE = ("--concurrency", "2", "--think-scale", "0")


def test_cli_cache_curve_json_keys_and_values(tmp_path: Path) -> None:
    result = _invoke(
        "trace", "cache-curve", _trace(tmp_path), *_BASE, "--budgets", "40,50,80",
        "--bytes-per-token", str(1 << 27), "--server-kv-tokens", "90", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["ceiling_hit_rate"] * 165 == 80
    assert d["lru_unbounded_hit_rate"] == d["ceiling_hit_rate"]
    assert [b["tokens"] for b in d["budgets"]] == [40, 50, 80]
    assert [round(b["lru_hit_rate"] * 165) for b in d["budgets"]] == [20, 40, 80]
    assert [round(b["belady_hit_rate"] * 165) for b in d["budgets"]] == [60, 70, 80]
    assert [b["gib"] for b in d["budgets"]] == [5.0, 6.25, 10.0]  # 1/8 GiB a token
    assert d["knee"] == {"tokens": 80, "gib": 10.0, "points_below_ceiling": 5.0}
    assert d["server"]["side"] == "above"
    assert d["server"]["kv_tokens"] == 90
    assert {
        "concurrency", "think_scale", "think_cap_s", "block_tokens", "bytes_per_token",
        "requests", "input_tokens", "max_inflight",
    } <= d.keys()  # fmt: skip
    assert d["requests"] == 5
    # In flight: p90 of 21, 52, 62, 82, 87 tokens (input + output at each send).
    assert d["inflight_tokens"] == 85
    assert [b["below_inflight"] for b in d["budgets"]] == [True, True, True]
    assert d["server"]["below_inflight"] is False
    assert d["max_inflight"] is None


def test_cli_cache_curve_warns_below_the_inflight_tokens(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    args = ("trace", "cache-curve", path, *_BASE, "--budgets", "60,90")
    result = _invoke(*args, "--server-kv-tokens", "60")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "in flight    ~85 tokens" in out
    lines = out.splitlines()
    assert lines[5].endswith("  *")
    assert not lines[6].endswith("*")
    assert "* below the in-flight tokens" in out
    assert "warning      the server's KV (60 tokens) is below what the" in out
    # One request in flight: each holds 21..51 tokens alone, p90 45.
    capped = _invoke(*args, "--server-kv-tokens", "60", "--max-inflight", "1")
    assert "at most 1 in flight" in capped.stdout
    assert "in flight    ~45 tokens" in capped.stdout
    assert "warning" not in capped.stdout
    assert "*" not in capped.stdout


def test_cli_cache_curve_table_says_which_side_of_the_knee(tmp_path: Path) -> None:
    result = _invoke(
        "trace", "cache-curve", _trace(tmp_path), *_BASE, "--budgets", "40,80",
        "--block-tokens", "16", "--bytes-per-token", str(1 << 27),
        "--server-kv-gib", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "ceiling      48.5%" in lines[1]
    # Budgets in server tokens, 16 per block: 40 → 2 blocks, 80 → 5 blocks.
    assert lines[5].split() == ["40", "5.00", "0.0%", "24.2%", "48.5%", "*"]
    assert lines[6].split() == ["80", "10.00", "24.2%", "42.4%", "48.5%", "*"]
    assert "knee         128 tokens (16.00 GiB)" in result.stdout
    # 8 GiB = 64 tokens = 4 blocks: LRU 20/165.
    assert "server       64 tokens (8.00 GiB): below the knee (LRU 12.1%" in (
        result.stdout
    )
    assert "the knee needs 2.0x its KV" in result.stdout


def test_cli_cache_curve_default_budgets_and_errors(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    result = _invoke("trace", "cache-curve", path, "--json")
    assert result.exit_code == 0, result.output
    budgets = json.loads(result.stdout)["budgets"]
    assert budgets[-1]["lru_hit_rate"] == json.loads(result.stdout)["ceiling_hit_rate"]
    bad = _invoke("trace", "cache-curve", path, "--budgets", "12,lots")
    assert bad.exit_code == 2
    assert "expected a list like 131072,262144" in bad.output
    gib = _invoke("trace", "cache-curve", path, "--server-kv-gib", "1")
    assert gib.exit_code == 2
    assert "--server-kv-gib needs --bytes-per-token" in gib.output
    mixed = tmp_path / "mixed.jsonl"
    small = {"id": "C", "block_size": 4, "requests": [
        {"t": 0, "type": "n", "in": 8, "out": 1, "hash_ids": [1, 2]}]}  # fmt: skip
    mixed.write_text(json.dumps(_A) + "\n" + json.dumps(small) + "\n")
    res = _invoke("trace", "cache-curve", mixed)
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1].startswith("Error: cache-curve needs")
