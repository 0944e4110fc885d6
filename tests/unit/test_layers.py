"""The decisions are pure: functions of plain data and a clock passed in, importing no I/O at all.

.importlinter forbids them the SDKs and frameworks; this test also keeps the standard library's I/O (sockets,
files, threads, asyncio, sqlite3) out, which import-linter cannot see."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hubshift"

PURE_MODULES = [
    "ownership/planner.py",
    "ownership/balancer.py",
    "ownership/records.py",
    "operator/autoscaler.py",
    "operator/rebalance.py",
    "operator/observe.py",
    "consumer/ownership_step.py",
    "consumer/checkpointing.py",
    "consumer/schedule.py",
    "consumer/failures.py",
]
# Plain data the pure modules read: the ownership and Event Hubs models, the manifest's typed spec, the
# consumers as a runtime reports them.
DATA_MODULES = {
    "ownership.model",
    "ownership.scope",
    "ownership.store",
    "eventhubs.model",
    "spec",
    "operator.runtime",
}

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
    "json",
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
    """Besides each other, the pure modules read only plain data (`DATA_MODULES`): their configuration,
    defaults included, comes from the manifest's typed spec."""
    pure = {m.removesuffix(".py").replace("/", ".") for m in PURE_MODULES}
    for module in PURE_MODULES:
        path = PACKAGE / module
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hubshift."):
                target = node.module.removeprefix("hubshift.")
                assert target in pure | DATA_MODULES, f"{module} imports {node.module}"
