"""The map-side combine done by Spark SQL, for aggregations with an exact SQL twin.

``groupBy(key).agg(...)`` runs Spark's own partial aggregation before the
shuffle and a final one after it, in the JVM, so each key reaches its operator
instance as **one row per micro-batch** and no input row ever crosses into
Python. The operator then only merges that row into the key's state.

Only aggregations whose SQL result equals opbuffer's partial exactly are
translated (others fall back to the Python combine):

* ``Count()``; ``Count(col)``, ``Sum``, ``Mean``, ``Min``, ``Max`` on integral
  columns (no NaN, which pandas counts as null and Spark does not);
  ``Min``/``Max``/``Count(col)`` on strings;
* ``ApproxDistinct`` on integral or string columns: Spark's ``hll_sketch_agg``
  is Apache DataSketches' HLL, whose sketches the Python ``datasketches``
  package reads and unions (same hash of longs and UTF-8 strings).

Sums and picks travel as ``coalesce(x, 0)`` plus a non-null count, so integers
never pass through a float column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd

from ..aggregations import ApproxDistinct, Aggregations, Count, HllPartial, Max, Mean, Min, Sum, _datasketches

_INTEGRAL = ("byte", "short", "integer", "long")


@dataclass(frozen=True)
class SqlPartial:
    """How one output's partial travels: its kind and the combined frame's columns."""

    name: str
    kind: str  # "count", "sum", "mean", "pick_int", "pick_str", "hll"
    columns: tuple[str, ...]


def _type_name(schema: Any, column: str) -> Optional[str]:
    for f in schema.fields:
        if f.name == column:
            return f.dataType.typeName()
    return None


def sql_partials(aggs: Aggregations, schema: Any) -> Optional[list[SqlPartial]]:
    """The SQL form of every output's partial, or None when one of them has no exact SQL twin."""
    out = []
    for i, (name, agg) in enumerate(aggs.items()):
        base = f"__opbuffer_p{i}"
        kind = type(agg)
        column_type = _type_name(schema, agg.column) if agg.column is not None else None
        if kind is Count and agg.column is None:
            out.append(SqlPartial(name, "count", (f"{base}_n",)))
        elif kind is Count and column_type in (*_INTEGRAL, "string"):
            out.append(SqlPartial(name, "count", (f"{base}_n",)))
        elif kind in (Sum, Mean) and column_type in _INTEGRAL:
            out.append(SqlPartial(name, "sum" if kind is Sum else "mean", (f"{base}_s", f"{base}_n")))
        elif kind in (Min, Max) and column_type in _INTEGRAL:
            out.append(SqlPartial(name, "pick_int", (f"{base}_v", f"{base}_n")))
        elif kind in (Min, Max) and column_type == "string":
            out.append(SqlPartial(name, "pick_str", (f"{base}_v", f"{base}_n")))
        elif kind is ApproxDistinct and column_type in (*_INTEGRAL, "string"):
            out.append(SqlPartial(name, "hll", (f"{base}_h",)))
        else:
            return None
    return out


def sql_exprs(aggs: Aggregations, partials: list[SqlPartial]) -> list[Any]:
    """The Spark aggregate expressions (driver side) producing the partial columns."""
    from pyspark.sql import functions as F

    exprs = []
    for p in partials:
        agg = aggs[p.name]
        column = F.col(agg.column) if agg.column is not None else None
        if p.kind == "count":
            exprs.append((F.count(F.lit(1)) if column is None else F.count(column)).alias(p.columns[0]))
        elif p.kind in ("sum", "mean"):
            exprs.append(F.coalesce(F.sum(column.cast("long")), F.lit(0).cast("long")).alias(p.columns[0]))
            exprs.append(F.count(column).alias(p.columns[1]))
        elif p.kind in ("pick_int", "pick_str"):
            pick = F.min(column) if isinstance(agg, Min) else F.max(column)
            if p.kind == "pick_int":
                pick = F.coalesce(pick.cast("long"), F.lit(0).cast("long"))
            exprs.append(pick.alias(p.columns[0]))
            exprs.append(F.count(column).alias(p.columns[1]))
        elif p.kind == "hll":
            assert isinstance(agg, ApproxDistinct)
            exprs.append(F.hll_sketch_agg(column, agg.lg_k).alias(p.columns[0]))
    return exprs


def columns(frame: pd.DataFrame, partials: list[SqlPartial]) -> dict[str, Any]:
    """Each output's partials as columns, for a columnar merge: counts as int64, sketches as bytes, sums,
    means and picks as (values, non-null counts)."""
    out: dict[str, Any] = {}
    for p in partials:
        if p.kind == "count":
            out[p.name] = frame[p.columns[0]].to_numpy(dtype="int64")
        elif p.kind == "hll":
            out[p.name] = frame[p.columns[0]].tolist()
        elif p.kind in ("sum", "mean", "pick_int"):
            out[p.name] = (frame[p.columns[0]].to_numpy(dtype="int64"), frame[p.columns[1]].to_numpy(dtype="int64"))
        else:  # pick_str
            out[p.name] = (frame[p.columns[0]].tolist(), frame[p.columns[1]].to_numpy(dtype="int64"))
    return out


def accumulators(frame: pd.DataFrame, partials: list[SqlPartial]) -> list[dict[str, Any]]:
    """One accumulator ``{output: partial}`` per row of a combined frame (worker side): :func:`columns`, row by row.

    A sum or a pick with no non-null value is None, a mean ``(sum, count)``, a
    sketch a :class:`HllPartial`.
    """
    per_output: dict[str, list[Any]] = {}
    for p, (name, column) in zip(partials, columns(frame, partials).items()):
        if p.kind == "count":
            per_output[name] = column.tolist()
        elif p.kind == "hll":
            deserialize = _datasketches().hll_sketch.deserialize
            per_output[name] = [HllPartial(deserialize(b if type(b) is bytes else bytes(b))) for b in column]
        else:
            values, counts = column
            values = values if isinstance(values, list) else values.tolist()
            if p.kind == "mean":
                per_output[name] = [(v, n) if n else (0, 0) for v, n in zip(values, counts.tolist())]
            else:  # sum, pick_int, pick_str
                per_output[name] = [v if n else None for v, n in zip(values, counts.tolist())]
    names = list(per_output)
    return [dict(zip(names, values)) for values in zip(*per_output.values())]
