"""Sketches: :class:`ApproxDistinct`, a HyperLogLog count of distinct values.

The sketch is ``datasketches``' ``hll_sketch`` (so a stored partial can be
read as a datasketches sketch), wrapped in :class:`HllPartial` to pickle as
its compact serialization; values are converted to what the sketch is fed
(ints, non-integral floats, strings) vectorized where the column is typed.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from pandas.api import types as pdt

from .base import Aggregation
from .engine import Grouping, _not_null, _pairs


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


# Every stored accumulator with a sketch names this function, and did so as
# buffering.aggregations._hll_partial before the module became a package: pickled
# under that name (the package re-exports it), state written here stays
# byte-identical to, and readable by, code from before the split.
_hll_partial.__module__ = "buffering.aggregations"


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


def _integral(x: np.ndarray) -> np.ndarray:
    """Which floats the sketch is fed as ints: whole and within int64 (so ``3.0`` and ``3`` are one value)."""
    return np.isfinite(x) & (np.trunc(x) == x) & (np.abs(x) < 9.2e18)


def _hll_words(values: pd.Series) -> np.ndarray | None:
    """The non-null ``values`` as the 64-bit data DataSketches hashes, or None for strings and objects.

    The same values as :func:`_hll_values` feeds the sketch, as int64 words:
    ints, bools, unsigned ints (their bits), integral floats (as ints), other
    floats (a double's bits: the sketch hashes a double's 8 bytes), datetimes
    and timedeltas (int64 nanoseconds).
    """
    dtype = values.dtype
    if pdt.is_bool_dtype(dtype) or pdt.is_signed_integer_dtype(dtype):
        return values.to_numpy(dtype=np.int64)
    if pdt.is_unsigned_integer_dtype(dtype):
        return values.to_numpy(dtype=np.uint64).view(np.int64)
    if pdt.is_float_dtype(dtype):
        x = values.to_numpy(dtype=np.float64)
        integral = _integral(x)
        words = x.view(np.int64).copy()
        words[integral] = x[integral].astype(np.int64)
        return words
    if isinstance(dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
        dtype = values.dtype
    if pdt.is_datetime64_dtype(dtype):
        return values.astype("datetime64[ns]").to_numpy().view(np.int64)
    if pdt.is_timedelta64_dtype(dtype):
        return values.astype("timedelta64[ns]").to_numpy().view(np.int64)
    return None


def _hll_values(values: pd.Series) -> list:
    """Non-null values as ints / non-integral floats / strings (vectorized for typed columns).

    Integral floats become ints, so ``3`` and ``3.0`` are one value whether a
    chunk's column came as int64 or (because of a null) as float64; datetimes
    and timedeltas become int64 nanoseconds (the words of :func:`_hll_words`).
    """
    if pdt.is_float_dtype(values.dtype):
        x = values.to_numpy(dtype=np.float64)
        integral = _integral(x)
        if integral.all():
            return x.astype(np.int64).tolist()
        out = x.astype(object)
        out[integral] = x[integral].astype(np.int64).astype(object)
        return out.tolist()
    words = _hll_words(values)
    if words is not None:
        return words.tolist()
    items = values.astype(object).tolist()
    if pd.api.types.infer_dtype(items, skipna=False) != "string":
        items = [_hll_scalar(v) for v in items]
    if "" in items:  # datasketches ignores empty strings; NaN (never fed otherwise: nulls are dropped) stands in
        items = [_EMPTY_STRING if v == "" else v for v in items]
    return items


# MurmurHash3_x64_128 of one 8-byte block, as DataSketches hashes a 64-bit datum (seed 9001).
_SEED = np.uint64(9001)
_EIGHT = np.uint64(8)
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S31, _S32, _S33 = np.uint64(31), np.uint64(32), np.uint64(33)
_ADDRESS_26 = np.uint64((1 << 26) - 1)
_LOW_32 = np.uint64(0xFFFFFFFF)


def _fmix64(k: np.ndarray) -> np.ndarray:
    k ^= k >> _S33
    k *= _F1
    k ^= k >> _S33
    k *= _F2
    k ^= k >> _S33
    return k


def _bit_length_32(x: np.ndarray) -> np.ndarray:
    """Bit length of values below 2**32 (exact: such a value is exact in a double)."""
    return np.frexp(x.astype(np.float64))[1]


def hll_coupons(words: np.ndarray) -> np.ndarray:
    """The HyperLogLog coupons DataSketches makes of 64-bit data: what ``hll_sketch.update`` adds for each.

    ``words``: int64 values (or a double's bits, see :func:`_hll_words`).
    A coupon is DataSketches' ``HllUtil::coupon`` of the datum's
    MurmurHash3_x64_128 ``(h1, h2)`` (its 8 little-endian bytes, seed 9001):
    ``(min(leading zeros of h2, 62) + 1) << 26 | (h1 & (2**26 - 1))``. A
    sketch in LIST or SET mode holds exactly the distinct coupons of its
    values; in HLL mode register ``coupon & (2**lg_k - 1)`` holds the largest
    ``coupon >> 26``. O(n) numpy work (tens of ns a value), checked against
    the library value by value in the tests.
    """
    k1 = np.ascontiguousarray(words, dtype=np.int64).view(np.uint64) * _C1
    k1 = (k1 << _S31) | (k1 >> _S33)
    k1 *= _C2
    h1 = k1 ^ (_SEED ^ _EIGHT)  # h1 = seed; h1 ^= k1 (the tail block); h1 ^= len
    h2 = np.full_like(h1, _SEED ^ _EIGHT)
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    high = h2 >> _S32
    bits = np.where(high > 0, 32 + _bit_length_32(high), _bit_length_32(h2 & _LOW_32))
    value = np.minimum(64 - bits, 62) + 1
    return (value.astype(np.uint32) << np.uint32(26)) | (h1 & _ADDRESS_26).astype(np.uint32)


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

    def coupons(self, df: pd.DataFrame, grouping: Grouping) -> tuple[np.ndarray, np.ndarray] | None:
        """Each non-null row's group and DataSketches coupon (:func:`hll_coupons`), or None for a column of
        strings or objects (hashed by the library, one value at a time). O(rows) numpy work."""
        values = self._input(df)
        mask = _not_null(values)
        words = _hll_words(values[mask] if not mask.all() else values)
        if words is None:
            return None
        return grouping.codes[mask], hll_coupons(words)

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
