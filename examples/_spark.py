"""What the example scripts share: a local SparkSession, and shipping an example's functions to the workers."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_spark(app_name: str, partitions: int = 4) -> Any:
    """A local[2] SparkSession for one example (loopback only, no UI, UTC, quiet logs)."""
    from buffering.spark._plan import ensure_python_workers

    ensure_python_workers()  # the workers run this interpreter
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only (and no warning about the host name)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def ship_by_value(module_name: str) -> None:
    """Pickle the functions of ``module_name`` by value when Spark ships them to its workers.

    Run as a script, an example is ``__main__`` and its functions travel by
    value anyway. Imported (by a test, or by another example), they would
    travel by reference, and the workers cannot import ``examples/``.
    """
    if module_name == "__main__":
        return
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])
