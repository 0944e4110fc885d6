"""What a consumer sets up for your own job before Spark starts: the job's files on its import path and its
Spark workers' (`use_code`), and its Spark session's settings (`session_conf`: the UI, the jars, what the
sink needs, then `spark.conf`)."""

from __future__ import annotations

import os
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubshift.consumer.app import use_code
from hubshift.consumer.spark.session import JARS_ENV, session_conf, split_secrets
from hubshift.errors import UserError
from hubshift.manifest import CODE_DIR, CodeSpec
from hubshift.sinks import SinkSpec, build_sink
from hubshift.sinks.delta import SESSION_CONF
from hubshift.spec import SparkSpec
from hubshift.usercode import load_function

KEY = "c2VjcmV0LWFjY291bnQta2V5LWZvci10ZXN0cw=="
LAKE_CONNECTION = (
    f"DefaultEndpointsProtocol=https;AccountName=lake;AccountKey={KEY};EndpointSuffix=core.windows.net"
)


@pytest.fixture
def clean_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    yield
    for name in ("jobcode_plain", "jobcode_zipped", "jobcode_zipped.enrich"):
        sys.modules.pop(name, None)


def job_folder(root: Path) -> Path:
    root.mkdir()
    (root / "jobcode_plain.py").write_text("def enrich(frame):\n    return frame\n")
    with zipfile.ZipFile(root / "jobcode.zip", "w") as package:
        package.writestr("jobcode_zipped/__init__.py", "")
        package.writestr("jobcode_zipped/enrich.py", "def run(frame):\n    return frame\n")
    (root / "sites.json").write_text("{}")
    return root


# --- use_code -----------------------------------------------------------------------------------------


def test_no_code_block_changes_nothing(clean_path: None) -> None:
    before = list(sys.path)
    use_code(CodeSpec())
    assert sys.path == before and os.environ["PYTHONPATH"] == "/inherited"


def test_the_folder_and_its_zip_packages_go_last_on_both_paths(clean_path: None, tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    use_code(CodeSpec(path=str(folder)))
    entries = [str(folder), str(folder / "jobcode.zip")]
    assert sys.path[-2:] == entries
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["/inherited", *entries])  # Spark's workers
    assert load_function("jobcode_plain:enrich", "pipeline function").__name__ == "enrich"
    assert load_function("jobcode_zipped.enrich:run", "pipeline function").__name__ == "run"
    use_code(CodeSpec(path=str(folder)))
    assert sys.path.count(str(folder)) == 1


def test_a_relative_path_is_made_absolute(
    clean_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_folder(tmp_path / "job")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH")
    use_code(CodeSpec(path="job"))
    assert str(tmp_path / "job") in sys.path
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "job")


def test_a_folder_that_is_not_there_is_one_line(clean_path: None, tmp_path: Path) -> None:
    with pytest.raises(UserError) as refused:
        use_code(CodeSpec(path=str(tmp_path / "nowhere")))
    assert str(refused.value) == f"spec.consumer.code.path: {tmp_path / 'nowhere'} is not a folder"
    if not Path(CODE_DIR).exists():
        with pytest.raises(UserError) as unmounted:
            use_code(CodeSpec(config_map="orders-job"))
        assert str(unmounted.value) == (
            f"spec.consumer.code.configMap: {CODE_DIR} is not a folder (is it mounted?)"
        )


@pytest.mark.parametrize("name", ["pyspark.py", "json.py", "sitecustomize.py", "psycopg", "hubshift"])
def test_a_module_that_would_replace_one_the_consumer_imports_is_refused(
    clean_path: None, tmp_path: Path, name: str
) -> None:
    """Spark's workers put PYTHONPATH before everything installed: a ConfigMap key `pyspark.py` would be
    the pyspark every worker imports (and `sitecustomize.py` would run at every interpreter's start)."""
    folder = job_folder(tmp_path / "job")
    (folder / name).mkdir() if "." not in name else (folder / name).write_text("")
    before = (list(sys.path), os.environ["PYTHONPATH"])
    with pytest.raises(UserError) as refused:
        use_code(CodeSpec(path=str(folder)))
    module = name.removesuffix(".py")
    assert str(refused.value) == (
        f"spec.consumer.code.path: {module} would replace the module of that name the consumer and Spark's "
        "workers import: rename it in the job's files"
    )
    assert (list(sys.path), os.environ["PYTHONPATH"]) == before


def test_a_zip_package_that_would_replace_a_module_is_refused(clean_path: None, tmp_path: Path) -> None:
    import zipfile

    folder = job_folder(tmp_path / "job")
    with zipfile.ZipFile(folder / "tools.zip", "w") as package:
        package.writestr("pyarrow/__init__.py", "")
    with pytest.raises(UserError, match="pyarrow would replace"):
        use_code(CodeSpec(path=str(folder)))


# --- session_conf -------------------------------------------------------------------------------------


def test_the_ui_is_off_by_default_and_on_its_port_when_asked_for() -> None:
    conf = session_conf(SparkSpec(), None, {})
    assert conf["spark.ui.enabled"] == "false" and "spark.ui.port" not in conf
    conf = session_conf(SparkSpec.model_validate({"ui": {"enabled": True, "port": 4050}}), None, {})
    assert (conf["spark.ui.enabled"], conf["spark.ui.port"]) == ("true", "4050")


