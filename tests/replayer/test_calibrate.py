"""`replayer calibrate` against a hidden truth: the live built-in simulator, run with
non-default step terms on a few real Weka sessions, is calibrated from two
concurrency levels, and three others (one oversubscribing its KV) are predicted."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from analysis.load import load_run
from replayer.cli import main
from replayer.records.engine_model import EngineModel, StepTerms, read_engine_model
from replayer.studies.calibrate import Figures, _log_misses, figures_of, holdout
from tests.builders import weka_cut

# The hidden truth: every step term away from its default.
TRUTH = {
    "decode_base_ms": 6.0,
    "decode_per_seq_ms": 1.5,
    "decode_us_per_context_token": 0.5,
    "prefill_us_per_token": 40.0,
    "gpu_hit_us_per_token": 4.0,
    "request_overhead_us": 5000.0,
}
# A small KV (12,288 tokens, 16-token blocks): 4 lanes of ~3,000-token prompts fit,
# 10 and 12 do not (preemptions, evicted prefixes: past the knee). Levels at the
# knee itself (6, 8) are left out of the live comparison: there a live client's own
# send delays reorder arrivals from run to run (docs/engine-model.md).
SIM_ARGS = [
    "--block-size", "16", "--kv-capacity-tokens", "12288", "--max-model-len", "4096",
    *(a for k, v in TRUTH.items() for a in (f"--{k.replace('_', '-')}", str(v))),
]  # fmt: skip
TRAIN = (2, 4)
HOLDOUT = (1, 10, 12)
KNEE = 6  # predicted, and checked against the true terms' prediction only
REPEAT = 10  # run twice: the server's own run-to-run spread


@pytest.fixture(scope="module")
def small_weka(weka_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve real Weka sessions (three with subagents), six entries each."""
    return weka_cut(weka_dir, tmp_path_factory.mktemp("weka-small"), 6)


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def live_runs(
    small_weka: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """One live run per concurrency level: 4 s of load after a 0.5 s warm-up,
    prompts of at most 3,000 tokens, think gaps scaled to at most 0.1 s."""
    root = tmp_path_factory.mktemp("live")
    runs = {}
    for c, out in [
        *((c, root / f"c{c}") for c in (*TRAIN, *HOLDOUT, KNEE)),
        (REPEAT, root / f"c{REPEAT}-again"),
    ]:
        result = _invoke(
            [
                "run", str(small_weka), "--concurrency", str(c), "--quiet",
                "--block-tokens", "2", "--max-input-tokens", "3000",
                "--think-scale", "0.01", "--think-cap", "0.1",
                "--warmup", "0.5", "--duration", "4",
                "--sim-args", shlex.join(SIM_ARGS), "--out", str(out),
            ]
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        runs[c if out.name == f"c{c}" else -c] = out
    return runs


def test_calibrate_recovers_hidden_truth_and_predicts_other_levels(
    live_runs: dict[int, Path], tmp_path: Path
) -> None:
    engine = tmp_path / "ENGINE.json"
    args = ["calibrate", *(str(live_runs[c]) for c in TRAIN), "-o", str(engine)]
    for c in HOLDOUT:
        args += ["--holdout", str(live_runs[c])]
    result = _invoke([*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    fitted = json.loads(engine.read_text())
    assert fitted["steps"] == doc["steps"]
    # Each term near the truth. The steps are read off live chunk arrivals, which a
    # loaded host delays: beside four other jobs on the 2 cores the context term
    # came out 11% low (0.445 against 0.5 us), where a quiet host gives under 10%.
    for name, truth in TRUTH.items():
        assert fitted["steps"][name] == pytest.approx(truth, rel=0.25), name
    assert fitted["cache"]["kv_capacity_tokens"] == 12288
    assert fitted["cache"]["block_size"] == 16
    # The server's context length as its /v1/models listed it, recorded by the run.
    assert fitted["cache"]["max_model_len"] == 4096
    assert "max_model_len: the server's /v1/models" in doc["cache_sources"]
    assert fitted["cache"]["policy"] == "vllm"
    assert "policy: simulator settings" in doc["cache_sources"]
    assert fitted["fit"]["runs"] == [str(live_runs[c]) for c in TRAIN]
    assert [h["label"] for h in doc["holdout"]] == [f"concurrency {c}" for c in HOLDOUT]
    # Against the live held-out runs: a bound that holds on a loaded host (another
    # job on the 2 cores once made held-out c1's measured TTFT P90 100.6 ms against
    # 69.7 ms predicted, all of it the host's stalls, none the model's). The
    # model's own error is pinned to 10% below, against the true terms in virtual
    # time, where the host's load cannot reach.
    for held in doc["holdout"]:
        figs = held["figures"]
        for name in ("ttft_p90_ms", "e2e_p90_ms"):
            assert abs(figs[name]["error"]) <= 0.5, (held["label"], name, figs[name])
        assert abs(figs["hit_rate"]["error"]) <= 2.0, (held["label"], figs["hit_rate"])
    # The calibration's own error, apart from the live simulator's: the held-out
    # levels replayed in virtual time on the true terms.
    cal = read_engine_model(engine)
    truth_model = EngineModel(steps=StepTerms(**TRUTH), cache=cal.cache)
    runs = [live_runs[c] for c in (*HOLDOUT, KNEE)]
    (knee,) = holdout(cal, [live_runs[KNEE]], workdir=tmp_path / "knee")
    for exact, held in zip(
        holdout(truth_model, runs, workdir=tmp_path / "truth"),
        [*doc["holdout"], knee.as_dict()],
        strict=True,
    ):
        figs = held["figures"]
        for f in exact.figures:
            if f.name in ("ttft_p90_ms", "e2e_p90_ms"):
                assert figs[f.name]["predicted"] == pytest.approx(
                    f.predicted, rel=0.10
                ), (held["label"], f.name)
        want = next(f.predicted for f in exact.figures if f.name == "hit_rate")
        assert figs["hit_rate"]["predicted"] == pytest.approx(want, abs=0.02)
    # The oversubscribed level is the knee: far fewer hits than the light ones.
    hits = {h["label"]: h["figures"]["hit_rate"]["measured"] for h in doc["holdout"]}
    assert hits["concurrency 12"] < hits["concurrency 1"] - 0.3

    # The refinement on the runs' own figures keeps to its replay budget, and near
    # the truth: it may move a term by its 10% prior's width and more where the
    # short runs' percentiles pull, not beyond. The live rows carry the host's own
    # stalls, which the refinement is there to absorb: on eight pairs of these runs
    # made beside three CPU burners the worst term was 8.8-27.5% off (median 16%);
    # a loaded CI host once put GPU hit cost 30% off.
    train = [str(live_runs[c]) for c in TRAIN]
    refined = _invoke(
        ["calibrate", *train, "-o", str(tmp_path / "R.json"), "--refine-evals", "8",
         "--json"]
    )  # fmt: skip
    assert refined.exit_code == 0, refined.output
    doc = json.loads(refined.stdout)
    assert 2 <= doc["refine_evaluations"] <= 8
    # The same runs in another order: the same model.
    swapped = _invoke(
        ["calibrate", *reversed(train), "-o", str(tmp_path / "S.json"),
         "--refine-evals", "8", "--json"]
    )  # fmt: skip
    assert json.loads(swapped.stdout)["steps"] == doc["steps"]
    for name, truth in TRUTH.items():
        assert doc["steps"][name] == pytest.approx(truth, rel=0.40), name
    # A repeat of a held-out level: its runs are one setting, with their spread.
    text = _invoke([*args, "--holdout", str(live_runs[-REPEAT])])
    assert text.exit_code == 0, text.output
    assert "holdout concurrency 12" in text.stdout
    assert f"holdout concurrency {REPEAT} (" in text.stdout
    assert "2 repeats" in text.stdout
    again = json.loads(
        _invoke([*args, "--holdout", str(live_runs[-REPEAT]), "--json"]).stdout
    )["holdout"]
    (group,) = [h for h in again if h["label"] == f"concurrency {REPEAT}"]
    assert len(group["runs"]) == 2
    assert all(f["spread"] is not None for f in group["figures"].values())
    # Each latency percentile's own sampling error (its bootstrap interval); the
    # repeats' mean is pinned tighter than either run alone.
    sampling = {k: f["sampling"] for k, f in group["figures"].items()}
    assert sampling["output_tok_s"] is None
    assert sampling["hit_rate"] is None
    latencies = {k: v for k, v in sampling.items() if k.endswith("_ms")}
    assert len(latencies) == 9
    assert all(0 < v < 2 for v in latencies.values())
    first = json.loads(result.stdout)["holdout"]  # one run of that level
    (alone,) = [h for h in first if h["label"] == f"concurrency {REPEAT}"]
    e2e = alone["figures"]["e2e_p90_ms"]["sampling"]
    assert group["figures"]["e2e_p90_ms"]["sampling"] < e2e
    assert "sampling (95%)" in text.stdout
    assert len(again) == len(HOLDOUT)


def _one_line_exit_2(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0]


def test_calibrate_refuses_runs_of_different_servers(
    live_runs: dict[int, Path], tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(live_runs[2], other)
    meta = json.loads((other / "run.json").read_text())
    meta["labels"]["engine"] = "sglang"
    (other / "run.json").write_text(json.dumps(meta))
    result = _invoke(
        ["calibrate", str(live_runs[2]), str(other), "-o", str(tmp_path / "E.json")]
    )
    _one_line_exit_2(result, "different servers", "engine")
    assert not (tmp_path / "E.json").exists()


def test_calibrate_refuses_a_run_without_successful_rows(
    live_runs: dict[int, Path], tmp_path: Path
) -> None:
    failed = tmp_path / "failed"
    shutil.copytree(live_runs[2], failed)
    for part in (failed / "requests").glob("part-*.parquet"):
        table = pq.read_table(part)
        status = pa.array(["http_error"] * table.num_rows, type=pa.string())
        table = table.set_column(
            table.schema.get_field_index("status"), "status", status
        )
        pq.write_table(table, part)
    result = _invoke(["calibrate", str(failed), "-o", str(tmp_path / "E.json")])
    _one_line_exit_2(result, str(failed), "no successful request")


def test_calibrate_refuses_a_missing_run_dir(tmp_path: Path) -> None:
    result = _invoke(
        ["calibrate", str(tmp_path / "nope"), "-o", str(tmp_path / "E.json")]
    )
    _one_line_exit_2(result, "no such run directory")


def test_virtual_refuses_another_engine_schema_version(
    live_runs: dict[int, Path], small_weka: Path, tmp_path: Path
) -> None:
    engine = tmp_path / "ENGINE.json"
    result = _invoke(["calibrate", str(live_runs[2]), "-o", str(engine)])
    assert result.exit_code == 0, result.output
    doc = json.loads(engine.read_text())
    doc["schema_version"] = 99
    engine.write_text(json.dumps(doc))
    result = _invoke(
        ["run", str(small_weka), "--virtual", str(engine), "--quiet",
         "--out", str(tmp_path / "v")]
    )  # fmt: skip
    _one_line_exit_2(result, str(engine), "schema version 99")


@pytest.mark.parametrize("budget", [512, 8192])
def test_step_fit_reads_chunked_prefills(
    small_weka: Path, tmp_path: Path, budget: int
) -> None:
    """Steps read off a virtual-time run (exact step ends) give back its terms, also
    when prompts are chunked over several steps that other prompts' chunks share:
    the chunks are placed within each step's token budget, not all in the step of
    the first token (that reading put prefill at a seventh of its cost here)."""
    from analysis.load import load_run
    from replayer.records.engine_model import CacheShape, write_engine_model
    from replayer.studies.calibrate import fit_steps, step_samples

    engine = tmp_path / "TRUTH.json"
    shape = CacheShape(
        block_size=16, kv_capacity_tokens=200_000, max_model_len=4096,
        max_num_seqs=64, max_num_batched_tokens=budget,
    )  # fmt: skip
    write_engine_model(engine, EngineModel(steps=StepTerms(**TRUTH), cache=shape))
    out = tmp_path / "run"
    result = _invoke(
        ["run", str(small_weka), "--virtual", str(engine), "--quiet",
         "--concurrency", "8", "--block-tokens", "2", "--max-input-tokens", "3000",
         "--think-scale", "0.01", "--think-cap", "0.1", "--duration", "20",
         "--out", str(out)]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    samples = step_samples(load_run(out).requests, budget)
    terms, residual = fit_steps(samples)
    assert residual < 0.02
    for name, truth in TRUTH.items():
        assert terms[name] == pytest.approx(truth, rel=0.05), name


def test_policy_flag_wins_over_the_runs(live_runs: dict[int, Path]) -> None:
    from replayer.studies.calibrate import ShapeFlags, cache_shape_of, load_live_runs

    runs = load_live_runs([live_runs[TRAIN[0]]])
    shape, sources = cache_shape_of(runs, ShapeFlags(policy="vllm-chunk"))
    assert shape.policy == "vllm-chunk"
    assert "policy: flag" in sources
    shape, sources = cache_shape_of(runs, ShapeFlags())
    assert shape.policy == "vllm"


def test_refinement_weighs_a_figure_by_how_tightly_its_run_pins_it(
    live_runs: dict[int, Path],
) -> None:
    """A P90 read off 28 requests is loose (its bootstrap interval is wide): a miss
    on it pulls the terms less than the same miss on a run 20 times its size."""
    small = load_run(live_runs[2]).requests
    big = pd.concat([small] * 20, ignore_index=True)
    loose, tight = figures_of(small, spread=True), figures_of(big, spread=True)
    # Near the same percentiles (numpy's interpolation between repeats differs).
    assert tight.ttft_ms[90] == pytest.approx(loose.ttft_ms[90], rel=0.1)
    name = "ttft_p90_ms"
    assert loose.log_se[name] > 0.1  # measured: 0.27
    assert tight.log_se[name] < loose.log_se[name] / 3
    assert figures_of(small).log_se == {}  # predictions carry none
    i = [f"{n}_p{q}_ms" for n in ("ttft", "tpot", "e2e") for q in (50, 90)].index(name)

    def misses(meas: Figures) -> list[float]:
        # A prediction 30% over on that figure alone.
        ttft = {**meas.ttft_ms, 90: meas.ttft_ms[90] * 1.3}
        return _log_misses(dataclasses.replace(meas, ttft_ms=ttft, log_se={}), meas)

    assert misses(loose)[i] == pytest.approx(math.log(1.3) / loose.log_se[name])
    assert misses(tight)[i] == pytest.approx(math.log(1.3) / 0.1)  # the floor: 10%
    assert sum(abs(r) for r in misses(loose)) == pytest.approx(misses(loose)[i])


# -- degenerate fits end with one line that names the runs and why ----------------

GOLDEN_LIVE = Path(__file__).resolve().parents[1] / "data/golden/inputs/live"


def _golden_copy(tmp_path: Path, name: str, *, limited: bool = False) -> Path:
    """The golden live run (48 rows against the built-in sim), its trace path made
    this checkout's, its self-check verdict set as asked."""
    run = tmp_path / name
    shutil.copytree(GOLDEN_LIVE, run)
    meta = json.loads((run / "run.json").read_text())
    meta["trace"]["path"] = str(GOLDEN_LIVE.parent / "trace.jsonl")
    if limited:
        meta["client_check"]["limited"] = True
        meta["client_check"]["reasons"] = ["requests sent late: dispatch lag P99"]
    (run / "run.json").write_text(json.dumps(meta))
    return run


def test_calibrate_ends_a_fit_without_measurable_steps(tmp_path: Path) -> None:
    """Every chunk of a row read at one instant (a client that read the whole
    stream at once): no step has a length; was `ValueError: Residuals are not
    finite in the initial point`."""
    run = _golden_copy(tmp_path, "coalesced")
    for part in (run / "requests").glob("*.parquet"):
        table = pq.read_table(part)
        chunks = [
            None if c is None else [c[-1]] * len(c)
            for c in table.column("chunk_times_ns").to_pylist()
        ]
        i = table.schema.get_field_index("chunk_times_ns")
        field = table.schema.field(i)
        table = table.set_column(i, field, pa.array(chunks, type=field.type))
        pq.write_table(table, part)
    result = _invoke(["calibrate", str(run), "-o", str(tmp_path / "E.json")])
    _one_line_exit_2(result, "engine steps of a measurable length", str(run))
    assert not (tmp_path / "E.json").exists()


def test_calibrate_refuses_runs_that_are_all_client_limited(tmp_path: Path) -> None:
    runs = [_golden_copy(tmp_path, f"r{i}", limited=True) for i in range(2)]
    result = _invoke(["calibrate", *map(str, runs), "-o", str(tmp_path / "E.json")])
    _one_line_exit_2(result, "client-limited", str(runs[0]), "dispatch lag")
    assert not (tmp_path / "E.json").exists()


def test_calibrate_warns_of_a_client_limited_run(tmp_path: Path) -> None:
    good = _golden_copy(tmp_path, "good")
    late = _golden_copy(tmp_path, "late", limited=True)
    engine = tmp_path / "E.json"
    result = CliRunner().invoke(
        main, ["calibrate", str(good), str(late), "-o", str(engine)]
    )
    assert result.exit_code == 0, result.output
    assert f"warning: {late} was flagged client-limited" in result.stderr
    as_json = _invoke(["calibrate", str(good), str(late), "-o", str(engine), "--json"])
    notes = json.loads(as_json.stdout)["notes"]
    assert any(f"{late} was flagged client-limited" in n for n in notes)


def test_calibrate_infers_the_batch_limits_from_the_servers_metrics(
    small_weka: Path, tmp_path: Path
) -> None:
    """With no flags and no simulator settings to read (as with vLLM, which exposes
    neither), the step budget comes from vllm:iteration_tokens_total and the running
    cap from where vllm:num_requests_running levelled off with requests waiting."""
    run = tmp_path / "c4"
    result = _invoke(
        [
            "run", str(small_weka), "--concurrency", "4", "--quiet",
            "--block-tokens", "2", "--max-input-tokens", "3000",
            "--think-scale", "0.01", "--think-cap", "0.1", "--duration", "4",
            "--sim-args", shlex.join([
                *SIM_ARGS, "--max-num-batched-tokens", "512", "--max-num-seqs", "2",
                "--speed", "4",
            ]),
            "--out", str(run),
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((run / "run.json").read_text())
    meta.pop("sim")  # what a vLLM run has: no settings of the server's
    (run / "run.json").write_text(json.dumps(meta))
    engine = tmp_path / "E.json"
    doc = json.loads(
        _invoke(["calibrate", str(run), "-o", str(engine), "--json"]).stdout
    )
    cache = json.loads(engine.read_text())["cache"]
    assert cache["max_num_batched_tokens"] == 512
    assert cache["max_num_seqs"] == 2
    sources = doc["cache_sources"]
    assert (
        "max_num_batched_tokens: the largest engine step of "
        "vllm:iteration_tokens_total" in sources
    )
    assert "max_num_seqs: the plateau of vllm:num_requests_running" in sources
