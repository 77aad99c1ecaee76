"""The package layout contract: our three packages are the ones imported, and the
import direction (traces → nothing, analysis → no aiohttp) holds."""

from __future__ import annotations

import ast
import importlib
import re
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
    # Every public name touched: analysis loads its names on first use.
    code = (
        f"import sys, {name}\n"
        f"for n in getattr({name}, '__all__', []): getattr({name}, n)\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
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


def test_layout_analysis_error_root_is_its_own() -> None:
    from analysis.errors import AnalysisError
    from replayer.errors import ReplayerError
    from traces.errors import TraceError

    roots = (AnalysisError, ReplayerError, TraceError)
    for root in roots:
        assert root.__bases__ == (Exception,)


# The layers of replayer/, top to bottom (DESIGN.md, "Layout"): a module imports only
# modules of lower layers, or of its own layer. Lazy and type-only imports count. A name
# ending in "." is a sub-package (all its modules), any other a single module.
_LAYERS: tuple[tuple[str, ...], ...] = (
    ("replayer.__main__",),
    ("replayer.cli.",),
    ("replayer.studies.",),
    ("replayer.launch",),
    ("replayer.runner.",),
    ("replayer.play.",),
    ("replayer.records.",),
    ("replayer.sim.",),
    # The base every layer may use: the package's own name and version, the exception
    # root, the clock, the typed config and the parent-death lifeline.
    (
        "replayer",
        "replayer.errors",
        "replayer.clock",
        "replayer.config",
        "replayer.lifeline",
    ),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Every module of the three packages → the modules of the three it imports
    (anywhere in the file: lazy and TYPE_CHECKING imports included)."""
    paths = [
        p
        for pkg in ("replayer", "traces", "analysis")
        for p in (REPO / pkg).rglob("*.py")
    ]
    names = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for p in paths:
        found: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{p}: relative import"
                base = node.module or ""
                for alias in node.names:  # `from pkg import module` names a module
                    full = f"{base}.{alias.name}"
                    found.add(full if full in names else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[_module_name(p)] = {m for m in found if m in names} - {_module_name(p)}
    return graph


def _layer(module: str) -> int:
    for i, names in enumerate(_LAYERS):
        for name in names:
            if module == name.rstrip(".") or (
                name.endswith(".") and module.startswith(name)
            ):
                return i
    raise AssertionError(f"{module}: in no layer of replayer/ (add it to one)")


def test_layout_replayer_layers_import_downwards_only() -> None:
    graph = _import_graph()
    wrong = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("replayer"):
            continue
        here = _layer(module)
        for other in sorted(imported):
            if not other.startswith("replayer"):
                continue
            there = _layer(other)
            if there < here:
                wrong.append(f"{module} (layer {here}) imports {other} (layer {there})")
    assert wrong == []


def test_layout_analysis_imports_only_the_records_of_replayer() -> None:
    graph = _import_graph()
    wrong = {
        module: sorted(
            m
            for m in imported
            if m.startswith("replayer") and not m.startswith("replayer.records")
        )
        for module, imported in graph.items()
        if module.startswith("analysis")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_layout_has_no_import_cycle() -> None:
    graph = _import_graph()
    # Tarjan's strongly connected components: any of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_layout_request_path_never_imports_the_sim() -> None:
    # In virtual time the launcher hands play/ a client that talks to the sim core;
    # play/ itself never knows which engine is behind its client.
    graph = _import_graph()
    wrong = {
        module: sorted(m for m in imported if m.startswith("replayer.sim"))
        for module, imported in graph.items()
        if module.startswith("replayer.play")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


# The typed documents (DESIGN.md: "typed run.json ... no dict[str, Any] but labels"):
# each root and every dataclass its fields name, in these modules. Exempt: free-form
# labels. RunMeta's ``extra`` (keys a newer version wrote) and the JSON a run's
# config was recorded as (written back as read; readers use its typed ReplayConfig)
# are JSON values (``Json``), not ``Any``.
_TYPED_MODULES = (
    "replayer/records/meta.py",
    "replayer/records/capacity.py",
    "replayer/records/engine_model.py",
    "replayer/sim/config.py",
    "analysis/results.py",
    "analysis/summary.py",
)
_TYPED_ROOTS = ("RunMeta", "Summary", "CapacityDoc")
_UNTYPED_FIELDS = {"labels"}


def _field_annotations() -> dict[str, dict[str, str]]:
    """Class name -> {field: annotation source} over :data:`_TYPED_MODULES`."""
    classes: dict[str, dict[str, str]] = {}
    for rel in _TYPED_MODULES:
        tree = ast.parse((REPO / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = {
                    item.target.id: ast.unparse(item.annotation)
                    for item in node.body
                    if isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                }
    return classes


def test_layout_typed_documents_hold_no_untyped_dicts() -> None:
    classes = _field_annotations()
    seen: set[str] = set()
    todo = list(_TYPED_ROOTS)
    wrong = []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for field, annotation in classes[name].items():
            names = set(re.findall(r"[A-Za-z_]\w*", annotation))
            exempt = field in _UNTYPED_FIELDS or f"{name}.{field}" in _UNTYPED_FIELDS
            if "Any" in names and not exempt:
                wrong.append(f"{name}.{field}: {annotation}")
            todo += sorted(names & set(classes))
    # The walk reached the parts (a rename that cuts it off would hide them).
    assert {"ClientCheck", "ProtocolInfo", "Latency", "SteadyState", "CapacityCell",
            "SloCheck", "CapacityResult", "RayInfo", "Validity",
            "RecordedConfig"} <= seen  # fmt: skip
    assert wrong == []


# Module docstrings say what the module is for in at most three lines and point to the
# docs page that explains more.
def _module_docstrings() -> dict[str, str | None]:
    return {
        str(p.relative_to(REPO)): ast.get_docstring(ast.parse(p.read_text()))
        for pkg in ("replayer", "traces", "analysis")
        for p in sorted((REPO / pkg).rglob("*.py"))
    }


def test_layout_module_docstrings_are_at_most_three_lines() -> None:
    docs = _module_docstrings()
    wrong = {
        path: "none" if doc is None else f"{len(doc.splitlines())} lines"
        for path, doc in docs.items()
        if doc is None or len(doc.splitlines()) > 3
    }
    assert wrong == {}


def test_layout_module_docstrings_point_to_pages_that_exist() -> None:
    missing = {
        f"{path}: {page}"
        for path, doc in _module_docstrings().items()
        for page in re.findall(r"docs/[\w./-]+?\.md", doc or "")
        if not (REPO / page).is_file()
    }
    assert missing == set()
