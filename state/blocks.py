"""Key-group blocks: a table's entries kept as a few RocksDB records per key group, cached as blocks.

A :class:`~state.RocksDBStore` keeps one record per key, and a
:class:`~state.WriteBackCache` one Python object per key, so every read of a
key not cached, every write-back, every checkpoint section, every restore and
every value crossing the cache is a call and some Python work per key. When
most keys of a key group change between checkpoints (an aggregate over hot
keys: every batch touches most of its keys), that per-key work is most of an
operator's state cost. :class:`KeyGroupCache` keeps the same entries per key
group instead:

* in memory, a block per key group: the raw keys, an index from raw key to
  row, and the values in one byte buffer (a start and a length per row), so
  values go in and out as byte ranges of numpy buffers
  (:meth:`KeyGroupCache.read_values`, :meth:`KeyGroupCache.write_values`);
* in RocksDB, a few records per key group (the block cut into records of
  about :data:`BLOCK_RECORD_BYTES`): the key is the key group's 2-byte prefix,
  ``0xFF`` (the first byte of no encoded key) and the record's number (u16),
  the value ``MAGIC``, the entry count (u32), the raw key lengths and value
  lengths (u32 each), the raw keys, the values.

The checkpoint layer moves the block records as any raw records: key groups
stay contiguous ranges, so deltas, snapshots, restores and rescales work
unchanged, and :func:`iter_entries` turns raw records back into per-key
records for readers of checkpoints (``read_state``, exports). A key group
holding per-key records (a table written with the per-key layout) is read as
those entries over its block, and written back as block records (the per-key
records deleted); :func:`split_blocks` goes the other way for a table opened
with per-key records.

Cost: a write-back rewrites the whole block of every key group it touches, so
the layout pays off when most of a key group changes between write-backs and
the cache holds the state; when a few keys of a large state change it writes
more than per-key records. An aggregate's default, ``cached_state(layout="auto")``,
keeps blocks only until its cache first evicts a key group, then converts them
with :func:`split_blocks` and goes on per key.
"""

from __future__ import annotations

import struct
import weakref
from collections import OrderedDict
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from .base import MISSING, Store, StoreClosedError, serialization_error
from .cache.malloc import pin_mmap_threshold, release_free_memory
from .cache.writeback import check_size, check_watermarks
from .keys import NormalizedKey, decode_key, normalize_keys
from .raw import KEY_GROUP_BYTES, fixed_width_cuts, key_groups_of_raw
from .rocksdb import RocksDBStore

if TYPE_CHECKING:
    from .cache.manager import CacheManager

#: A write-back of many key groups goes to RocksDB in write batches of about this many bytes.
WRITE_BATCH_BYTES = 4 << 20
#: The first bytes of every block value.
MAGIC = b"OPBK\x01"
_HEAD = len(MAGIC) + 4
#: Bytes a block row costs in memory besides its value: its raw key object (44 bytes for the 11
#: bytes of a long key), its index entry, its row number and its start and length (93 bytes,
#: measured with tracemalloc for 1k and 20k rows, CPython 3.11). Longer keys cost more than this.
ROW_OVERHEAD_BYTES = 144


#: A block record holds at most about this many bytes of keys and values: a key group's block is
#: cut into records of this size. RocksDB keeps large values in memory many times over (rewriting
#: 128 values of 400 KB raised the RSS of a store capped at 16 MB by 60-112 MB; of 64 KB, by 38 MB).
BLOCK_RECORD_BYTES = 64 << 10
#: The byte after the key-group prefix of a block record's key (no encoded key starts with it).
_BLOCK_MARK = 0xFF


def block_key(prefix: bytes, chunk: int) -> bytes:
    """The raw key of record ``chunk`` of the block of key group ``prefix``."""
    return prefix + bytes([_BLOCK_MARK]) + chunk.to_bytes(2, "big")


def is_block_key(raw_key: bytes) -> bool:
    """Whether a raw key is one of a key group's block records rather than one entry's key."""
    return len(raw_key) == KEY_GROUP_BYTES + 3 and raw_key[KEY_GROUP_BYTES] == _BLOCK_MARK


def _prefix_after(prefix: bytes) -> bytes:
    """The first raw key after every key of the key group ``prefix`` (key groups are below 2**15)."""
    return (int.from_bytes(prefix, "big") + 1).to_bytes(KEY_GROUP_BYTES, "big")


def concatenated_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for each (s, n), without a Python loop: the positions of
    byte ranges, to gather them from a numpy buffer in one indexing."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(total, dtype=np.int64) + np.repeat(starts.astype(np.int64) - (ends - lengths), lengths)


#: Above this many bytes a range on average, :func:`gather_ranges` copies range by range (about 0.3 us
#: a range) rather than through an index per byte (about 14 ns a byte); measured crossover 30-40 bytes.
_SLICE_GATHER_BYTES = 40


