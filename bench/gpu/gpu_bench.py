"""Measured and predicted on a GPU: start vLLM, replay the Weka sessions at full
length at several lane counts, check the runs against vLLM's own counters, calibrate
on two levels and predict the held-out ones (docs/engines.md, "On a GPU")."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "weka"
VLLM_SERVE = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (127.0.0.1)
        return bytes(resp.read())


def _healthy(base: str) -> bool:
    try:
        _get(base + "/health", 2.0)
        return True
    except OSError:
        return False


def _post(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
        return dict(json.loads(resp.read()))


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- the server


def server_args(a: argparse.Namespace) -> list[str]:
    """vLLM's flags for the regime (the same ones recorded in server.json)."""
    args = [
        str(a.model_dir), "--served-model-name", a.served_name,
        "--host", "127.0.0.1", "--port", str(a.port),
        "--max-model-len", str(a.max_model_len),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--block-size", str(a.block_size),
        "--num-gpu-blocks-override", str(a.kv_blocks),
        "--gpu-memory-utilization", str(a.gpu_memory_utilization),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
    ]  # fmt: skip
    if a.load_format:
        args += ["--load-format", a.load_format]
    if a.enforce_eager:
        args.append("--enforce-eager")
    if a.attention_backend:
        args += ["--attention-backend", a.attention_backend]
    if a.regime == "offload":
        args += ["--kv-offloading-size", str(a.offload_gib)]
    return args + list(a.vllm_arg or [])


