"""run_stream: a failure in the user's code reaches the driver as the user's exception, and what Spark's
stream thread is handed stays short (Spark 4.3 scans it with a regex that overflows the stack on long texts)."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pandas as pd
import pytest

from buffering.spark import _errors, run_stream

from .helpers import collect_sink, stream_of, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "k long, v long"

#: Spark 4.3's StreamExecution.PROXY_ERROR: a foreachBatch error that matches it is a stop(), not a failure.
PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|java.nio.channels.ClosedByInterruptException)"
)


def fails_on_key_3_in_its_second_call(key, rows, state):
    n = sum(len(r) for r in rows)
    if key[0] == 3 and state.exists:
        raise ValueError("boom for key 3")
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def _keys(n: int) -> pd.DataFrame:
    return pd.DataFrame({"k": np.arange(n, dtype=np.int64), "v": np.ones(n, dtype=np.int64)})


@pytest.fixture(scope="module")
def failed_query(spark, tmp_path_factory):
    """A run_stream whose function raises ValueError for key 3 in batch 1, run until it fails."""
    root = tmp_path_factory.mktemp("user-errors")
    source = write_batches(str(root / "in"), [_keys(6), _keys(6)])
    query = run_stream(
        stream_of(spark, source, SCHEMA), fails_on_key_3_in_its_second_call, key="k", output_schema="k long, n long",
        checkpoint_location=str(root / "ck"), sink=collect_sink([]), trigger={"availableNow": True},
    )
    try:
        query.query.awaitTermination()
    except Exception:  # noqa: BLE001 - Spark's own exception; the tests read what OpbufferQuery makes of it
        pass
    return query


def test_await_termination_raises_the_users_exception_naming_the_key_the_call_and_the_batch(failed_query):
    with pytest.raises(ValueError, match="boom for key 3") as info:
        failed_query.awaitTermination()
    notes = "\n".join(info.value.__notes__)
    assert "the data call for key (3,), batch 1" in notes
    assert 'raise ValueError("boom for key 3")' in notes  # the user's frame, from the Spark task


def test_the_error_spark_is_handed_names_the_failure_in_under_a_kilobyte(failed_query):
    spark_error = failed_query.query.exception()
    # What the foreachBatch function raised, as Py4J hands it to Spark (Spark appends the query's description).
    handed = str(spark_error).split("\n\n=== Streaming Query ===")[0]
    assert "ValueError: boom for key 3 (in the data call for key (3,), batch 1)" in handed
    assert len(handed) < 1024


def test_stopping_a_query_while_its_batch_runs_hands_spark_a_short_error_it_reads_as_a_stop(spark, tmp_path, monkeypatch):
    raised: list[Exception] = []
    make = _errors.batch_error
    monkeypatch.setattr(_errors, "batch_error", lambda *args: raised.append(make(*args)) or raised[-1])
    started = str(tmp_path / "started")

    def slow(key, rows, state):
        open(started, "w").close()
        time.sleep(60)  # stopped long before
        yield pd.DataFrame({"k": [key[0]], "n": [1]})

    query = run_stream(
        stream_of(spark, write_batches(str(tmp_path / "in"), [_keys(2)]), SCHEMA), slow, key="k",
        output_schema="k long, n long", checkpoint_location=str(tmp_path / "ck"), sink=collect_sink([]),
        trigger={"processingTime": "1 second"},
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()
    assert query.exception() is None
    assert len(raised) == 1 and len(str(raised[0])) < 1024 and PROXY_ERROR.search(str(raised[0]))