def gather_ranges(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``source[s:s + n]`` for each (s, n), concatenated, as a new writable array.

    Values of one width lying at multiples of it (fixed-width accumulators, as a
    merge encodes them and a block keeps them) are gathered as rows of a 2-D view,
    one copy per value. Long values of several widths (sketch images) are joined as
    slices, O(ranges + bytes); short ones through an index per byte, O(bytes) with
    a larger constant but no per-range Python step."""
    n = len(lengths)
    if n:
        width = int(lengths[0])
        if width > 0 and len(source) % width == 0 and (lengths == width).all() and not (starts % width).any():
            return source.reshape(-1, width)[starts // width].reshape(-1)
        total = int(lengths.sum())
        if total > _SLICE_GATHER_BYTES * n and source.itemsize == 1:
            view = memoryview(np.ascontiguousarray(source))
            ends = (starts + lengths).tolist()
            joined = bytearray().join([view[a:b] for a, b in zip(starts.tolist(), ends)])
            return np.frombuffer(joined, dtype=np.uint8)
    return source[concatenated_ranges(starts, lengths)]


def _record(keys: Sequence[bytes], key_lengths: np.ndarray, value_lengths: np.ndarray, values: bytes) -> bytes:
    """A block record's value: ``MAGIC``, the count, the key and value lengths, the keys, the values."""
    table = np.concatenate([key_lengths, value_lengths]).astype("<u4")
    return b"".join((MAGIC, struct.pack("<I", len(keys)), table.tobytes(), *keys, values))


def encode_block(keys: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    """A block record's value holding raw keys and their serialized values, in the order given."""
    n = len(keys)
    return _record(
        keys,
        np.fromiter(map(len, keys), dtype=np.int64, count=n),
        np.fromiter(map(len, values), dtype=np.int64, count=n),
        b"".join(values),
    )


def _parse(value: bytes) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray]:
    """``(raw keys, values buffer, value starts, value lengths)`` of a block record's value."""
    if not value.startswith(MAGIC) or len(value) < _HEAD:
        raise ValueError(f"not a key-group block: {bytes(value[:16])!r}...")
    (n,) = struct.unpack_from("<I", value, len(MAGIC))
    table_end = _HEAD + 8 * n
    if len(value) < table_end:
        raise ValueError(f"a key-group block of {n} entries is truncated ({len(value)} bytes)")
    lengths = np.frombuffer(value, dtype="<u4", count=2 * n, offset=_HEAD).astype(np.int64)
    ends = np.cumsum(lengths) + table_end
    if n and int(ends[-1]) != len(value):
        raise ValueError(f"a key-group block of {n} entries has {len(value)} bytes, its lengths say {int(ends[-1])}")
    key_ends = ends[:n]
    width = int(lengths[0]) if n else 0
    if width and (lengths[:n] == width).all():  # keys of fixed-width columns
        keys = fixed_width_cuts(value, width, n, table_end)
    else:
        keys = [value[a:b] for a, b in zip((key_ends - lengths[:n]).tolist(), key_ends.tolist())]
    values_at = int(key_ends[-1]) if n else table_end
    data = np.frombuffer(value, dtype=np.uint8, offset=values_at).copy()
    value_lengths = lengths[n:].copy()
    value_starts = ends[n:] - value_lengths - values_at
    return keys, data, value_starts, value_lengths


def decode_block(value: bytes) -> tuple[list[bytes], list[bytes]]:
    """``(raw keys, values)`` of a block record's value; ValueError for a value that is not a whole block."""
    keys, data, starts, lengths = _parse(value)
    raw = data.tobytes()
    return keys, [raw[a:b] for a, b in zip(starts.tolist(), (starts + lengths).tolist())]


def iter_entries(records: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """The per-key records of raw records in key order: blocks expanded (a per-key record of a key
    group overrides its block's entry of the same key), in key order."""
    group: Optional[bytes] = None
    entries: dict[bytes, bytes] = {}
    has_block = False
    for raw_key, raw_value in records:
        prefix = raw_key[:KEY_GROUP_BYTES]
        if prefix != group:
            yield from (sorted(entries.items()) if has_block else entries.items())
            group, entries, has_block = prefix, {}, False
        if is_block_key(raw_key):
            keys, values = decode_block(raw_value)
            for key, value in zip(keys, values):
                entries.setdefault(key, value)  # a per-key record read before it wins
            has_block = True
        else:
            entries[raw_key] = raw_value
    yield from (sorted(entries.items()) if has_block else entries.items())


def holds_per_key_records(table: RocksDBStore, key_groups: range) -> bool:
    """Whether any of ``key_groups`` holds per-key records (a table written with the per-key layout, or
    converted to it by :func:`split_blocks`): one seek per key group (its per-key records sort before its
    block records)."""
    for g in key_groups:
        prefix = g.to_bytes(KEY_GROUP_BYTES, "big")
        if next(table.iter_raw_keys(prefix, block_key(prefix, 0)), None) is not None:
            return True
    return False


def split_blocks(table: RocksDBStore, key_groups: range) -> int:
    """Turn the block records of ``key_groups`` into per-key records (the per-key layout); return how
    many key groups had blocks.

    For a table written as blocks and opened with per-key records: one seek per
    key group to its block records (which sort after its per-key records) and,
    when there are any, one write batch, recorded as changes (the next checkpoint
    writes those key groups again).
    """
    pairs: list[tuple[bytes, Optional[bytes]]] = []
    found = 0
    for g in key_groups:
        prefix = g.to_bytes(KEY_GROUP_BYTES, "big")
        blocks = list(table.iter_raw_between(block_key(prefix, 0), _prefix_after(prefix)))
        if not blocks:
            continue
        found += 1
        present = set(table.iter_raw_keys(prefix, block_key(prefix, 0)))  # per-key records win
        for raw_key, value in blocks:
            keys, values = decode_block(value)
            pairs.extend((k, v) for k, v in zip(keys, values) if k not in present)
            pairs.append((raw_key, None))
    if pairs:
        table.write_raw(pairs, track=True)
    return found


def _grown(array: np.ndarray, used: int, need: int) -> np.ndarray:
    """``array`` with room for ``need`` items, its first ``used`` kept (capacity doubles: appends are
    amortized O(1) per item)."""
    if need <= len(array):
        return array
    grown = np.empty(max(need, 2 * len(array), 16), dtype=array.dtype)
    grown[:used] = array[:used]
    return grown


class _KeyGroup:
    """One key group's entries in memory: raw keys, their rows, the values as byte ranges of one buffer.

    Rows are never reordered: a new key takes the next row, a delete leaves a
    dead row (length -1) until :meth:`compact`. Updated values are appended to
    the buffer; the old bytes stay until :meth:`compact`. The buffer and the
    row arrays keep spare capacity, so one key's update costs O(its bytes).
    """

    __slots__ = ("keys", "index", "_data", "used", "_starts", "_lengths", "live_bytes", "dirty", "folded", "stored", "__weakref__")

    def __init__(self, keys: list[bytes], data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.keys = keys
        self.index: dict[bytes, int] = dict(zip(keys, range(len(keys))))
        self._data = data
        self.used = len(data)
        self._starts = starts
        self._lengths = lengths
        self.live_bytes = int(lengths[lengths >= 0].sum())
        self.dirty = False
        #: Per-key records of this key group in the table, to delete at the next write-back.
        self.folded: list[bytes] = []
        #: How many block records of this key group the table holds.
        self.stored = 0

    @classmethod
    def empty(cls) -> "_KeyGroup":
        return cls([], np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64))

    @property
    def data(self) -> np.ndarray:
        return self._data[: self.used]

    @property
    def starts(self) -> np.ndarray:
        return self._starts[: len(self.keys)]

    @property
    def lengths(self) -> np.ndarray:
        return self._lengths[: len(self.keys)]

    def __len__(self) -> int:
        return len(self.index)

    def memory_bytes(self) -> int:
        return int(self._data.nbytes) + ROW_OVERHEAD_BYTES * len(self.keys)

    def rows_of(self, keys: Sequence[bytes]) -> np.ndarray:
        """The row of each raw key (-1: not held)."""
        return np.fromiter(map(self.index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))

    def add(self, keys: Sequence[bytes]) -> np.ndarray:
        """New rows for raw keys not held (distinct), with no value yet; their rows."""
        first = len(self.keys)
        end = first + len(keys)
        self._starts = _grown(self._starts, first, end)
        self._lengths = _grown(self._lengths, first, end)
        self._lengths[first:end] = -1
        self.keys.extend(keys)
        rows = np.arange(first, end, dtype=np.int64)
        self.index.update(zip(keys, rows.tolist()))
        return rows

    def delete(self, rows: np.ndarray) -> None:
        """Drop the entries of ``rows`` (their rows stay dead until :meth:`compact`)."""
        index, keys = self.index, self.keys
        for row in rows.tolist():
            del index[keys[row]]
        self.live_bytes -= int(self._lengths[rows].sum())
        self._lengths[rows] = -1
        self.dirty = True

    def set(self, rows: np.ndarray, source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Set the value of each of ``rows`` (distinct) to ``source[starts[i]:starts[i] + lengths[i]]``."""
        old = self._lengths[rows]
        self.live_bytes -= int(old[old >= 0].sum())
        lengths = lengths.astype(np.int64, copy=False)
        total = int(lengths.sum())
        used = self.used
        self._data = _grown(self._data, used, used + total)
        self._data[used : used + total] = gather_ranges(source, starts, lengths)
        self.used = used + total
        self._starts[rows] = np.cumsum(lengths) - lengths + used
        self._lengths[rows] = lengths
        self.live_bytes += total
        self.dirty = True
        if self.used > 4 * self.live_bytes + 4096:  # replaced values pile up until the write-back compacts
            self.compact()

    def put(
        self, keys: Sequence[bytes], source: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
        rows: Optional[np.ndarray] = None,
    ) -> None:
        """Set distinct raw ``keys`` to ``source[starts[i]:starts[i] + lengths[i]]`` (length -1 deletes);
        ``rows``: their rows (-1: not held) if already looked up."""
        rows = self.rows_of(keys) if rows is None else rows.copy()
        put = lengths >= 0
        new = put & (rows < 0)
        if new.any():
            rows[new] = self.add(list(compress(keys, new.tolist())))
        gone = ~put & (rows >= 0)
        if gone.any():
            self.delete(rows[gone])
        if put.any():
            self.set(rows[put], source, starts[put], lengths[put])

    def compact(self) -> None:
        """Drop dead rows and the bytes of replaced values (capacity shrinks to what is held)."""
        lengths = self.lengths
        alive = lengths >= 0
        starts, lengths = self.starts[alive], lengths[alive]  # before the keys shrink (the views follow them)
        if not alive.all():
            self.keys = list(compress(self.keys, alive.tolist()))
            self.index = dict(zip(self.keys, range(len(self.keys))))
        self._data = gather_ranges(self.data, starts, lengths)
        self.used = len(self._data)
        self._lengths = lengths
        self._starts = np.cumsum(lengths) - lengths
        self.live_bytes = self.used

    def records(self) -> list[bytes]:
        """This key group's block record values, each about :data:`BLOCK_RECORD_BYTES` or less (none when
        it has no entries); compacts first."""
        self.compact()
        n = len(self.keys)
        if not n:
            return []
        key_lengths = np.fromiter(map(len, self.keys), dtype=np.int64, count=n)
        lengths = self._lengths
        ends = np.cumsum(key_lengths + lengths + 8)
        cuts = np.flatnonzero(np.diff(ends // BLOCK_RECORD_BYTES)) + 1  # a row that crosses a boundary starts a record
        out = []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
            first, last = int(self._starts[lo]), int(self._starts[hi - 1] + lengths[hi - 1])
            out.append(_record(self.keys[lo:hi], key_lengths[lo:hi], lengths[lo:hi], self._data[first:last].tobytes()))
        return out


#: No watermark level on this measure (no bound on it).
_NO_LEVEL = float("inf")


def _check_bounds(max_entries: Any, max_bytes: Any) -> None:
    check_size("max_entries", max_entries)
    check_size("max_bytes", max_bytes)


class _Located(NamedTuple):
    """Keys of one key group in a call: the group, their positions in the call, raw keys, rows then."""

    prefix: bytes
    at: np.ndarray
    keys: list[bytes]
    rows: Any  # np.ndarray, or None when not looked up
    group: Callable[[], Optional[_KeyGroup]]  # a weak reference to the group the rows are of


def _no_group() -> None:
    return None


class KeyGroupCache(Store):
    """A write-back cache of key-group blocks in front of a RocksDB table that keeps a few records per key group.

    The :class:`~state.Store` interface per key (values serialized with the
    table's serializer), plus :meth:`read_values` / :meth:`write_values`, which
    move many keys' serialized values as byte ranges of numpy buffers
    (:meth:`update_values`: read, merge and write back in one pass). Key
    groups are loaded whole (one range scan) and evicted whole, least recently
    used first, when the entries held pass ``max_entries`` or their bytes
    (values plus :data:`ROW_OVERHEAD_BYTES` a row) pass ``max_bytes``, checked
    after each key group a call touches; a dirty one is written back first.
    :meth:`flush` writes back every dirty key group, in write batches of about
    :data:`WRITE_BATCH_BYTES` (the table records the block keys as changes).

    Watermarks (``low_watermark < high_watermark``, fractions of the bounds)
    keep that flush short, as ``WriteBackCache``'s do: after each call, when
    the dirty key groups hold more than ``high_watermark`` of ``max_entries``
    (entries) or of ``max_bytes`` (bytes), the least recently modified dirty
    ones are written back (and stay held, clean) until they hold at most
    ``low_watermark`` of it. A key group is written back whole, so a group
    changed again after its sync is written again.

    With a ``manager`` (a :class:`~state.cache.CacheManager`), the manager
    grants the byte bound and changes it as the process's memory allows
    (:meth:`resize`); the cache shares one budget with the manager's other
    caches.

    Complexity: reading or writing k keys of g key groups is O(k) Python (an
    index lookup each) plus numpy copies of their bytes, plus for each of the g
    groups not held one range scan and O(entries of the group) to index it; a
    write-back of a key group is O(its bytes).
    """

    batches_writes = True

    def __init__(
        self,
        table: RocksDBStore,
        *,
        max_entries: Optional[int] = None,
        max_bytes: Optional[int] = None,
        low_watermark: Optional[float] = None,
        high_watermark: Optional[float] = None,
        manager: Optional["CacheManager"] = None,
        name: str = "state",
    ) -> None:
        if not isinstance(table, RocksDBStore):
            raise TypeError(f"KeyGroupCache keeps its blocks in a RocksDBStore table, got {type(table).__name__}")
        _check_bounds(max_entries, max_bytes)
        check_watermarks(
            low_watermark, high_watermark, bounded=not (max_entries is None and max_bytes is None and manager is None)
        )
        super().__init__(
            name=table.name, max_parallelism=table.max_parallelism, key_types=table.key_types, serializer=table.serializer
        )
        self.cache_name = name
        if max_bytes is not None or manager is not None:
            pin_mmap_threshold()  # its blocks are large allocations: freed ones must leave the process
        self._table = table
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._groups: OrderedDict[bytes, _KeyGroup] = OrderedDict()
        # The dirty key groups, least recently modified first, and the entries and bytes they hold.
        self._dirty: OrderedDict[bytes, None] = OrderedDict()
        self._dirty_entries = 0
        self._dirty_bytes = 0
        self._low = low_watermark
        self._high = high_watermark
        self._watermark_levels = (_NO_LEVEL, _NO_LEVEL, _NO_LEVEL, _NO_LEVEL)
        # Entries and bytes of the held groups, kept as they change (a sum over the groups after each
        # key group of a call would cost O(groups) there: 32768 key groups make that quadratic).
        self._held_entries = 0
        self._held_bytes = 0
        self._closed = False
        self._hits = 0
        self._misses = 0
        self._loads = 0
        self._evictions = 0
        self._writes = 0
        self._write_batches = 0
        self._syncs = 0
        self._set_watermark_levels()
        self._manager: Optional["CacheManager"] = None
        if manager is not None:
            manager.register(self)  # attaches it and grants the byte bound through resize()

    # ------------------------------------------------------------ key groups
    @property
    def table_store(self) -> RocksDBStore:
        """The RocksDB table the blocks are written to (what checkpoints read)."""
        return self._table

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"cache {self.cache_name!r} is closed")

    def _group(self, prefix: bytes) -> _KeyGroup:
        """The key group's block, loaded from the table when not held (most recently used now)."""
        group = self._groups.get(prefix)
        if group is not None:
            self._groups.move_to_end(prefix)
            return group
        parsed = []
        extra: dict[bytes, bytes] = {}
        for raw_key, raw_value in self._table.iter_raw_between(prefix, _prefix_after(prefix)):
            if is_block_key(raw_key):
                parsed.append(_parse(raw_value))
            else:
                extra[raw_key] = raw_value
        if not parsed:
            group = _KeyGroup.empty()
        elif len(parsed) == 1:
            group = _KeyGroup(*parsed[0])
        else:
            shifts = np.cumsum([0] + [len(data) for _, data, _, _ in parsed[:-1]])
            group = _KeyGroup(
                [k for keys, _, _, _ in parsed for k in keys],
                np.concatenate([data for _, data, _, _ in parsed]),
                np.concatenate([starts + shift for (_, _, starts, _), shift in zip(parsed, shifts.tolist())]),
                np.concatenate([lengths for _, _, _, lengths in parsed]),
            )
        group.stored = len(parsed)
        if parsed:
            self._loads += 1
        if extra:  # per-key records (the per-key layout): entries over the block, folded at write-back
            keys = list(extra)
            values = list(extra.values())
            lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
            group.put(keys, np.frombuffer(b"".join(values), dtype=np.uint8), np.cumsum(lengths) - lengths, lengths)
            group.folded = keys
        self._groups[prefix] = group
        self._held_entries += len(group)
        self._held_bytes += group.memory_bytes()
        if group.dirty:
            self._touched(prefix, group)
        return group

    def _changing(self, group: _KeyGroup) -> tuple[int, int]:
        return len(group), group.memory_bytes()

    def _changed(self, prefix: bytes, group: _KeyGroup, before: tuple[int, int]) -> None:
        """Account for a held group's change since ``before`` (its :meth:`_changing`)."""
        entries, size = len(group) - before[0], group.memory_bytes() - before[1]
        self._held_entries += entries
        self._held_bytes += size
        if prefix in self._dirty:
            self._dirty_entries += entries
            self._dirty_bytes += size

    def _touched(self, prefix: bytes, group: _KeyGroup) -> None:
        """After a write to a held group: if it made the group dirty, the group is the most recently modified."""
        if prefix in self._dirty:
            self._dirty.move_to_end(prefix)
        elif group.dirty:
            self._dirty[prefix] = None
            self._dirty_entries += len(group)
            self._dirty_bytes += group.memory_bytes()

    def _cleaned(self, prefix: bytes, group: _KeyGroup) -> None:
        """A dirty group was written back: clean, no longer counted as dirty."""
        group.dirty = False
        if prefix in self._dirty:
            del self._dirty[prefix]
            self._dirty_entries -= len(group)
            self._dirty_bytes -= group.memory_bytes()

    def _locate(self, nkeys: Sequence[NormalizedKey]) -> tuple[list[bytes], list[tuple[bytes, np.ndarray]]]:
        """The raw keys of ``nkeys`` and, per key group, its prefix and the positions of its keys."""
        raw_keys = self._table.raw_keys(nkeys)
        if not raw_keys:
            return raw_keys, []
        groups = key_groups_of_raw(raw_keys)
        order = np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        return raw_keys, [(raw_keys[int(at[0])][:KEY_GROUP_BYTES], at) for at in np.split(order, cuts)]

    def _held(self, prefix: bytes, n: int) -> _KeyGroup:
        if prefix in self._groups:
            self._hits += n
        else:
            self._misses += n
        return self._group(prefix)

    # ------------------------------------------------------------ many keys as byte ranges
    def read_values(self, nkeys: Sequence[NormalizedKey]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The serialized values of ``nkeys`` in one buffer: ``(buffer, starts, lengths)``, one start and
        length per key in order (length -1: no value)."""
        self._check_open()
        raw_keys, located = self._locate(nkeys)
        values = self._gather(raw_keys, located)[:3]
        self._sync_dirty()  # a key group read with per-key records over its block is dirty (folded)
        return values

    def _gather(self, raw_keys: list[bytes], located: list[tuple[bytes, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[_Located]]:
        """The values of the located keys in one buffer, and where each key group's keys were found.

        The bounds are kept after each key group (reading every key group of a
        state larger than the bound holds one bound's worth at a time)."""
        n = len(raw_keys)
        starts = np.zeros(n, dtype=np.int64)
        lengths = np.full(n, -1, dtype=np.int64)
        pieces: list[np.ndarray] = []
        parts = []
        offset = 0
        for prefix, at in located:
            group = self._held(prefix, len(at))
            keys = [raw_keys[i] for i in at.tolist()]
            rows = group.rows_of(keys)
            parts.append(_Located(prefix, at, keys, rows, weakref.ref(group)))
            found = rows >= 0
            if found.any():
                held_rows = rows[found]
                row_lengths = group.lengths[held_rows]
                pieces.append(gather_ranges(group.data, group.starts[held_rows], row_lengths))
                starts[at[found]] = offset + np.cumsum(row_lengths) - row_lengths
                lengths[at[found]] = row_lengths
                offset += int(row_lengths.sum())
            del group
            self._bound()
        if not pieces:
            buffer = np.empty(0, np.uint8)
        else:
            buffer = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return buffer, starts, lengths, parts

    def _scatter(self, parts: list[_Located], source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Each located key's new value (length -1: delete), from ``source``; the bounds kept after each
        key group (one evicted since it was located is loaded again)."""
        for part in parts:
            group = self._group(part.prefix)
            before = self._changing(group)
            rows = part.rows if part.group() is group else None  # looked up again if it was evicted meanwhile
            group.put(part.keys, source, starts[part.at], lengths[part.at], rows)
            self._changed(part.prefix, group, before)
            self._touched(part.prefix, group)
            del group
            self._bound()
        # After the call, not after each key group: a sync compacts the groups it writes back, and
        # rows located for the groups still to come must stay valid.
        self._sync_dirty()
        if self._manager is not None:
            self._manager.maybe_rebalance()  # rate-limited: a clock read between rebalances

    def update_values(
        self,
        nkeys: Sequence[NormalizedKey],
        update: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
    ) -> np.ndarray:
        """Read the serialized values of distinct ``nkeys`` as :meth:`read_values` gives them, hand them
        to ``update``, and set each key to what it returns (``(buffer, starts, lengths)`` in the same
        order; length -1 deletes). The keys are located once; when the key groups fit the bounds they
        stay held in between. Returns each key's key group (int64), found on the way."""
        return self._update(nkeys, update, "update_values")

    def _update(
        self,
        nkeys: Sequence[NormalizedKey],
        update: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
        caller: str,
    ) -> np.ndarray:
        """:meth:`update_values`, its error naming ``caller``."""
        self._check_open()
        raw_keys, located = self._locate(nkeys)
        if len(set(raw_keys)) != len(raw_keys):
            raise ValueError(f"{caller} takes distinct keys")
        buffer, starts, lengths, parts = self._gather(raw_keys, located)
        source, new_starts, new_lengths = update(buffer, starts, lengths)
        if len(new_starts) != len(raw_keys) or len(new_lengths) != len(raw_keys):
            raise ValueError(f"update returned {len(new_starts)} values for {len(raw_keys)} keys")
        self._scatter(parts, source, np.asarray(new_starts, dtype=np.int64), np.asarray(new_lengths, dtype=np.int64))
        key_groups = np.empty(len(raw_keys), dtype=np.int64)
        for prefix, at in located:
            key_groups[at] = int.from_bytes(prefix, "big")
        return key_groups

    def write_values(self, nkeys: Sequence[NormalizedKey], source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Set each key's serialized value to ``source[starts[i]:starts[i] + lengths[i]]`` (length -1
        deletes it); the last write of a repeated key wins. Written back at :meth:`flush` or eviction."""
        self._check_open()
        if not len(nkeys):
            return
        last = dict(zip(self._table.raw_keys(nkeys), range(len(nkeys))))  # the last write of a key wins
        if len(last) != len(nkeys):
            pick = np.fromiter(last.values(), dtype=np.int64, count=len(last))
            nkeys = [nkeys[i] for i in pick.tolist()]
            starts, lengths = np.asarray(starts)[pick], np.asarray(lengths)[pick]
        raw_keys, located = self._locate(nkeys)
        parts = [_Located(prefix, at, [raw_keys[i] for i in at.tolist()], None, _no_group) for prefix, at in located]
        self._scatter(parts, source, np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64))

    # ------------------------------------------------------------ bounds and write-back
    def held_entries(self) -> int:
        """Entries of the key groups held in memory."""
        return self._held_entries

    def estimated_bytes(self) -> int:
        """Bytes of the key groups held in memory (values, spare buffer room, ROW_OVERHEAD_BYTES a row)."""
        return self._held_bytes

    @property
    def sized(self) -> bool:
        """Always: the bytes of the held blocks are counted as they change, so it takes a byte bound or a
        manager's at any time."""
        return True

    def attach(self, manager: Optional["CacheManager"]) -> None:
        """The manager that grants this cache's bytes (called by its ``register``/``unregister``)."""
        self._manager = manager

    def resize(self, *, max_entries: Any = ..., max_bytes: Any = ...) -> None:
        """Change the bounds (``...`` keeps one; None drops one), then evict and sync down to them at once."""
        entries = self.max_entries if max_entries is ... else max_entries
        size = self.max_bytes if max_bytes is ... else max_bytes
        _check_bounds(entries, size)
        if self._high is not None and entries is None and size is None:
            raise ValueError(f"cache {self.cache_name!r} has watermarks, which are fractions of a bound: keep one")
        if size is not None:
            pin_mmap_threshold()
        self.max_entries, self.max_bytes = entries, size
        self._set_watermark_levels()
        self._bound()
        self._sync_dirty()

    def _set_watermark_levels(self) -> None:
        """The dirty entries and bytes above which a sync starts (high) and down to which it goes (low)."""
        if self._high is None or self._low is None:
            return
        entries, size = self.max_entries, self.max_bytes
        self._watermark_levels = (
            _NO_LEVEL if entries is None else self._high * entries,
            _NO_LEVEL if size is None else self._high * size,
            _NO_LEVEL if entries is None else self._low * entries,
            _NO_LEVEL if size is None else self._low * size,
        )

    def _sync_dirty(self) -> None:
        """Above the high watermark: write back the least recently modified dirty groups down to the low one."""
        high_entries, high_bytes, low_entries, low_bytes = self._watermark_levels
        if self._dirty_entries <= high_entries and self._dirty_bytes <= high_bytes:
            return
        out = self._oldest_over(self._dirty, self._dirty_entries, self._dirty_bytes, low_entries, low_bytes)
        self._write_back([(p, self._groups[p]) for p in out])
        self._syncs += len(out)

    def _oldest_over(
        self, prefixes: Iterable[bytes], entries: float, size: float, max_entries: float, max_bytes: float
    ) -> list[bytes]:
        """The first of ``prefixes`` (oldest first) whose groups must go for ``entries`` and ``size`` (what
        they hold together) to be at most ``max_entries`` and ``max_bytes``."""
        out: list[bytes] = []
        for prefix in prefixes:
            if entries <= max_entries and size <= max_bytes:
                break
            group = self._groups[prefix]
            out.append(prefix)
            entries -= len(group)
            size -= group.memory_bytes()
        return out

    def _bound(self) -> None:
        """Evict least recently used key groups until within the bounds (dirty ones written back first).
        Bounds hold per key group: one larger than a bound is evicted after each use."""
        if self.max_entries is None and self.max_bytes is None:
            return
        out = self._oldest_over(
            self._groups, self._held_entries, self._held_bytes,
            _NO_LEVEL if self.max_entries is None else self.max_entries,
            _NO_LEVEL if self.max_bytes is None else self.max_bytes,
        )
        if not out:
            return
        self._write_back([(p, self._groups[p]) for p in out if p in self._dirty])
        for prefix in out:
            group = self._groups.pop(prefix)
            self._held_entries -= len(group)
            self._held_bytes -= group.memory_bytes()
        self._evictions += len(out)
        if self.max_bytes is not None:
            release_free_memory()  # what the evicted blocks freed in pieces goes back to the OS

    def _write_back(self, groups: Sequence[tuple[bytes, _KeyGroup]]) -> None:
        """Write the groups' block records (and delete their folded per-key records and records beyond
        the new count), in write batches of about WRITE_BATCH_BYTES; a group is clean once its batch is
        written."""
        pairs: list[tuple[bytes, Optional[bytes]]] = []
        written: list[tuple[bytes, _KeyGroup, int]] = []
        pending = 0
        for i, (prefix, group) in enumerate(groups):
            pairs.extend((raw_key, None) for raw_key in group.folded)
            before = self._changing(group)
            records = group.records()  # compacts: the group holds less
            self._changed(prefix, group, before)
            pairs.extend((block_key(prefix, r), value) for r, value in enumerate(records))
            pairs.extend((block_key(prefix, r), None) for r in range(len(records), group.stored))
            pending += sum(map(len, records))
            written.append((prefix, group, len(records)))
            if pending >= WRITE_BATCH_BYTES or i == len(groups) - 1:
                self._table.write_raw(pairs, track=True)
                for done_prefix, done, stored in written:
                    done.stored, done.folded = stored, []
                    self._cleaned(done_prefix, done)
                self._write_batches += 1
                self._writes += len(written)
                pairs, written, pending = [], [], 0

    def flush(self, durable: bool = False) -> None:
        """Write back every dirty key group (write batches of about WRITE_BATCH_BYTES); with ``durable``
        also flush the table."""
        self._check_open()
        self._write_back([(p, self._groups[p]) for p in self._dirty])
        if durable:
            self._table.flush()

    @property
    def dirty_groups(self) -> int:
        """Key groups held with changes not yet written back to the table."""
        return len(self._dirty)

    def rebind(self, table: RocksDBStore) -> None:
        """Point a flushed cache at ``table``: the same store reopened (its contents must be unchanged)."""
        if self.dirty_groups:
            raise RuntimeError(f"{self.cache_name}: flush() before rebind(); {self.dirty_groups} key groups are dirty")
        self._table = table

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (the keys of ``WriteBackCache.stats`` that apply; reads count per key)."""
        reads = self._hits + self._misses
        return {
            "hits": self._hits,
            "misses": self._misses,
            "hit_ratio": self._hits / reads if reads else 0.0,
            "loads": self._loads,
            "evictions": self._evictions,
            "dirty": self.dirty_groups,
            "entries": self.held_entries(),
            "key_groups": len(self._groups),
            "syncs": self._syncs,
            "writes": self._writes,
            "write_batches": self._write_batches,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "granted_bytes": self.max_bytes if self._manager is not None else None,
            "estimated_bytes": self.estimated_bytes(),
            "layout": "key_group",
        }

    # ------------------------------------------------------------ the Store interface
    def _load(self, nkey: NormalizedKey) -> Any:
        return self._load_many([nkey])[0]

    def _load_many(self, nkeys: Sequence[NormalizedKey]) -> list[Any]:
        return self._deserialized(*self.read_values(nkeys))

    def _deserialized(self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[Any]:
        """The values lying in ``buffer`` at ``starts`` with ``lengths``, deserialized (MISSING: length -1)."""
        raw = buffer.tobytes()
        loads = self.serializer.loads
        return [
            MISSING if length < 0 else loads(raw[start : start + length])
            for start, length in zip(starts.tolist(), lengths.tolist())
        ]

    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        dumps = self.serializer.dumps
        try:
            serialized = [(k, None if v is MISSING else dumps(v)) for k, v in items]
        except Exception as exc:
            # Every value is serialized before anything is written: a failure writes nothing.
            raise serialization_error(self, items, exc) from exc
        self._write_serialized(serialized)

    def _write_serialized(self, items: Iterable[tuple[NormalizedKey, Optional[bytes]]]) -> None:
        nkeys: list[NormalizedKey] = []
        values: list[bytes] = []
        lengths: list[int] = []
        for nkey, value in items:
            nkeys.append(nkey)
            if value is None:
                lengths.append(-1)
            else:
                values.append(value)
                lengths.append(len(value))
        sizes = np.asarray(lengths, dtype=np.int64)
        starts = np.cumsum(np.maximum(sizes, 0)) - np.maximum(sizes, 0)
        self.write_values(nkeys, np.frombuffer(b"".join(values), dtype=np.uint8), starts, sizes)

    def key_list(self) -> list[NormalizedKey]:
        """Every key with a value, normalized, in no particular order (written back first; only the keys
        of each block record are parsed, not its values). O(n)."""
        self._check_open()
        self.flush()
        raws: list[bytes] = []
        for raw_key, raw_value in self._table.iter_raw():
            if is_block_key(raw_key):
                raws.extend(_parse(raw_value)[0])
            else:
                raws.append(raw_key)  # a per-key record over a block (a per-key checkpoint restored)
        return self._table.decode_raw_keys(list(dict.fromkeys(raws)))

    def pop_values(self, nkeys: Sequence[NormalizedKey]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Delete distinct ``nkeys`` and return their serialized values as :meth:`read_values` gives them
        (length -1: had none). The keys are located once, for the read and the deletes. O(k) plus
        the bytes of their key groups, as :meth:`update_values`."""
        popped: list[np.ndarray] = []

        def delete(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, ...]:
            popped[:] = (buffer, starts, lengths)
            return buffer, starts, np.full(len(starts), -1, dtype=np.int64)

        self._update(nkeys, delete, "pop_many")
        return popped[0], popped[1], popped[2]

    def pop_selected(
        self, key_groups: Iterable[int], select: Callable[[list[bytes]], np.ndarray]
    ) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray]:
        """Delete the entries of ``key_groups`` that ``select`` picks and return them: ``(raw keys, buffer,
        starts, lengths)``, the values as :meth:`read_values` gives them.

        ``select`` gets a key group's raw keys (rows of deleted entries among them) and returns a bool
        mask over them; nothing is encoded or looked up per key, so popping what a predicate on the raw
        keys picks (windows by the start their keys end with) costs numpy work per key group. A key
        group not held is loaded; the bounds are kept after each. O(entries of the key groups)."""
        self._check_open()
        raws: list[bytes] = []
        pieces: list[np.ndarray] = []
        all_lengths: list[np.ndarray] = []
        for g in key_groups:
            prefix = int(g).to_bytes(KEY_GROUP_BYTES, "big")
            group = self._held(prefix, 0)
            lengths = group.lengths
            picked = np.asarray(select(group.keys), dtype=bool)
            if picked.shape != lengths.shape:
                raise ValueError(f"select returned a mask of shape {picked.shape} for {len(lengths)} raw keys")
            picked &= lengths >= 0
            rows = np.flatnonzero(picked)
            if len(rows):
                row_lengths = lengths[rows]
                pieces.append(gather_ranges(group.data, group.starts[rows], row_lengths))
                all_lengths.append(row_lengths)
                keys = group.keys
                raws.extend([keys[r] for r in rows.tolist()])
                before = self._changing(group)
                group.delete(rows)
                self._changed(prefix, group, before)
                self._touched(prefix, group)
            del group
            self._bound()
        self._sync_dirty()
        if not raws:
            return raws, np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64)
        lengths = np.concatenate(all_lengths)
        return raws, np.concatenate(pieces), np.cumsum(lengths) - lengths, lengths

    def iter_group_keys(self, key_groups: Iterable[int]) -> Iterator[tuple[int, list[bytes]]]:
        """``(key group, raw keys of its entries)`` for each of ``key_groups`` holding entries, the key
        groups loaded as a read loads them (bounds kept after each). Key groups with nothing held or
        stored are skipped without a load (one scan of the table's keys over the range finds the
        stored ones: a few block records per key group). O(entries of the key groups)."""
        self._check_open()
        wanted = sorted({int(g) for g in key_groups})
        if not wanted:
            return
        lower = wanted[0].to_bytes(KEY_GROUP_BYTES, "big")
        upper = _prefix_after(wanted[-1].to_bytes(KEY_GROUP_BYTES, "big"))
        present = {raw[:KEY_GROUP_BYTES] for raw in self._table.iter_raw_keys(lower, upper)}
        present.update(prefix for prefix in self._groups if lower <= prefix < upper)
        for g in wanted:
            prefix = g.to_bytes(KEY_GROUP_BYTES, "big")
            if prefix not in present:
                continue
            group = self._held(prefix, 0)
            alive = group.lengths >= 0
            keys = list(group.keys) if alive.all() else list(compress(group.keys, alive.tolist()))
            del group
            self._bound()
            if keys:
                yield g, keys

    def pop_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """:meth:`Store.pop_many`, the keys located once (see :meth:`pop_values`)."""
        values = self._deserialized(*self.pop_values(normalize_keys(keys)))
        return [default if v is MISSING else v for v in values]

    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        self.flush()
        loads = self.serializer.loads
        for raw_key, raw_value in iter_entries(self._table.iter_raw()):
            yield decode_key(raw_key, KEY_GROUP_BYTES), loads(raw_value)

    def table(self, name: str) -> Store:
        return self._table.table(name)

    def tables(self) -> list[str]:
        return self._table.tables()

    @property
    def evictions(self) -> int:
        """Key groups evicted to stay within the bounds since the cache was made (none: the state fits)."""
        return self._evictions

    def release(self) -> None:
        """Write back every dirty key group, drop the blocks and leave the manager; the table stays open.

        For a caller that goes on with the table under another cache (an
        ``aggregate()`` whose state outgrew the bounds switches to the per-key
        layout). The cache is closed afterwards.
        """
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._manager is not None:
            self._manager.unregister(self)
        self._groups.clear()
        self._held_entries = self._held_bytes = 0
        release_free_memory()

    def close(self) -> None:
        """Write back, then close the table."""
        if self._closed:
            return
        self.flush(durable=True)
        self.release()
        self._table.close()

    def __repr__(self) -> str:
        return f"KeyGroupCache({self._table!r}, key_groups={len(self._groups)}, dirty={self.dirty_groups})"