def start_server(a: argparse.Namespace, regime_dir: Path) -> subprocess.Popen[bytes]:
    """Start vLLM (or the built-in simulator, to rehearse) in its own process
    session, its log in the regime's folder; wait until /health answers."""
    base = f"http://127.0.0.1:{a.port}"
    log = open(regime_dir / "server.log", "ab")  # noqa: SIM115 (the child's)
    if a.server == "sim":
        cmd = [
            sys.executable, "-m", "replayer", "sim", "--port", str(a.port),
            "--kv-capacity-tokens", str(a.kv_blocks * a.block_size),
            "--block-size", str(a.block_size), "--max-model-len", str(a.max_model_len),
            *(["--host-capacity-tokens", str(a.offload_gib * 2**30 // a.kv_bytes_per_token)]
              if a.regime == "offload" else []),
            *(a.sim_arg or []),
        ]  # fmt: skip
    else:
        cmd = [*(a.vllm_cmd.split() if a.vllm_cmd else VLLM_SERVE), *server_args(a)]
    _log("server: " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (regime_dir / "server.pid").write_text(str(proc.pid))
    t0 = time.monotonic()
    while not _healthy(base):
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {regime_dir}/server.log")
        if time.monotonic() - t0 > a.start_timeout:
            raise SystemExit(f"server not healthy after {a.start_timeout} s")
        time.sleep(1.0)
    _log(f"server healthy after {time.monotonic() - t0:.0f} s")
    return proc


def stop_server(regime_dir: Path) -> None:
    pid_file = regime_dir / "server.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(60):
            with contextlib.suppress(ChildProcessError):  # reap it if it is ours
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            os.killpg(pid, 0)
            time.sleep(0.5)
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid_file.unlink()


def warm_engine(base: str, name: str) -> None:
    """One untimed request first, so that kernel compilation stays out of the runs."""
    t0 = time.monotonic()
    for n in (4000, 40000):
        _post(base + "/v1/completions", {
            "model": name, "prompt": [1000 + (i * 7919) % 29000 for i in range(n)],
            "max_tokens": 32, "min_tokens": 32, "ignore_eos": True,
        })  # fmt: skip
    _log(f"engine warmed in {time.monotonic() - t0:.1f} s")


def describe_server(a: argparse.Namespace, regime_dir: Path, base: str) -> None:
    """server.json: version, flags, model config, what /v1/models lists."""
    info: dict[str, Any] = {"regime": a.regime, "server": a.server}
    if a.server == "vllm":
        info["flags"] = server_args(a)
        from importlib.metadata import PackageNotFoundError, version

        try:
            info["vllm_version"] = version("vllm")
        except PackageNotFoundError:
            info["vllm_version"] = a.engine_version
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                 "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False,
            ).stdout.strip()  # fmt: skip
        except OSError:
            pass
        cfg = Path(a.model_dir) / "config.json"
        if cfg.exists():
            info["model_config"] = json.loads(cfg.read_text())
    try:
        info["v1_models"] = json.loads(_get(base + "/v1/models"))
    except OSError:
        pass
    (regime_dir / "server.json").write_text(json.dumps(info, indent=1) + "\n")


# ---------------------------------------------------------------- measuring


def run_names(levels: list[int]) -> list[tuple[int, str]]:
    """(lanes, folder name) in run order; a level's k-th run is c{N}-r{k}."""
    seen: dict[int, int] = {}
    out = []
    for n in levels:
        seen[n] = seen.get(n, 0) + 1
        out.append((n, f"c{n:02d}-r{seen[n]}"))
    return out


def warmup_s(a: argparse.Namespace, lanes: int) -> float:
    """The warm-up of a level: each run starts with a cold (salted) cache, and its
    lanes' first prompts are cold prefills, more of them the more lanes."""
    return a.warmup + a.warmup_per_lane * lanes


def replay(a: argparse.Namespace, lanes: int, run_dir: Path, base: str) -> int:
    finish = lanes in a.finish_levels
    warm = warmup_s(a, lanes)
    cmd = [
        sys.executable, "-m", "replayer", "run", str(a.trace),
        "--endpoint", base, "--model", a.served_name if a.server == "vllm" else "sim",
        "--api", "completions",
        "--concurrency", str(lanes), "--think-scale", "0", "--loop",
        "--duration", str(warm + a.window), "--warmup", str(warm),
        "--drain", "finish" if finish else "cancel",
        "--max-input-tokens", str(a.max_input_tokens), "--fit-context", "clamp",
        "--engine", "vllm" if a.server == "vllm" else "sim",
        "--engine-version", a.engine_version, "--gpus", "1", "--tp", "1",
        "--hardware", a.hardware or ("simulator" if a.server == "sim" else "gpu"),
        "--kv-offload", f"native-cpu-{a.offload_gib}GiB" if a.regime == "offload" else "none",
        "--label", f"regime={a.regime}", "--seed", "0", "--quiet",
        "--out", str(run_dir),
    ]  # fmt: skip
    _log(f"run {run_dir.name}: {lanes} lanes, drain {'finish' if finish else 'cancel'}")
    return subprocess.run(cmd, check=False).returncode


def measure(a: argparse.Namespace) -> None:
    """Run the levels of one regime; each finished run is compacted and, with
    --pack-to, packed as a tarball as soon as it ends (a timeout keeps the rest)."""
    t_start = time.monotonic()
    regime_dir = Path(a.out) / a.regime
    regime_dir.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{a.port}"
    for other in Path(a.out).iterdir():
        if other != regime_dir and (other / "server.pid").exists():
            _log(f"stopping the {other.name} server first")
            stop_server(other)
    if not _healthy(base):
        start_server(a, regime_dir)
        describe_server(a, regime_dir, base)
        if a.server == "vllm":
            warm_engine(base, a.served_name)
    else:
        _log("server already up: reusing it")
    for lanes, name in run_names(a.levels):
        run_dir = regime_dir / name
        if (run_dir / "run.json").exists():
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a run cut off earlier: again
        left = a.deadline - (time.monotonic() - t_start)
        need = warmup_s(a, lanes) + a.window + (45 if lanes in a.finish_levels else 15)
        if left < need:
            _log(f"stop: {left:.0f} s left, a run needs ~{need:.0f}")
            break
        run_dir.mkdir(parents=True)
        (run_dir / "metrics_before.txt").write_bytes(_get(base + "/metrics"))
        rc = replay(a, lanes, run_dir, base)
        (run_dir / "metrics_after.txt").write_bytes(_get(base + "/metrics"))
        subprocess.run([sys.executable, "-m", "replayer", "compact", str(run_dir)],
                       check=False, capture_output=True)  # fmt: skip
        _log(f"run {name}: exit {rc}; {summary_line(run_dir)}")
        if a.pack_to:
            pack(regime_dir, Path(a.pack_to))
    if a.pack_to:
        pack(regime_dir, Path(a.pack_to))
    if not a.keep_server:
        stop_server(regime_dir)


def pack(regime_dir: Path, dest: Path) -> None:
    """The regime's finished runs and server files as one tar.gz (rewritten)."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{regime_dir.name}.tar.gz"
    members = [p.name for p in sorted(regime_dir.iterdir()) if p.name != "server.pid"]
    subprocess.run(["tar", "czf", str(tmp), "-C", str(regime_dir.parent),
                    *[f"{regime_dir.name}/{m}" for m in members]], check=False)  # fmt: skip
    tmp.replace(dest / f"{regime_dir.name}.tar.gz")


def analyze(run_dir: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "replayer", "analyze", str(run_dir), "--json"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    try:
        return dict(json.loads(out.stdout))
    except json.JSONDecodeError:
        return {"error": out.stderr.strip()[-400:]}


def summary_line(run_dir: Path) -> str:
    d = analyze(run_dir)
    if "error" in d:
        return "analyze: " + d["error"]
    ttft, e2e = d.get("ttft_ms", {}), d.get("e2e_ms", {})
    hit = (d.get("cache_hit_rate") or {}).get("server")
    return (f"{d.get('ok')} ok / {d.get('errors')} err; TTFT P90 {ttft.get('p90')} ms; "
            f"E2E P90 {e2e.get('p90')} ms; hit {hit}")  # fmt: skip


# ---------------------------------------------------------------- checking


def _samples(text: str) -> dict[tuple[str, str], float]:
    """Prometheus text → {(name, labels as sorted JSON): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("engine", "model_name")}
            key = (s.name, json.dumps(labels, sort_keys=True))
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def _delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float],
           name: str) -> dict[str, float]:  # fmt: skip
    return {lab: v - before.get((n, lab), 0.0) for (n, lab), v in after.items() if n == name}