def test_the_jars_folder_goes_on_the_drivers_classpath(tmp_path: Path) -> None:
    for name in ("delta-spark_2.13-4.4.0.jar", "postgresql-42.7.jar", "README"):
        (tmp_path / name).write_text("")
    conf = session_conf(SparkSpec(), None, {JARS_ENV: str(tmp_path)})
    assert conf["spark.driver.extraClassPath"] == ":".join(
        [str(tmp_path / "delta-spark_2.13-4.4.0.jar"), str(tmp_path / "postgresql-42.7.jar")]
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError) as refused:
        session_conf(SparkSpec(), None, {JARS_ENV: str(empty)})
    assert str(refused.value) == f"{JARS_ENV}={empty}: no jars there (tools/spark-jars fills such a folder)"


@pytest.fixture
def jars(tmp_path: Path) -> dict[str, str]:
    """An environment naming a folder of the jars a Delta table on Azure needs (names only: nothing runs)."""
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar", "hadoop-azure-3.5.0.jar"):
        (folder / name).write_text("")
    return {JARS_ENV: str(folder)}


def test_a_sink_whose_jars_pyspark_lacks_is_refused_at_start_with_where_to_get_them(tmp_path: Path) -> None:
    delta = build_sink(
        SinkSpec.model_validate({"type": "delta", "delta": {"path": "/data/t"}}), {}, scope="s"
    )
    with pytest.raises(UserError) as refused:
        session_conf(SparkSpec(), delta, {})
    assert str(refused.value) == (
        "Delta table /data/t needs Delta Lake's jars beside PySpark's jars (the hubshift image has them): "
        f"run tools/spark-jars and set {JARS_ENV} to the folder it prints"
    )
    (tmp_path / "delta-spark_4.2_2.13-4.4.0.jar").write_text("")
    with pytest.raises(UserError, match="Delta Lake's jars"):  # delta-storage is missing still
        session_conf(SparkSpec(), delta, {JARS_ENV: str(tmp_path)})


def test_the_sinks_needs_then_the_specs_own_conf(jars: dict[str, str]) -> None:
    delta = build_sink(
        SinkSpec.model_validate({"type": "delta", "delta": {"path": "/data/t"}}), {}, scope="s"
    )
    spec = SparkSpec.model_validate(
        {"conf": {"spark.databricks.delta.snapshotPartitions": "4", "spark.executor.cores": "2"}}
    )
    conf = session_conf(spec, delta, jars)
    assert conf["spark.sql.extensions"] == SESSION_CONF["spark.sql.extensions"]
    assert conf["spark.databricks.delta.snapshotPartitions"] == "4"  # the user's word is last
    assert conf["spark.executor.cores"] == "2"
    folder = build_sink(SinkSpec.model_validate({"type": "folder"}), {}, check=False)
    assert session_conf(SparkSpec(), folder, {}) == session_conf(SparkSpec(), None, {})  # hubshift writes it


def test_an_azure_tables_settings_reach_the_session_as_spark_hadoop(jars: dict[str, str]) -> None:
    block = {"path": "abfss://t@lake.dfs.core.windows.net/orders", "connectionStringEnv": "LAKE"}
    delta = build_sink(SinkSpec.model_validate({"type": "delta", "delta": block}), {"LAKE": LAKE_CONNECTION})
    conf = session_conf(SparkSpec(), delta, jars)
    assert conf["spark.hadoop.fs.azure.account.key.lake.dfs.core.windows.net"] == KEY


def test_the_spark_ui_redacts_the_account_key_and_what_spark_redacts_itself(jars: dict[str, str]) -> None:
    # Spark's own pattern misses hadoop-azure's `fs.azure.account.key.<host>`: with the UI on, its
    # Environment page showed the key (tests/integration/consumer/test_spark_ui.py looks at the page).
    block = {"path": "abfss://t@lake.dfs.core.windows.net/orders", "connectionStringEnv": "LAKE"}
    delta = build_sink(SinkSpec.model_validate({"type": "delta", "delta": block}), {"LAKE": LAKE_CONNECTION})
    conf = session_conf(SparkSpec.model_validate({"ui": {"enabled": True}}), delta, jars)
    pattern = re.compile(conf["spark.redaction.regex"])
    secrets = [key for key, value in conf.items() if KEY in value]
    assert secrets == ["spark.hadoop.fs.azure.account.key.lake.dfs.core.windows.net"]
    for key in [*secrets, *(key.removeprefix("spark.hadoop.") for key in secrets)]:
        assert pattern.search(key), key
    for spark_default in (
        "spark.ssl.keyPassword",
        "spark.authenticate.secret",
        "fs.s3a.access.key",
        "x.token",
    ):
        assert pattern.search(spark_default), spark_default
    assert not pattern.search("spark.sql.shuffle.partitions")


def test_an_account_key_is_not_on_the_jvms_command_line(jars: dict[str, str]) -> None:
    """PySpark launches the JVM with every builder setting as a `--conf` argument, which anyone listing the
    node's processes reads: the Hadoop settings whose names say they are secret are held back and set on the
    running context's Hadoop configuration instead."""
    block = {"path": "abfss://t@lake.dfs.core.windows.net/orders", "connectionStringEnv": "LAKE"}
    delta = build_sink(SinkSpec.model_validate({"type": "delta", "delta": block}), {"LAKE": LAKE_CONNECTION})
    at_launch, secret = split_secrets(session_conf(SparkSpec(), delta, jars))
    assert secret == {"fs.azure.account.key.lake.dfs.core.windows.net": KEY}
    assert KEY not in at_launch.values()
    assert at_launch["spark.hadoop.fs.azure.account.auth.type.lake.dfs.core.windows.net"] == "SharedKey"
