"""Contract types of ours for import-linter (`.importlinter` names them under `contract_types`), for what its
own types cannot say. `lint-imports` puts the repository on `sys.path`, so it finds this module.

- `eager_forbidden`: a `forbidden` contract over the imports that run when a module is imported: imports
  inside functions and under `if TYPE_CHECKING:` are left out. "The operator never loads PySpark" is this
  contract: a pipeline's module declares its block to the operator and imports PySpark only in the functions
  a consumer runs.
- `only_imports`: each source module imports nothing but the listed modules (and their submodules), at any
  depth of its code: the pure decisions, whose list of allowed imports (the standard library's pure parts,
  the plain-data modules) is this contract's.
- `lazy_imports`: an import inside a function is of a heavy module (`heavy_modules`: PySpark, pyarrow, the
  SDKs, a database driver), which modules the operator or a light command reads import where they need it;
  any other says why on its line or the line above (`# lazy: ...`). Everything else is imported at the top.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from grimp import ImportGraph
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules


@cache
def _deferred_lines(path: str) -> frozenset[int]:
    """The lines of a module's imports that do not run when it is imported: inside a function, or under
    `if TYPE_CHECKING:`."""
    tree = ast.parse(Path(path).read_text())
    deferred: set[int] = set()

    def visit(node: ast.AST, deferring: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = deferring or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    visit_statement(statement, True)
                for statement in child.orelse:
                    visit_statement(statement, deferring)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom) and inside:
                deferred.add(child.lineno)
            visit(child, inside)

    def visit_statement(statement: ast.stmt, deferring: bool) -> None:
        if isinstance(statement, ast.Import | ast.ImportFrom) and deferring:
            deferred.add(statement.lineno)
        visit(statement, deferring)

    visit(tree, False)
    return frozenset(deferred)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _source_of(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    return spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def remove_deferred_imports(graph: ImportGraph) -> None:
    """Keep only the imports that run at import time."""
    for importer in sorted(graph.modules):
        path = _source_of(importer) if not graph.is_module_squashed(importer) else None
        if path is None or not path.endswith(".py"):
            continue
        deferred = _deferred_lines(path)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            details = graph.get_import_details(importer=importer, imported=imported)
            if details and all(detail["line_number"] in deferred for detail in details):
                graph.remove_import(importer=importer, imported=imported)


class EagerForbiddenContract(ForbiddenContract):
    """`forbidden`, over the imports that run when the source modules are imported."""

    type_name = "eager_forbidden"

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        remove_deferred_imports(graph)
        return super().check(graph, verbose)


class OnlyImportsContract(Contract):
    """Each source module imports only `allowed_modules` (and their submodules), wherever in its code."""

    type_name = "only_imports"

    source_modules = fields.SetField(subfield=fields.ModuleExpressionField())
    allowed_modules = fields.SetField(subfield=fields.ModuleExpressionField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = module_expressions_to_modules(graph, self.source_modules)  # type: ignore[arg-type]
        allowed = {module.name for module in module_expressions_to_modules(graph, self.allowed_modules)}  # type: ignore[arg-type]
        sources_by_name = {module.name for module in sources}
        broken: list[dict[str, Any]] = []
        for source in sorted(sources_by_name):
            for imported in sorted(graph.find_modules_directly_imported_by(source)):
                if imported in sources_by_name or any(
                    imported == name or imported.startswith(f"{name}.") for name in allowed
                ):
                    continue
                lines = [
                    d["line_number"] for d in graph.get_import_details(importer=source, imported=imported)
                ]
                broken.append({"importer": source, "imported": imported, "lines": lines})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        from importlinter.application import output

        for item in check.metadata["broken"]:
            lines = ", ".join(f"l.{line}" for line in item["lines"])
            output.print_error(f"{item['importer']} may not import {item['imported']} ({lines})")


def _function_imports(path: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import inside a function of a module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                    found.append((sub.lineno, sub.module))
                elif isinstance(sub, ast.Import):
                    found.extend((sub.lineno, alias.name) for alias in sub.names)
    return sorted(set(found))


class LazyImportsContract(Contract):
    """Function-level imports are of `heavy_modules`, or carry `# lazy: <why>`."""

    type_name = "lazy_imports"

    source_modules = fields.SetField(subfield=fields.ModuleExpressionField())
    heavy_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        heavy = {str(name) for name in self.heavy_modules}  # type: ignore[attr-defined]
        sources = module_expressions_to_modules(graph, self.source_modules)  # type: ignore[arg-type]
        names = {m.name for m in sources}
        for source in sorted(names):
            names.update(graph.find_descendants(source))
        broken: list[dict[str, Any]] = []
        for module in sorted(names):
            path = _source_of(module)
            if path is None or not path.endswith(".py"):
                continue
            lines = Path(path).read_text().splitlines()
            for line, imported in _function_imports(path):
                if imported.split(".")[0] in heavy:
                    continue
                said = lines[line - 1] + (lines[line - 2] if line >= 2 else "")
                if "# lazy:" not in said:
                    broken.append({"importer": module, "imported": imported, "lines": [line]})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        from importlinter.application import output

        for item in check.metadata["broken"]:
            output.print_error(
                f"{item['importer']} imports {item['imported']} inside a function (l.{item['lines'][0]}): "
                "import it at the top, or say why on the line (# lazy: ...)"
            )
