"""StateSchema.convert reads back what Spark 4.3 read back (measured: one state per value type,
stored under applyInPandasWithState with the schema below and read in the next micro-batch)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from state.state_schema import StateSchema

SCHEMA = "f_double double, f_float float, f_long long, f_int int, f_string string, f_boolean boolean"
D = dt.datetime(2024, 5, 6, 7, 8, 9)

# value stored in every field -> the tuple Spark 4.3 gave back (copied from the measurement).
MEASURED = [
    (1, (None, None, 1, 1, "1", None)),
    (1.5, (1.5, 1.5, None, None, "1.5", None)),
    (True, (None, None, None, None, "true", True)),
    ("x", (None, None, None, None, "x", None)),
    (np.int64(3), (None, None, 3, 3, "3", None)),
    (np.float64(2.5), (2.5, 2.5, None, None, "2.5", None)),
    (2.0, (2.0, 2.0, None, None, "2.0", None)),
    (None, (None,) * 6),
]


@pytest.mark.parametrize("value, expected", MEASURED, ids=repr)
def test_a_stored_value_reads_back_as_spark_reads_it_back(value, expected):
    got = StateSchema.of(SCHEMA).convert((value,) * 6)
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]


def test_a_datetime_in_a_date_field_reads_back_as_its_date():
    assert StateSchema.of("d date, t timestamp").convert((D, D)) == (D.date(), D)


def test_a_float_field_keeps_32_bits():
    assert StateSchema.of("f float").convert((0.1,)) == (float(np.float32(0.1)),)


def test_a_struct_type_and_its_ddl_are_the_same_schema():
    types = pytest.importorskip("pyspark.sql.types")
    struct = types.StructType([types.StructField("a", types.LongType()), types.StructField("b", types.DateType())])
    assert StateSchema.of(struct).convert((1.5, D)) == StateSchema.of("a long, b date").convert((1.5, D)) == (None, D.date())


@pytest.mark.parametrize(
    "schema, value, offending",
    [("d date", (5,), "5"), ("t timestamp", (D.date(),), "datetime.date(2024, 5, 6)"), ("s string", (D,), "datetime.datetime(2024")],
)
def test_a_value_spark_cannot_store_is_refused_naming_field_and_value(schema, value, offending):
    with pytest.raises(TypeError) as info:
        StateSchema.of(schema).convert(value)
    assert offending in str(info.value) and schema.split()[0] in str(info.value)


def test_a_state_of_the_wrong_arity_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"\(1, 2\)"):
        StateSchema.of("a long").convert((1, 2))


def test_an_unreadable_ddl_names_the_field():
    with pytest.raises(ValueError, match="'long'"):
        StateSchema.of("long")
