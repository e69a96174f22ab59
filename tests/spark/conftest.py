"""Fixtures of the Spark tests beyond the classic ``spark`` one: a Spark Connect server and session."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from ..conftest import _java_available
from .connect_server import connect_server

#: What a Connect session sets for the whole process; ``pyspark.sql.functions`` then builds Connect columns.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


def _require(what: str, ok: bool) -> None:
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what}; CI is set, so Spark Connect tests must run", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a local[2] Spark Connect server, started once, stopped at the end."""
    _require("Spark Connect tests need Java (17+)", _java_available())
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
        missing = None
    except ImportError as exc:
        missing = str(exc)
    _require(f"Spark Connect tests need the connect client packages (pip install '.[test]'): {missing}", missing is None)
    log = str(tmp_path_factory.mktemp("connect-server") / "server.log")
    with connect_server(log) as url:
        yield url


@pytest.fixture(scope="session")
def _connect_session(connect_url: str) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    had_mode = os.environ.get(_CONNECT_MODE)
    session = SparkSession.builder.remote(connect_url).getOrCreate()
    # Creating it switched the process to Connect mode; the classic tests that run after
    # these must not be: the ``connect`` fixture switches it on for each test only.
    _restore(had_mode)
    try:
        yield session
    finally:
        os.environ[_CONNECT_MODE] = "1"
        try:
            session.stop()
        finally:
            _restore(had_mode)


def _restore(value: str | None) -> None:
    if value is None:
        os.environ.pop(_CONNECT_MODE, None)
    else:
        os.environ[_CONNECT_MODE] = value


@pytest.fixture
def connect(_connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Spark Connect session to the test server, with the process in Connect mode for the test."""
    monkeypatch.setenv(_CONNECT_MODE, "1")
    return _connect_session
