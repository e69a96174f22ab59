"""Mergeable aggregations: vectorized partials, merge, result.

An :class:`Aggregation` turns rows into a *partial* (a small, picklable
accumulator), merges partials, and turns a partial into the final value. The
mini-batch buffer uses them to pre-aggregate: it computes one partial per key
for each incoming pandas chunk (:meth:`Aggregation.partials`, vectorized: no
Python work per row), keeps one partial per key instead of the rows (memory
O(keys)), and merges the buffered partial into the key's state accumulator on a
flush. :class:`Aggregations` does the same for ``{output_column: aggregation}``
and is what an ``aggregate`` operator keeps per key: ``dict[out_col, partial]``.

>>> import pandas as pd
>>> df = pd.DataFrame({"k": ["a", "b", "a"], "x": [1, None, 3]})
>>> aggs = Aggregations({"n": Count(), "total": Sum("x"), "hi": Max("x")})
>>> aggs.partials(df, ["k"])  # doctest: +NORMALIZE_WHITESPACE
   n total    hi
k
a  2   4.0   3.0
b  1  None  None
>>> aggs.result(aggs.merge(aggs.partial(df.iloc[:2]), aggs.partial(df.iloc[2:])))
{'n': 3, 'total': 4.0, 'hi': 3.0}

Conventions (all aggregations):

* **Groups.** ``partials(df, by)`` returns one partial per group of the
  ``by`` columns, indexed by the group keys **in order of first appearance**
  (``groupby(by, sort=False, dropna=False)``): a plain :class:`pandas.Index`
  for one key column, a :class:`pandas.MultiIndex` for several. Rows whose key
  is null form their own group (keys are never null by contract; nothing is
  dropped silently).
* **Nulls** are ignored as in SQL (``None``, ``NaN``, ``NaT``, ``pd.NA``; pandas
  cannot tell a float NaN from a null, so NaN counts as null). ``Count()``
  counts rows, ``Count(col)`` non-null values; Sum/Min/Max/Mean/First/Last of a
  group with no non-null value is ``None``.
* **Partials are values.** They are Python objects (ints, floats, strings,
  tuples, :class:`HllPartial`), picklable with protocol 5, and treated as
  immutable: ``merge`` never mutates its inputs, but may return one of them
  unchanged (e.g. when the other is the identity).
* **Merge laws.** ``merge`` is associative for every aggregation, has
  ``empty()`` as identity, and is commutative except for :class:`First` and
  :class:`Last`, whose ``merge(earlier, later)`` keeps the earlier (First) or
  the later (Last) value. Float sums depend on the order of additions only up
  to rounding.
* **Output types** are Arrow type names (``"int64"``, ``"double"``,
  ``"string"``, ``"list<string>"``, ...); see :meth:`Aggregation.output_type`
  and :func:`arrow_type`.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
from pandas.api import types as pdt

from state.keys import denormalize_key, normalize_key

__all__ = [
    "Aggregation",
    "Aggregations",
    "ApproxDistinct",
    "CollectSet",
    "ColumnNotFoundError",
    "Count",
    "First",
    "Grouping",
    "HllPartial",
    "Last",
    "Max",
    "Mean",
    "Min",
    "Sum",
    "arrow_type",
    "combine_frame",
    "type_name",
]


# ------------------------------------------------------------------ errors, types


class ColumnNotFoundError(KeyError, ValueError):
    """A column an aggregation (or the grouping) needs is not in the frame.

    Both a KeyError (what pandas raises) and a ValueError (bad input), so
    either ``except`` catches it. The message names the missing and the
    available columns.
    """

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0]) if self.args else ""


def _check_columns(df: pd.DataFrame, needed: Iterable[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    columns = df.columns
    missing = [c for c in dict.fromkeys(needed) if c not in columns]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        plural = "s" if len(missing) > 1 else ""
        raise ColumnNotFoundError(
            f"{what}: column{plural} {names} not in the frame; available columns: {list(columns)!r}"
        )


def _as_by(by: str | Sequence[str]) -> list[str]:
    if isinstance(by, str):
        return [by]
    by = list(by)
    if not by:
        raise ValueError("by: at least one key column is needed (use partial(df) for the whole frame)")
    return by


def type_name(t: Any) -> str:
    """The Arrow type name of a pandas/numpy dtype, a pyarrow type, or a type name.

    ``object`` means strings (the pandas convention); ``float64`` is
    ``"double"``; a name pandas does not know (``"list<string>"``,
    ``"timestamp[us]"``) is returned unchanged.
    """
    if isinstance(t, pa.DataType):
        return str(t)
    if isinstance(t, str):
        try:
            t = pdt.pandas_dtype(t)
        except TypeError:
            return t
    if isinstance(t, pd.CategoricalDtype):
        return type_name(t.categories.dtype)
    if isinstance(t, pd.DatetimeTZDtype):
        return f"timestamp[{t.unit}, tz={t.tz}]"
    if isinstance(t, pd.StringDtype) or t == np.dtype(object):
        return "string"
    if isinstance(t, pd.ArrowDtype):
        return str(t.pyarrow_dtype)
    if isinstance(t, pd.api.extensions.ExtensionDtype):
        numpy_dtype = getattr(t, "numpy_dtype", None)  # Int64, Float64, boolean
        if numpy_dtype is None:
            raise TypeError(f"no Arrow type for the pandas dtype {t!r}")
        t = numpy_dtype
    return str(pa.from_numpy_dtype(np.dtype(t)))


_TIMESTAMP = re.compile(r"timestamp\[(\w+)(?:,\s*tz=(.+))?\]$")


def arrow_type(name: str) -> pa.DataType:
    """Parse a type name as returned by :meth:`Aggregation.output_type` into a pyarrow type."""
    name = name.strip()
    if name.startswith("list<") and name.endswith(">"):
        inner = name[5:-1]
        if inner.startswith("item:"):
            inner = inner[5:]
        return pa.list_(arrow_type(inner))
    m = _TIMESTAMP.match(name)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    return pa.type_for_alias(name)


# ------------------------------------------------------------------ grouping


class Grouping:
    """The groups of a frame by some key columns, computed once and shared by aggregations.

    ``codes[i]`` is the group number of row ``i`` (0..ngroups-1, numbered in
    order of first appearance) and ``index`` holds the group keys in that
    order. Reductions run on numpy (``ufunc.at``): on the values themselves
    for numeric, bool and datetime columns, on the ranks of the distinct
    values (hashed with ``pd.factorize``, sorted once) for strings and other
    objects.
    """

    __slots__ = ("codes", "ngroups", "index")

    def __init__(self, codes: np.ndarray, ngroups: int, index: pd.Index | None) -> None:
        self.codes = codes
        self.ngroups = ngroups
        self.index = index

    @classmethod
    def of(cls, df: pd.DataFrame, by: str | Sequence[str]) -> "Grouping":
        by = _as_by(by)
        _check_columns(df, by, "group by")
        n = len(df)
        if len(by) == 1:
            codes, uniques = pd.factorize(df[by[0]], use_na_sentinel=False)
            index = pd.Index(uniques, name=by[0])
            return cls(np.asarray(codes, dtype=np.intp), len(index), index)
        # Several columns: factorize each and fold the codes pairwise, so the
        # combined codes stay dense (< n) and numbered in order of first appearance.
        # A null key gets the level code -1 (how a MultiIndex spells a missing label).
        codes = np.zeros(n, dtype=np.int64)
        levels, level_codes = [], []
        for column in by:
            c, uniques = pd.factorize(df[column], use_na_sentinel=True)
            codes, _ = pd.factorize(codes * (len(uniques) + 1) + (c + 1))
            levels.append(uniques)
            level_codes.append(c)
        codes = np.asarray(codes, dtype=np.intp)
        ngroups = int(codes.max()) + 1 if n else 0
        first = np.full(ngroups, n, dtype=np.intp)
        np.minimum.at(first, codes, np.arange(n, dtype=np.intp))
        index = pd.MultiIndex(
            levels=levels, codes=[c[first] for c in level_codes], names=by, verify_integrity=False
        )
        return cls(codes, ngroups, index)

    @classmethod
    def single(cls, df: pd.DataFrame) -> "Grouping":
        """All rows in one group (no index)."""
        n = len(df)
        return cls(np.zeros(n, dtype=np.intp), 1 if n else 0, None)

    def counts(self, mask: np.ndarray | None = None) -> np.ndarray:
        codes = self.codes if mask is None else self.codes[mask]
        return np.bincount(codes, minlength=self.ngroups)

    def reduce(self, values: pd.Series, how: str, mask: np.ndarray) -> np.ndarray:
        """``how`` (``sum``, ``min``, ``max``, ``first``, ``last``) per group over ``values[mask]``.

        Returns an object array of Python scalars (``Timestamp`` for
        datetimes), one per group, None for a group without selected rows.
        ``first``/``last`` follow row order.
        """
        codes = self.codes[mask]
        out = np.full(self.ngroups, None, dtype=object)
        if len(codes) == 0:
            return out
        present = np.bincount(codes, minlength=self.ngroups) > 0
        if how in ("first", "last"):
            rows = np.flatnonzero(mask)
            if how == "first":
                pos = np.full(self.ngroups, len(mask), dtype=np.intp)
                np.minimum.at(pos, codes, rows)
            else:
                pos = np.full(self.ngroups, -1, dtype=np.intp)
                np.maximum.at(pos, codes, rows)
            out[present] = _python_objects(values.iloc[pos[present]])
            return out
        arr = _numpy_values(values)
        if arr is None and how != "sum":  # strings, objects, tz-aware datetimes: reduce ranks
            ranks, ordered = _ranks(values[mask])
            pos = np.full(self.ngroups, len(ordered) if how == "min" else -1, dtype=np.intp)
            (np.minimum if how == "min" else np.maximum).at(pos, codes, ranks)
            out[present] = ordered[pos[present]]
            return out
        if arr is None:  # sum of objects (e.g. Decimal): pandas
            cat = pd.Categorical.from_codes(codes, categories=pd.RangeIndex(self.ngroups))
            grouped = values[mask].reset_index(drop=True).groupby(cat, observed=True, sort=True)
            reduced = getattr(grouped, how)()
            out[np.asarray(reduced.index.codes)] = _python_objects(reduced)
            return out
        arr = arr[mask]
        if how == "sum":
            acc_dtype = {"f": np.float64, "u": np.uint64}.get(arr.dtype.kind, np.int64)
            acc = np.zeros(self.ngroups, dtype=acc_dtype)
            np.add.at(acc, codes, arr)
        else:
            if arr.dtype.kind == "f":
                start = np.inf if how == "min" else -np.inf
            elif arr.dtype.kind == "b":
                start = how == "min"
            else:
                info = np.iinfo(arr.dtype)
                start = info.max if how == "min" else info.min
            acc = np.full(self.ngroups, start, dtype=arr.dtype)
            (np.minimum if how == "min" else np.maximum).at(acc, codes, arr)
        acc = acc[present]
        dtype = values.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "mM" and how != "sum":
            out[present] = pd.Series(acc.view(dtype)).astype(object).to_numpy()
        else:
            out[present] = acc.astype(object)
        return out

    def split(self, codes: np.ndarray) -> np.ndarray:
        """Boundaries of each group in ``codes`` sorted ascending: group g is ``[b[g], b[g+1])``."""
        return np.searchsorted(codes, np.arange(self.ngroups + 1), side="left")


def _ranks(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, ordered)``: the distinct non-null values sorted (``ordered``, an object
    array of Python scalars) and each row's position in it.

    Hashing (``pd.factorize``) finds the distinct values; only those are
    compared and sorted. Values that compare equal in Python (``1`` and
    ``1.0``) are one value.
    """
    codes, uniques = pd.factorize(values)
    order = _argsort(uniques, values.name)
    rank_of_code = np.empty(len(order), dtype=np.intp)
    rank_of_code[order] = np.arange(len(order), dtype=np.intp)
    ordered = pd.Series(uniques.take(order)).astype(object).to_numpy(dtype=object)  # no nulls here
    return rank_of_code[codes], ordered


