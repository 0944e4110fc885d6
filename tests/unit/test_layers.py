"""The decisions are pure: functions of plain data and a clock passed in, importing no I/O at all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hubshift"

PURE_MODULES = [
    "ownership/planner.py",
    "ownership/balancer.py",
    "operator/autoscaler.py",
    "operator/rebalance.py",
]

ALLOWED_ROOTS = {
    "__future__",
    "dataclasses",
    "typing",
    "collections",
    "enum",
    "math",
    "itertools",
    "functools",
    "bisect",
    "heapq",
    "datetime",
    "hubshift",
}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", PURE_MODULES)
def test_decision_module_imports_no_io(module: str) -> None:
    path = PACKAGE / module
    if not path.exists():
        pytest.skip(f"{module} is not written yet")
    assert imported_roots(path) <= ALLOWED_ROOTS, f"{module} imports {imported_roots(path) - ALLOWED_ROOTS}"


def test_pure_modules_import_only_pure_hubshift_modules() -> None:
    """Besides each other, the pure modules read the data models: the ownership model and the manifest's
    typed spec (their configuration, defaults included, comes from it)."""
    pure = {m.removesuffix(".py").replace("/", ".") for m in PURE_MODULES}
    for module in PURE_MODULES:
        path = PACKAGE / module
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hubshift."):
                target = node.module.removeprefix("hubshift.")
                allowed = target in pure or target.endswith(".model") or target == "spec"
                assert allowed, f"{module} imports {node.module}"
