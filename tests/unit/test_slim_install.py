"""The operator and the commands install without PySpark, Delta, pandas and psycopg (pyproject.toml's extras
`spark`, `postgres`, `all`): in a Python that cannot import them, every command's module imports, the
operator renders every example's children, `--help` works, and what does need one says which extra to install
in one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hubshift.errors import UserError, require_extra

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "delta", "deltalake", "pandas", "psycopg", "py4j")

# Installed first in the child: any import of HEAVY fails as if the package were not installed.
BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys
    HEAVY = {HEAVY!r}
    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, NotInstalled())
    """
)

COMMAND_MODULES = (
    "hubshift.cli",
    "hubshift.operator.cli",
    "hubshift.operator.kubernetes.handlers",
    "hubshift.operator.local.cli",
    "hubshift.apps.status",
    "hubshift.apps.checkpoints",
    "hubshift.apps.produce",
    "hubshift.apps.views",
    "hubshift.apps.demo",
    "hubshift.emulator.cli",
    "hubshift.consumer.cli",
)


def run_blocked(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def test_every_command_and_the_operator_import_without_the_heavy_extras() -> None:
    done = run_blocked(
        f"""
        import importlib, sys
        for name in {COMMAND_MODULES!r}:
            importlib.import_module(name)
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in HEAVY)
        assert not loaded, loaded
        """
    )
    assert done.returncode == 0, done.stderr


def test_the_operator_renders_every_example_without_the_heavy_extras() -> None:
    done = run_blocked(
        """
        import sys, yaml
        from pathlib import Path
        from hubshift.operator.kubernetes.render import Owner, consumer_from_body, render_children
        for path in sorted(Path("examples").glob("*.yaml")):
            body = yaml.safe_load(path.read_text())
            body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
            consumer = consumer_from_body(body)
            assert render_children(consumer, Owner.from_body(body), 2), path
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in HEAVY)
        assert not loaded, loaded
        """
    )
    assert done.returncode == 0, done.stderr


def test_help_works_without_the_heavy_extras() -> None:
    for command in ([], ["operator"], ["status"], ["checkpoints"], ["run"], ["consume"]):
        done = run_blocked("from hubshift.cli import main; main()", *command, "--help")
        assert done.returncode == 0 and "Usage:" in done.stdout, (command, done.stderr)


def test_a_spark_consumer_without_the_spark_extra_names_it_in_one_line(tmp_path: Path) -> None:
    done = run_blocked(
        "from hubshift.cli import main; main()",
        "consume",
        "-f",
        str(ROOT / "examples" / "homes.yaml"),
        "--id",
        "consumer-0",
        "--scratch",
        str(tmp_path / "scratch"),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "hubshift: error: the Spark engine (consumer.engine: spark) needs pyspark, which is not installed: "
        "pip install 'hubshift[spark]'"
    ]


def test_the_blocker_blocks() -> None:
    done = run_blocked("import pyspark")
    assert done.returncode != 0 and "No module named 'pyspark'" in done.stderr


def test_a_missing_extra_is_one_line_naming_it() -> None:
    with pytest.raises(UserError) as error:
        require_extra(
            "hubshift_no_such_module", "postgres", "spec.consumer.pipeline.projection: database postgres"
        )
    assert str(error.value) == (
        "spec.consumer.pipeline.projection: database postgres needs hubshift_no_such_module, which is not "
        "installed: pip install 'hubshift[postgres]'"
    )
    require_extra("sqlite3", "postgres", "never raised: sqlite3 is installed")
