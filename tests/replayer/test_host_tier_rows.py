"""Per-tier rows: a replay against the live simulator with a host tier records each
request's GPU and host hits as the simulator counted them, in either dialect; and
calibrate's refusal of runs with and without them, and its unfitted host term."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from analysis.load import load_run
from analysis.summary import summarize
from replayer.cli import main
from replayer.records.engine_model import (
    CacheShape,
    EngineModel,
    FitReport,
    HostFit,
    StepTerms,
)
from replayer.sim import SimConfig, make_app
from replayer.sim.engine import Sequence
from replayer.sim.server import SIM_KEY
from replayer.studies.calibrate import TERMS, StepSamples, _host_fit, _unseen
from tests.builders import weka_cut
from tests.fakes import serve_app_in_thread

# 12 KiB of GPU KV for 8 lanes of ~3,000-token prompts: prefixes are evicted to
# the 48 KiB host tier and come back from it.
CONFIG = {
    "block_size": 16,
    "kv_capacity_tokens": 12288,
    "max_model_len": 4096,
    "host_capacity_tokens": 49152,
}


@contextlib.contextmanager
def sim_in_thread(config: SimConfig, seen: list[Sequence]) -> Iterator[str]:
    """The simulator on 127.0.0.1 on a loop of its own thread; every sequence its
    engine admits is appended to ``seen``. Yields the base URL."""
    app = make_app(config)
    engine = app[SIM_KEY].engine
    submit = engine.submit

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seq = submit(*args, **kwargs)
        seen.append(seq)
        return seq

    engine.submit = recording  # type: ignore[method-assign]
    with serve_app_in_thread(app) as url:
        yield url


def replay(trace: Path, config: SimConfig, lanes: int, out: Path) -> list[Sequence]:
    """``replayer run`` of ``trace`` at ``lanes`` against the simulator; the
    sequences the simulator admitted."""
    seen: list[Sequence] = []
    with sim_in_thread(config, seen) as url:
        result = CliRunner().invoke(
            main,
            [
                "run", str(trace), "--endpoint", url, "--concurrency", str(lanes),
                "--block-tokens", "2", "--max-input-tokens", "3000",
                "--think-scale", "0", "--out", str(out), "--quiet",
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    return seen


@pytest.fixture(scope="module")
def small_weka(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return weka_cut(weka_dir, tmp_path_factory.mktemp("weka-tier"), 6)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_rows_carry_the_simulators_own_per_tier_counts(
    small_weka: Path, tmp_path: Path, dialect: str
) -> None:
    config = SimConfig.fast(**CONFIG, host_dialect=dialect)
    out = tmp_path / "run"
    seen = replay(small_weka, config, 8, out)
    rows = load_run(out).requests
    ok = rows[rows["status"] == "ok"]
    assert len(ok) == len(seen) > 50
    got = Counter(
        zip(
            ok["server_prompt_tokens"],
            ok["cached_tokens"],
            ok["cached_gpu_tokens"],
            ok["cached_host_tokens"],
            strict=True,
        )
    )
    want = Counter(
        (
            s.core.prompt_tokens,
            s.core.cached_tokens,
            s.core.cached_tokens - s.core.host_hit_tokens,
            s.core.host_hit_tokens,
        )
        for s in seen
    )
    assert got == want
    assert ok["cached_host_tokens"].sum() > 0  # the host tier did serve hits
    assert (ok["cached_gpu_tokens"] + ok["cached_host_tokens"]).equals(
        ok["cached_tokens"]
    )
    # analyze: the rows' split, and the scraped per-tier counters beside it.
    tiers = summarize(load_run(out)).cache_tiers
    assert tiers is not None
    assert tiers.source == "rows"
    prompt = ok["server_prompt_tokens"].sum()
    assert tiers.host == pytest.approx(ok["cached_host_tokens"].sum() / prompt)
    assert tiers.counters["host"] == pytest.approx(tiers.host, abs=0.02)
    assert tiers.counters["gpu"] == pytest.approx(tiers.gpu, abs=0.02)


def test_rows_without_a_host_tier_leave_the_split_null(
    small_weka: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    replay(small_weka, SimConfig.fast(**{**CONFIG, "host_capacity_tokens": 0}), 2, out)
    rows = load_run(out).requests
    assert rows["cached_tokens"].notna().all()
    assert pd.isna(rows["cached_gpu_tokens"]).all()
    assert pd.isna(rows["cached_host_tokens"]).all()


def test_calibrate_refuses_runs_with_and_without_per_tier_hits(
    small_weka: Path, tmp_path: Path
) -> None:
    split = tmp_path / "split"
    replay(small_weka, SimConfig.fast(**CONFIG), 2, split)
    plain = tmp_path / "plain"
    shutil.copytree(split, plain)
    for part in (plain / "requests").glob("*.parquet"):
        table = pq.read_table(part)
        old = table.drop_columns(["cached_gpu_tokens", "cached_host_tokens"])
        pq.write_table(old.replace_schema_metadata(table.schema.metadata), part)
    out = tmp_path / "ENGINE.json"
    result = CliRunner().invoke(
        main, ["calibrate", str(split), str(plain), "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("Error: runs with per-tier hits")
    assert "\n" not in line
    assert not out.exists()


def _shape(host_tokens: int) -> CacheShape:
    return CacheShape(
        block_size=16,
        kv_capacity_tokens=12288,
        host_capacity_tokens=host_tokens,
        max_model_len=4096,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
    )


def test_without_per_tier_runs_the_host_term_stays_unfitted_and_is_said() -> None:
    x = np.zeros((20, len(TERMS)))
    x[:, 0] = 1000.0
    x[:, 3] = np.arange(20) * 10.0
    samples = StepSamples(x=x, y_us=x[:, 0] + 40 * x[:, 3])
    shape = _shape(0)
    terms = {name: 0.0 for name in TERMS}
    host = _host_fit(samples, terms, shape, per_tier=False)
    assert host.fitted is False
    assert host.reason is not None
    assert "do not say which hits came from the host tier" in host.reason
    assert any("host_hit_us_per_token is not fitted" in n for n in _unseen(samples))
    said = _host_fit(samples, terms, shape, per_tier=True)
    assert said.fitted is False
    assert said.reason is not None
    assert "no step read loaded host hits" in said.reason


def test_engine_json_keeps_the_host_fit_and_old_files_read_as_before() -> None:
    shape = _shape(36864)
    host = HostFit(
        capacity_tokens=36864,
        cost_model="c",
        fitted=True,
        steps_with_host_hits=3,
        median_rel_residual=0.01,
    )
    steps = StepTerms(
        prefill_us_per_token=40.0,
        host_hit_us_per_token=20.0,
        decode_base_ms=6.0,
        decode_per_seq_ms=1.5,
        decode_us_per_context_token=0.5,
    )
    model = EngineModel(steps=steps, cache=shape, fit=FitReport(method="m", host=host))
    doc = model.as_dict()
    assert doc["fit"]["host"]["fitted"] is True
    assert EngineModel.from_dict(json.loads(json.dumps(doc))) == model
    old = EngineModel(steps=steps, cache=shape, fit=FitReport(method="m"))
    assert "host" not in old.as_dict()["fit"]
    assert EngineModel.from_dict(old.as_dict()) == old
