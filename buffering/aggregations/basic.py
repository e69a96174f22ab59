"""The aggregations whose partials are plain Python values.

:class:`Count`, :class:`Sum` and :class:`Mean` (an int, a number, a
``(sum, count)`` pair); :class:`Min`, :class:`Max`, :class:`First` and
:class:`Last` (one input value); :class:`CollectSet` (a sorted tuple of at
most ``max_size`` distinct values).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from pandas.api import types as pdt

from .base import Aggregation
from .engine import Grouping, _check_columns, _not_null, _object_array, _pairs, _ranks


# ------------------------------------------------------------------ Count / Sum / Mean


def _numeric(values: pd.Series, agg: Aggregation) -> pd.Series:
    """The input as a numeric Series (bools as ints; object columns through ``pd.to_numeric``)."""
    dtype = values.dtype
    if pdt.is_bool_dtype(dtype):
        if isinstance(dtype, pd.api.extensions.ExtensionDtype):
            return values.astype("Int64")
        return values.astype(np.int64)
    if pdt.is_numeric_dtype(dtype):
        return values
    if dtype == np.dtype(object):
        kind = pdt.infer_dtype(values, skipna=True)
        if kind in ("integer", "floating", "mixed-integer-float", "empty"):
            return pd.to_numeric(values)
        if kind == "boolean":
            return values.astype("boolean").astype("Int64")
        if kind == "decimal":
            return values  # summed as Python Decimals
        raise TypeError(f"{agg!r}: column {agg.column!r} holds {kind} values, not numbers")
    raise TypeError(f"{agg!r}: column {agg.column!r} has the non-numeric dtype {dtype}")


def _sum_type(agg: Aggregation, input_type: Any) -> str:
    name = agg._needs_input_type(input_type)
    if name == "bool" or re.fullmatch(r"u?int(8|16|32|64)", name):
        return "int64"
    if name in ("double", "float", "halffloat"):
        return "double"
    if name.startswith("decimal"):
        return name
    raise ValueError(f"{agg!r}: cannot sum a column of type {name}")


class Count(Aggregation):
    """``Count()`` counts rows; ``Count(col)`` counts non-null values. Partial: an int."""

    needs_column = False
    partial_dtype = np.int64

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        if self.column is None:
            return grouping.counts()
        return grouping.counts(_not_null(self._input(df)))

    def partial(self, df: pd.DataFrame) -> int:
        _check_columns(df, self.input_columns, repr(self))
        return len(df) if self.column is None else int(self._input(df).count())

    def merge(self, a: int, b: int) -> int:
        return a + b

    def merge_many(self, partials: Iterable[int]) -> int:
        return sum(partials, 0)

    def result(self, p: int) -> int:
        return int(p)

    def empty(self) -> int:
        return 0

    def output_type(self, input_type: Any = None) -> str:
        return "int64"


class Sum(Aggregation):
    """Sum of the non-null values; None when there are none (SQL). Partial: a number or None.

    Numeric and bool columns (bools count as 0/1), and object columns of
    Python numbers (Decimals stay Decimals). Per chunk, integer columns are summed in int64 (wrapping
    on overflow, as numpy does); merging partials uses Python ints (exact).
    """

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        values = _numeric(self._input(df), self)
        return grouping.reduce(values, "sum", _not_null(values))

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return a + b

    def result(self, p: Any) -> Any:
        return p

    def empty(self) -> None:
        return None

    def output_type(self, input_type: Any = None) -> str:
        return _sum_type(self, input_type)


class Mean(Aggregation):
    """Arithmetic mean of the non-null values (a float), None when there are none.

    Partial: ``(sum, count)``; the identity is ``(0, 0)``.
    """

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        values = _numeric(self._input(df), self)
        mask = _not_null(values)
        sums = grouping.reduce(values, "sum", mask)
        counts = grouping.counts(mask).tolist()
        return _object_array(((0 if s is None else s, c) for s, c in zip(sums, counts)), grouping.ngroups)

    def merge(self, a: tuple, b: tuple) -> tuple:
        if not b[1]:
            return a
        if not a[1]:
            return b
        return (a[0] + b[0], a[1] + b[1])

    def result(self, p: tuple) -> float | None:
        total, count = p
        return None if not count else float(total / count)

    def empty(self) -> tuple:
        return (0, 0)

    def output_type(self, input_type: Any = None) -> str:
        return "double"


# ------------------------------------------------------------------ Min / Max / First / Last


class _Pick(Aggregation):
    """Aggregations whose partial is one input value or None."""

    _how: str

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        values = self._input(df)
        return grouping.reduce(values, self._how, _not_null(values))

    def result(self, p: Any) -> Any:
        return p

    def empty(self) -> None:
        return None

    def output_type(self, input_type: Any = None) -> str:
        return self._needs_input_type(input_type)


class Min(_Pick):
    """Smallest non-null value (None when there is none). Partial: that value or None."""

    _how = "min"

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return b if b < a else a


class Max(_Pick):
    """Largest non-null value (None when there is none). Partial: that value or None."""

    _how = "max"

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return b if b > a else a


class First(_Pick):
    """First non-null value in arrival order. ``merge(earlier, later)`` keeps ``earlier`` (not commutative)."""

    _how = "first"

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a


class Last(_Pick):
    """Last non-null value in arrival order. ``merge(earlier, later)`` keeps ``later`` (not commutative)."""

    _how = "last"

    def merge(self, a: Any, b: Any) -> Any:
        return a if b is None else b


# ------------------------------------------------------------------ CollectSet


class CollectSet(Aggregation):
    """The distinct non-null values, bounded: at most ``max_size`` of them.

    When a key has more than ``max_size`` distinct values, the **max_size
    smallest** are kept (not the first seen): that choice makes ``merge``
    commutative and associative and the result independent of how the stream
    was split into chunks. The values of a column must be mutually comparable.

    Partial: a sorted tuple of at most ``max_size`` values (identity ``()``).
    Result: a sorted ``list`` (an Arrow ``list<...>``; ``[]`` for a key
    without values).
    """

    def __init__(self, column: str, max_size: int = 1000) -> None:
        super().__init__(column)
        if isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer)):
            raise TypeError(f"CollectSet: max_size must be an int, got {max_size!r}")
        if max_size < 1:
            raise ValueError(f"CollectSet: max_size must be >= 1, got {max_size}")
        self.max_size = int(max_size)

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        values = self._input(df)
        mask = _not_null(values)
        ranks, ordered = _ranks(values[mask])
        codes, ranks = _pairs(grouping.codes[mask], ranks, len(ordered))
        bounds = grouping.split(codes)
        keep = np.arange(len(codes)) - bounds[codes] < self.max_size
        items = ordered[ranks[keep]].tolist()
        kept = np.minimum(np.diff(bounds), self.max_size)
        ends = np.cumsum(kept).tolist()
        return _object_array(
            (tuple(items[end - k : end]) for end, k in zip(ends, kept.tolist())), grouping.ngroups
        )

    def merge(self, a: tuple, b: tuple) -> tuple:
        if not b:
            return a
        if not a:
            return b
        return tuple(sorted(set(a).union(b)))[: self.max_size]

    def merge_many(self, partials: Iterable[tuple]) -> tuple:
        seen: set = set()
        for p in partials:
            seen.update(p)
        return tuple(sorted(seen))[: self.max_size]

    def result(self, p: tuple) -> list:
        return list(p)

    def empty(self) -> tuple:
        return ()

    def output_type(self, input_type: Any = None) -> str:
        return f"list<{self._needs_input_type(input_type)}>"

    def _params(self) -> tuple:
        return (self.column, self.max_size)

    def _options(self) -> dict[str, Any]:
        return {"max_size": self.max_size}