def _metrics_text(run_dir: Path, name: str) -> str:
    """A raw /metrics dump kept beside the run (``name``.txt, or gzipped once kept)."""
    import gzip

    path = run_dir / f"{name}.txt"
    if path.exists():
        return path.read_text()
    return gzip.decompress((run_dir / f"{name}.txt.gz").read_bytes()).decode()


def check_run(run_dir: Path) -> dict[str, Any]:
    """The run against vLLM's own counters: Σ cached_tokens vs the prefix-cache
    counter's change, the client's TTFT per vLLM histogram bucket, the self-check,
    the per-source prompt-token counters, the longest prompt."""
    import numpy as np
    import pandas as pd

    rows = pd.read_parquet(run_dir / "requests")
    meta = json.loads((run_dir / "run.json").read_text())
    before = _samples(_metrics_text(run_dir, "metrics_before"))
    after = _samples(_metrics_text(run_dir, "metrics_after"))
    ok = rows[rows["status"] == "ok"]
    out: dict[str, Any] = {"run": run_dir.name, "rows": len(rows), "ok": int(len(ok))}
    out["status_counts"] = {str(k): int(v) for k, v in rows["status"].value_counts().items()}
    cached = rows["cached_tokens"]
    out["sum_cached_tokens"] = int(np.nansum(cached.to_numpy(dtype=float)))
    out["rows_without_cached"] = int(cached.isna().sum())
    hits = sum(_delta(before, after, "vllm:prefix_cache_hits_total").values())
    queries = sum(_delta(before, after, "vllm:prefix_cache_queries_total").values())
    # vLLM 0.26's usage cached_tokens is its prefill's local + external (the
    # offloading connector's) hits; the counters keep the two apart.
    external = sum(_delta(before, after, "vllm:external_prefix_cache_hits_total").values())
    out["prefix_cache_hits_delta"] = hits
    out["prefix_cache_queries_delta"] = queries
    out["external_prefix_cache_hits_delta"] = external
    out["prompt_tokens_cached_delta"] = sum(
        _delta(before, after, "vllm:prompt_tokens_cached_total").values()
    )
    out["sum_server_prompt_tokens"] = int(np.nansum(rows["server_prompt_tokens"].to_numpy(dtype=float))) if "server_prompt_tokens" in rows else None  # noqa: E501
    out["cached_equals_counter"] = bool(out["sum_cached_tokens"] == round(hits + external))
    out["max_prompt_tokens"] = int(rows["prompt_tokens"].max()) if len(rows) else 0
    out["rows_prompt_over_100k"] = int((rows["prompt_tokens"] > 100_000).sum())
    # Prompt tokens by source, and the offloading connector's counters.
    out["prompt_tokens_by_source_delta"] = {
        json.loads(k).get("source", k): v
        for k, v in _delta(before, after, "vllm:prompt_tokens_by_source_total").items()
    }
    out["connector_counters_delta"] = {
        f"{n}{lab}": v - before.get((n, lab), 0.0) for (n, lab), v in after.items()
        if ("offload" in n.lower() or "kv_connector" in n.lower() or "external" in n.lower())
        and not n.endswith(("_bucket", "_created"))
    }  # fmt: skip
    # TTFT: the client's (send → first content chunk) against vLLM's histogram.
    hist = _delta(before, after, "vllm:time_to_first_token_seconds_bucket")
    edges = sorted((float(json.loads(k)["le"]), v) for k, v in hist.items())
    ttft_s = rows["ttft_ns"].dropna().to_numpy(dtype=float) / 1e9
    buckets = []
    lo, lo_srv = 0.0, 0.0
    for le, cum in edges:
        ours = int(((ttft_s > lo) & (ttft_s <= le)).sum()) if lo > 0 else int((ttft_s <= le).sum())
        buckets.append({"le": le, "server": round(cum - lo_srv), "client": ours})
        lo, lo_srv = le, cum
    out["ttft_buckets"] = [b for b in buckets if b["server"] or b["client"]]
    out["ttft_bucket_mismatch"] = int(sum(abs(b["server"] - b["client"]) for b in buckets) // 2)
    out["ttft_client_count"] = int(ttft_s.size)
    out["ttft_server_count"] = round(edges[-1][1]) if edges else 0
    cc = meta.get("client_check") or {}
    out["client_check"] = {k: cc.get(k) for k in ("limited", "verdict", "reasons") if k in cc} or cc
    usage_keys = sorted({k for k in rows.columns if "cached" in k or "external" in k})
    out["row_columns_cached"] = usage_keys
    return out


def check(a: argparse.Namespace) -> None:
    results = []
    for regime_dir in sorted(p for p in Path(a.out).iterdir() if p.is_dir()):
        for run_dir in sorted(p for p in regime_dir.iterdir() if (p / "run.json").exists()):
            r = check_run(run_dir)
            r["regime"] = regime_dir.name
            results.append(r)
            print(f"{regime_dir.name}/{run_dir.name}: {r['ok']}/{r['rows']} ok, "
                  f"Σcached {r['sum_cached_tokens']:,} vs Δhits {r['prefix_cache_hits_delta']:,.0f}"
                  f" + Δexternal {r['external_prefix_cache_hits_delta']:,.0f} "
                  f"({'equal' if r['cached_equals_counter'] else 'differ'}; "
                  f"{r['rows_without_cached']} rows without usage), "
                  f"TTFT buckets off by {r['ttft_bucket_mismatch']} of {r['ttft_client_count']}, "
                  f"max prompt {r['max_prompt_tokens']:,}, self-check {r['client_check']}")  # fmt: skip
    Path(a.out, "checks.json").write_text(json.dumps(results, indent=1) + "\n")


# ---------------------------------------------------------------- predicting


def local_copies(runs: list[Path], trace: Path, work: Path) -> list[Path]:
    """Copies of the runs whose run.json names ``trace`` (they were measured on
    another machine, where the same trace files sat elsewhere)."""
    out = []
    for run in runs:
        dest = work / run.parent.name / run.name
        shutil.copytree(run, dest)
        meta = json.loads((dest / "run.json").read_text())
        meta["trace"]["path"] = str(trace)
        (dest / "run.json").write_text(json.dumps(meta))
        out.append(dest)
    return out


def predict_regime(regime_dir: Path, fit: list[int], trace: Path, *, host_tokens: int = 0,
                   engine_out: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Calibrate on the ``fit`` levels' first runs, predict every other run; the
    engine model goes to ``engine_out`` (default: the regime's engine.json)."""
    from dataclasses import asdict, replace

    from replayer.cli.calibrate import format_calibration, format_holdout
    from replayer.records.engine_model import write_engine_model
    from replayer.studies.calibrate import ShapeFlags, calibrate, holdout

    runs = sorted(p for p in regime_dir.iterdir() if (p / "run.json").exists())
    fit_runs = [p for p in runs if p.name in {f"c{n:02d}-r1" for n in fit}]
    held_runs = [p for p in runs if p not in fit_runs]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fit_l = local_copies(fit_runs, trace, work / "in")
        held_l = local_copies(held_runs, trace, work / "in")
        cal = calibrate(fit_l, ShapeFlags(), workdir=work)
        model = cal.model
        if host_tokens:
            # The host tier is not fitted (calibrate reads no per-tier hits): its
            # size is vLLM's --kv-offloading-size, its load cost left at 0.
            model = replace(model, cache=replace(model.cache, host_capacity_tokens=host_tokens))
        engine_out = engine_out or regime_dir / "engine.json"
        write_engine_model(engine_out, model)
        held = holdout(model, held_l, workdir=work)
    text = format_calibration(cal, engine_out) + "\n" + format_holdout(held)
    return {
        "regime": regime_dir.name,
        "fit": [p.name for p in fit_runs],
        "holdout": [s.as_dict() for s in held],
        "steps": asdict(model.steps),
        "cache": asdict(model.cache),
        "notes": list(cal.notes),
        "text": text,
    }


FIGS = ["ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms",
        "e2e_p90_ms", "hit_rate"]  # fmt: skip


def _cell(name: str, f: dict[str, Any]) -> str:
    def num(v: float | None) -> str:
        if v is None or not math.isfinite(v):
            return "-"
        return f"{v:.1%}" if name == "hit_rate" else f"{v:,.0f}"

    def fin(v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    pts = f.get("unit") == "points"
    err = fin(f.get("error"))
    err_s = "-" if err is None else (f"{err:+.1f} pt" if pts else f"{err:+.1%}")
    spread = fin(f.get("spread"))
    sp = "-" if spread is None else (f"{spread:.1f} pt" if pts else f"{spread:.1%}")
    samp = fin(f.get("sampling"))
    sa = "" if samp is None else f", ±{samp:.0%}"
    return f"{num(f.get('predicted'))} / {num(f.get('measured'))} ({err_s}; {sp}{sa})"


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per regime and held-out level, predicted / measured (error;
    run-to-run spread, sampling 95%) for each figure."""
    heads = ["TTFT P50", "TTFT P90", "TPOT P50", "TPOT P90", "E2E P50", "E2E P90", "hit"]
    lines = ["| regime | held out | " + " | ".join(heads) + " |",
             "|---|---|" + "---|" * len(heads)]  # fmt: skip
    for r in results:
        for s in r["holdout"]:
            cells = [_cell(n, s["figures"].get(n, {})) for n in FIGS]
            lines.append(f"| {r['regime']} | {s['label']} ({len(s['runs'])} runs) | "
                         + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines)


def predict(a: argparse.Namespace) -> None:
    results = []
    for regime_dir in sorted(p for p in Path(a.out).iterdir() if p.is_dir()):
        host = (a.offload_gib * 2**30 // a.kv_bytes_per_token) if regime_dir.name == "offload" else 0
        r = predict_regime(regime_dir, a.fit, Path(a.trace), host_tokens=host)
        print(r["text"])
        results.append(r)
    md = table(results)
    print(md)
    Path(a.out, "predict.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    Path(a.out, "table.md").write_text(md + "\n")


def keep(a: argparse.Namespace) -> None:
    """Copy the measured regimes into the repository (--to): the compacted runs, raw
    /metrics dumps gzipped, server.json, the engine models, checks and table; the
    server log's last 200 lines."""
    import gzip

    src, dest = Path(a.out), Path(a.to)
    for regime_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        to = dest / regime_dir.name
        for run_dir in sorted(p for p in regime_dir.iterdir() if (p / "run.json").exists()):
            shutil.copytree(run_dir, to / run_dir.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("metrics_*.txt"))  # fmt: skip
            for txt in run_dir.glob("metrics_*.txt"):
                (to / run_dir.name / (txt.name + ".gz")).write_bytes(
                    gzip.compress(txt.read_bytes(), mtime=0))
        for name in ("server.json", "engine.json"):
            if (regime_dir / name).exists():
                shutil.copy(regime_dir / name, to / name)
        log = regime_dir / "server.log"
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-200:]
            (to / "server-log-tail.txt").write_text("\n".join(tail) + "\n")
    for name in ("checks.json", "predict.json", "table.md"):
        if (src / name).exists():
            shutil.copy(src / name, dest / name)


# ---------------------------------------------------------------- the command


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("step", choices=["measure", "check", "predict", "all", "keep"])
    p.add_argument("--to", help="keep: the repository folder for the runs.")
    p.add_argument("--out", default="bench/gpu/out", help="Folder of the regimes' runs.")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--regime", choices=["gpu", "offload"], default="gpu")
    p.add_argument("--server", choices=["vllm", "sim"], default="vllm",
                   help="sim: the built-in simulator instead of vLLM (a rehearsal).")
    p.add_argument("--vllm-cmd", help="How to start vLLM (default: this python -m vllm... serve).")
    p.add_argument("--vllm-arg", action="append", help="One more vLLM flag (repeatable).")
    p.add_argument("--sim-arg", action="append", help="One more simulator flag (repeatable).")
    p.add_argument("--model-dir", type=Path, default=HERE / "model")
    p.add_argument("--served-name", default="llama-1b-shape")
    p.add_argument("--load-format", default="dummy", help="'' for real weights.")
    p.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false")
    p.add_argument("--attention-backend", default="TRITON_ATTN")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=262144)
    p.add_argument("--max-input-tokens", type=int, default=258048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=62500, help="--num-gpu-blocks-override")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--offload-gib", type=int, default=32)
    p.add_argument("--kv-bytes-per-token", type=int, default=32768,
                   help="The model's KV bytes per token (host-tier size in tokens).")
    p.add_argument("--levels", type=_ints, default=_ints("2,4,8,12,16,4,8,16"),
                   help="Lanes, in run order; a repeated level is a repeat.")
    p.add_argument("--fit", type=_ints, default=_ints("2,12"))
    p.add_argument("--finish-levels", type=_ints, default=_ints("2"),
                   help="Levels whose in-flight requests finish at the end (the rest "
                   "are cancelled, which keeps each run short).")
    p.add_argument("--window", type=float, default=33.0,
                   help="Measured seconds of each run, after its warm-up.")
    p.add_argument("--warmup", type=float, default=9.0,
                   help="Warm-up seconds of each run, plus --warmup-per-lane a lane.")
    p.add_argument("--warmup-per-lane", type=float, default=1.5)
    p.add_argument("--deadline", type=float, default=1e9,
                   help="Seconds from start after which no run is begun.")
    p.add_argument("--start-timeout", type=float, default=400.0)
    p.add_argument("--keep-server", action="store_true", help="Leave the server running.")
    p.add_argument("--pack-to", help="Folder for a tar.gz of the runs after each run.")
    p.add_argument("--engine-version", default="0.26.0")
    p.add_argument("--hardware", default="",
                   help="Hardware label of the runs (e.g. the GPU's name from nvidia-smi).")
    return p


def main() -> None:
    a = parser().parse_args()
    if a.step in ("measure", "all"):
        measure(a)
    if a.step in ("check", "all"):
        check(a)
    if a.step in ("predict", "all"):
        predict(a)
    if a.step == "keep":
        keep(a)


if __name__ == "__main__":
    main()