def _argsort(uniques: Any, name: Any) -> np.ndarray:
    """Sorting permutation of distinct values (strings sorted by pyarrow: numpy compares objects in Python)."""
    if len(uniques) > 64 and getattr(uniques, "dtype", None) == np.dtype(object):
        if pdt.infer_dtype(uniques, skipna=False) == "string":
            # UTF-8 byte order is code point order, i.e. Python's str order.
            return pa.compute.array_sort_indices(pa.array(np.asarray(uniques), type=pa.large_string())).to_numpy()
    try:
        return np.asarray(uniques.argsort())
    except TypeError as exc:
        raise TypeError(f"values of column {name!r} are not mutually comparable: {exc}") from None


def _pairs(codes: np.ndarray, values: np.ndarray, n_values: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``(group code, value code)`` pairs sorted by group, then value code."""
    if len(codes) == 0:
        return codes, values
    pair = np.sort(codes.astype(np.int64) * n_values + values)
    if len(pair) > 1:
        pair = pair[np.concatenate(([True], pair[1:] != pair[:-1]))]
    return (pair // n_values).astype(np.intp), (pair % n_values).astype(np.intp)


def _numpy_values(values: pd.Series) -> np.ndarray | None:
    """The values as a numpy array for numpy reductions (nulls as 0; always masked out), or None."""
    dtype = values.dtype
    if isinstance(dtype, np.dtype):
        if dtype.kind in "iufb":
            return values.to_numpy()
        if dtype.kind in "mM":
            return values.to_numpy().view(np.int64)
        return None
    numpy_dtype = getattr(dtype, "numpy_dtype", None)  # Int64, Float64, boolean (masked arrays)
    if isinstance(numpy_dtype, np.dtype) and numpy_dtype.kind in "iufb" and not isinstance(dtype, pd.ArrowDtype):
        return values.to_numpy(dtype=numpy_dtype, na_value=False if numpy_dtype.kind == "b" else 0)
    return None


def _python_objects(values: pd.Series) -> np.ndarray:
    """An object array of Python scalars (``Timestamp`` for datetimes), None for nulls."""
    out = values.astype(object).to_numpy(dtype=object, copy=True)
    na = values.isna().to_numpy()
    if na.any():
        out[na] = None
    return out


def _not_null(values: pd.Series) -> np.ndarray:
    return values.notna().to_numpy()


def _object_array(items: Iterable[Any], n: int) -> np.ndarray:
    return np.fromiter(items, dtype=object, count=n)


# ------------------------------------------------------------------ base class


class Aggregation(ABC):
    """A mergeable aggregation of one input column (or of rows, for ``Count()``).

    Subclasses implement :meth:`_grouped` (vectorized partials for a
    :class:`Grouping`), :meth:`merge`, :meth:`result`, :meth:`empty` and
    :meth:`output_type`.
    """

    #: whether the aggregation needs an input column
    needs_column: bool = True
    #: dtype of the Series returned by :meth:`partials`
    partial_dtype: Any = object

    def __init__(self, column: str | None = None) -> None:
        if column is None and self.needs_column:
            raise TypeError(f"{type(self).__name__} needs an input column, e.g. {type(self).__name__}('amount')")
        if column is not None and not isinstance(column, str):
            raise TypeError(f"{type(self).__name__}: the column must be a str, got {column!r}")
        self.column: str | None = column

    # -- partials
    def partials(self, df: pd.DataFrame, by: str | Sequence[str]) -> pd.Series:
        """One partial per group of ``by`` (keys in order of first appearance), vectorized."""
        by = _as_by(by)
        _check_columns(df, [*by, *self.input_columns], repr(self))
        grouping = Grouping.of(df, by)
        return self._series(df, grouping)

    def partial(self, df: pd.DataFrame) -> Any:
        """The partial of a whole frame (one key); ``empty()`` for a frame without rows."""
        _check_columns(df, self.input_columns, repr(self))
        if len(df) == 0:
            return self.empty()
        return self._grouped(df, Grouping.single(df))[0]

    @property
    def input_columns(self) -> list[str]:
        return [] if self.column is None else [self.column]

    def _series(self, df: pd.DataFrame, grouping: Grouping) -> pd.Series:
        values = self._grouped(df, grouping)
        return pd.Series(values, index=grouping.index, dtype=self.partial_dtype, copy=False)

    @abstractmethod
    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        """The partials of every group of ``grouping`` as an array (object unless ``partial_dtype``)."""

    # -- merging
    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """Combine two partials (``a`` from earlier rows than ``b``) without mutating them."""

    def merge_many(self, partials: Iterable[Any]) -> Any:
        """Merge partials in order (earliest first); ``empty()`` for none."""
        acc = self.empty()
        for p in partials:
            acc = self.merge(acc, p)
        return acc

    @abstractmethod
    def result(self, p: Any) -> Any:
        """The final value of a partial."""

    @abstractmethod
    def empty(self) -> Any:
        """The identity partial: what a key without rows has."""

    @abstractmethod
    def output_type(self, input_type: Any = None) -> str:
        """Arrow type name of :meth:`result` (see :func:`type_name`, :func:`arrow_type`).

        ``input_type`` is the input column's type (a pandas/numpy dtype, a
        pyarrow type or a type name); aggregations whose result type follows
        the input raise ValueError without it.
        """

    # -- helpers
    def _input(self, df: pd.DataFrame) -> pd.Series:
        assert self.column is not None
        return df[self.column]

    def _needs_input_type(self, input_type: Any) -> str:
        if input_type is None:
            raise ValueError(
                f"{self!r}.output_type() follows the input column's type: pass it, "
                f"e.g. output_type('int64') or output_type(df[{self.column!r}].dtype)"
            )
        return type_name(input_type)

    def _params(self) -> tuple:
        return (self.column,)

    def __repr__(self) -> str:
        args = [] if self.column is None else [repr(self.column)]
        args += [f"{k}={v!r}" for k, v in self._options().items()]
        return f"{type(self).__name__}({', '.join(args)})"

    def _options(self) -> dict[str, Any]:
        return {}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._params() == self._params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._params()))


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


# ------------------------------------------------------------------ Count / Sum / Mean


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


# ------------------------------------------------------------------ ApproxDistinct


def _datasketches():
    try:
        import datasketches
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("ApproxDistinct needs the `datasketches` package: pip install datasketches") from exc
    return datasketches


_HLL_TYPES = ("HLL_4", "HLL_6", "HLL_8")


class HllPartial:
    """A picklable wrapper of a ``datasketches.hll_sketch`` (which does not pickle).

    Pickles as the sketch's compact serialization. Treated as immutable:
    merging goes through an ``hll_union`` and builds a new sketch.
    """

    __slots__ = ("sketch",)

    def __init__(self, sketch: Any) -> None:
        self.sketch = sketch

    @classmethod
    def from_bytes(cls, data: bytes) -> "HllPartial":
        return cls(_datasketches().hll_sketch.deserialize(bytes(data)))

    def to_bytes(self) -> bytes:
        return self.sketch.serialize_compact()

    def __reduce__(self):
        # A module-level function, not the bound classmethod: pickling that costs
        # two more global lookups (getattr, the class): 15 us instead of 5 per sketch.
        return (_hll_partial, (self.sketch.serialize_compact(),))

    @property
    def lg_k(self) -> int:
        return self.sketch.lg_config_k

    def estimate(self) -> float:
        return self.sketch.get_estimate()

    def is_empty(self) -> bool:
        return self.sketch.is_empty()

    def __repr__(self) -> str:
        return f"HllPartial(lg_k={self.lg_k}, estimate={self.estimate():.1f})"


def _hll_partial(data: bytes) -> HllPartial:
    """Unpickle an :class:`HllPartial`."""
    return HllPartial(_datasketches().hll_sketch.deserialize(bytes(data)))


_EMPTY_STRING = math.nan  # what the sketch sees for "" (it ignores empty strings)


def _hll_scalar(v: Any) -> int | float | str:
    """One value as what is fed to the sketch: ints, non-integral floats, strings."""
    t = type(v)
    if t is str:
        return v
    if t is int or t is bool:
        return int(v)
    if t is float:
        return int(v) if v.is_integer() and abs(v) < 9.2e18 else v
    if isinstance(v, np.generic):
        return _hll_scalar(v.item())
    if isinstance(v, (pd.Timestamp, _dt.datetime, np.datetime64)):
        return pd.Timestamp(v).as_unit("ns").value
    if isinstance(v, (pd.Timedelta, _dt.timedelta, np.timedelta64)):
        return pd.Timedelta(v).as_unit("ns").value
    if isinstance(v, _dt.date):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("latin-1")  # one-to-one; a column holds one type
    if isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (float, decimal.Decimal)):
        return _hll_scalar(float(v))
    raise TypeError(f"ApproxDistinct: unsupported value {v!r} of type {t.__name__}")


def _hll_values(values: pd.Series) -> list:
    """Non-null values as ints / non-integral floats / strings (vectorized for typed columns).

    Integral floats become ints, so ``3`` and ``3.0`` are one value whether a
    chunk's column came as int64 or (because of a null) as float64; datetimes
    and timedeltas become int64 nanoseconds.
    """
    dtype = values.dtype
    if pdt.is_bool_dtype(dtype) or pdt.is_signed_integer_dtype(dtype):
        return values.to_numpy(dtype=np.int64).tolist()
    if pdt.is_unsigned_integer_dtype(dtype):
        return values.to_numpy(dtype=np.uint64).view(np.int64).tolist()
    if pdt.is_float_dtype(dtype):
        x = values.to_numpy(dtype=np.float64)
        integral = np.isfinite(x) & (np.trunc(x) == x) & (np.abs(x) < 9.2e18)
        if integral.all():
            return x.astype(np.int64).tolist()
        out = x.astype(object)
        out[integral] = x[integral].astype(np.int64).astype(object)
        return out.tolist()
    if isinstance(dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
        dtype = values.dtype
    if pdt.is_datetime64_dtype(dtype):
        return values.astype("datetime64[ns]").to_numpy().view(np.int64).tolist()
    if pdt.is_timedelta64_dtype(dtype):
        return values.astype("timedelta64[ns]").to_numpy().view(np.int64).tolist()
    items = values.astype(object).tolist()
    if pd.api.types.infer_dtype(items, skipna=False) != "string":
        items = [_hll_scalar(v) for v in items]
    if "" in items:  # datasketches ignores empty strings; NaN (never fed otherwise: nulls are dropped) stands in
        items = [_EMPTY_STRING if v == "" else v for v in items]
    return items


class ApproxDistinct(Aggregation):
    """Approximate number of distinct non-null values: a HyperLogLog sketch (``datasketches``).

    ``lg_k`` (7..21) sets the accuracy: relative standard error about
    ``1.04 / sqrt(2**lg_k)`` (1.6% for the default 12); ``tgt_type`` is the
    register width (``"HLL_8"``: fastest updates, 2**lg_k bytes;
    ``"HLL_4"``: half the size). Small cardinalities (list and set
    modes of the sketch) are counted almost exactly.

    Values are fed to the sketch as Python ints, non-integral floats and
    strings (integral floats as ints, datetimes as int64 nanoseconds, the
    empty string as NaN, which the sketch would otherwise ignore); rows are
    de-duplicated per group before updating, so repeated values cost one
    update. ``datasketches`` has no bulk update: one Python call per distinct
    value per group.

    Partial: an :class:`HllPartial`. Result: the estimate rounded to an int.
    """

    def __init__(self, column: str, lg_k: int = 12, tgt_type: str = "HLL_8") -> None:
        super().__init__(column)
        if isinstance(lg_k, bool) or not isinstance(lg_k, (int, np.integer)) or not 7 <= lg_k <= 21:
            raise ValueError(f"ApproxDistinct: lg_k must be an int in [7, 21], got {lg_k!r}")
        if tgt_type not in _HLL_TYPES:
            raise ValueError(f"ApproxDistinct: tgt_type must be one of {_HLL_TYPES}, got {tgt_type!r}")
        self.lg_k = int(lg_k)
        self.tgt_type = tgt_type
        self._ds = _datasketches()
        self._tgt = getattr(self._ds.tgt_hll_type, tgt_type)

    def __getstate__(self) -> dict:
        return {"column": self.column, "lg_k": self.lg_k, "tgt_type": self.tgt_type}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["column"], state["lg_k"], state["tgt_type"])  # type: ignore[misc]

    def _new(self):
        return self._ds.hll_sketch(self.lg_k, self._tgt)

    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        values = self._input(df)
        mask = _not_null(values)
        value_codes, uniques = pd.factorize(values[mask])
        distinct = np.empty(len(uniques), dtype=object)
        distinct[:] = _hll_values(pd.Series(uniques))  # each distinct value converted once
        codes, value_codes = _pairs(grouping.codes[mask], value_codes, len(uniques))
        items = distinct[value_codes].tolist()
        bounds = grouping.split(codes).tolist()
        new = self._new
        out = np.empty(grouping.ngroups, dtype=object)
        for g, (start, end) in enumerate(zip(bounds, bounds[1:])):
            sketch = new()
            deque(map(sketch.update, items[start:end]), maxlen=0)  # no bulk update in datasketches
            out[g] = HllPartial(sketch)
        return out

    def merge(self, a: HllPartial, b: HllPartial) -> HllPartial:
        if b.sketch.is_empty():
            return a
        if a.sketch.is_empty():
            return b
        # A new union per merge: as fast as resetting a kept one (measured), and a kept one
        # outlives nanobind at interpreter exit, which then reports it as leaked.
        union = self._ds.hll_union(self.lg_k)
        union.update(a.sketch)
        union.update(b.sketch)
        return HllPartial(union.get_result(self._tgt))

    def merge_many(self, partials: Iterable[HllPartial]) -> HllPartial:
        union = self._ds.hll_union(self.lg_k)
        for p in partials:
            union.update(p.sketch)
        return HllPartial(union.get_result(self._tgt))

    def result(self, p: HllPartial) -> int:
        return int(round(p.estimate()))

    def empty(self) -> HllPartial:
        return HllPartial(self._new())

    def output_type(self, input_type: Any = None) -> str:
        return "int64"

    def _params(self) -> tuple:
        return (self.column, self.lg_k, self.tgt_type)

    def _options(self) -> dict[str, Any]:
        return {"lg_k": self.lg_k, "tgt_type": self.tgt_type}


# ------------------------------------------------------------------ several outputs


Accumulator = dict  # dict[out_col, partial]


class Aggregations(Mapping[str, Aggregation]):
    """``{output_column: aggregation}``: partials, merges and results of all outputs at once.

    An accumulator (what an ``aggregate`` operator keeps per key) is a
    ``dict[output_column, partial]``; a *partials frame* has one row per key
    (the group keys as index, as in :meth:`Aggregation.partials`) and one
    column of partials per output.
    """

    def __init__(self, aggs: Mapping[str, Aggregation] | Iterable[tuple[str, Aggregation]]) -> None:
        items = list(aggs.items() if isinstance(aggs, Mapping) else aggs)
        if not items:
            raise ValueError("Aggregations: at least one output is needed")
        self._aggs: dict[str, Aggregation] = {}
        for name, agg in items:
            if not isinstance(name, str):
                raise TypeError(f"Aggregations: output names must be str, got {name!r}")
            if not isinstance(agg, Aggregation):
                raise TypeError(f"Aggregations: {name!r} must be an Aggregation, got {agg!r}")
            if name in self._aggs:
                raise ValueError(f"Aggregations: duplicate output {name!r}")
            self._aggs[name] = agg

    # Mapping
    def __getitem__(self, name: str) -> Aggregation:
        return self._aggs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._aggs)

    def __len__(self) -> int:
        return len(self._aggs)

    def __repr__(self) -> str:
        return f"Aggregations({self._aggs!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Aggregations):
            return list(self._aggs.items()) == list(other._aggs.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def input_columns(self) -> list[str]:
        """The input columns needed, without repeats, in order."""
        return list(dict.fromkeys(c for agg in self._aggs.values() for c in agg.input_columns))

    # partials
    def partials(self, df: pd.DataFrame, by: str | Sequence[str]) -> pd.DataFrame:
        """The partials frame of ``df``: one row per group of ``by`` (first-appearance order)."""
        by = _as_by(by)
        _check_columns(df, [*by, *self.input_columns], "aggregate")
        grouping = Grouping.of(df, by)
        data = {name: agg._series(df, grouping) for name, agg in self._aggs.items()}
        return pd.DataFrame(data, index=grouping.index)

    def partial(self, df: pd.DataFrame) -> Accumulator:
        _check_columns(df, self.input_columns, "aggregate")
        return {name: agg.partial(df) for name, agg in self._aggs.items()}

    def empty(self) -> Accumulator:
        return {name: agg.empty() for name, agg in self._aggs.items()}

    # merging
    def merge(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> Accumulator:
        """Merge two accumulators (``a`` earlier); an output missing from one counts as empty."""
        if len(a) == len(b) == len(self._aggs):
            try:  # the common case: both complete
                return {name: agg.merge(a[name], b[name]) for name, agg in self._aggs.items()}
            except KeyError:
                pass  # an output of neither, or a stray name: the general path
        out = {}
        for name, agg in self._aggs.items():
            if name not in a:
                out[name] = b[name] if name in b else agg.empty()
            elif name not in b:
                out[name] = a[name]
            else:
                out[name] = agg.merge(a[name], b[name])
        return out

    def merge_many(self, accumulators: Iterable[Mapping[str, Any]]) -> Accumulator:
        accs = list(accumulators)
        return {name: agg.merge_many(acc[name] for acc in accs if name in acc) for name, agg in self._aggs.items()}

    def rows(self, frame: pd.DataFrame) -> Iterator[tuple[Hashable, Accumulator]]:
        """``(label, accumulator)`` for each row of a partials frame (label: scalar or tuple)."""
        names = list(self._aggs)
        columns = [frame[name].tolist() for name in names]
        for label, *partials in zip(frame.index.tolist(), *columns):
            yield label, dict(zip(names, partials))

    def merge_frames(self, earlier: pd.DataFrame, later: pd.DataFrame) -> pd.DataFrame:
        """Merge two partials frames key by key (keys in order of first appearance)."""
        merged: dict[Hashable, Accumulator] = {}
        for frame in (earlier, later):
            for label, acc in self.rows(frame):
                prev = merged.get(label)
                merged[label] = acc if prev is None else self.merge(prev, acc)
        index = earlier.index.append(later.index).unique()
        labels = index.tolist()
        data = {
            name: pd.Series(
                _object_array((merged[label][name] for label in labels), len(labels)),
                index=index,
                dtype=agg.partial_dtype,
            )
            for name, agg in self._aggs.items()
        }
        return pd.DataFrame(data, index=index)

    def merge_into(
        self,
        accumulators: MutableMapping[Hashable, Accumulator],
        frame: pd.DataFrame,
        key: Callable[[Any], Hashable] = normalize_key,
    ) -> list[Hashable]:
        """Merge each row of a partials frame into ``accumulators[key(label)]`` (created if absent).

        The frame's partials are the later ones. Accumulators are replaced,
        never mutated. Returns the keys updated, in frame order. With the
        default ``key`` the dict is keyed by :func:`state.keys.normalize_key`.
        """
        updated = []
        for label, acc in self.rows(frame):
            k = key(label)
            prev = accumulators.get(k)
            accumulators[k] = acc if prev is None else self.merge(prev, acc)
            updated.append(k)
        return updated

    # results
    def result(self, acc: Mapping[str, Any]) -> dict[str, Any]:
        """The final values of an accumulator (a missing output counts as empty)."""
        return {name: agg.result(acc[name] if name in acc else agg.empty()) for name, agg in self._aggs.items()}

    def results(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The results of a partials frame, same index, one column per output."""
        data = {}
        for name, agg in self._aggs.items():
            values = frame[name].tolist()
            data[name] = pd.Series(
                _object_array((agg.result(p) for p in values), len(values)), index=frame.index, dtype=object
            )
        return pd.DataFrame(data, index=frame.index)

    def results_frame(
        self,
        accumulators: Mapping[Hashable, Mapping[str, Any]],
        key_names: Sequence[str],
        keys: Iterable[Hashable] | None = None,
        key_columns: Callable[[Hashable], tuple] = denormalize_key,
    ) -> pd.DataFrame:
        """One row per key: the key columns (``key_names``), then one column per output.

        ``keys`` (default: all, in the mapping's order) selects the rows;
        ``key_columns`` turns a stored key into its column values (default
        :func:`state.keys.denormalize_key`).
        """
        key_names = list(key_names)
        keys = list(accumulators if keys is None else keys)
        data: dict[str, Any] = {}
        if len(key_names) == 1 and key_columns is denormalize_key and all(type(k) is not tuple for k in keys):
            data[key_names[0]] = keys  # one key column of plain scalars (the common case): no per-key tuples
        else:
            key_rows = [key_columns(k) for k in keys]
            for k, row in zip(keys, key_rows):
                if len(row) != len(key_names):
                    raise ValueError(f"key {k!r} has {len(row)} columns but key_names is {key_names!r}")
            for i, name in enumerate(key_names):
                data[name] = [row[i] for row in key_rows]
        accs = [accumulators[k] for k in keys]
        for name, agg in self._aggs.items():
            if name in data:
                raise ValueError(f"output {name!r} is also a key column")
            result = agg.result
            try:
                values = [result(acc[name]) for acc in accs]
            except KeyError:  # an accumulator lacks this output: it counts as empty
                empty = agg.empty()
                values = [result(acc[name] if name in acc else empty) for acc in accs]
            column = np.empty(len(values), dtype=object)
            column[:] = values
            data[name] = column
        return pd.DataFrame(data, columns=[*key_names, *self._aggs])

    def output_types(self, input_types: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Arrow type name of each output, given the input columns' types (e.g. ``df.dtypes``)."""
        input_types = {} if input_types is None else input_types
        return {
            name: agg.output_type(input_types.get(agg.column) if agg.column is not None else None)
            for name, agg in self._aggs.items()
        }


def combine_frame(
    df: pd.DataFrame, by: str | Sequence[str], aggs: Mapping[str, Aggregation] | Aggregations
) -> pd.DataFrame:
    """All partials of all groups at once: ``Aggregations(aggs).partials(df, by)``."""
    if not isinstance(aggs, Aggregations):
        aggs = Aggregations(aggs)
    return aggs.partials(df, by)
