"""Driver-side helpers shared by the Spark runners: keys, key groups, schemas.

The key group of a row is computed in the JVM as ``pmod(xxhash64(keys), max_parallelism)``,
bit-for-bit what :func:`state.keys.key_group` computes in Python (tested
against Spark), and the operator instance as Flink's
``key_group * parallelism div max_parallelism``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from state.keygroups import check_max_parallelism
from state.keys import spark_type_name

from ..decorators import OperatorSpec


def key_list(key: Sequence[str] | str) -> list[str]:
    """The key columns as a list; a clear error for anything else."""
    columns = [key] if isinstance(key, str) else list(key) if isinstance(key, (list, tuple)) else None
    if not columns or not all(isinstance(c, str) and c for c in columns):
        raise ValueError(f"key must name one or more columns (a str or a list of str), got {key!r}")
    if len(set(columns)) != len(columns):
        raise ValueError(f"key names a column twice: {columns!r}")
    return columns


def key_types_of(schema: Any, key_columns: Sequence[str]) -> tuple[str, ...]:
    """The Spark type name of each key column in ``schema`` (a StructType)."""
    fields = {f.name: f for f in schema.fields}
    missing = [c for c in key_columns if c not in fields]
    if missing:
        raise ValueError(f"key columns {missing} are not in the DataFrame (it has {[f.name for f in schema.fields]})")
    types = []
    for column in key_columns:
        try:
            types.append(spark_type_name(fields[column].dataType))
        except ValueError as err:
            raise ValueError(f"key column {column!r}: {err}") from None
    return tuple(types)


def quoted(column: str) -> str:
    """``column`` as a SQL identifier (backticks, doubled inside)."""
    return "`" + column.replace("`", "``") + "`"


def key_group_sql(key_columns: Sequence[str], max_parallelism: int) -> str:
    """SQL for a row's key group: ``pmod(xxhash64(keys), max_parallelism)``."""
    check_max_parallelism(max_parallelism)
    return f"pmod(xxhash64({', '.join(quoted(c) for c in key_columns)}), {max_parallelism})"


def operator_index_sql(key_columns: Sequence[str], parallelism: int, max_parallelism: int) -> str:
    """SQL for a row's operator instance (Flink's ``key_group * p div max_parallelism``), an int."""
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")
    return f"cast(({key_group_sql(key_columns, max_parallelism)} * {parallelism}) div {max_parallelism} as int)"


def struct_type(schema: Any) -> Any:
    """A StructType from a StructType or a DDL string (``"word string, n long"``)."""
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        parsed = StructType.fromDDL(schema)
        if not isinstance(parsed, StructType):
            raise ValueError(f"output_schema {schema!r} is not a struct (a list of 'name type' fields)")
        return parsed
    raise TypeError(f"output_schema must be a StructType or a DDL string, got {schema!r}")


def nullable(schema: Any) -> Any:
    """The same fields, all nullable (report rows carry nulls in every output column)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields])


def aggregate_output_schema(spec: OperatorSpec, input_schema: Any, key_columns: Sequence[str]) -> Any:
    """The output schema of an ``aggregate(...)`` operator: the key columns, then one column per output."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
    from pyspark.sql.types import StructField, StructType

    from ..aggregations import arrow_type

    aggs = spec.aggregations
    assert aggs is not None
    fields = {f.name: f for f in input_schema.fields}
    input_types = {}
    for agg in aggs.values():
        if agg.column is not None and agg.column in fields:
            input_types[agg.column] = to_arrow_type(fields[agg.column].dataType)
    out = [StructField(c, fields[c].dataType, True) for c in key_columns]
    if spec.window is not None:
        from pyspark.sql.types import TimestampType

        from ..windows import WINDOW_END, WINDOW_START

        out += [StructField(WINDOW_START, TimestampType(), True), StructField(WINDOW_END, TimestampType(), True)]
    for name, type_name in aggs.output_types(input_types).items():
        out.append(StructField(name, from_arrow_type(arrow_type(type_name)), True))
    return StructType(out)


def output_schema_for(spec: OperatorSpec, output_schema: Optional[Any], input_schema: Any, key_columns: Sequence[str]) -> Any:
    """``output_schema`` as a StructType; inferred for ``aggregate(...)`` operators when None."""
    if output_schema is None:
        if spec.aggregations is None:
            raise ValueError("output_schema is required unless fn is buffering.aggregate(...)")
        return aggregate_output_schema(spec, input_schema, key_columns)
    return struct_type(output_schema)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote("sc://...")``).

    The public check: ``isinstance`` against Connect's own SparkSession class.
    (``pyspark.sql.utils.is_remote()`` reads a process-wide environment variable,
    which is wrong in a process that holds a classic and a Connect session.)
    """
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # Connect's client dependencies (grpcio, ...) are absent: no Connect session exists
        return False
    return isinstance(spark, ConnectSession)


def ensure_python_workers() -> None:
    """Point PySpark's workers at this interpreter when nothing else is configured (before a session starts)."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
