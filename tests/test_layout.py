"""The package layout contract: our three packages are the ones imported, and the
import direction (traces → nothing, analysis → no aiohttp) holds."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["traces", "replayer", "analysis"])
def test_layout_package_resolves_inside_repository(name: str) -> None:
    # The package index has unrelated distributions with these names.
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().is_relative_to(REPO / name)


def _modules_after_import(name: str) -> set[str]:
    code = f"import sys, {name}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=60,
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("name", ["traces", "analysis", "replayer"])
def test_layout_import_does_not_load_aiohttp(name: str) -> None:
    loaded = _modules_after_import(name)
    assert name in loaded
    assert "aiohttp" not in loaded


def test_layout_traces_does_not_load_replayer_or_analysis() -> None:
    loaded = _modules_after_import("traces")
    assert not {m for m in loaded if m.split(".")[0] in ("replayer", "analysis")}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_layout_traces_source_never_imports_replayer_or_analysis() -> None:
    # Also catches imports inside functions, which the sys.modules check cannot see.
    sources = sorted((REPO / "traces").rglob("*.py"))
    assert sources
    offenders = {
        str(p.relative_to(REPO)): sorted(_imported_roots(p) & {"replayer", "analysis"})
        for p in sources
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            mods.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module)
    return mods


# Studies run many replays and judge them: they sit above engine and analysis.
_STUDIES = {"sweep.py", "capacity.py"}
_ENTRY = {"__main__.py"}  # `python -m replayer` is the command line
# The request path: from the schedule to the recorder.
_REQUEST_PATH = {
    "schedule.py",
    "session.py",
    "client.py",
    "sse.py",
    "recorder.py",
    "scrape.py",
    "progress.py",
}


def test_layout_engine_never_imports_analysis_or_the_cli() -> None:
    engine = [p for p in _sources(REPO / "replayer") if p.name not in _STUDIES | _ENTRY]
    assert {p.name for p in engine} >= _REQUEST_PATH | {"launch.py", "records.py"}
    offenders = {
        p.name: sorted(
            m
            for m in _imported_modules(p)
            if m.split(".")[0] == "analysis" or m.split(".")[:2] == ["replayer", "cli"]
        )
        for p in engine
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_layout_request_path_never_imports_the_sim() -> None:
    # Starting the simulator is the launcher's job, through one helper.
    for p in _sources(REPO / "replayer"):
        sims = {m for m in _imported_modules(p) if m.startswith("replayer.sim")}
        if p.name in _REQUEST_PATH:
            assert sims == set(), p.name
        elif p.name == "launch.py":
            assert sims <= {"replayer.sim.process"}, sims


def test_layout_sim_imports_no_engine_module() -> None:
    allowed = {"replayer.errors"}  # the exception root shared by every command
    for p in sorted((REPO / "replayer" / "sim").rglob("*.py")):
        ours = {m for m in _imported_modules(p) if m.split(".")[0] == "replayer"}
        engine = {m for m in ours if not m.startswith("replayer.sim")} - allowed
        assert engine == set(), (p.name, engine)


def test_layout_analysis_error_root_is_its_own() -> None:
    from analysis.errors import AnalysisError
    from replayer.errors import ReplayerError
    from traces.errors import TraceError

    roots = (AnalysisError, ReplayerError, TraceError)
    for root in roots:
        assert root.__bases__ == (Exception,)
