"""The SparkSession the judge runs on, and the code it ships to executors.

The judge uses DataFrame expressions only (no Python UDFs), so executors run
no Python of ours today; the package is still shipped (addPyFile) when the
master is not local, so a later UDF or a spark-submit of this same code does
not fail on a missing module. Under spark-submit the session already exists
and getOrCreate returns it, with the submit's master and --py-files.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from warren.verification.judge.javaenv import ensure_java

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding verification/


def spark_session(master: str | None = None, driver_memory: str = "2g",
                  shuffle_partitions: int | None = None) -> tuple[SparkSession, bool]:
    """(session, created_here): a session this call created is the caller's to stop."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    ensure_java()
    builder = (SparkSession.builder.appName("warren-verify")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", driver_memory)  # only effective when this starts the JVM
               .config("spark.sql.adaptive.enabled", "true"))
    if master:
        builder = builder.master(master)
    if _local_run(master):
        # Java ignores TMPDIR: its temporary files (Spark's block manager among them) go where
        # Python's do, and neither the driver nor spark-submit's launcher (SPARK_LAUNCHER_OPTS)
        # leaves a /tmp/hsperfdata_<user> behind.
        os.environ.setdefault("SPARK_LAUNCHER_OPTS", "-XX:-UsePerfData")   # split by spark-class: no quoting
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f'"-Djava.io.tmpdir={tempfile.gettempdir()}" -XX:-UsePerfData')
        if shuffle_partitions is None:
            # Spark's 200 default costs more in per-partition overhead than the work on one machine.
            shuffle_partitions = 4 * (os.cpu_count() or 2)
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not spark.sparkContext.master.startswith("local"):
        spark.sparkContext.addPyFile(str(build_package_zip(Path(tempfile.mkdtemp(prefix="warren-verify-")))))
    return spark, True


def _local_run(master: str | None) -> bool:
    """Local mode started here, not under spark-submit (whose --conf must not be overridden)."""
    return (master or "local").startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ


def build_package_zip(directory: Path) -> Path:
    """verification/ (history format and judge) as a zip for --py-files / addPyFile."""
    target = directory / "warren-verify.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted((_PACKAGE_ROOT / "verification").rglob("*.py")):
            archive.write(source, source.relative_to(_PACKAGE_ROOT).as_posix())
    return target


def main() -> None:
    """`python -m verification.judge.session DIR`: write DIR/warren-verify.zip for spark-submit."""
    import sys

    directory = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    directory.mkdir(parents=True, exist_ok=True)
    print(build_package_zip(directory))


if __name__ == "__main__":
    main()
