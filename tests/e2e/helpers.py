"""Helpers for the e2e tests: shrunk Weka subsets, the real CLI in a subprocess,
Prometheus deltas and histogram quantiles, and the prefix-cache ideal at the server's
block size rebuilt from the prompt token ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.io import read_trace, write_trace
from traces.materialize import Materializer, PromptConfig
from traces.model import Session, Trace

REPLAYER = [sys.executable, "-m", "replayer"]


def _cap_outputs(session: Session, cap: int) -> Session:
    requests = tuple(
        replace(r, output_tokens=min(r.output_tokens, cap)) for r in session.requests
    )
    subagents = tuple(
        replace(s, session=_cap_outputs(s.session, cap)) for s in session.subagents
    )
    return replace(session, requests=requests, subagents=subagents)


def weka_subset(weka_dir: Path, ids: Sequence[str], out_cap: int, out: Path) -> Path:
    """The named real sessions, output lengths capped at ``out_cap`` (the engines here
    decode a few hundred tokens per second; the prompts keep their full structure)."""
    trace = read_trace(weka_dir)
    by_id = {s.session_id: s for s in trace.sessions}
    missing = [i for i in ids if i not in by_id]
    assert not missing, f"sessions not in {weka_dir}: {missing}"
    sessions = tuple(_cap_outputs(by_id[i], out_cap) for i in ids)
    return write_trace(Trace(sessions=sessions, source_format="native"), out)


@dataclass
class Run:
    out: Path
    rows: pd.DataFrame
    metrics: pd.DataFrame
    meta: dict[str, Any]
    stdout: str


def replay(
    url: str, model: str, trace: Path, out: Path, *args: str, timeout: float = 540
) -> Run:
    """``replayer run`` against ``url``; fails the test with its output if it fails."""
    cmd = [
        *REPLAYER, "run", str(trace), "--endpoint", url, "--model", model,
        "--out", str(out), "--quiet", "--think-scale", "0", *args,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    rows = pd.read_parquet(out / "requests")
    metrics = pd.read_parquet(out / "server_metrics.parquet")
    meta = json.loads((out / "run.json").read_text())
    return Run(out, rows, metrics, meta, done.stdout + done.stderr)


def scrape(url: str) -> dict[tuple[str, str], float]:
    """{(sample name, labels JSON): value} of the server's /metrics now."""
    from replayer.records import parse_metrics

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(name, labels): value for name, labels, value in parse_metrics(text)}


def total(samples: dict[tuple[str, str], float], metric: str) -> float:
    """Sum of a metric over all its label sets."""
    return sum(v for (name, _), v in samples.items() if name == metric)


def last_scrape(metrics: pd.DataFrame) -> dict[tuple[str, str], float]:
    """The final scrape of a run's server_metrics.parquet as a samples dict."""
    assert len(metrics), "server_metrics.parquet is empty"
    last = metrics[metrics["scrape_ns"] == metrics["scrape_ns"].max()]
    return {
        (m, lab): float(v)
        for m, lab, v in zip(last["metric"], last["labels"], last["value"], strict=True)
    }


def histogram_delta(
    before: dict[tuple[str, str], float],
    after: dict[tuple[str, str], float],
    metric: str,
) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count)] of ``metric``'s buckets, after - before, summed
    over label sets other than ``le``."""
    bucket = metric + "_bucket"
    counts: dict[float, float] = {}
    for (name, labels), value in after.items():
        if name != bucket:
            continue
        le = float(json.loads(labels)["le"])
        counts[le] = counts.get(le, 0.0) + value - before.get((name, labels), 0.0)
    return sorted(counts.items())


def histogram_quantile(
    buckets: list[tuple[float, float]], q: float
) -> tuple[float, float, float]:
    """(estimate, bucket lower bound, bucket upper bound) of quantile ``q`` from
    cumulative buckets, interpolated linearly inside the bucket (Prometheus's
    histogram_quantile)."""
    n = buckets[-1][1]
    assert n > 0, "empty histogram"
    rank = q * n
    lo_bound, lo_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if np.isinf(le):
                return lo_bound, lo_bound, le
            frac = (rank - lo_count) / (count - lo_count) if count > lo_count else 1.0
            return lo_bound + (le - lo_bound) * frac, lo_bound, le
        lo_bound, lo_count = le, count
    raise AssertionError("quantile beyond the last bucket")


def sessions_by_id(trace: Trace) -> dict[str, Session]:
    return {s.session_id: s for s, _ in trace.all_sessions()}


def _sent_bodies(run: Run, trace_path: Path) -> list[dict[str, Any]]:
    """The prompt part of each row's request body, rebuilt with the run's own prompt
    config (same salt, block and cap), in ``run.rows`` order."""
    mat = Materializer(PromptConfig(**dict(run.meta["config"]["prompt"])))
    trace = read_trace(trace_path)
    sessions = sessions_by_id(trace)
    roots = {root.session_id: root for root in trace.sessions}
    bodies = []
    for sid, root, i in zip(
        run.rows["session_id"],
        run.rows["root_session_id"],
        run.rows["request_index"],
        strict=True,
    ):
        namespace = roots[root].hash_namespace()
        frag = mat.prompt(sessions[sid], int(i), namespace).fragment
        bodies.append(json.loads(b"{" + frag + b"}"))
    return bodies


def prompt_token_ids(run: Run, trace_path: Path) -> list[list[int]]:
    """The token ids each completions-mode row sent, in ``run.rows`` order."""
    return [body["prompt"] for body in _sent_bodies(run, trace_path)]


def chat_messages(run: Run, trace_path: Path) -> list[list[dict[str, str]]]:
    """The messages each chat-mode row sent, in ``run.rows`` order."""
    return [body["messages"] for body in _sent_bodies(run, trace_path)]


def vllm_tokenize(url: str, model: str, messages: list[dict[str, str]]) -> list[int]:
    """The prompt token ids vLLM builds for ``messages`` (its /tokenize endpoint, the
    chat template with the generation prompt, as /v1/chat/completions does)."""
    body = json.dumps({"model": model, "messages": messages}).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/tokenize", data=body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return list(json.loads(resp.read())["tokens"])


def block_prefix_ideal(prompts: Iterable[Sequence[int]], block: int) -> list[int]:
    """Ideal prefix-cache hits (tokens) of each prompt, in send order, for a server
    that caches only full ``block``-token blocks chained by their prefix (vLLM), with
    unlimited capacity. Like vLLM, a prompt never hits its last token (at least one
    token is computed), so a fully cached prompt hits ``(n - 1) // block`` blocks."""
    seen: set[int] = set()
    hits = []
    for ids in prompts:
        arr = np.asarray(ids, dtype=np.int64)
        n_full = len(arr) // block
        keys = []
        parent = 0
        for b in range(n_full):
            parent = hash((parent, arr[b * block : (b + 1) * block].tobytes()))
            keys.append(parent)
        hit = 0
        while hit < n_full and keys[hit] in seen:
            hit += 1
        hits.append(min(hit, (len(arr) - 1) // block) * block)
        seen.update(keys)
    return hits


def report(test: str, **numbers: object) -> None:
    """Append measured numbers to ``$REPLAYER_E2E_LOGS/e2e-numbers.jsonl`` (printed by
    .ci/engines.sh at the end, so the CI log shows them)."""
    logs = os.environ.get("REPLAYER_E2E_LOGS")
    if logs:
        with (Path(logs) / "e2e-numbers.jsonl").open("a") as f:
            f.write(json.dumps({"test": test, **numbers}) + "\n")
