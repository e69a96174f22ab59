"""``state.key_group`` is bit-for-bit Spark's ``pmod(xxhash64(cols), n)``.

Each test builds one DataFrame of a few hundred values of one key type (fixed
seed, plus edge cases), lets Spark SQL compute ``xxhash64`` and
``pmod(xxhash64(...), n)``, and compares every row with what Python computes
from the same Python values. No Python UDF runs: Spark computes in the JVM.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import struct
from typing import Any, Sequence

import pytest

from state import key_group, normalize_key, spark_hash
from state.keys import normalize_types

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

SEED = 20240611
N_RANDOM = 400
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UTC = dt.timezone.utc


def _rng(salt: str) -> random.Random:
    return random.Random(f"{SEED}-{salt}")


def _spark_key_groups(
    spark: Any,
    fields: Sequence[StructField],
    rows: Sequence[tuple],
    moduli: Sequence[int],
) -> dict[int, Any]:
    """Row index -> Spark row with ``h`` = xxhash64(cols) and ``kg<n>`` = pmod(xxhash64(cols), n)."""
    schema = StructType([StructField("i", IntegerType(), False), *fields])
    df = spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], schema)
    cols = ", ".join(f"`{f.name}`" for f in fields)
    exprs = [F.expr(f"xxhash64({cols})").alias("h")]
    exprs += [F.expr(f"pmod(xxhash64({cols}), {n})").alias(f"kg{n}") for n in moduli]
    result = {r["i"]: r for r in df.select("i", *exprs).collect()}
    assert len(result) == len(rows)
    return result


def assert_key_groups_match(
    spark: Any,
    fields: Sequence[StructField],
    rows: Sequence[tuple],
    types: Sequence[Any],
    moduli: Sequence[int] = (128,),
    check_inferred: bool = False,
) -> None:
    """``key_group(row, n, types=types)`` equals Spark's value for every row and every ``n``.

    With ``check_inferred`` the same must hold without ``types`` (Python-type inference).
    """
    spark_rows = _spark_key_groups(spark, fields, rows, moduli)
    ntypes = normalize_types(types)
    mismatches = []
    for i, row in enumerate(rows):
        key = row[0] if len(row) == 1 else row
        got = spark_rows[i]
        for n in moduli:
            variants = [("types", types)] + ([("inferred", None)] if check_inferred else [])
            for label, t in variants:
                ours = key_group(key, n, types=t)
                if ours != got[f"kg{n}"]:
                    our_hash = spark_hash(normalize_key(key), ntypes if t is not None else None)
                    mismatches.append(
                        f"{label} n={n} key={key!r}: python kg={ours} hash={our_hash}, "
                        f"spark kg={got[f'kg{n}']} hash={got['h']}"
                    )
    assert not mismatches, f"{len(mismatches)} mismatches, first ones:\n" + "\n".join(mismatches[:15])


# ---------------------------------------------------------------- longs


def _long_values() -> list[int]:
    rng = _rng("long")
    edges = [0, 1, -1, 2, -2, 127, 128, -128, 255, 256, 1000, -1000,
             INT32_MAX, INT32_MIN, INT32_MAX + 1, INT32_MIN - 1,
             INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1]
    values = edges + [rng.randint(INT64_MIN, INT64_MAX) for _ in range(N_RANDOM)]
    values += [rng.randint(-100_000, 100_000) for _ in range(100)]
    return values


def test_long_keys_match_spark(spark):
    rows = [(v,) for v in _long_values()]
    assert_key_groups_match(
        spark, [StructField("k", LongType(), False)], rows, types=["long"], moduli=(128,), check_inferred=True
    )


@pytest.mark.parametrize("max_parallelism", [100, 7, 1, 32768])
def test_long_keys_other_max_parallelism(spark, max_parallelism):
    # Not powers of two (100, 7) exercise the signed pmod of a negative hash.
    rows = [(v,) for v in _long_values()]
    assert_key_groups_match(
        spark, [StructField("k", LongType(), False)], rows, types=[LongType()], moduli=(max_parallelism,)
    )


def test_long_keys_negative_hashes_are_exercised():
    # Guard for the test above: a good share of the hashes is negative, so pmod != unsigned mod.
    hashes = [spark_hash(normalize_key(v), ("long",)) for v in _long_values()]
    assert sum(h < 0 for h in hashes) > len(hashes) // 4
    assert any((h % 100) != ((h + (1 << 64)) % 100) for h in hashes if h < 0)


# ---------------------------------------------------------------- ints


def test_int_keys_match_spark(spark):
    rng = _rng("int")
    edges = [0, 1, -1, 127, -128, 32767, -32768, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1]
    values = edges + [rng.randint(INT32_MIN, INT32_MAX) for _ in range(N_RANDOM)]
    values += [rng.randint(-1000, 1000) for _ in range(100)]
    rows = [(v,) for v in values]
    fields = [StructField("k", IntegerType(), False)]
    assert_key_groups_match(spark, fields, rows, types=["int"], moduli=(128, 100))
    assert_key_groups_match(spark, fields, rows, types=[IntegerType()], moduli=(128,))


# ---------------------------------------------------------------- strings

_ASCII = [chr(c) for c in range(32, 127)]
_UNICODE = list("éüßøçñåÆŒ€£¥ЖжЯяΩωλ中文字日本語한국어العربيةहिन्दी") + [
    "\u0301",  # combining acute
    "\u200b",  # zero-width space
    "\U0001f600",  # emoji (4 UTF-8 bytes, a surrogate pair in Java)
    "\U0001f9d1\u200d\U0001f4bb",  # ZWJ sequence
    "\U00010348",  # gothic letter
    "\x00",  # NUL is a valid string character
]


def _string_values(salt: str) -> list[str]:
    rng = _rng(salt)
    edges = ["", " ", "a", "A", "0", "key", "\x00", "é", "e\u0301", "\U0001f600", "中", "a" * 1000, "ü" * 33]
    ascii_values = ["".join(rng.choices(_ASCII, k=rng.randint(0, 40))) for _ in range(N_RANDOM // 2)]
    unicode_values = [
        "".join(rng.choices(_ASCII + _UNICODE * 3, k=rng.randint(0, 24))) for _ in range(N_RANDOM // 2)
    ]
    return edges + ascii_values + unicode_values


def test_string_keys_match_spark(spark):
    values = _string_values("string")
    assert "" in values and any(ord(c) > 0xFFFF for v in values for c in v)
    rows = [(v,) for v in values]
    assert_key_groups_match(
        spark, [StructField("k", StringType(), False)], rows, types=["string"], moduli=(128, 100), check_inferred=True
    )


# ---------------------------------------------------------------- two columns


def test_long_string_keys_match_spark(spark):
    rng = _rng("long-string")
    longs = _long_values()
    strings = _string_values("long-string")
    rows = [(rng.choice(longs), rng.choice(strings)) for _ in range(N_RANDOM)]
    rows += [(0, ""), (-1, "a"), (INT64_MIN, "\U0001f600"), (INT64_MAX, "中文")]
    fields = [StructField("a", LongType(), False), StructField("b", StringType(), False)]
    assert_key_groups_match(spark, fields, rows, types=["long", "string"], moduli=(128, 100), check_inferred=True)


def test_string_long_keys_match_spark(spark):
    rng = _rng("string-long")
    longs = _long_values()
    strings = _string_values("string-long")
    rows = [(rng.choice(strings), rng.choice(longs)) for _ in range(N_RANDOM)]
    rows += [("", 0), ("a", -1), ("\U0001f600", INT64_MIN), ("中文", INT64_MAX)]
    fields = [StructField("a", StringType(), False), StructField("b", LongType(), False)]
    assert_key_groups_match(spark, fields, rows, types=["string", "long"], moduli=(128, 100), check_inferred=True)


# ---------------------------------------------------------------- doubles


def test_double_keys_match_spark(spark):
    rng = _rng("double")
    edges = [0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 3.141592653589793, 1e-300, -1e300,
             5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
             math.inf, -math.inf, float(INT64_MAX), float(INT64_MIN), 2.0**53, 2.0**53 + 2]
    values = list(edges)
    values += [rng.uniform(-1e6, 1e6) for _ in range(N_RANDOM // 2)]
    values += [float(rng.randint(-1000, 1000)) for _ in range(50)]
    while len(values) < len(edges) + N_RANDOM:  # random bit patterns over the whole range, NaN excluded
        (d,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if not math.isnan(d):
            values.append(d)
    rows = [(v,) for v in values]
    assert_key_groups_match(
        spark, [StructField("k", DoubleType(), False)], rows, types=["double"], moduli=(128, 100), check_inferred=True
    )


def test_negative_zero_double_key_matches_spark(spark):
    # -0.0 and 0.0 are one key (Spark groups them together); Python hashes -0.0 as 0.0.
    # This checks that Spark's xxhash64 agrees, i.e. the JVM puts both in the same key group.
    rows = [(-0.0,), (0.0,)]
    assert_key_groups_match(spark, [StructField("k", DoubleType(), False)], rows, types=["double"], moduli=(128, 100))


# ---------------------------------------------------------------- booleans


def test_boolean_keys_match_spark(spark):
    rows = [(True,), (False,)] * 3
    assert_key_groups_match(
        spark, [StructField("k", BooleanType(), False)], rows, types=["boolean"], moduli=(128, 100, 7),
        check_inferred=True,
    )


# ---------------------------------------------------------------- dates


def test_date_keys_match_spark(spark):
    rng = _rng("date")
    edges = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(1970, 1, 2), dt.date(2000, 2, 29),
             dt.date(1900, 1, 1), dt.date(1582, 10, 15), dt.date(1582, 10, 4), dt.date(1, 1, 1),
             dt.date(9999, 12, 31), dt.date(2038, 1, 19), dt.date.today()]
    lo, hi = dt.date(1, 1, 1).toordinal(), dt.date(9999, 12, 31).toordinal()
    values = edges + [dt.date.fromordinal(rng.randint(lo, hi)) for _ in range(N_RANDOM // 2)]
    near = dt.date(1970, 1, 1).toordinal()
    values += [dt.date.fromordinal(near + rng.randint(-40_000, 40_000)) for _ in range(N_RANDOM // 2)]
    rows = [(v,) for v in values]
    assert_key_groups_match(
        spark, [StructField("k", DateType(), False)], rows, types=["date"], moduli=(128, 100), check_inferred=True
    )


# ---------------------------------------------------------------- timestamps


def _micros_to_naive(micros: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)


def _timestamp_micros() -> list[int]:
    rng = _rng("timestamp")
    lo = (dt.datetime(1000, 1, 1) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    hi = (dt.datetime(9000, 1, 1) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    edges = [0, 1, -1, 999_999, -999_999, 1_000_000, -1_000_000, 86_400_000_000, -86_400_000_000]
    values = edges + [rng.randint(lo, hi) for _ in range(N_RANDOM // 2)]
    values += [rng.randint(-(10**15), 10**15) for _ in range(N_RANDOM // 2)]  # ~1938..2001
    return values


def test_timestamp_keys_match_spark(spark):
    # Aware datetimes name an instant unambiguously, whatever the session or process time zone.
    rng = _rng("timestamp-tz")
    zones = [UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-8))]
    values = [_micros_to_naive(m).replace(tzinfo=UTC).astimezone(rng.choice(zones)) for m in _timestamp_micros()]
    rows = [(v,) for v in values]
    assert_key_groups_match(
        spark, [StructField("k", TimestampType(), False)], rows, types=["timestamp"], moduli=(128, 100),
        check_inferred=True,
    )


def test_timestamp_ntz_keys_match_spark(spark):
    # Naive datetimes are wall-clock micros: Spark's TimestampNTZType, and key_group's reading of a naive value.
    values = [_micros_to_naive(m) for m in _timestamp_micros()]
    rows = [(v,) for v in values]
    assert_key_groups_match(
        spark, [StructField("k", TimestampNTZType(), False)], rows, types=["timestamp_ntz"], moduli=(128, 100),
        check_inferred=True,
    )


# ---------------------------------------------------------------- nulls


def test_keys_with_null_columns_match_spark(spark):
    """Spark's xxhash64 skips a null column (the hash so far passes through); so must key_group."""
    fields = [StructField("a", LongType(), True), StructField("b", StringType(), True), StructField("c", DoubleType(), True)]
    rows = [(None, None, None), (None, "x", 1.5), (7, None, 2.5), (7, "x", None), (None, None, float("nan")), (0, "", None)]
    assert_key_groups_match(spark, fields, rows, types=["long", "string", "double"], moduli=(128, 7))
    assert_key_groups_match(spark, [StructField("a", LongType(), True)], [(None,), (3,)], types=["long"], moduli=(128,))
