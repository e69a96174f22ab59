"""Accumulators as columns: merge, encode and decode many keys' state at once.

An ``aggregate()`` operator keeps one accumulator per key. Held as Python
objects (a dict per key, a ``datasketches`` sketch per key), every merge,
pickle and estimate is Python work per key. A :class:`ColumnarLayout` keeps
the same accumulators as columns for all keys of a flush at once:

* ``Count``: an int64 array; merging is one numpy add.
* ``ApproxDistinct``: HyperLogLog state in DataSketches' own terms. A key
  with few distinct values holds *coupons* (32-bit: a 26-bit hash address and
  a 6-bit register value, as a sketch in LIST/SET mode); past DataSketches'
  own limit (``0.75 * 2**(lg_k - 3)`` coupons, 7 below ``lg_k`` 8) it holds
  ``2**lg_k`` 8-bit registers (HLL mode). Merging is a union of coupon sets
  (one sort over all keys) and an elementwise register max; a coupon sets
  register ``address & (k - 1)`` to its value. The estimate of a coupon set
  is its size (what DataSketches' estimate rounds to in those modes, checked
  for every lg_k); a register array's estimate is DataSketches' own, read
  from the sketch image.

Each key's accumulator is stored as one ``bytes`` value that is a valid
pickle of a :class:`PackedAccumulator` (a read-only ``Mapping`` of output
name to partial, the same partials as the object path: an int, an
:class:`HllPartial`), so ``read_state``, ``inspect`` and ``export`` show
accumulators as before, while the operator encodes and decodes the values of
a whole flush with numpy, never calling pickle. The payload names its fields,
so a value read without the operator still decodes.

Sketches stay DataSketches sketches: :meth:`PackedAccumulator.__getitem__`
and the SQL path read and write the library's serialization (LIST, SET and
HLL_8 images), so a user can take an accumulator's ``HllPartial.sketch`` and
union it with any other DataSketches HLL sketch.

Complexity of a flush of n keys with c coupons and d register arrays in
total: O(n + c log c + d * 2**lg_k) numpy work; Python work per key is one
slice of the encoded buffer (building the value) and the estimate of each
register array (a DataSketches call, only for keys past the coupon limit).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

from state.blocks import concatenated_ranges

from .basic import Count, First, Last, Max, Mean, Min, Sum
from .engine import Grouping
from .sketches import ApproxDistinct, HllPartial, _datasketches

if TYPE_CHECKING:
    from state.blocks import KeyGroupCache

_FORMAT = 1
#: A coupon set this small has DataSketches' estimate == its size exactly (checked for lg_k 4..21).
_EXACT_COUPONS = 384
#: Bytes before the registers of a DataSketches HLL_8 image in HLL mode.
_HLL_8_HEADER = 40


def coupon_limit(lg_k: int) -> int:
    """Most coupons a DataSketches HLL sketch of ``lg_k`` holds before it turns into registers."""
    return 7 if lg_k < 8 else 3 << (lg_k - 5)


# ---------------------------------------------------------------- the pickle image around a payload
def _unpack(payload: bytes) -> "PackedAccumulator":
    """Unpickle a packed accumulator (what the stored values call)."""
    return PackedAccumulator(_IMAGE_HEAD + struct.pack("<I", len(payload)) + payload + _IMAGE_TAIL)


_module = _unpack.__module__.encode()
_name = _unpack.__name__.encode()
#: PROTO 5, STACK_GLOBAL(module, name), BINBYTES <u32 length> ... then TUPLE1, REDUCE, STOP.
_IMAGE_HEAD = (
    b"\x80\x05" + b"\x8c" + bytes([len(_module)]) + _module + b"\x8c" + bytes([len(_name)]) + _name + b"\x93" + b"B"
)
_IMAGE_TAIL = b"\x85R."
_HEAD = len(_IMAGE_HEAD) + 4  # where the payload starts


class PackedAccumulator(bytes):
    """An ``aggregate()`` accumulator of a key, as stored: a read-only mapping ``{output: partial}``.

    The bytes are a pickle image (``pickle.loads`` of them gives this object
    again). ``acc["views"]`` decodes one partial: an int for ``Count``, an
    :class:`HllPartial` (a DataSketches sketch) for ``ApproxDistinct``;
    ``dict(acc)`` gives the dict the object path keeps.
    """

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (_unpack, (self.payload,))

    @property
    def payload(self) -> bytes:
        return bytes(self[_HEAD:-len(_IMAGE_TAIL)])

    @property
    def layout(self) -> "ColumnarLayout":
        return ColumnarLayout.from_header(self.payload)

    def as_dict(self) -> dict[str, Any]:
        layout = self.layout
        block = layout.decode([self])
        return {name: field.partial(column, 0) for name, field, column in zip(layout.names, layout.fields, block)}

    def __getitem__(self, name: Any) -> Any:  # type: ignore[override]
        if not isinstance(name, str):
            return bytes.__getitem__(self, name)
        return self.as_dict()[name]

    def keys(self) -> list[str]:
        return list(self.layout.names)

    def items(self) -> list[tuple[str, Any]]:
        return list(self.as_dict().items())

    def values(self) -> list[Any]:
        return list(self.as_dict().values())

    def __contains__(self, name: object) -> bool:  # type: ignore[override]
        if isinstance(name, str):
            return name in self.layout.names
        return bytes.__contains__(self, name)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):  # the same partials as a dict of the object path
            return self.as_dict() == dict(other)
        return bytes.__eq__(self, other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = bytes.__hash__

    def __repr__(self) -> str:
        return f"PackedAccumulator({self.as_dict()!r})"  # decoded only here, when shown

    # bytes' own __str__ is its repr of the bytes, not this class's __repr__: print(acc), str(acc)
    # and f"{acc}" would show the pickle image.
    __str__ = __repr__


# ---------------------------------------------------------------- vectorized byte helpers
def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by a sort (numpy's hash-based unique of int64 measured 10x slower here).

    The sort is numpy's stable one (timsort for int64), which merges runs
    already in order in linear time: a state's coupons come back sorted and
    only the batch's new ones are not (850k keys, 700k of them in order:
    10-12 ms against quicksort's 43; all random: 52 against 44).
    """
    if len(values) < 2:
        return values
    values = np.sort(values, kind="stable")
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _read(data: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return np.ascontiguousarray(data[pos[:, None] + np.arange(width)]).view(dtype).ravel()


def _fill(buf: np.ndarray, pos: np.ndarray, constant: np.ndarray) -> None:
    """Write the bytes ``constant`` at each of ``pos`` (uint8 ``buf``).

    Whole 8-byte words of it are written through a uint64 view of ``buf`` per
    residue of the positions mod 8, the rest a byte at a time: for 15,500 rows
    of the ~70 constant bytes of an encoded accumulator, a fraction of one
    scatter per byte (which was 38 % of :meth:`ColumnarLayout.encode_buffer`).
    Under 64 rows, that one scatter."""
    if len(pos) < 64:  # a few rows: one scatter through a (rows, bytes) index costs less than a loop
        buf[pos[:, None] + np.arange(len(constant))] = constant
        return
    data = constant.tobytes()
    done = 0
    words = len(data) // 8
    if words:
        values = np.frombuffer(data, dtype="<u8", count=words).tolist()
        residue = pos % 8
        for r in range(8):
            at = pos[residue == r]
            if not len(at):
                continue
            view = buf[r : r + 8 * ((len(buf) - r) // 8)].view("<u8")
            base = (at - r) // 8
            for w, value in enumerate(values):
                view[base + w] = value
        done = 8 * words
    for offset in range(done, len(data)):
        buf[pos + offset] = data[offset]


def _write(buf: np.ndarray, pos: np.ndarray, values: np.ndarray, dtype: str) -> None:
    width = np.dtype(dtype).itemsize
    buf[pos[:, None] + np.arange(width)] = np.ascontiguousarray(values, dtype=dtype).view(np.uint8).reshape(-1, width)


# ---------------------------------------------------------------- fields
class CountField:
    """``Count``: an int64 per key."""

    kind = "count"
    fixed = 8

    def empty(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.int64)

    def decode(self, data: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _read(data, pos, "<i8"), pos + 8

    def sizes(self, column: np.ndarray) -> np.ndarray:
        return np.full(len(column), 8, dtype=np.int64)

    def encode(self, buf: np.ndarray, pos: np.ndarray, column: np.ndarray) -> np.ndarray:
        _write(buf, pos, column, "<i8")
        return pos + 8

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def results(self, column: np.ndarray) -> np.ndarray:
        return column

    def length(self, column: np.ndarray) -> int:
        return len(column)

    def spread(self, column: np.ndarray, where: np.ndarray, n: int) -> np.ndarray:
        """The column over ``n`` rows: row i of ``column`` at ``where[i]``, the others empty."""
        full = np.zeros(n, dtype=np.int64)
        full[where] = column
        return full

    def from_partials(self, partials: Sequence[Any]) -> np.ndarray:
        return np.fromiter(partials, dtype=np.int64, count=len(partials))

    def from_rows(self, agg: Count, df: Any, grouping: Grouping) -> np.ndarray:
        return np.asarray(agg._grouped(df, grouping), dtype=np.int64)

    def from_sql(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    def partial(self, column: np.ndarray, row: int) -> int:
        return int(column[row])


@dataclass
class HllColumn:
    """HyperLogLog state of ``n`` keys: coupons (owner row, coupon) and register arrays of some rows."""

    n: int
    rows: np.ndarray  # int64, the owner of each coupon
    coupons: np.ndarray  # uint32
    dense_rows: np.ndarray  # int64, sorted, unique
    registers: np.ndarray  # uint8, (len(dense_rows), 2**lg_k)


class HllField:
    """``ApproxDistinct``: coupons or registers per key, as DataSketches keeps them."""

    kind = "hll"

    def __init__(self, lg_k: int, tgt_type: str = "HLL_8") -> None:
        self.lg_k = int(lg_k)
        self.k = 1 << self.lg_k
        self.limit = coupon_limit(self.lg_k)
        self.tgt_type = tgt_type

    # -- layout: u8 lg_k, u8 mode (0 coupons, 1 registers), u32 count, then the coupons or registers
    def empty(self, n: int) -> HllColumn:
        return HllColumn(n, np.empty(0, np.int64), np.empty(0, np.uint32), np.empty(0, np.int64),
                         np.empty((0, self.k), np.uint8))

    def decode(self, data: np.ndarray, pos: np.ndarray) -> tuple[HllColumn, np.ndarray]:
        n = len(pos)
        lg_k = data[pos]
        if len(lg_k) and (lg_k != self.lg_k).any():
            bad = int(lg_k[lg_k != self.lg_k][0])
            raise ValueError(f"a stored ApproxDistinct state has lg_k {bad}, the aggregation's is {self.lg_k}")
        mode = data[pos + 1]
        count = _read(data, pos + 2, "<u4").astype(np.int64)
        start = pos + 6
        sparse = mode == 0
        lengths = np.where(sparse, count * 4, self.k)
        owners = np.repeat(np.arange(n, dtype=np.int64)[sparse], count[sparse])
        coupon_bytes = data[concatenated_ranges(start[sparse], count[sparse] * 4)]
        coupons = np.ascontiguousarray(coupon_bytes).view("<u4").astype(np.uint32)
        dense_rows = np.flatnonzero(~sparse).astype(np.int64)
        registers = data[start[dense_rows][:, None] + np.arange(self.k)] if len(dense_rows) else (
            np.empty((0, self.k), np.uint8))
        return HllColumn(n, owners, coupons, dense_rows, registers), start + lengths

    def sizes(self, column: HllColumn) -> np.ndarray:
        sizes = np.full(column.n, 6, dtype=np.int64)
        sizes += 4 * np.bincount(column.rows, minlength=column.n)
        sizes[column.dense_rows] += self.k
        return sizes

    def encode(self, buf: np.ndarray, pos: np.ndarray, column: HllColumn) -> np.ndarray:
        n = column.n
        counts = np.bincount(column.rows, minlength=n)
        mode = np.zeros(n, dtype=np.uint8)
        mode[column.dense_rows] = 1
        counts[column.dense_rows] = self.k
        buf[pos] = self.lg_k
        buf[pos + 1] = mode
        _write(buf, pos + 2, counts, "<u4")
        start = pos + 6
        order = np.argsort(column.rows, kind="stable")  # coupons grouped by owner, in row order
        sparse_counts = counts.copy()
        sparse_counts[column.dense_rows] = 0
        byte_pos = concatenated_ranges(start, sparse_counts * 4)
        buf[byte_pos] = column.coupons[order].astype("<u4").view(np.uint8)
        if len(column.dense_rows):
            buf[start[column.dense_rows][:, None] + np.arange(self.k)] = column.registers
        return start + np.where(mode == 1, self.k, sparse_counts * 4)

    def merge(self, a: HllColumn, b: HllColumn) -> HllColumn:
        n = a.n
        k = self.k
        keys = _sorted_unique(np.concatenate([
            (a.rows << 32) | a.coupons.astype(np.int64),
            (b.rows << 32) | b.coupons.astype(np.int64),
        ]))
        rows = keys >> 32
        coupons = (keys & 0xFFFFFFFF).astype(np.uint32)
        counts = np.bincount(rows, minlength=n)
        dense_rows = np.union1d(np.union1d(a.dense_rows, b.dense_rows), np.flatnonzero(counts > self.limit))
        if not len(dense_rows):
            return HllColumn(n, rows, coupons, dense_rows, np.empty((0, k), np.uint8))
        registers = np.zeros((len(dense_rows), k), dtype=np.uint8)
        if len(a.dense_rows):
            registers[np.searchsorted(dense_rows, a.dense_rows)] = a.registers
        if len(b.dense_rows):
            at = np.searchsorted(dense_rows, b.dense_rows)
            registers[at] = np.maximum(registers[at], b.registers)
        to_dense = np.isin(rows, dense_rows)
        if to_dense.any():
            owners = np.searchsorted(dense_rows, rows[to_dense])
            promoted = coupons[to_dense]
            flat = registers.reshape(-1)
            np.maximum.at(flat, owners * k + (promoted & (k - 1)).astype(np.int64), (promoted >> 26).astype(np.uint8))
        keep = ~to_dense
        return HllColumn(n, rows[keep], coupons[keep], dense_rows, registers)

    def results(self, column: HllColumn) -> np.ndarray:
        counts = np.bincount(column.rows, minlength=column.n).astype(np.int64)
        out = counts.copy()
        big = np.flatnonzero(counts > _EXACT_COUPONS)
        if len(big):
            order = np.argsort(column.rows, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(counts)])
            coupons = column.coupons[order]
            deserialize = _datasketches().hll_sketch.deserialize
            for row in big.tolist():
                image = self.coupon_image(coupons[bounds[row]:bounds[row + 1]])
                out[row] = int(round(deserialize(image).get_estimate()))
        if len(column.dense_rows):
            deserialize = _datasketches().hll_sketch.deserialize
            for row, registers in zip(column.dense_rows.tolist(), column.registers):
                out[row] = int(round(deserialize(self.register_image(registers)).get_estimate()))
        return out

    def length(self, column: HllColumn) -> int:
        return column.n

    def spread(self, column: HllColumn, where: np.ndarray, n: int) -> HllColumn:
        return HllColumn(n, where[column.rows], column.coupons, where[column.dense_rows], column.registers)

    # -- DataSketches images
    def _mode_byte(self, mode: int) -> int:
        return mode | ({"HLL_4": 0, "HLL_6": 1, "HLL_8": 2}[self.tgt_type] << 2)

    def coupon_image(self, coupons: np.ndarray) -> bytes:
        """A compact LIST or SET sketch image holding ``coupons``."""
        coupons = np.asarray(coupons, dtype="<u4")
        n = len(coupons)
        if n < 8 or self.lg_k < 8:
            head = bytes([2, 1, 7, self.lg_k, 3, 8 | (4 if n == 0 else 0), n, self._mode_byte(0)])
            return head + coupons.tobytes()
        lg_arr = 5
        while n > 0.75 * (1 << lg_arr):
            lg_arr += 1
        head = bytes([3, 1, 7, self.lg_k, lg_arr, 8, 0, self._mode_byte(1)]) + struct.pack("<i", n)
        return head + coupons.tobytes()

    def register_image(self, registers: np.ndarray) -> bytes:
        """An HLL_8 sketch image of ``registers``, marked out of order (the union's estimator applies)."""
        registers = np.asarray(registers, dtype=np.uint8)
        cur_min = int(registers.min())
        at_min = int((registers == cur_min).sum())
        inverse = np.ldexp(1.0, -registers.astype(np.int64))
        low = registers < 32
        head = struct.pack(
            "<BBBBBBBBdddii", 10, 1, 7, self.lg_k, 0, 16, cur_min, 2 | (2 << 2), 0.0,
            float(inverse[low].sum()), float(inverse[~low].sum()), at_min, 0,
        )
        return head + registers.tobytes()

    def from_sketch_bytes(self, blobs: Sequence[Any]) -> HllColumn:
        """Serialized DataSketches HLL sketches (LIST/SET: parsed with numpy; HLL mode: through the library)."""
        n = len(blobs)
        lengths = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=n)
        data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if n and (lengths < 8).any():
            bad = int(np.flatnonzero(lengths < 8)[0])
            raise ValueError(f"ApproxDistinct: row {bad} holds {int(lengths[bad])} bytes, not a DataSketches HLL sketch")
        pre_ints = data[starts] if n else np.empty(0, np.uint8)
        family = data[starts + 2] if n else np.empty(0, np.uint8)
        lg_k = data[starts + 3] if n else np.empty(0, np.uint8)
        if n and ((family != 7) | (lg_k != self.lg_k)).any():
            bad = int(np.flatnonzero((family != 7) | (lg_k != self.lg_k))[0])
            raise ValueError(
                f"ApproxDistinct(lg_k={self.lg_k}): row {bad} is not an HLL sketch of lg_k {self.lg_k} "
                f"(family {int(family[bad])}, lg_k {int(lg_k[bad])})")
        mode = (data[starts + 7] & 3) if n else np.empty(0, np.uint8)
        coupon_mode = mode < 2
        body = np.where(pre_ints == 2, 8, 12)
        words = np.where(coupon_mode, (lengths - body) // 4, 0)
        owners = np.repeat(np.arange(n, dtype=np.int64), words)
        positions = concatenated_ranges(starts + body, words * 4)
        coupons = np.ascontiguousarray(data[positions]).view("<u4").astype(np.uint32)
        filled = coupons != 0  # an updatable image's hash table has empty (zero) slots
        owners, coupons = owners[filled], coupons[filled]
        dense_rows = np.flatnonzero(~coupon_mode).astype(np.int64)
        registers = np.empty((len(dense_rows), self.k), dtype=np.uint8)
        # An HLL_8 image in HLL mode (what Spark's hll_sketch_agg sends) holds the registers themselves
        # after its 40-byte header; HLL_4 and HLL_6 images pack them (with exceptions): DataSketches
        # unpacks those, one sketch at a time.
        hll_8 = (data[starts[dense_rows] + 7] >> 2) & 3 == 2 if len(dense_rows) else np.empty(0, bool)
        hll_8 &= lengths[dense_rows] >= _HLL_8_HEADER + self.k
        if hll_8.any():
            at = starts[dense_rows[hll_8]] + _HLL_8_HEADER
            registers[hll_8] = data[at[:, None] + np.arange(self.k)]
        if not hll_8.all():
            ds = _datasketches()
            for i, row in zip(np.flatnonzero(~hll_8).tolist(), dense_rows[~hll_8].tolist()):
                union = ds.hll_union(self.lg_k)
                union.update(ds.hll_sketch.deserialize(bytes(blobs[row])))
                image = union.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable()
                registers[i] = np.frombuffer(image, dtype=np.uint8, count=self.k, offset=_HLL_8_HEADER)
        # A sketch's coupons are distinct and within DataSketches' limit: nothing to merge or promote.
        return HllColumn(n, owners, coupons, dense_rows, registers)

    def from_partials(self, partials: Sequence[Any]) -> HllColumn:
        return self.from_sketch_bytes([p.sketch.serialize_compact() for p in partials])

    def from_rows(self, agg: ApproxDistinct, df: Any, grouping: Grouping) -> HllColumn:
        """The sketches of the groups' raw values: for typed columns the coupons DataSketches would add
        (:func:`~.sketches.hll_coupons`), de-duplicated and past the limit folded into registers by one
        :meth:`merge`, with no sketch object per group; strings and objects through the library."""
        pairs = agg.coupons(df, grouping)
        if pairs is None:
            return self.from_partials(agg._grouped(df, grouping))
        rows, coupons = pairs
        n = grouping.ngroups
        raw = HllColumn(n, rows.astype(np.int64), coupons, np.empty(0, np.int64), np.empty((0, self.k), np.uint8))
        return self.merge(self.empty(n), raw)

    def from_sql(self, values: np.ndarray) -> HllColumn:
        return self.from_sketch_bytes([v if type(v) is bytes else bytes(v) for v in values])

    def partial(self, column: HllColumn, row: int) -> HllPartial:
        deserialize = _datasketches().hll_sketch.deserialize
        at = np.searchsorted(column.dense_rows, row)
        if at < len(column.dense_rows) and column.dense_rows[at] == row:
            return HllPartial(deserialize(self.register_image(column.registers[at])))
        return HllPartial(deserialize(self.coupon_image(np.sort(column.coupons[column.rows == row]))))



# ---------------------------------------------------------------- Sum, Min, Max, First, Last, Mean
_NULL, _INT, _FLOAT, _OBJECT = 0, 1, 2, 3
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass
class ScalarColumn:
    """One value (or None) per key: int64 and float64 values in numpy, anything else as Python objects."""

    tags: np.ndarray  # uint8: _NULL, _INT, _FLOAT or _OBJECT
    bits: np.ndarray  # int64: the int, or the float's bits
    objects: dict  # row -> value, for _OBJECT rows

    def __len__(self) -> int:
        return len(self.tags)

    def value(self, row: int) -> Any:
        tag = self.tags[row]
        if tag == _INT:
            return int(self.bits[row])
        if tag == _FLOAT:
            return float(self.bits[row:row + 1].view(np.float64)[0])
        return self.objects[row] if tag == _OBJECT else None


#: A partial's tag by its exact type (any other type, bool included, is not one of these three).
_TAG_OF_TYPE = {type(None): _NULL, int: _INT, float: _FLOAT}


def _scalar_column_of_array(values: Any) -> Optional[ScalarColumn]:
    """:func:`_scalar_column` of a numpy array of partials with each numpy scalar taken as its Python
    value, in O(n) C work; None when some value needs the loop (an int past int64, a bool, any object).

    A count's partials from the rows are an int array and a sum's an object
    array of ints (or floats) and None: these take no Python step per value.
    """
    if not isinstance(values, np.ndarray) or values.ndim != 1:
        return None
    kind, n = values.dtype.kind, len(values)
    if kind == "f":
        return ScalarColumn(np.full(n, _FLOAT, dtype=np.uint8), values.astype(np.float64).view(np.int64), {})
    if kind == "i" or (kind == "u" and (n == 0 or int(values.max()) <= _INT64[1])):
        return ScalarColumn(np.full(n, _INT, dtype=np.uint8), values.astype(np.int64), {})
    if kind != "O":
        return None
    tags = np.fromiter(map(_TAG_OF_TYPE.get, map(type, values), repeat(_OBJECT)), dtype=np.uint8, count=n)
    if (tags == _OBJECT).any():
        return None
    bits = np.zeros(n, dtype=np.int64)
    ints, floats = tags == _INT, tags == _FLOAT
    try:
        bits[ints] = values[ints].astype(np.int64)
    except OverflowError:  # an int past int64 is kept as an object
        return None
    bits.view(np.float64)[floats] = values[floats].astype(np.float64)
    return ScalarColumn(tags, bits, {})


def _scalar_column(values: Sequence[Any]) -> ScalarColumn:
    n = len(values)
    tags = np.zeros(n, dtype=np.uint8)
    bits = np.zeros(n, dtype=np.int64)
    floats = bits.view(np.float64)
    objects: dict[int, Any] = {}
    lo, hi = _INT64
    for i, v in enumerate(values):
        t = type(v)
        if v is None:
            continue
        if t is int and lo <= v <= hi:
            tags[i], bits[i] = _INT, v
        elif t is float:
            tags[i], floats[i] = _FLOAT, v
        else:
            tags[i] = _OBJECT
            objects[i] = v
    return ScalarColumn(tags, bits, objects)


class ScalarField:
    """``Sum``, ``Min``, ``Max``, ``First``, ``Last``: a value or None per key.

    Rows of int64s or of floats merge with numpy (a sum that would overflow
    int64, mixed ints and floats and other values merge in Python with the
    aggregation's own ``merge``, so results equal the object path's).
    """

    def __init__(self, agg: Any) -> None:
        self.agg = agg
        self.kind = type(agg).__name__.lower()

    def empty(self, n: int) -> ScalarColumn:
        return ScalarColumn(np.zeros(n, np.uint8), np.zeros(n, np.int64), {})

    # -- layout: u8 tag, then 8 bytes (int64 or float64) or u32 length + a pickle
    def decode(self, data: np.ndarray, pos: np.ndarray) -> tuple[ScalarColumn, np.ndarray]:
        tags = data[pos].copy()
        fixed = tags != _OBJECT
        bits = np.zeros(len(pos), dtype=np.int64)
        bits[fixed] = _read(data, pos[fixed] + 1, "<i8")
        objects: dict[int, Any] = {}
        ends = pos + 9
        for row in np.flatnonzero(~fixed).tolist():
            at = int(pos[row]) + 1
            size = int(_read(data, np.array([at]), "<u4")[0])
            objects[row] = pickle.loads(data[at + 4:at + 4 + size].tobytes())
            ends[row] = at + 4 + size
        return ScalarColumn(tags, bits, objects), ends

    def _pickles(self, column: ScalarColumn) -> dict[int, bytes]:
        return {row: pickle.dumps(v, 5) for row, v in column.objects.items()}

    def sizes(self, column: ScalarColumn) -> np.ndarray:
        sizes = np.full(len(column), 9, dtype=np.int64)
        for row, blob in self._pickles(column).items():
            sizes[row] = 5 + len(blob)
        return sizes

    def encode(self, buf: np.ndarray, pos: np.ndarray, column: ScalarColumn) -> np.ndarray:
        buf[pos] = column.tags
        fixed = column.tags != _OBJECT
        _write(buf, pos[fixed] + 1, column.bits[fixed], "<i8")
        ends = pos + 9
        for row, blob in self._pickles(column).items():
            at = int(pos[row]) + 1
            buf[at:at + 4] = np.frombuffer(struct.pack("<I", len(blob)), dtype=np.uint8)
            buf[at + 4:at + 4 + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            ends[row] = at + 4 + len(blob)
        return ends

    def merge(self, a: ScalarColumn, b: ScalarColumn) -> ScalarColumn:
        """``merge(a[i], b[i])`` per row (``a`` the earlier)."""
        kind = self.kind
        tags = np.where(a.tags == _NULL, b.tags, a.tags)
        bits = np.where(a.tags == _NULL, b.bits, a.bits)
        both = (a.tags != _NULL) & (b.tags != _NULL)
        same = both & (a.tags == b.tags) & (a.tags != _OBJECT)
        ints = same & (a.tags == _INT)
        floats = same & (a.tags == _FLOAT)
        python = both & ~same
        if kind == "last":
            tags = np.where(b.tags != _NULL, b.tags, a.tags)
            bits = np.where(b.tags != _NULL, b.bits, a.bits)
        elif kind in ("min", "max"):
            pick = np.minimum if kind == "min" else np.maximum
            bits[ints] = pick(a.bits[ints], b.bits[ints])
            fa, fb = a.bits.view(np.float64), b.bits.view(np.float64)
            bits[floats] = pick(fa[floats], fb[floats]).view(np.int64)
        elif kind == "sum":
            with np.errstate(over="ignore"):
                total = a.bits[ints] + b.bits[ints]
            x, y = a.bits[ints], b.bits[ints]
            overflow = ((x > 0) & (y > 0) & (total < 0)) | ((x < 0) & (y < 0) & (total >= 0))
            bits[ints] = total
            if overflow.any():
                python[np.flatnonzero(ints)[overflow]] = True
            fa, fb = a.bits.view(np.float64), b.bits.view(np.float64)
            bits[floats] = (fa[floats] + fb[floats]).view(np.int64)
        out = ScalarColumn(tags, bits, {})
        keep_a = a.tags == _OBJECT
        keep_b = b.tags == _OBJECT
        for row in np.flatnonzero((keep_a | keep_b) & ~python).tolist():  # one side only, or kept as is
            if kind == "last" and b.tags[row] != _NULL:
                source = b
            elif kind == "last" or a.tags[row] != _NULL:
                source = a
            else:
                source = b
            if source.tags[row] == _OBJECT:
                out.objects[row] = source.objects[row]
        merge = self.agg.merge
        lo, hi = _INT64
        for row in np.flatnonzero(python).tolist():
            value = merge(a.value(row), b.value(row))
            if type(value) is int and lo <= value <= hi:
                out.tags[row], out.bits[row] = _INT, value
            elif type(value) is float:
                out.tags[row] = _FLOAT
                out.bits[row:row + 1].view(np.float64)[0] = value
            else:
                out.tags[row] = _NULL if value is None else _OBJECT
                if value is not None:
                    out.objects[row] = value
        return out

    def results(self, column: ScalarColumn) -> np.ndarray:
        out = np.empty(len(column), dtype=object)
        ints = np.flatnonzero(column.tags == _INT)
        floats = np.flatnonzero(column.tags == _FLOAT)
        out[ints] = column.bits[ints].tolist()
        out[floats] = column.bits.view(np.float64)[floats].tolist()
        for row, value in column.objects.items():
            out[row] = value
        return out

    def from_partials(self, partials: Sequence[Any]) -> ScalarColumn:
        column = _scalar_column_of_array(partials)
        if column is None:
            column = _scalar_column([p.item() if isinstance(p, np.generic) else p for p in partials])
        return column

    def from_rows(self, agg: Any, df: Any, grouping: Grouping) -> ScalarColumn:
        return self.from_partials(agg._grouped(df, grouping))

    def from_sql(self, values: Any) -> ScalarColumn:
        """``(values, non-null counts)`` as the SQL combine gives them (ints, or strings for a pick)."""
        values, counts = values
        present = np.asarray(counts) > 0
        if isinstance(values, np.ndarray) and values.dtype == np.int64:
            return ScalarColumn(np.where(present, _INT, _NULL).astype(np.uint8), np.where(present, values, 0), {})
        return _scalar_column([v if p else None for v, p in zip(list(values), present.tolist())])

    def partial(self, column: ScalarColumn, row: int) -> Any:
        return column.value(row)

    def length(self, column: ScalarColumn) -> int:
        return len(column)

    def spread(self, column: ScalarColumn, where: np.ndarray, n: int) -> ScalarColumn:
        out = self.empty(n)
        out.tags[where] = column.tags
        out.bits[where] = column.bits
        out.objects.update({int(where[row]): value for row, value in column.objects.items()})
        return out


class MeanField:
    """``Mean``: a sum (as :class:`ScalarField` of a ``Sum``) and an int64 count per key."""

    kind = "mean"

    def __init__(self) -> None:
        self.sum = ScalarField(Sum("_"))
        self.count = CountField()

    def empty(self, n: int) -> tuple:
        return (self.sum.empty(n), self.count.empty(n))

    def decode(self, data: np.ndarray, pos: np.ndarray) -> tuple[tuple, np.ndarray]:
        total, pos = self.sum.decode(data, pos)
        count, pos = self.count.decode(data, pos)
        return (total, count), pos

    def sizes(self, column: tuple) -> np.ndarray:
        return self.sum.sizes(column[0]) + 8

    def encode(self, buf: np.ndarray, pos: np.ndarray, column: tuple) -> np.ndarray:
        return self.count.encode(buf, self.sum.encode(buf, pos, column[0]), column[1])

    def merge(self, a: tuple, b: tuple) -> tuple:
        return (self.sum.merge(a[0], b[0]), a[1] + b[1])

    def results(self, column: tuple) -> np.ndarray:
        totals, counts = self.sum.results(column[0]), column[1]
        out = np.empty(len(counts), dtype=object)
        for row in np.flatnonzero(counts).tolist():
            out[row] = float(totals[row] / int(counts[row]))
        return out

    def from_partials(self, partials: Sequence[Any]) -> tuple:
        sums = [None if not c else (s.item() if isinstance(s, np.generic) else s) for s, c in partials]
        return (_scalar_column(sums), np.fromiter((c for _, c in partials), dtype=np.int64, count=len(partials)))

    def from_rows(self, agg: Mean, df: Any, grouping: Grouping) -> tuple:
        return self.from_partials(agg._grouped(df, grouping))

    def from_sql(self, values: Any) -> tuple:
        sums, counts = values
        counts = np.asarray(counts, dtype=np.int64)
        return (self.sum.from_sql((sums, counts)), counts)

    def partial(self, column: tuple, row: int) -> tuple:
        total = column[0].value(row)
        return (0 if total is None else total, int(column[1][row]))

    def length(self, column: tuple) -> int:
        return len(column[1])

    def spread(self, column: tuple, where: np.ndarray, n: int) -> tuple:
        return (self.sum.spread(column[0], where, n), self.count.spread(column[1], where, n))


Field = Any  # CountField | HllField | ScalarField | MeanField


# ---------------------------------------------------------------- the layout
class ColumnarLayout:
    """The columns of an ``Aggregations``' accumulators, or None (:meth:`of`) when one has no column form.

    Every method works on a *block*: one column per output, rows aligned with a
    list of keys.
    """

    def __init__(self, names: Sequence[str], fields: Sequence[Field]) -> None:
        self.names = tuple(names)
        self.fields = tuple(fields)
        spec = ";".join(
            f"{name}={field.kind}" + (f":{field.lg_k}:{field.tgt_type}" if field.kind == "hll" else "")
            for name, field in zip(self.names, self.fields)
        ).encode()

        # version, header length, header: a stored value names its fields
        self.header = bytes([_FORMAT]) + struct.pack("<H", len(spec)) + spec
        self._head = np.frombuffer(_IMAGE_HEAD, dtype=np.uint8)
        self._tail = np.frombuffer(_IMAGE_TAIL, dtype=np.uint8)
        self._header = np.frombuffer(self.header, dtype=np.uint8)

    @classmethod
    def of(cls, aggregations: Mapping[str, Any]) -> Optional["ColumnarLayout"]:
        if any(c in name for name in aggregations for c in "=;:"):
            return None  # a stored header could not be read back: such outputs stay objects
        fields: list[Field] = []
        for agg in aggregations.values():
            kind = type(agg)
            if kind is Count:
                fields.append(CountField())
            elif kind is ApproxDistinct:
                fields.append(HllField(agg.lg_k, agg.tgt_type))
            elif kind in (Sum, Min, Max, First, Last):
                fields.append(ScalarField(agg))
            elif kind is Mean:
                fields.append(MeanField())
            else:
                return None
        return cls(list(aggregations), fields)

    @classmethod
    def from_header(cls, payload: bytes) -> "ColumnarLayout":
        if not payload or payload[0] != _FORMAT:
            raise ValueError(f"not a packed accumulator of format {_FORMAT}: {payload[:8]!r}")
        (size,) = struct.unpack_from("<H", payload, 1)
        names, fields = [], []
        for item in payload[3:3 + size].decode().split(";"):
            name, spec = item.split("=", 1)
            parts = spec.split(":")
            names.append(name)
            fields.append(_field_of(parts))
        return cls(names, fields)

    # -- blocks
    def empty(self, n: int) -> list[Any]:
        return [field.empty(n) for field in self.fields]

    def from_accumulators(self, accumulators: Sequence[Mapping[str, Any]]) -> list[Any]:
        """A block from the object path's ``{output: partial}`` dicts."""
        return [field.from_partials([acc[name] for acc in accumulators]) for name, field in zip(self.names, self.fields)]

    def from_rows(self, aggregations: Mapping[str, Any], df: Any, grouping: Grouping) -> list[Any]:
        """A block of the partials of raw rows: row i holds group i of ``grouping``.

        ``ApproxDistinct`` of typed values hashes them with numpy as DataSketches
        would (no sketch object per group, no call per value), ``Count`` is one
        bincount; other outputs come from their aggregation's grouped partials.
        O(rows) numpy work plus a sort of the distinct (group, coupon) pairs.
        """
        return [field.from_rows(aggregations[name], df, grouping) for name, field in zip(self.names, self.fields)]

    def from_columns(self, columns: Mapping[str, Any]) -> list[Any]:
        """A block from per-output arrays of partials as Spark SQL gives them (counts, sketch bytes)."""
        return [field.from_sql(columns[name]) for name, field in zip(self.names, self.fields)]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [field.merge(x, y) for field, x, y in zip(self.fields, a, b)]

    def results(self, block: list[Any]) -> dict[str, np.ndarray]:
        return {name: field.results(column) for name, field, column in zip(self.names, self.fields, block)}

    # -- stored values
    def decode(self, values: Sequence[Optional[bytes]]) -> list[Any]:
        """The block of stored values (None: an empty accumulator). Values of another layout are refused."""
        n = len(values)
        present = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        if not present.any():
            return self.empty(n)
        stored = [v for v in values if v is not None]
        for v in stored:
            if not isinstance(v, bytes):
                return self._decode_objects(values)
        lengths = np.fromiter(map(len, stored), dtype=np.int64, count=len(stored))
        data = np.frombuffer(b"".join(stored), dtype=np.uint8)
        starts = np.zeros(n, dtype=np.int64)
        starts[present] = np.cumsum(lengths) - lengths
        full = np.full(n, -1, dtype=np.int64)
        full[present] = lengths
        return self.decode_buffer(data, starts, full)

    def decode_buffer(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[Any]:
        """The block of stored values lying in ``data`` (uint8) at ``starts`` with ``lengths`` (-1: no
        value, an empty accumulator). What :meth:`decode` does once the values are in one buffer."""
        n = len(starts)
        present = lengths >= 0
        if not present.any():
            return self.empty(n)
        at = starts[present]
        sizes = lengths[present]
        header_at = at + _HEAD
        width = len(self.header)
        if (sizes < _HEAD + width + len(_IMAGE_TAIL)).any() or not np.array_equal(
            data[header_at[:, None] + np.arange(width)], np.broadcast_to(self._header, (len(at), width))
        ):
            self._refuse([data[a : a + size].tobytes() for a, size in zip(at.tolist(), sizes.tolist())])
        pos = header_at + width
        block = []
        for field in self.fields:
            column, pos = field.decode(data, pos)
            block.append(column)
        if present.all():
            return block
        # spread the stored rows over all n rows (the others empty)
        return self.spread(block, np.flatnonzero(present), n)

    def spread(self, block: list[Any], where: np.ndarray, n: int) -> list[Any]:
        """The block over ``n`` rows: its row i at row ``where[i]`` (distinct), the other rows empty."""
        return [field.spread(column, where, n) for field, column in zip(self.fields, block)]

    def _decode_objects(self, values: Sequence[Any]) -> list[Any]:
        """Values written by the object path (dicts of partials, from older checkpoints)."""
        accumulators = []
        for v in values:
            if v is None:
                accumulators.append({name: _empty_partial(field) for name, field in zip(self.names, self.fields)})
            elif isinstance(v, bytes):
                accumulators.append(PackedAccumulator(v).as_dict())  # packed bytes beside the dicts
            elif isinstance(v, Mapping):
                accumulators.append(v)
            else:
                raise TypeError(f"an aggregate() state value must be its accumulators, got {type(v).__name__}: {v!r}")
        return self.from_accumulators(accumulators)

    def _refuse(self, stored: Sequence[bytes]) -> None:
        for v in stored:
            payload = bytes(v[_HEAD:_HEAD + 3 + 1024])
            if not bytes(v).startswith(_IMAGE_HEAD):
                raise ValueError(f"a stored aggregate() state is not a packed accumulator: {bytes(v[:16])!r}...")
            if not payload.startswith(self.header):
                other = ColumnarLayout.from_header(payload)
                raise ValueError(
                    "the stored accumulators are of other aggregations "
                    f"({dict(zip(other.names, (f.kind for f in other.fields)))}) than this operator's "
                    f"({dict(zip(self.names, (f.kind for f in self.fields)))}): restore with the same aggregate()"
                )
        raise ValueError("a stored aggregate() state is truncated")

    def merge_into(
        self, cache: "KeyGroupCache", keys: Sequence[Any], incoming: list[Any]
    ) -> tuple[list[Any], np.ndarray]:
        """Merge the block ``incoming`` (one row per key) into the accumulators ``cache`` holds for the
        distinct normalized ``keys``, read and written as byte ranges (no object per key): the merged
        block, and each key's key group (what ``update_values`` returns)."""
        merged: list[Any] = []

        def update(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
            merged[:] = self.merge(self.decode_buffer(buffer, starts, lengths), incoming)
            encoded, begins, ends = self.encode_buffer(merged)
            return encoded, begins, ends - begins

        key_groups = cache.update_values(keys, update)
        return merged, key_groups

    def encode(self, block: list[Any]) -> list[bytes]:
        """One stored value per row of ``block`` (the bytes of a :class:`PackedAccumulator`)."""
        buf, starts, ends = self.encode_buffer(block)
        data = buf.tobytes()
        return [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]

    def encode_buffer(self, block: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stored values of ``block``'s rows, one after another in one buffer: ``(buffer, starts, ends)``."""
        n = self.fields[0].length(block[0])
        payload = np.full(n, len(self.header), dtype=np.int64)
        for field, column in zip(self.fields, block):
            payload += field.sizes(column)
        sizes = payload + _HEAD + len(_IMAGE_TAIL)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        buf = np.empty(int(ends[-1]) if n else 0, dtype=np.uint8)
        head = len(_IMAGE_HEAD)
        _fill(buf, starts, self._head)
        _write(buf, starts + head, payload, "<u4")
        pos = starts + _HEAD
        _fill(buf, pos, self._header)
        pos = pos + len(self.header)
        for field, column in zip(self.fields, block):
            pos = field.encode(buf, pos, column)
        _fill(buf, pos, self._tail)
        return buf, starts, ends


def _field_of(parts: list[str]) -> Field:
    """The field a stored header names (``count``, ``hll:<lg_k>:<type>``, ``sum``, ``min``, ..., ``mean``)."""
    kind = parts[0]
    if kind == "count":
        return CountField()
    if kind == "hll":
        return HllField(int(parts[1]), parts[2])
    if kind == "mean":
        return MeanField()
    picks = {"sum": Sum, "min": Min, "max": Max, "first": First, "last": Last}
    if kind in picks:
        return ScalarField(picks[kind]("_"))
    raise ValueError(f"a stored accumulator names an unknown field kind {kind!r}")


def _empty_partial(field: Field) -> Any:
    if field.kind == "hll":
        return HllPartial.from_bytes(field.coupon_image(np.empty(0, np.uint32)))
    return field.partial(field.empty(1), 0)


class PackedSerializer:
    """The state table's serializer for packed accumulators: their bytes as they are, anything else pickled.

    A packed value is stored and read back as the plain ``bytes`` of its
    pickle image (no copy, no pickle call); :func:`packed` wraps it for users.
    """

    __slots__ = ("dumps", "loads")

    def __init__(self) -> None:
        head = _IMAGE_HEAD
        packed = PackedAccumulator
        dumps, loads = pickle.dumps, pickle.loads

        def _dumps(value: Any) -> bytes:
            if (type(value) is bytes and value.startswith(head)) or type(value) is packed:
                return value
            return dumps(value, 5)

        def _loads(data: bytes) -> Any:
            return data if data.startswith(head) else loads(data)

        self.dumps = _dumps
        self.loads = _loads

    def __repr__(self) -> str:
        return "PackedSerializer()"


def packed(value: Any) -> Any:
    """A stored aggregate value as users see it: a :class:`PackedAccumulator` for packed bytes, else as is."""
    if type(value) is bytes and value.startswith(_IMAGE_HEAD):
        return PackedAccumulator(value)
    return value
