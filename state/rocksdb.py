"""RocksDBStore: keyed state in embedded RocksDB through ``rocksdict`` (raw mode).

Every RocksDB key is ``key group (2 bytes, big-endian) + canonical key bytes``,
so one key group is one contiguous key range: it can be scanned, deleted and
bulk-loaded as a unit. Each table is a column family, created when the table
is first written: a table nobody writes costs nothing to open, flush or close
(an operator's working store is reopened at every micro-batch).

The write-ahead log is off by default: this store is the working copy of
state whose durable copy is the checkpoint (as in Flink), and ``flush()``
persists the memtables when a caller needs the files themselves to be
durable. Pass ``wal=True`` for a store that must survive a crash on its own.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from itertools import chain
from typing import Any, Iterable, Iterator, Sequence

import xxhash
from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from .base import MISSING, Store, StoreClosedError, StoreError, StoreLockedError, serialization_error
from .raw import KEY_GROUP_BYTES, fixed_width_cuts
from .keygroups import DEFAULT_MAX_PARALLELISM, key_group_from_hash
from .keys import (
    NormalizedKey,
    decode_key,
    denormalize_key,
    encode_key,
    key_columns,
    normalize_key,
    spark_hash,
    spark_hash_longs,
    split_pairs,
)
from .serializers import Serializer

_pack_le_q = struct.Struct("<q").pack
_pack_be_q = struct.Struct(">q").pack
_xxh = xxhash.xxh64_intdigest
_KG_BYTES = KEY_GROUP_BYTES
#: Target size of the SST files compactions write (see _Database._make_options).
SST_TARGET_FILE_BYTES = 4 << 20
#: RocksDB info logs kept in a store's directory (the current one and the previous open's).
KEPT_INFO_LOGS = 2


def _int_key_record() -> "Any":
    import numpy as np

    return np.dtype([("kg", ">u2"), ("tag", "u1"), ("key", ">i8")])


#: Layout of a one-column long key in RocksDB: key group, element tag, big-endian long.
_INT_KEY_RECORD = _int_key_record()


def _int_pair_record() -> "Any":
    import numpy as np

    return np.dtype([("kg", ">u2"), ("tag1", "u1"), ("key1", ">i8"), ("tag2", "u1"), ("key2", ">i8")])


#: Layout of a two-column (long, long) key grouped by its first column (e.g. a key and a window start).
_INT_PAIR_RECORD = _int_pair_record()


def _next_prefix(prefix: bytes) -> bytes:
    """The least byte string above every string that starts with ``prefix`` (an iterate upper bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        raise ValueError("a prefix of 0xff bytes only has no upper bound")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def _kg_prefix(key_group: int) -> bytes:
    return key_group.to_bytes(_KG_BYTES, "big")


class _Closed:
    """Stands in for the column family after close(): every use raises StoreClosedError."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> Any:
        raise StoreClosedError(f"RocksDBStore at {self._path!r} is closed")


class _Absent:
    """Stands in for the column family of a table never written: reads find nothing, deletes have
    nothing to delete, and the first write creates the column family (``RocksDBStore._create``)."""

    def __init__(self, store: "RocksDBStore") -> None:
        self._store = store

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        return [None] * len(key) if isinstance(key, list) else None

    def keys(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        return iter(())

    def items(self, *args: Any, **kwargs: Any) -> Iterator[tuple[bytes, bytes]]:
        return iter(())

    def delete(self, *args: Any) -> None:
        pass

    def delete_range(self, *args: Any) -> None:
        pass

    def compact_range(self, *args: Any) -> None:
        pass

    def flush(self, *args: Any) -> None:
        pass

    def put(self, *args: Any) -> None:
        self._store._create().put(*args)

    def ingest_external_file(self, *args: Any) -> None:
        self._store._create().ingest_external_file(*args)


class _Database:
    """The open RocksDB instance shared by the tables (column families) of one store."""

    def __init__(
        self, path: str, *, wal: bool, block_cache_bytes: int, bloom_bits_per_key: float, default_table: str = "default"
    ) -> None:
        self.path = path
        self.wal = wal
        self.tables: dict[str, "RocksDBStore"] = {}
        self.closed = False
        # RocksDB's memory for the whole database: one block cache shared by every table (column
        # family), and one cap on the memtables of all tables (RocksDB's default is 64 MB per
        # table, twice over, and would keep a working store's recent data in memory unbounded).
        self.block_cache = Cache(block_cache_bytes)
        self._memtable_bytes = max(1 << 20, block_cache_bytes // 2)
        self._cf_options = self._make_options(bloom_bits_per_key)
        options = self._make_options(bloom_bits_per_key)
        options.set_db_write_buffer_size(self._memtable_bytes)  # all tables' memtables together
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        existing: list[str] = []
        if os.path.exists(os.path.join(path, "CURRENT")):
            try:
                existing = Rdict.list_cf(path)
            except Exception as exc:  # rocksdict raises plain Exception
                raise StoreError(f"cannot list the tables of the RocksDB store at {path!r}: {exc}") from exc
        column_families = {name: self._cf_options for name in existing if name != "default"}
        # The table kept in RocksDB's default column family, which every database has. A store
        # that already holds a column family by that table's name (written before it was asked
        # for) keeps the table there.
        self.default_table = "default" if default_table in existing else default_table
        try:
            self.db = Rdict(path, options, column_families=column_families or None)
        except Exception as exc:
            message = str(exc)
            if "lock" in message.lower():
                raise StoreLockedError(
                    f"the RocksDB store at {path!r} is already open in another process or store "
                    f"(RocksDB holds its LOCK file): {message}"
                ) from exc
            raise StoreError(f"cannot open the RocksDB store at {path!r}: {message}") from exc
        self.write_options = WriteOptions()
        self.write_options.disable_wal = not wal
        self.db.set_write_options(self.write_options)

    def _make_options(self, bloom_bits_per_key: float) -> Options:
        options = Options(raw_mode=True)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_size(self._memtable_bytes // 2)
        # A compaction builds each output file's bloom filter from the hashes of all its keys,
        # held in memory until the file is done (8 bytes per key): with RocksDB's 64 MB default
        # that was the process's largest transient (34 MB peak RSS for 3M small entries, 18 MB
        # with 4 MB files; measured in benchmarks.memory_bound's store row).
        options.set_target_file_size_base(SST_TARGET_FILE_BYTES)
        # An operator's working store is closed and reopened at every micro-batch (handed between
        # Python workers), so the fixed costs of an open count. RocksDB's default of 16 threads to
        # open SST files made an open take 8.7 ms against 6.4 with 2 (50 files, local disk), and in
        # the Spark tasks of benchmarks.spark_e2e (100k tweets, two runs of each, alternating) 33 and
        # 27 ms against 18 and 22. Every open also starts a new info LOG (75 KB: the options of every
        # table), of which RocksDB's default keeps 1000.
        options.set_max_file_opening_threads(2)
        options.set_keep_log_file_num(KEPT_INFO_LOGS)
        # No compression where the hand-over's flushes land (L0) nor in the level they compact into
        # first; Snappy below that, for a state large enough to reach deeper levels. RocksDB's default
        # compresses every flush, and an operator's working store is flushed at every hand-over: for
        # the 4.2 MB of key-group blocks of one spark_e2e (c) instance at 100k tweets (count +
        # HyperLogLog blocks, which Snappy shrinks by about a third), an open + read + write + flush +
        # close cycle took 15.0-17.1 ms against 18.8-22.8 (medians of 24 cycles, four rounds).
        # (With level_compaction_dynamic_level_bytes, RocksDB's default, the second entry is the
        # level L0 compacts into, whatever its number.)
        none, snappy = DBCompressionType.none(), DBCompressionType.snappy()
        options.set_compression_per_level([none, none] + [snappy] * 5)  # RocksDB's 7 levels
        table = BlockBasedOptions()
        table.set_block_cache(self.block_cache)
        if bloom_bits_per_key:
            # A whole-key bloom filter makes a miss on a new key cheap (no block read).
            table.set_bloom_filter(bloom_bits_per_key, False)
        options.set_block_based_table_factory(table)
        return options

    def column_family(self, name: str, *, create: bool) -> tuple[Rdict | None, Any]:
        """The table's column family and its handle; ``(None, None)`` if it does not exist and not ``create``.

        Each column family costs every open (RocksDB writes its options and state to the new
        MANIFEST, OPTIONS file and info LOG) and every close (a flush): measured with two
        CPU-bound processes on both cores, as in a Spark worker, an open + write + flush + close of
        a store with two empty tables beside the written one took 33 ms, of the written one alone
        23 ms (medians of 24 cycles). In CPU the difference is smaller: an operator's store with four
        column families against one, 13.5 against 11 ms a cycle (all threads); the rest is waiting
        on file syncs. Hence tables are created when first written.
        """
        if self.closed:
            raise StoreClosedError(f"RocksDBStore at {self.path!r} is closed")
        if name == self.default_table:
            return self.db, self.db.get_column_family_handle("default")
        if name == "default":
            raise ValueError(
                f"the RocksDB store at {self.path!r} keeps table {self.default_table!r} in its default column "
                f"family: it has no table 'default'"
            )
        try:
            cf = self.db.get_column_family(name)
        except Exception:  # rocksdict raises plain Exception for a missing column family
            if not create:
                return None, None
            cf = self.db.create_column_family(name, self._cf_options)
        cf.set_write_options(self.write_options)
        return cf, self.db.get_column_family_handle(name)

    def table_names(self) -> set[str]:
        """Every table open here or stored in the database."""
        stored = (self.default_table if name == "default" else name for name in Rdict.list_cf(self.path))
        return set(self.tables) | set(stored)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for table in self.tables.values():
            table._cf.flush(True)
        for table in self.tables.values():
            table._cf = _Closed(self.path)  # type: ignore[assignment]
        self.db.close()
        # A live column-family handle keeps RocksDB's LOCK: drop every one so the path can reopen.
        for table in self.tables.values():
            table._handle = None
        self.db = _Closed(self.path)  # type: ignore[assignment]


class RocksDBStore(Store):
    """One table (column family) of an embedded RocksDB; ``table(name)`` opens siblings.

    Args:
        path: directory of the database (created if missing). One process at a
            time: a second open raises :class:`~state.StoreLockedError`.
        max_parallelism: key groups in front of every key (fixed for the life of the data).
        key_types: Spark types of the key columns, for key groups that match
            Spark's ``pmod(xxhash64(cols), n)``; inferred from Python types if None.
        serializer: value serializer (pickle protocol 5 by default).
        table: the table this object reads and writes.
        wal: keep RocksDB's write-ahead log (off: the checkpoint is the durable copy).
        block_cache_bytes: RocksDB's memory for this store: one block cache of this size shared
            by its tables, and memtables of all tables together capped at half of it
            (``db_write_buffer_size``). Index and filter blocks stay outside the cache
            (about 1.3 bytes per key with the bloom filter): charged to a small cache they
            made random reads many times slower.
        bloom_bits_per_key: bloom filter bits per key (0 disables it).
        group_columns: for a table of composite keys (a grouping key followed by more
            columns, e.g. a map entry's user key), the number of leading columns that
            are the grouping key: the key group, and so the instance that owns the entry
            after any rescale, comes from those columns alone, and all entries of one
            grouping key are adjacent (see :meth:`iter_prefix`). ``key_types`` then
            types the grouping columns. None: the whole key is the grouping key.
        default_column_family: keep ``table`` in RocksDB's default column family, which
            every database has and which otherwise stays empty beside the tables (each
            column family costs every open, flush and close); the store then has no table
            named ``"default"``. A store that already holds a column family named ``table``
            keeps the table there. Only for the store that opens the database; open it with
            the same flag every time (without it, a table kept in the default column family
            reads as empty).
    """

    batches_writes = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        key_types: Iterable[Any] | None = None,
        serializer: Serializer | None = None,
        table: str = "default",
        wal: bool = False,
        block_cache_bytes: int = 64 << 20,
        bloom_bits_per_key: float = 10,
        group_columns: int | None = None,
        default_column_family: bool = False,
        _database: _Database | None = None,
    ) -> None:
        super().__init__(name=table, max_parallelism=max_parallelism, key_types=key_types, serializer=serializer)
        if block_cache_bytes <= 0:
            raise ValueError(f"block_cache_bytes must be positive, got {block_cache_bytes!r}")
        if bloom_bits_per_key < 0:
            raise ValueError(f"bloom_bits_per_key must be >= 0, got {bloom_bits_per_key!r}")
        self.path = os.fspath(path)
        if _database is None:
            os.makedirs(self.path, exist_ok=True)
            _database = _Database(
                self.path, wal=wal, block_cache_bytes=block_cache_bytes, bloom_bits_per_key=bloom_bits_per_key,
                default_table=table if default_column_family else "default",
            )
            self._owner = True
        else:
            self._owner = False
        self._database = _database
        cf, self._handle = _database.column_family(table, create=False)
        self._cf: Any = _Absent(self) if cf is None else cf
        _database.tables[table] = self
        self._prefixes = [_kg_prefix(g) for g in range(self.max_parallelism)]
        if group_columns is not None and (isinstance(group_columns, bool) or not isinstance(group_columns, int) or group_columns < 1):
            raise ValueError(f"group_columns must be a positive int or None, got {group_columns!r}")
        self.group_columns = group_columns
        # The packed fast path hashes a whole one-column long key; a composite key never is one.
        self._single_long = group_columns is None and (self.key_types is None or self.key_types in (("long",), ("bigint",)))
        self._changed: set[bytes] | None = None

    # ------------------------------------------------------------ key bytes
    def _encode(self, nkey: NormalizedKey) -> bytes:
        """``key group (2 bytes BE) + canonical key bytes``."""
        if type(nkey) is int and self._single_long:
            h = _xxh(_pack_le_q(nkey), 42)
            if h >= 9223372036854775808:
                h -= 18446744073709551616
            return self._prefixes[h % self.max_parallelism] + b"\x01" + _pack_be_q(nkey)
        if self.group_columns is not None:
            columns = key_columns(nkey)
            if len(columns) <= self.group_columns:
                raise ValueError(
                    f"key {denormalize_key(nkey)!r} of table {self.name!r} needs more than its "
                    f"{self.group_columns} grouping column(s)"
                )
            h = spark_hash(columns[: self.group_columns], self.key_types)
        else:
            h = spark_hash(nkey, self.key_types)
        return self._prefixes[h % self.max_parallelism] + encode_key(nkey)

    def key_group(self, key: Any) -> int:
        """The key group ``key`` is stored under: in a table that groups its keys, that of its first
        ``group_columns`` columns (a key and a window start: the key's; the grouping key alone gives the
        same), else that of the whole key."""
        if self.group_columns is None:
            return super().key_group(key)
        columns = key_columns(normalize_key(key))
        if len(columns) < self.group_columns:
            raise ValueError(
                f"key {key!r} of table {self.name!r} has fewer than its {self.group_columns} grouping column(s)"
            )
        return key_group_from_hash(spark_hash(columns[: self.group_columns], self.key_types), self.max_parallelism)

    def _group_prefix(self, group_key: Any) -> bytes:
        """Raw bytes every key of ``group_key`` starts with (a table with ``group_columns``)."""
        if self.group_columns is None:
            raise StoreError(f"table {self.name!r} has no grouping columns: it was opened without group_columns")
        ngroup = key_columns(normalize_key(group_key))
        if len(ngroup) != self.group_columns:
            raise ValueError(
                f"grouping key {denormalize_key(ngroup)!r} has {len(ngroup)} column(s); table {self.name!r} "
                f"groups by {self.group_columns}"
            )
        h = spark_hash(ngroup, self.key_types)
        return self._prefixes[h % self.max_parallelism] + encode_key(ngroup)

    def iter_prefix(self, group_key: Any, limit: int | None = None) -> Iterator[tuple[NormalizedKey, Any]]:
        """``(normalized key, value)`` of every entry of ``group_key``, in key order (at most ``limit``).

        O(log n + entries of the group): one seek, then a range scan bounded by the prefix.
        """
        prefix = self._group_prefix(group_key)
        loads = self.serializer.loads
        count = 0
        for raw_key, raw_value in self.iter_raw_between(prefix, _next_prefix(prefix)):
            if limit is not None and count >= limit:
                return
            count += 1
            yield decode_key(raw_key, _KG_BYTES), loads(raw_value)

    def _encode_many(self, nkeys: Sequence[NormalizedKey]) -> list[bytes]:
        """Raw keys of many normalized keys; one-column long keys are hashed and packed with numpy."""
        n = len(nkeys)
        # The checks of the numpy paths are C-level passes over the keys (set of types, lengths), not a
        # Python expression per key: that was most of the cost of encoding a windowed aggregate's keys.
        types = set(map(type, nkeys)) if n >= 32 else None
        if types == {int} and self._single_long:
            import numpy as np

            values = np.fromiter(nkeys, dtype=np.int64, count=n)
            records = np.empty(n, dtype=_INT_KEY_RECORD)
            records["kg"] = spark_hash_longs(values) % self.max_parallelism
            records["tag"] = 1
            records["key"] = values
            return fixed_width_cuts(records, _INT_KEY_RECORD.itemsize, n)
        if (
            types == {tuple}
            and self.group_columns == 1
            and self.key_types in (None, ("long",), ("bigint",))
            and set(map(len, nkeys)) == {2}
            and set(map(type, chain.from_iterable(nkeys))) == {int}
        ):
            # (long key, long) grouped by the key, e.g. a windowed aggregate's (key, window start): the same
            # bytes as _encode (key group of the first column, then each element tagged), made with numpy.
            import numpy as np

            flat = np.fromiter(chain.from_iterable(nkeys), dtype=np.int64, count=2 * n).reshape(n, 2)
            firsts = flat[:, 0]
            pairs = np.empty(n, dtype=_INT_PAIR_RECORD)
            pairs["kg"] = spark_hash_longs(np.ascontiguousarray(firsts)) % self.max_parallelism
            pairs["tag1"] = 1
            pairs["key1"] = firsts
            pairs["tag2"] = 1
            pairs["key2"] = flat[:, 1]
            return fixed_width_cuts(pairs, _INT_PAIR_RECORD.itemsize, n)
        encode = self._encode
        return [encode(k) for k in nkeys]

    # ------------------------------------------------------------ primitives
    def _load(self, nkey: NormalizedKey) -> Any:
        raw = self._cf.get(self._encode(nkey))
        return MISSING if raw is None else self.serializer.loads(raw)

    def _load_many(self, nkeys: Sequence[NormalizedKey]) -> list[Any]:
        if not nkeys:
            return []
        raws = self._cf.get(self._encode_many(nkeys))
        loads = self.serializer.loads
        return [MISSING if raw is None else loads(raw) for raw in raws]

    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        dumps = self.serializer.dumps
        try:
            serialized = [(k, None if v is MISSING else dumps(v)) for k, v in items]
        except Exception as exc:
            # Every value is serialized before anything is written: a failure writes nothing.
            raise serialization_error(self, items, exc) from exc
        self._write_serialized(serialized)

    def _write_serialized(self, items: Iterable[tuple[NormalizedKey, bytes | None]]) -> None:
        # Two lists rather than a list of pairs: a flush of thousands of entries then allocates no
        # container the garbage collector tracks (a full collection over a big cache takes 0.5 s).
        nkeys: list[NormalizedKey] = []
        raws: list[bytes | None] = []
        for nkey, raw in items:
            nkeys.append(nkey)
            raws.append(raw)
        raw_keys = self._encode_many(nkeys)
        if self._changed is not None:
            self._changed.update(raw_keys)
        self._write_batch(raw_keys, raws)

    def _write_batch(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """One write batch of raw keys and their values (None deletes)."""
        if isinstance(self._cf, _Absent):
            if all(value is None for value in values):
                return  # deletes in a table never written
            self._create()
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._handle)
        put = batch.put
        if None in values:
            delete = batch.delete
            for raw_key, raw_value in zip(keys, values):
                if raw_value is None:
                    delete(raw_key)
                else:
                    put(raw_key, raw_value)
        else:
            deque(map(put, keys, values), maxlen=0)  # no per-entry Python bytecode
        if batch.len():
            self._cf.write(batch)

    def key_list(self) -> list[NormalizedKey]:
        """Every key of this table, normalized, without reading a value. O(entries)."""
        return self.decode_raw_keys(list(self._cf.keys()))

    def decode_raw_keys(self, raws: list[bytes]) -> list[NormalizedKey]:
        """The normalized keys of raw keys of this table; keys of two longs grouped by the first (a key
        and a window start) are decoded with numpy. O(len(raws))."""
        width = _INT_PAIR_RECORD.itemsize
        if len(raws) >= 32 and self.group_columns == 1 and set(map(len, raws)) == {width}:
            import numpy as np

            pairs = np.frombuffer(b"".join(raws), dtype=_INT_PAIR_RECORD)
            if (pairs["tag1"] == 1).all() and (pairs["tag2"] == 1).all():
                return list(zip(pairs["key1"].tolist(), pairs["key2"].tolist()))
        return [decode_key(raw, _KG_BYTES) for raw in raws]

    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        loads = self.serializer.loads
        for raw_key, raw_value in self._cf.items():
            yield decode_key(raw_key, _KG_BYTES), loads(raw_value)

    # Faster single-key paths than the generic ones (no tuple of pairs, no batch).
    def get(self, key: Any, default: Any = None) -> Any:
        raw = self._cf.get(self._encode(normalize_key(key)))
        return default if raw is None else self.serializer.loads(raw)

    def put(self, key: Any, value: Any) -> None:
        nkey = normalize_key(key)
        raw_key = self._encode(nkey)
        try:
            raw_value = self.serializer.dumps(value)
        except Exception as exc:
            raise serialization_error(self, ((nkey, value),), exc) from exc
        self._cf.put(raw_key, raw_value)
        if self._changed is not None:
            self._changed.add(raw_key)

    def delete(self, key: Any) -> None:
        raw_key = self._encode(normalize_key(key))
        self._cf.delete(raw_key)
        if self._changed is not None:
            self._changed.add(raw_key)

    # ------------------------------------------------------------ change tracking (incremental checkpoints)
    def track_changes(self, enabled: bool = True) -> None:
        """Record the raw keys written or deleted from now on (for delta checkpoints)."""
        self._changed = set() if enabled else None

    def drain_changes(self) -> set[bytes]:
        """The raw keys written or deleted since tracking started or the last drain; resets the set."""
        if self._changed is None:
            raise StoreError(f"{self!r} does not track changes; call track_changes() first")
        changed, self._changed = self._changed, set()
        return changed

    def get_raw_many(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Raw values of raw keys (None where absent), in one multi-get."""
        if not raw_keys:
            return []
        return self._cf.get(list(raw_keys))

    def __contains__(self, key: Any) -> bool:
        return self._cf.get(self._encode(normalize_key(key))) is not None

    # ------------------------------------------------------------ key groups
    def _check_key_groups(self, key_groups: range) -> range:
        if not isinstance(key_groups, range) or key_groups.step != 1:
            raise TypeError(f"key_groups must be a range with step 1, got {key_groups!r}")
        if key_groups.start < 0 or key_groups.stop > self.max_parallelism:
            raise ValueError(f"key_groups {key_groups!r} outside [0, max_parallelism={self.max_parallelism})")
        return key_groups

    def _bounds(self, key_groups: range) -> tuple[bytes, bytes]:
        return _kg_prefix(key_groups.start), _kg_prefix(key_groups.stop)

    def iter_raw(self, key_groups: range | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Raw ``(key bytes, value bytes)`` of the table, optionally of a key-group range, in key order."""
        if key_groups is None:
            yield from self._cf.items()
            return
        lower, upper = self._bounds(self._check_key_groups(key_groups))
        if not len(key_groups):
            return
        yield from self.iter_raw_between(lower, upper)

    def items(self, key_groups: range | None = None) -> Iterator[tuple[tuple, Any]]:  # type: ignore[override]
        """``(key, value)`` pairs, optionally only those of a contiguous key-group range."""
        loads = self.serializer.loads
        for raw_key, raw_value in self.iter_raw(key_groups):
            yield denormalize_key(decode_key(raw_key, _KG_BYTES)), loads(raw_value)

    def delete_key_groups(self, key_groups: range) -> None:
        """Delete every key of a contiguous key-group range (one range tombstone)."""
        self._check_key_groups(key_groups)
        if len(key_groups):
            lower, upper = self._bounds(key_groups)
            self._cf.delete_range(lower, upper)

    def key_group_of_raw(self, raw_key: bytes) -> int:
        """The key group stored in front of a raw RocksDB key."""
        return int.from_bytes(raw_key[:_KG_BYTES], "big")

    def write_raw(self, pairs: Iterable[tuple[bytes, bytes | None]], *, track: bool = False) -> None:
        """Write raw ``(key bytes, value bytes or None to delete)`` pairs in one write batch (restore path).

        Restores are not recorded as changes: they bring back what a checkpoint already holds.
        ``track=True`` records them (for tables whose raw keys a caller builds, e.g. an expiry order).
        """
        keys, values = split_pairs(pairs)
        if track and self._changed is not None:
            self._changed.update(keys)
        self._write_batch(keys, values)

    def raw_keys(self, nkeys: Sequence[NormalizedKey]) -> list[bytes]:
        """The raw keys (key group + canonical bytes) of normalized keys, as this table stores them."""
        return self._encode_many(nkeys)

    def iter_raw_keys(self, lower: bytes, upper: bytes) -> Iterator[bytes]:
        """Raw keys in ``[lower, upper)``, in key order (one seek, then sequential reads)."""
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        yield from self._cf.keys(from_key=lower, read_opt=options)

    def iter_raw_between(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Raw records with keys in ``[lower, upper)``, in key order (one seek, then sequential reads)."""
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        yield from self._cf.items(from_key=lower, read_opt=options)

    def write_raw_columns(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """:meth:`write_raw` of parallel sequences of raw keys and values (None deletes), in one write batch."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        self._write_batch(keys, values)

    def ingest_sst_files(self, paths: Sequence[str]) -> None:
        """Bulk-load SST files (built with this table's raw keys); files on the same filesystem are moved in."""
        if paths:
            options = IngestExternalFileOptions()
            options.set_move_files(True)
            self._cf.ingest_external_file(list(paths), options)

    def compact_key_groups(self, key_groups: range) -> None:
        """Compact the key range of ``key_groups`` (drops range tombstones after a bulk delete)."""
        self._check_key_groups(key_groups)
        if len(key_groups):
            lower, upper = self._bounds(key_groups)
            self._cf.compact_range(lower, upper)

    # ------------------------------------------------------------ lifecycle
    def _create(self) -> Rdict:
        """This table's column family, created now if the table was never written (writes call this)."""
        if isinstance(self._cf, _Absent):
            self._cf, self._handle = self._database.column_family(self.name, create=True)
        return self._cf

    def table(self, name: str, group_columns: int | None = None) -> "RocksDBStore":
        """The sibling table ``name`` of this database (opened once; see ``group_columns`` in the class doc)."""
        if self._database.closed:
            raise StoreClosedError(f"RocksDBStore at {self.path!r} is closed")
        existing = self._database.tables.get(name)
        if existing is not None:
            if existing.group_columns != group_columns:
                raise ValueError(
                    f"table {name!r} is open with group_columns={existing.group_columns!r}, not {group_columns!r}"
                )
            return existing
        return RocksDBStore(
            self.path,
            max_parallelism=self.max_parallelism,
            key_types=self.key_types,
            serializer=self.serializer,
            table=name,
            group_columns=group_columns,
            _database=self._database,
        )

    def tables(self) -> list[str]:
        if self._database.closed:
            raise StoreClosedError(f"RocksDBStore at {self.path!r} is closed")
        return sorted(self._database.table_names())

    def flush(self) -> None:
        """Persist this table's memtable to SST files (durable without a WAL)."""
        self._cf.flush(True)

    def close(self) -> None:
        """Flush every table and close the database (only the store that opened it closes it)."""
        if self._owner:
            self._database.close()

    @property
    def closed(self) -> bool:
        return self._database.closed

    def __repr__(self) -> str:
        return f"RocksDBStore({self.path!r}, table={self.name!r})"
