"""LocalRunner(state_schema=...): the next call reads its state back as applyInPandasWithState hands it.

A sessionizer written for Spark keeps its visits as ``array<struct<...>>``,
stores them as dicts and reads them back as ``pyspark.sql.Row`` objects
(``visit.visit_time_as_milliseconds``). PySpark 4.3's own
applyInPandasWithState cannot run it (its worker fails on an array field of
the state schema), so this runs under LocalRunner only.
"""

from __future__ import annotations

import pandas as pd
import pytest

from buffering import LocalRunner

Row = pytest.importorskip("pyspark.sql").Row

STATE_SCHEMA = "visits array<struct<visit_time_as_milliseconds: long, page: string>>"


def sessionize(key, pdf_iter, state):
    """Written for Spark: the stored dicts come back as Rows, read by attribute."""
    visits = list(state.get[0]) if state.exists else []
    previous = [visit.visit_time_as_milliseconds for visit in visits]
    for pdf in pdf_iter:
        for t, page in zip(pdf["t"], pdf["page"]):
            visits.append({"visit_time_as_milliseconds": int(t), "page": page})
    state.update((visits,))
    yield pd.DataFrame({"user": [key[0]], "visits": [len(visits)], "previous": [repr(previous)]})


def _batch(*rows):
    return pd.DataFrame(rows, columns=["user", "t", "page"])


def test_a_list_of_dicts_in_an_array_of_structs_reads_back_as_rows_with_attribute_access():
    runner = LocalRunner(sessionize, key="user", state_schema=STATE_SCHEMA)
    runner.process(_batch((1, 10, "a"), (1, 20, "b")))
    out = runner.process(_batch((1, 30, "c")))
    assert out[["visits", "previous"]].values.tolist() == [[3, "[10, 20]"]]
    (visits,) = runner.get_state(1)
    assert all(isinstance(v, Row) for v in visits) and [v.page for v in visits] == ["a", "b", "c"]


def test_the_rows_of_a_struct_field_survive_a_restart_from_the_checkpoint(tmp_path):
    with LocalRunner(sessionize, key="user", state_schema=STATE_SCHEMA, checkpoint_location=tmp_path) as first:
        first.process(_batch((1, 10, "a")))
    with LocalRunner(sessionize, key="user", state_schema=STATE_SCHEMA, checkpoint_location=tmp_path) as second:
        out = second.process(_batch((1, 20, "b")))
    assert out[["visits", "previous"]].values.tolist() == [[2, "[10]"]]


def test_without_a_state_schema_the_state_reads_back_as_stored():
    seen = []

    def fn(key, pdf_iter, state):
        for _ in pdf_iter:
            pass
        if state.exists:
            seen.append(state.get)
        else:
            state.update(([{"visit_time_as_milliseconds": 10, "page": "a"}],))
        return iter(())

    runner = LocalRunner(fn, key="user")
    runner.process(_batch((1, 10, "a")))
    runner.process(_batch((1, 20, "b")))
    assert seen == [([{"visit_time_as_milliseconds": 10, "page": "a"}],)]
    assert type(seen[0][0][0]) is dict
