"""A user's `module:function`: imported at start-up, or one line saying what is wrong."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubshift.errors import UserError
from hubshift.pipelines import PipelineSpec, build_pipeline
from hubshift.pipelines.aggregate import AggregatePipeline
from hubshift.pipelines.function import FunctionPipeline
from hubshift.usercode import load_function

MODULES = (
    "userjobs_for_test",
    "userjobs_broken",
    "userjobs_raising",
    "userjobs_script",
    "userjobs_exiting",
    "userjobs_syntax",
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "userjobs_for_test.py").write_text(
        "def enrich(frame):\n    return frame\n\nNOT_A_FUNCTION = 3\n"
    )
    (tmp_path / "userjobs_broken.py").write_text("import missing_dependency_xyz\n")
    (tmp_path / "userjobs_raising.py").write_text("raise RuntimeError('bad\\nconfig')\n")
    (tmp_path / "userjobs_script.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--table', required=True)\n"
        "ARGS = parser.parse_args([])\n"
    )
    (tmp_path / "userjobs_exiting.py").write_text("import sys\nsys.exit('run me as a script')\n")
    (tmp_path / "userjobs_syntax.py").write_text("def enrich(frame)\n    return frame\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userjobs_for_test"
    for name in MODULES:
        sys.modules.pop(name, None)


def test_loads_a_function(user_module: str) -> None:
    function = load_function(f"{user_module}:enrich")
    assert function.__name__ == "enrich"
    pipeline = build_pipeline(PipelineSpec(type="function", function=f"{user_module}:enrich"))
    assert isinstance(pipeline, FunctionPipeline)
    assert pipeline.name == "function"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_such_module_abc:run", "no module named 'no_such_module_abc' (install it"),
        ("userjobs_for_test:missing", "has no attribute 'missing'"),
        ("userjobs_for_test:NOT_A_FUNCTION", "is a int, not a function"),
        ("userjobs_broken:run", "importing userjobs_broken failed: no module named 'missing_dependency_xyz'"),
        ("userjobs_raising:run", "importing userjobs_raising failed: RuntimeError: bad config"),
        ("userjobs_for_test", "expected module:function"),
        ("userjobs_for_test:enrich:x", "expected module:function"),
        ("userjobs_syntax:enrich", "importing userjobs_syntax failed: SyntaxError: expected ':'"),
        # A module written as a script exits when imported: one line, not the process gone with exit 2
        ("userjobs_script:run", "importing userjobs_script failed: SystemExit: 2"),
        ("userjobs_exiting:run", "importing userjobs_exiting failed: SystemExit: run me as a script"),
    ],
)
def test_errors_are_one_line(user_module: str, reference: str, message: str) -> None:
    with pytest.raises(UserError) as error:
        load_function(reference)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_aggregate_is_the_default() -> None:
    pipeline = build_pipeline(PipelineSpec.model_validate({"aggregate": {"windowSeconds": 30}}))
    assert isinstance(pipeline, AggregatePipeline)
    assert pipeline.window_seconds == 30
