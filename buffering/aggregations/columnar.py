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
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .basic import Count
from .sketches import ApproxDistinct, HllPartial, _datasketches

_FORMAT = 1
#: A coupon set this small has DataSketches' estimate == its size exactly (checked for lg_k 4..21).
_EXACT_COUPONS = 384


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

    def __repr__(self) -> str:
        return f"PackedAccumulator({self.as_dict()!r})"


# ---------------------------------------------------------------- vectorized byte helpers
def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts.astype(np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by a sort (numpy's hash-based unique of int64 measured 10x slower here)."""
    if len(values) < 2:
        return values
    values = np.sort(values)
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _read(data: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return np.ascontiguousarray(data[pos[:, None] + np.arange(width)]).view(dtype).ravel()


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

    def take(self, column: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return column[rows]

    def from_partials(self, partials: Sequence[Any]) -> np.ndarray:
        return np.fromiter(partials, dtype=np.int64, count=len(partials))

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
        coupon_bytes = data[_ranges(start[sparse], count[sparse] * 4)]
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
        byte_pos = _ranges(start, sparse_counts * 4)
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

    def take(self, column: HllColumn, rows: np.ndarray) -> HllColumn:
        """The column of ``rows`` (in that order), renumbered 0..len(rows)-1."""
        where = np.full(column.n, -1, dtype=np.int64)
        where[rows] = np.arange(len(rows))
        owners = where[column.rows]
        keep = owners >= 0
        dense_new = where[column.dense_rows]
        dkeep = dense_new >= 0
        order = np.argsort(dense_new[dkeep], kind="stable")
        return HllColumn(len(rows), owners[keep], column.coupons[keep], dense_new[dkeep][order],
                         column.registers[dkeep][order])

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
        positions = _ranges(starts + body, words * 4)
        coupons = np.ascontiguousarray(data[positions]).view("<u4").astype(np.uint32)
        filled = coupons != 0  # an updatable image's hash table has empty (zero) slots
        owners, coupons = owners[filled], coupons[filled]
        dense_rows = np.flatnonzero(~coupon_mode).astype(np.int64)
        registers = np.empty((len(dense_rows), self.k), dtype=np.uint8)
        if len(dense_rows):
            ds = _datasketches()
            for i, row in enumerate(dense_rows.tolist()):
                union = ds.hll_union(self.lg_k)
                union.update(ds.hll_sketch.deserialize(bytes(blobs[row])))
                image = union.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable()
                registers[i] = np.frombuffer(image, dtype=np.uint8, count=self.k, offset=40)
        column = HllColumn(n, owners, coupons, dense_rows, registers)
        return self.merge(column, self.empty(n)) if len(owners) else column

    def from_partials(self, partials: Sequence[Any]) -> HllColumn:
        return self.from_sketch_bytes([p.sketch.serialize_compact() for p in partials])

    def from_sql(self, values: np.ndarray) -> HllColumn:
        return self.from_sketch_bytes([v if type(v) is bytes else bytes(v) for v in values])

    def partial(self, column: HllColumn, row: int) -> HllPartial:
        deserialize = _datasketches().hll_sketch.deserialize
        at = np.searchsorted(column.dense_rows, row)
        if at < len(column.dense_rows) and column.dense_rows[at] == row:
            return HllPartial(deserialize(self.register_image(column.registers[at])))
        return HllPartial(deserialize(self.coupon_image(np.sort(column.coupons[column.rows == row]))))


Field = Any  # CountField | HllField


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
        fields: list[Field] = []
        for agg in aggregations.values():
            if type(agg) is Count:
                fields.append(CountField())
            elif type(agg) is ApproxDistinct:
                fields.append(HllField(agg.lg_k, agg.tgt_type))
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
            fields.append(CountField() if parts[0] == "count" else HllField(int(parts[1]), parts[2]))
        return cls(names, fields)

    # -- blocks
    def empty(self, n: int) -> list[Any]:
        return [field.empty(n) for field in self.fields]

    def from_accumulators(self, accumulators: Sequence[Mapping[str, Any]]) -> list[Any]:
        """A block from the object path's ``{output: partial}`` dicts."""
        return [field.from_partials([acc[name] for acc in accumulators]) for name, field in zip(self.names, self.fields)]

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
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        header_at = starts + _HEAD
        width = len(self.header)
        if (lengths < _HEAD + width + len(_IMAGE_TAIL)).any() or not np.array_equal(
            data[header_at[:, None] + np.arange(width)], np.broadcast_to(self._header, (len(stored), width))
        ):
            self._refuse(stored)
        pos = header_at + width
        block = []
        for field in self.fields:
            column, pos = field.decode(data, pos)
            block.append(column)
        if present.all():
            return block
        # spread the stored rows over all n rows (the others empty)
        return self._spread(block, np.flatnonzero(present), n)

    def _spread(self, block: list[Any], where: np.ndarray, n: int) -> list[Any]:
        out = []
        for field, column in zip(self.fields, block):
            if field.kind == "count":
                full = np.zeros(n, dtype=np.int64)
                full[where] = column
                out.append(full)
            else:
                out.append(HllColumn(n, where[column.rows], column.coupons, where[column.dense_rows], column.registers))
        return out

    def _decode_objects(self, values: Sequence[Any]) -> list[Any]:
        """Values written by the object path (dicts of partials, from older checkpoints)."""
        accumulators = []
        for v in values:
            if v is None:
                accumulators.append({name: _empty_partial(field) for name, field in zip(self.names, self.fields)})
            elif isinstance(v, bytes):
                accumulators.append(PackedAccumulator(v).as_dict() if isinstance(v, PackedAccumulator) else
                                    pickle.loads(v).as_dict())
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

    def encode(self, block: list[Any]) -> list[bytes]:
        """One stored value per row of ``block`` (the bytes of a :class:`PackedAccumulator`)."""
        n = len(block[0]) if self.fields[0].kind == "count" else block[0].n
        payload = np.full(n, len(self.header), dtype=np.int64)
        for field, column in zip(self.fields, block):
            payload += field.sizes(column)
        sizes = payload + _HEAD + len(_IMAGE_TAIL)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        buf = np.empty(int(ends[-1]) if n else 0, dtype=np.uint8)
        head = len(_IMAGE_HEAD)
        buf[starts[:, None] + np.arange(head)] = self._head
        _write(buf, starts + head, payload, "<u4")
        pos = starts + _HEAD
        buf[pos[:, None] + np.arange(len(self.header))] = self._header
        pos = pos + len(self.header)
        for field, column in zip(self.fields, block):
            pos = field.encode(buf, pos, column)
        buf[pos[:, None] + np.arange(len(_IMAGE_TAIL))] = self._tail
        data = buf.tobytes()
        return [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]


def _empty_partial(field: Field) -> Any:
    return 0 if field.kind == "count" else HllPartial.from_bytes(field.coupon_image(np.empty(0, np.uint32)))


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
