"""Exporting an opbuffer checkpoint's state: one row per key, key columns then state fields (checkpoint.export);
a processor's state: one frame per state variable (buffering.spark.migrate.processor_state_frames).

The shape Spark's ``transformWithStateInPandas(initialState=...)`` takes; the Spark
DataFrame variant and the import from Spark are in tests/spark/test_import_state.py.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

from buffering import LocalRunner
from buffering.spark.migrate import EXPIRY_COLUMN, TIMERS_EXPORT, processor_state_frames
from checkpoint.__main__ import main
from checkpoint.export import export_state


def totals(key, rows, state):
    """Rows and the sum of v per key, as a two-field state; a processing-time timeout of 1 s."""
    n, total = state.get if state.exists else (0, 0.0)
    for pdf in rows:
        n += len(pdf)
        total += float(pdf["v"].sum())
    state.update((n, total))
    state.setTimeoutDuration(1000)
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


def _checkpoint(path) -> str:
    location = str(path / "ckpt")
    runner = LocalRunner(totals, key="k", checkpoint_location=location, timeout="processing", clock=lambda: 5_000)
    try:
        runner.process(pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]}))
        runner.process(pd.DataFrame({"k": ["c"], "v": [4]}))
    finally:
        runner.close()
    return location


def test_export_gives_one_row_per_key_with_the_state_fields_as_columns(tmp_path):
    frame = export_state(_checkpoint(tmp_path), state_schema="n long, total double")
    assert list(frame.columns) == ["k", "n", "total"]
    assert sorted(frame.itertuples(index=False, name=None)) == [("a", 2, 4.0), ("b", 1, 2.0), ("c", 1, 4.0)]


def test_export_adds_each_keys_timeout_when_asked(tmp_path):
    frame = export_state(_checkpoint(tmp_path), state_schema="n long, total double", timeout_column="timeout")
    assert sorted(frame.itertuples(index=False, name=None)) == [
        ("a", 2, 4.0, 6_000),
        ("b", 1, 2.0, 6_000),
        ("c", 1, 4.0, 6_000),
    ]


def test_export_of_an_older_version_gives_its_state(tmp_path):
    frame = export_state(_checkpoint(tmp_path), 0, state_schema="n long, total double")
    assert sorted(frame.itertuples(index=False, name=None)) == [("a", 2, 4.0), ("b", 1, 2.0)]


def test_export_refuses_a_state_schema_with_another_number_of_fields(tmp_path):
    with pytest.raises(ValueError, match=r"the state of key \('a',\) is tuple \(2, 4.0\), not a tuple of 1 item"):
        export_state(_checkpoint(tmp_path), state_schema="n long")


def test_export_without_a_state_schema_asks_for_one(tmp_path):
    with pytest.raises(ValueError, match=r"state_schema= is needed"):
        export_state(_checkpoint(tmp_path))


def test_cli_export_writes_csv(tmp_path, capsys):
    out = str(tmp_path / "state.csv")
    assert main(["export", _checkpoint(tmp_path), out, "--state-schema", "n long, total double"]) == 0
    assert "wrote 3 keys (k, n, total)" in capsys.readouterr().out
    frame = pd.read_csv(out)
    assert sorted(frame.itertuples(index=False, name=None)) == [("a", 2, 4.0), ("b", 1, 2.0), ("c", 1, 4.0)]


def test_cli_export_writes_parquet_with_the_timeout_column(tmp_path):
    out = str(tmp_path / "state.out")
    argv = ["export", _checkpoint(tmp_path), out, "--state-schema", "n long, total double", "--timeout-column", "t"]
    assert main([*argv, "--format", "parquet"]) == 0
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["k", "n", "total", "t"] and frame["t"].tolist() == [6_000] * 3


def test_cli_export_without_a_state_schema_fails_with_a_message(tmp_path, capsys):
    assert main(["export", _checkpoint(tmp_path), str(tmp_path / "state.csv")]) == 1
    assert "state_schema= is needed" in capsys.readouterr().err


def test_cli_export_to_a_path_of_unknown_format_fails_with_a_message(tmp_path, capsys):
    location = _checkpoint(tmp_path)
    assert main(["export", location, str(tmp_path / "state.txt"), "--state-schema", "n long, total double"]) == 1
    assert "cannot tell the format of" in capsys.readouterr().err


# ---------------------------------------------------------------- a transformWithStateInPandas processor's state


class Tally(StatefulProcessor):
    """A count, the values in order, a count per value, and a processing-time timer 1 s ahead."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.values = handle.getListState("values", "v long")
        self.per_value = handle.getMapState("per_value", "value long", "times long")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            for v in pdf["v"].tolist():
                n += 1
                self.values.appendValue((v,))
                seen = self.per_value.getValue((v,))
                self.per_value.updateValue((v,), ((seen[0] if seen else 0) + 1,))
        self.count.update((n,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1000)
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self):
        pass


def _processor_checkpoint(path) -> str:
    location = str(path / "ckpt")
    runner = LocalRunner(Tally(), key="k", checkpoint_location=location, time_mode="ProcessingTime", clock=lambda: 5_000)
    try:
        runner.process(pd.DataFrame({"k": ["a", "b", "a", "a"], "v": [3, 2, 1, 3]}))
    finally:
        runner.close()
    return location


def _sorted(frame: pd.DataFrame) -> list[tuple]:
    return sorted(frame.itertuples(index=False, name=None))


def test_a_processors_state_exports_one_frame_per_variable_with_its_schemas_columns(tmp_path):
    frames = processor_state_frames(_processor_checkpoint(tmp_path), Tally())
    assert list(frames["count"].columns) == ["k", "n"]
    assert _sorted(frames["count"]) == [("a", 3), ("b", 1)]
    assert list(frames["per_value"].columns) == ["k", "value", "times"]
    assert _sorted(frames["per_value"]) == [("a", 1, 1), ("a", 3, 2), ("b", 2, 1)]


def test_a_processors_list_state_exports_one_row_per_element_in_list_order(tmp_path):
    frame = processor_state_frames(_processor_checkpoint(tmp_path), Tally())["values"]
    assert list(frame.itertuples(index=False, name=None)) in (
        [("a", 3), ("a", 1), ("a", 3), ("b", 2)],
        [("b", 2), ("a", 3), ("a", 1), ("a", 3)],
    )


def test_a_processors_timers_export_with_their_expiry(tmp_path):
    frame = processor_state_frames(_processor_checkpoint(tmp_path), Tally())[TIMERS_EXPORT]
    assert list(frame.columns) == ["k", EXPIRY_COLUMN]
    assert _sorted(frame) == [("a", 6_000), ("b", 6_000)]


def test_cli_export_of_a_processors_state_writes_one_file_per_variable(tmp_path, capsys):
    out = str(tmp_path / "state")
    processor = "tests.buffering.test_export_state:Tally"
    assert main(["export", _processor_checkpoint(tmp_path), out, "--processor", processor]) == 0
    assert sorted(os.listdir(out)) == ["count.parquet", "per_value.parquet", "timers.parquet", "values.parquet"]
    assert _sorted(pd.read_parquet(os.path.join(out, "count.parquet"))) == [("a", 3), ("b", 1)]
    assert "wrote 3 rows of per_value (k, value, times)" in capsys.readouterr().out


def test_cli_export_with_a_processor_that_cannot_be_imported_fails_with_a_message(tmp_path, capsys):
    assert main(["export", _processor_checkpoint(tmp_path), str(tmp_path / "s"), "--processor", "no_such_module:P"]) == 2
    assert "--processor 'no_such_module:P'" in capsys.readouterr().err
