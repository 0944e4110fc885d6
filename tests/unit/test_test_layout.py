"""The test tree itself: every test module has a basename of its own. The tiers run as one pytest session
over the whole tree (selected by marker), with rootdir-based imports, so two modules of the same name in
different folders stop the session at collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for module in TESTS.rglob("test_*.py"):
        where[module.name].append(str(module.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each (pytest imports them by basename): {clashes}"
