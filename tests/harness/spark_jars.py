"""The folder of jars Delta Lake, hadoop-azure and the JDBC driver need beside PySpark's own, for
`HUBSHIFT_SPARK_JARS` (`tools/spark-jars`: fetched from Maven Central once, then cached): the tests'
fixture and the benchmarks both ask here."""

from __future__ import annotations

import subprocess
from pathlib import Path

JARS_TOOL = Path(__file__).resolve().parents[2] / "tools" / "spark-jars"


def spark_jars_folder(timeout: float = 900) -> str:
    """The folder's path; RuntimeError with the tool's last words when it fails."""
    done = subprocess.run([str(JARS_TOOL)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"tools/spark-jars failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()
