"""StateSchema.convert reads back what Spark 4.3 read back (measured: one state per value type,
stored under applyInPandasWithState with the schema below and read in the next micro-batch)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from state.state_schema import StateSchema, canonical_type_name

Row = pytest.importorskip("pyspark.sql").Row

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


# ---------------------------------------------------------------- every scalar type, as pyspark reads it back
# (the values below were measured on Spark 4.3 the same way as MEASURED above)


@pytest.mark.parametrize(
    "field_type, stored, read_back",
    [
        ("long", 2**40, 2**40),
        ("long", 2**70, None),  # beyond a Java long
        ("int", 2**40, 0),  # cut to 32 bits as Java casts it
        ("int", 2**31, -(2**31)),
        ("short", 70000, 4464),
        ("byte", 300, 44),
        ("byte", -129, 127),
        ("short", True, None),
        ("int", "1", None),
    ],
    ids=repr,
)
def test_an_integral_field_reads_back_an_int_cut_to_its_bits(field_type, stored, read_back):
    got = StateSchema.of(f"x {field_type}").convert((stored,))
    assert got == (read_back,) and type(got[0]) is type(read_back)


def test_a_double_field_reads_back_a_float():
    got = StateSchema.of("x double").convert((np.float32(0.5),))
    assert got == (0.5,) and type(got[0]) is float


def test_a_string_field_reads_back_a_str():
    assert StateSchema.of("x string").convert(("é",)) == ("é",)


def test_a_boolean_field_reads_back_a_bool():
    got = StateSchema.of("x boolean, y boolean").convert((np.bool_(True), 1))
    assert got == (True, None) and type(got[0]) is bool


def test_a_date_field_reads_back_a_plain_date():
    got = StateSchema.of("d date").convert((pd.Timestamp("2024-05-06 07:08"),))
    assert got == (dt.date(2024, 5, 6),) and type(got[0]) is dt.date


def test_a_zone_aware_timestamp_reads_back_as_the_naive_local_time_of_the_same_instant():
    aware = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    got = StateSchema.of("t timestamp").convert((aware,))
    assert got == (aware.astimezone().replace(tzinfo=None),) and got[0].tzinfo is None


def test_a_naive_timestamp_and_a_pandas_timestamp_read_back_as_plain_datetimes():
    got = StateSchema.of("t timestamp, p timestamp").convert((D, pd.Timestamp("2024-05-06 07:08:09.5")))
    assert got == (D, dt.datetime(2024, 5, 6, 7, 8, 9, 500000))
    assert [type(v) for v in got] == [dt.datetime, dt.datetime]


def test_a_timestamp_ntz_field_keeps_the_wall_time_without_the_zone():
    aware = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert StateSchema.of("t timestamp_ntz").convert((aware,)) == (dt.datetime(2024, 5, 6, 7, 8, 9),)


def test_a_decimal_field_reads_back_a_decimal_rounded_half_up_to_its_scale():
    got = StateSchema.of("a decimal(5,2), b decimal(5,2)").convert((Decimal("1.005"), Decimal("123.4")))
    assert got == (Decimal("1.01"), Decimal("123.40"))
    assert [str(v) for v in got] == ["1.01", "123.40"]


def test_an_int_or_a_float_in_a_decimal_field_reads_back_null():
    assert StateSchema.of("a decimal(5,2), b decimal").convert((5, 1.5)) == (None, None)


def test_a_binary_field_reads_back_bytes():
    got = StateSchema.of("a binary, b binary, c binary, d binary").convert((b"ab", bytearray(b"x"), "é", 1))
    assert got == (b"ab", b"x", "é".encode(), None)
    assert [type(v) for v in got[:3]] == [bytes, bytes, bytes]


# ---------------------------------------------------------------- nested types


def test_an_array_of_structs_reads_back_as_a_list_of_rows_with_attribute_access():
    schema = StateSchema.of("visits array<struct<visit_time_as_milliseconds: long, page: string>>")
    (visits,) = schema.convert(([{"visit_time_as_milliseconds": 5, "page": "a"}, {"visit_time_as_milliseconds": 6, "page": "b"}],))
    assert isinstance(visits, list) and all(isinstance(v, Row) for v in visits)
    assert [v.visit_time_as_milliseconds for v in visits] == [5, 6]
    assert visits[1].page == "b" and visits[1].asDict() == {"visit_time_as_milliseconds": 6, "page": "b"}


@pytest.mark.parametrize(
    "stored",
    [{"a": 1, "d": D}, (1, D), [1, D], Row(a=1, d=D), SimpleNamespace(a=1, d=D)],
    ids=["dict", "tuple", "list", "Row", "object"],
)
def test_a_struct_field_reads_back_as_a_row_however_it_was_stored(stored):
    (got,) = StateSchema.of("s struct<a: long, d: date>").convert((stored,))
    assert isinstance(got, Row) and got.a == 1 and got.d == D.date()
    assert got.__fields__ == ["a", "d"]


def test_a_struct_from_a_dict_reads_a_missing_name_as_null_and_ignores_others():
    (got,) = StateSchema.of("s struct<a: long, b: long>").convert(({"a": 1, "zzz": 2},))
    assert got == Row(a=1, b=None)


def test_a_struct_field_keeps_the_case_of_its_field_names():
    (got,) = StateSchema.of("s struct<visitTime: long>").convert(({"visitTime": 7},))
    assert got.visitTime == 7


def test_a_struct_inside_a_struct_reads_back_as_a_row_inside_a_row():
    (got,) = StateSchema.of("s struct<inner: struct<t: timestamp>, n: int>").convert(({"inner": {"t": D}, "n": 1.5},))
    assert isinstance(got.inner, Row) and got.inner.t == D
    assert got.n is None  # a float in an int field, at any depth


def test_a_map_field_reads_back_as_a_dict():
    (got,) = StateSchema.of("m map<string, long>").convert(({"a": 1, "b": 2.5},))
    assert got == {"a": 1, "b": None} and type(got) is dict


def test_a_map_with_struct_values_reads_back_the_values_as_rows():
    (got,) = StateSchema.of("m map<string, struct<x: double>>").convert(({"k": {"x": 1.5}, "j": (2.5,)},))
    assert got == {"k": Row(x=1.5), "j": Row(x=2.5)}
    assert got["k"].x == 1.5 and isinstance(got["j"], Row)


def test_an_array_reads_back_as_a_list_from_a_list_or_a_tuple():
    assert StateSchema.of("a array<date>, b array<long>").convert(((D,), [1, None])) == ([D.date()], [1, None])


def test_a_struct_type_with_nested_fields_converts_as_its_ddl():
    types = pytest.importorskip("pyspark.sql.types")
    visit = types.StructType([types.StructField("visit time", types.LongType())])  # a name DDL could not spell unquoted
    struct = types.StructType([types.StructField("visits", types.ArrayType(visit))])
    (visits,) = StateSchema.of(struct).convert(([{"visit time": 5}],))
    assert visits == [Row(**{"visit time": 5})] and visits[0]["visit time"] == 5


def test_none_reads_back_as_null_in_every_nullable_field_at_every_depth():
    schema = StateSchema.of(
        "a array<struct<x: long>>, m map<string, struct<x: long>>, s struct<x: long, d: decimal(5,2)>, b binary, t timestamp"
    )
    assert schema.convert((None,) * 5) == (None,) * 5
    assert schema.convert(([None], {"k": None}, (None, None), None, None)) == ([None], {"k": None}, Row(x=None, d=None), None, None)


def test_nested_type_names_have_one_canonical_spelling():
    assert canonical_type_name("array<struct<t: bigint, s: STRING>>") == canonical_type_name("array<struct<t:long,s:string>>")
    assert canonical_type_name("decimal") == "decimal(10,0)"
    assert canonical_type_name("bigint") == "long"


@pytest.mark.parametrize(
    "schema, value, offending",
    [
        ("visits array<struct<t: long>>", (5,), "int value 5"),
        ("visits array<struct<d: date>>", ([{"d": "x"}],), "str value 'x'"),
        ("m map<string, long>", ([("a", 1)],), "list value [('a', 1)]"),
        ("m map<double, long>", ({1: 2},), "has the key 1"),
        ("s struct<a: long, b: long>", ((1,),), "tuple value (1,)"),
        ("s struct<a: long>", ("ab",), "str value 'ab'"),
        ("d decimal(3,1)", (Decimal("100"),), "Decimal value Decimal('100')"),
    ],
    ids=["array", "struct in array", "map", "null map key", "struct arity", "struct", "decimal digits"],
)
def test_a_value_that_cannot_be_stored_in_a_nested_or_decimal_field_is_a_value_error_naming_both(schema, value, offending):
    with pytest.raises(ValueError) as info:
        StateSchema.of(schema).convert(value)
    assert offending in str(info.value) and repr(schema.split()[0]) in str(info.value).replace("[].d", "")


def test_a_refusal_deep_in_a_field_names_the_path_to_it():
    with pytest.raises(ValueError, match=r"'visits\[\]\.d' \(date\)"):
        StateSchema.of("visits array<struct<d: date>>").convert(([{"d": 5}],))


def test_an_unreadable_nested_type_names_the_field():
    with pytest.raises(ValueError, match="'visits'"):
        StateSchema.of("visits array<struct<a long>")

