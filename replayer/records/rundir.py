"""The run directory on disk: run ids, the trace's content hash, atomic writes of
``run.json``, and the check that ``--out`` does not already hold a run. What the files
contain is ``replayer.records``' business."""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

from replayer.errors import ConfigError, RecorderError
from replayer.records import RunMeta


def new_run_id() -> str:
    """Sortable and unique: UTC time plus 4 random bytes."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def trace_content_hash(path: Path) -> str:
    """sha256 over the names and bytes of the trace's files (sorted), hex."""
    h = hashlib.sha256()
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    )
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_new_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that already holds request rows."""
    requests = run_dir / "requests"
    if requests.is_dir() and any(requests.iterdir()):
        raise ConfigError(f"{run_dir}: already holds a run; choose another --out")


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN: "unavailable") as None, recursively,
    so that it prints as strict JSON (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` to ``path`` through a temporary file: readers never see half.
    Strict JSON: NaN is written as null."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(strict_json(obj), indent=2, default=str) + "\n")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RecorderError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def write_run_json(path: Path, meta: RunMeta) -> None:
    """``run.json`` (or a worker's ``run-worker-NNN.json``)."""
    write_json_atomic(path, meta.as_dict())


def read_run_json(path: Path) -> RunMeta:
    """A run.json written by this engine (a worker's, when merging)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecorderError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(obj, dict):
        raise RecorderError(f"{path}: not a JSON object")
    return RunMeta.from_dict(obj)
