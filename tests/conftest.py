"""Shared pytest fixtures.

Only the ``spark`` fixture lives here: one local SparkSession for the whole
test session, created on first use by a test that asks for it (tests that do
not ask never start a JVM). Mark such tests ``@pytest.mark.spark``.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Iterator

import pytest


def _java_available() -> bool:
    if shutil.which("java"):
        return True
    java_home = os.environ.get("JAVA_HOME")
    return bool(java_home) and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)


@pytest.fixture(scope="session")
def spark() -> Iterator["pyspark.sql.SparkSession"]:  # type: ignore[name-defined]  # noqa: F821
    """A local[2,4] SparkSession shared by every Spark test; stopped at the end of the session.

    ``local[2,4]``: two cores, and a failed task is retried up to 4 times as on
    a cluster (plain ``local[2]`` never retries, so retries could not be tested).

    Skipped when no ``java`` is found, except under CI (``CI`` set), where
    Spark tests must run and a missing JVM is a failure.
    """
    if not _java_available():
        reason = "Spark tests need Java (17+): no `java` on PATH and no JAVA_HOME/bin/java"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so Spark tests must run", pytrace=False)
        pytest.skip(reason)

    # Python workers and the driver must be this interpreter (the venv's), set
    # before the JVM starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("opbuffer-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        # Loopback only: tests never need another address, and a host name
        # that does not resolve must not break them.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator["S3Server"]:  # noqa: F821
    """A moto S3 server on 127.0.0.1 (a free port, its own process group) with a bucket; stopped at the end.

    Skipped when s3fs or moto's server is not installed, except under CI
    (``CI`` set), where the S3 tests must run.
    """
    try:
        import s3fs  # noqa: F401

        from .s3_server import _moto_server

        _moto_server()
    except (ImportError, FileNotFoundError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"S3 tests need s3fs and moto[server] (the test extra): {exc}", pytrace=False)
        pytest.skip(f"S3 tests need s3fs and moto[server]: {exc}")
    from .s3_server import start_s3_server

    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_location(s3_server, request) -> str:
    """A fresh ``s3://`` checkpoint location on the test session's S3 server (reach it with ``s3_options``)."""
    return s3_server.location(request.node.name.split("[")[0][:40])


@pytest.fixture
def s3_options(s3_server) -> dict:
    """The s3fs storage options of the test session's S3 server (a fresh dict per test)."""
    return s3_server.storage_options


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the Spark Connect tests before any test that starts the classic SparkSession.

    PySpark refuses a remote session while a regular one runs in the process
    (SESSION_ALREADY_EXIST), and the classic session is shared by the whole
    test session; the other way round works (the ``connect`` fixture switches
    Connect mode on for each of its tests only).
    """
    items.sort(key=lambda item: 0 if "connect" in getattr(item, "fixturenames", ()) else 1)
