"""Real engines for the e2e tests, started by `.ci/engines.sh` (see docs/engines.md).

The script exports REPLAYER_E2E_<ENGINE>_URL and _MODEL when the engine is up, or
REPLAYER_E2E_<ENGINE>_ERROR saying why not; without either, the tests skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

MODEL_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "models"


@dataclass(frozen=True)
class Engine:
    name: str  # "vllm" | "vllm_kv" | "llamacpp"
    url: str
    model: str


def _engine(name: str, label: str) -> Engine:
    key = f"REPLAYER_E2E_{name.upper()}"
    url = os.environ.get(f"{key}_URL")
    if not url:
        why = os.environ.get(f"{key}_ERROR") or (
            f"{key}_URL not set: run under `bash .ci/engines.sh -- pytest -m e2e`"
        )
        pytest.skip(f"{label}: {why}")
    return Engine(name=name, url=url, model=os.environ.get(f"{key}_MODEL", ""))


@pytest.fixture(scope="session")
def vllm() -> Engine:
    """The vLLM (CPU build) server serving tiny-random-llama."""
    return _engine("vllm", "vLLM")


@pytest.fixture(scope="session")
def llamacpp() -> Engine:
    """llama.cpp's server (xllamacpp) serving SmolLM2-135M-Instruct (GGUF)."""
    return _engine("llamacpp", "llama.cpp server")


@pytest.fixture(scope="session")
def tokenizer_json() -> Path:
    """SmolLM2's tokenizer.json (shipped with tiny-random-llama; the GGUF uses the
    same vocabulary)."""
    path = (MODEL_DIR / "tiny-random-llama" / "tokenizer.json").resolve()
    if not path.is_file():
        pytest.skip(f"tokenizer not found at {path}")
    return path


@pytest.fixture(scope="session")
def vllm_kv() -> Engine:
    """vLLM (CPU build) with its KV cut to 400 blocks of 32 tokens: it preempts."""
    return _engine("vllm_kv", "vLLM (small KV)")
