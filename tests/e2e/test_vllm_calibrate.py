"""The engine model against a real engine: `replayer calibrate` fitted on two live
levels of vLLM's CPU build with a KV small enough to preempt, then two held-out levels
predicted in virtual time, each run twice so the server's own spread stands beside
the error. The numbers go to the CI log (e2e-numbers.jsonl) and bench/RESULTS.md;
docs/engine-model.md explains the model.

Started by `bash .ci/engines.sh -- pytest -m e2e tests/e2e`; skipped without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import weka_cut
from tests.e2e.conftest import Engine
from tests.e2e.helpers import replay, report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Fitted on a light level and one past the knee, so the fit sees both cheap (cached)
# and full prefills; predicted between them: a light level and one past the knee.
# vLLM v1 preempts rarely here (it admits a request only when its whole prompt
# fits, scheduler_reserve_full_isl, and decode growth seldom uses up the rest): 0-4
# times in 30 s at 10-24 lanes on this machine, and 12 lanes preempted in each run
# measured, 10 in none.
TRAIN = (2, 14)
HOLDOUT = (4, 12)
SETTINGS = (
    "--api", "completions", "--engine", "vllm", "--block-tokens", "2",
    "--max-input-tokens", "3000", "--think-scale", "0.01", "--think-cap", "0.1",
    "--warmup", "2", "--duration", "30", "--loop",
)  # fmt: skip
# vLLM's CPU defaults for its API server, which calibrate infers without flags: the
# step budget from vllm:iteration_tokens_total, the running cap from the CPU build's
# cache config (it never binds here).
SERVER_LIMITS = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
SERVER = ("--max-num-batched-tokens", "2048", "--max-num-seqs", "128")
PREEMPTIONS = "vllm:num_preemptions_total"


@pytest.fixture(scope="module")
def sessions(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve real sessions (three with subagents), their first 40 entries, outputs
    of 6-25 tokens; prompts are cut at 3,000 tokens (2 tokens per trace block), so 4
    lanes fit the 12,800-token KV and 8 do not."""
    return weka_cut(weka_dir, tmp_path_factory.mktemp("weka-calibrate"), 40)


def _preempted(run_dir: Path) -> float:
    import pandas as pd

    m = pd.read_parquet(run_dir / "server_metrics.parquet")
    m = m[m["metric"] == PREEMPTIONS]
    first, last = m["scrape_ns"].min(), m["scrape_ns"].max()
    return float(
        m.loc[m["scrape_ns"] == last, "value"].sum()
        - m.loc[m["scrape_ns"] == first, "value"].sum()
    )


def test_vllm_calibration_predicts_held_out_levels(
    vllm_kv: Engine, sessions: Path, tmp_path: Path
) -> None:
    runs: dict[int, list[Path]] = {}
    # Interleaved (c2, c4, c12, c14, c4, c12): a shared machine's load drifts over
    # the minutes of the runs, and held-out runs made after all the fitted ones
    # measured that drift as model error (every figure 14-21% slow in one CI run).
    for c in (TRAIN[0], *HOLDOUT, TRAIN[1], *HOLDOUT):
        out = tmp_path / f"c{c}-{len(runs.get(c, []))}"
        run = replay(
            vllm_kv.url, vllm_kv.model, sessions, out,
            "--concurrency", str(c), *SETTINGS,
        )  # fmt: skip
        assert (run.rows["status"] == "ok").all()
        runs.setdefault(c, []).append(out)
    preempted = {c: [_preempted(d) for d in runs[c]] for c in HOLDOUT}
    assert any(v > 0 for vs in preempted.values() for v in vs), preempted

    # The step fit alone, calibrate's default: on five saved sets of these runs it
    # kept every held-out P90 within 20%; --refine-evals 16 went past it on two
    # (RESULTS.md).
    engine = tmp_path / "ENGINE.json"
    cmd = [
        sys.executable, "-m", "replayer", "calibrate",
        *(str(runs[c][0]) for c in TRAIN), "-o", str(engine), *SERVER,
        *(a for c in HOLDOUT for d in runs[c] for a in ("--holdout", str(d))),
    ]  # fmt: skip
    done = subprocess.run(
        [*cmd, "--json"], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    # The table as a user sees it, for the CI log (e2e-numbers.jsonl).
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    report("vllm-calibrate-table", lines=text.stdout.splitlines())
    assert doc["cache"]["kv_capacity_tokens"] == 12_800
    assert doc["cache"]["block_size"] == 32
    # What calibrate infers without the batch-limit flags, for the CI log: not yet
    # asserted, as no run of this vLLM has shown it here.
    bare = subprocess.run(
        [sys.executable, "-m", "replayer", "calibrate",
         *(str(runs[c][0]) for c in TRAIN), "-o", str(tmp_path / "BARE.json"),
         "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if bare.returncode == 0:
        inferred = json.loads(bare.stdout)
        report(
            "vllm-calibrate-limits",
            want=SERVER_LIMITS,
            got={k: inferred["cache"][k] for k in SERVER_LIMITS},
            sources=inferred["cache_sources"],
        )
    else:
        report("vllm-calibrate-limits", error=bare.stderr[-500:])

    # Asserted: the hit within the 3 points at both levels; P90 TTFT and E2E
    # within a guard (30% past the knee, 50% at the light level, or the spread where
    # larger) against a model gone wrong. Whether the 20% bar held is reported
    # with the figures (bar_met), not asserted: on a shared 2-core machine the light
    # level's TTFT tail moves with the load beside the engine (its two runs 7-34%
    # apart). docs/engine-model.md has the figures.
    failures = []
    for held, c in zip(doc["holdout"], HOLDOUT, strict=True):
        assert held["label"] == f"concurrency {c}"
        figs = held["figures"]
        bar_met = {}
        for name in ("ttft_p90_ms", "e2e_p90_ms"):
            f = figs[name]
            spread = f["spread"] or 0.0
            bar_met[name] = abs(f["error"]) <= max(0.20, spread)
            guard = 0.30 if c == HOLDOUT[-1] else 0.50
            if abs(f["error"]) > max(guard, spread):
                failures.append(f"c{c} {name} {f['error']:+.1%} (spread {spread:.0%})")
        hit = figs["hit_rate"]
        bar_met["hit_rate"] = abs(hit["error"]) <= 3.0
        if not bar_met["hit_rate"]:
            failures.append(f"c{c} hit {hit['error']:+.1f} pt")
        report(
            f"vllm-calibrate-c{c}",
            train=list(TRAIN),
            preemptions=preempted[c],
            bar_met=bar_met,
            **{
                name: {
                    k: figs[name][k]
                    for k in ("predicted", "measured", "error", "spread", "sampling")
                }
                for name in ("ttft_p90_ms", "e2e_p90_ms", "output_tok_s", "hit_rate")
            },
            steps=doc["steps"],
        )
    assert not failures, "; ".join(failures) + "\n" + text.stdout
