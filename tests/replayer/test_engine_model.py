"""ENGINE.json: written and read back as it was; other versions and bad fields are one
line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayer.records.engine_model import (
    CacheShape,
    EngineModel,
    EngineModelError,
    FitReport,
    ServerInfo,
    StepTerms,
    read_engine_model,
    write_engine_model,
)


def _model() -> EngineModel:
    return EngineModel(
        steps=StepTerms(
            prefill_us_per_token=40.0,
            decode_base_ms=6.0,
            decode_per_seq_ms=0.3,
            decode_us_per_context_token=0.02,
        ),
        cache=CacheShape(
            block_size=32,
            kv_capacity_tokens=12_800,
            max_model_len=4096,
            max_num_seqs=256,
            max_num_batched_tokens=2048,
        ),
        server=ServerInfo(model="m", engine="vllm", labels={"gpu": "cpu"}),
        fit=FitReport(method="x", runs=("a", "b"), rows=10, residuals={"ttft": 0.1}),
    )


def test_engine_model_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "ENGINE.json"
    write_engine_model(path, _model())
    assert read_engine_model(path) == _model()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.update(schema_version=2), "schema version 2"),
        (lambda o: o["steps"].update(decode_base_ms=-1), "steps.decode_base_ms"),
        (lambda o: o["cache"].update(block_size=0), "cache.block_size"),
        (lambda o: o["cache"].update(colour="red"), "unknown field"),
        (lambda o: o.pop("steps"), "missing"),
    ],
)
def test_engine_model_bad_file_is_one_line(tmp_path: Path, edit, message) -> None:  # type: ignore[no-untyped-def]
    obj = _model().as_dict()
    edit(obj)
    path = tmp_path / "ENGINE.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(EngineModelError, match=message) as info:
        read_engine_model(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_engine_model_not_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ENGINE.json"
    path.write_text("{not json")
    with pytest.raises(EngineModelError, match="not JSON"):
        read_engine_model(path)
