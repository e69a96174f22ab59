"""The group-reduction engine: a frame's groups and numpy reductions per group.

:class:`Grouping` numbers the groups of a frame by its key columns (in order
of first appearance) once, and every aggregation of that frame reduces over
it: sums, minima, maxima, first and last values with ``ufunc.at``, on the
values themselves or on the ranks of distinct values. The column checks that
every entry point runs first (:class:`ColumnNotFoundError`) live here too, as
does the rest of the vectorized toolkit the aggregations share (distinct
``(group, value)`` pairs, ranks, null masks, object arrays).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
from pandas.api import types as pdt


# ------------------------------------------------------------------ column checks


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
