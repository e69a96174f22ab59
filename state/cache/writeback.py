"""WriteBackCache: a bounded cache of live state objects in front of any store.

Read-through, write-back. A miss loads from the backend (a key the backend
does not hold is cached as absent, so the next read of a new key is a hit);
a put marks the entry dirty; an evicted dirty entry goes to the backend; a
delete is a dirty tombstone. ``flush()`` writes every dirty entry and returns
when they are in the store.

Writes to a backend that serializes (RocksDB) go through a small *write
buffer* of serialized values that reaches the store as one write batch every
``write_batch_entries`` entries (the DataSynchronizer of the ByteDance cache
layer). Reads see the buffer, and it holds bytes, not live objects; its size
is reported in ``stats()["pending"]``.

High/low watermarks (fractions of capacity) bound the dirty entries so that
the synchronous part of a checkpoint (``flush()``) stays short: above the low
watermark every eviction also syncs ``sync_step`` more dirty entries (the
least recently modified); above the high watermark every access syncs
``sync_step`` until dirty is back at the low watermark, and dirty never
exceeds the high watermark after an operation. Only a cache with watermarks
can be draining, so ``WriteBackCache(...)`` with watermarks builds the
``WatermarkedWriteBackCache`` variant, whose reads also advance the drain;
without watermarks, a byte bound or a manager nothing follows a put on a
cached key (no size to sample, no watermark), and ``UnsizedWriteBackCache``
skips that check. The variant is chosen once, in ``__new__``.

The policy owns the table of cached entries (see ``policies``): the cache
has one get path and one put path, over subscripts of the policy's table
(read: a counted access; write on a cached key: an update) and its
``insert``, taken once at construction. With the built-in LRU policy the
table is an ``lru.LRU`` (lru-dict, C), so a hit is one C call that finds the
value, moves it to the front and counts the hit. A put right after a get of
the same key (read-modify-write, what operators do) skips the key checks:
the get just validated it.

A byte bound is a bound on memory: entries are sized by sampling the live
key and value objects (``MemoryEstimator``), plus the policy's measured
per-entry bookkeeping and the dirty-set slot.

The contract: whatever the bounds, policy and watermarks, the cache over a
store behaves exactly like a dict.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ..base import (
    MISSING,
    StateSerializationError,  # noqa: F401 - re-exported by state.cache
    Store,
    StoreClosedError,
    serialization_error,
    unserializable_value_error,
)
from ..keys import NormalizedKey, normalize_key, normalize_keys, split_pairs
from .estimator import MemoryEstimator
from .malloc import pin_mmap_threshold, release_free_memory
from .policies import CachePolicy, PolicySpec, make_policy

if TYPE_CHECKING:
    from .manager import CacheManager


class _NotCached:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_CACHED"


_NOT_CACHED: Any = _NotCached()
_UNBOUNDED = 1 << 62
#: Bytes a dirty entry adds (its slot in the dirty dict): 53 measured with tracemalloc on a fresh
#: dict, 96 on one that churns keys (deleted slots stay allocated until the dict resizes).
DIRTY_SLOT_BYTES = 96


def check_size(name: str, value: Any) -> None:
    """ValueError naming ``name`` and the value unless it is a positive int or None (a bound, a step)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def _check_fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], got {value!r}")


def check_watermarks(low_watermark: Any, high_watermark: Any, *, bounded: bool) -> None:
    """ValueError naming the value unless the watermarks are both None, or fractions ``0 < low < high <= 1``
    of a cache with a bound (``bounded``: max_entries, max_bytes or a manager)."""
    if (low_watermark is None) != (high_watermark is None):
        raise ValueError(
            f"give both low_watermark and high_watermark or neither, got low={low_watermark!r} high={high_watermark!r}"
        )
    if low_watermark is None:
        return
    _check_fraction("low_watermark", low_watermark)
    _check_fraction("high_watermark", high_watermark)
    if not low_watermark < high_watermark:
        raise ValueError(f"low_watermark {low_watermark!r} must be below high_watermark {high_watermark!r}")
    if not bounded:
        raise ValueError("watermarks are fractions of capacity: set max_entries, max_bytes or a manager")


class WriteBackCache(Store):
    """A bounded write-back cache over ``backend`` with the :class:`~state.Store` interface.

    Args:
        backend: the store that holds what does not fit (usually a RocksDBStore).
        max_entries: at most this many cached entries (None: no entry bound).
        max_bytes: at most this many estimated bytes in memory (sampled sizes of the
            live keys and values plus the cache's own bookkeeping per entry).
        policy: ``"lru"`` (default), ``"clock"``, ``"lfu"``, a CachePolicy class or a
            factory returning a new CachePolicy; an instance is taken only if no other
            cache owns it.
        low_watermark, high_watermark: dirty-entry watermarks as fractions of
            capacity, ``0 < low < high <= 1``; both or neither.
        sync_step: dirty entries synced per eviction/access above a watermark.
        write_batch_entries: evicted or synced entries buffered per write batch.
        estimator: the MemoryEstimator (one is made if None).
        manager: a CacheManager that grants this cache its byte budget.
        name: the cache's name in stats and in its manager.

    Not thread-safe: one cache per operator instance, as Spark runs one task
    per Python worker.
    """

    def __new__(
        cls,
        *args: Any,
        low_watermark: float | None = None,
        max_bytes: int | None = None,
        manager: "CacheManager | None" = None,
        **kwargs: Any,
    ) -> "WriteBackCache":
        # The variant is chosen once, here. Only a cache with watermarks can be draining, so only
        # its reads pay for advancing the drain (a hit without it is ~5 % faster); only a cache
        # bounded by bytes or watermarks has work after a put on a cached key, so the others' put
        # skips that check (~4 % on a read-modify-write hit, benchmarks.state_cache).
        if cls is WriteBackCache:
            if low_watermark is not None:
                cls = WatermarkedWriteBackCache
            elif max_bytes is None and manager is None:
                cls = UnsizedWriteBackCache
        return super().__new__(cls)

    def __init__(
        self,
        backend: Store,
        *,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        policy: PolicySpec = "lru",
        low_watermark: float | None = None,
        high_watermark: float | None = None,
        sync_step: int = 3,
        write_batch_entries: int = 256,
        estimator: MemoryEstimator | None = None,
        manager: "CacheManager | None" = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(backend, Store):
            raise TypeError(f"backend must be a state Store, got {type(backend).__name__}")
        check_size("max_entries", max_entries)
        check_size("max_bytes", max_bytes)
        check_size("sync_step", sync_step)
        check_size("write_batch_entries", write_batch_entries)
        check_watermarks(low_watermark, high_watermark, bounded=not (max_entries is None and max_bytes is None and manager is None))
        super().__init__(
            name=backend.name,
            max_parallelism=backend.max_parallelism,
            key_types=backend.key_types,
            serializer=backend.serializer,
        )
        self.cache_name = name or f"{type(backend).__name__}:{backend.name}"
        self._backend = backend
        self._policy = make_policy(policy)
        self._policy.bind(self)
        # The policy's table (an lru.LRU for LRU: every subscript a C call) and its insert.
        self._table = self._policy.table
        self._policy_insert = self._policy.insert
        self._sample_countdown = 1
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._low = low_watermark
        self._high = high_watermark
        self._watermarks = low_watermark is not None
        self._sync_step = sync_step
        self._write_batch_entries = write_batch_entries
        self._estimator = estimator if estimator is not None else MemoryEstimator()
        if self._estimator.entry_overhead is None:
            self._estimator.entry_overhead = self._policy.entry_overhead + DIRTY_SLOT_BYTES
        self._buffered = backend.batches_writes
        self._dumps = backend.serializer.dumps
        self._loads = backend.serializer.loads

        # The key of the last get: still cached until the next eviction.
        self._last: Any = _NOT_CACHED
        # Dirty entries (key -> value, the value also cached), in order of last modification when
        # watermarks sync the oldest first. Holding the values lets flush and sync read them without
        # touching the table's recency. (Not an lru.LRU: its items() is a list of tuples, whose
        # allocation at every flush set off full garbage collections, 0.5 s at 64 MB of entries.)
        self._dirty: dict[NormalizedKey, Any] = OrderedDict() if self._watermarks else {}
        self._pending: dict[NormalizedKey, bytes | None] = {}
        self._draining = False
        self._closed = False
        # After a put: watermark check and, with a byte bound, size sampling of updated values.
        self._after_put = self._watermarks or max_bytes is not None or manager is not None
        # A bound on memory: freed tables and entries must leave the process (see malloc.py).
        self._trims = max_bytes is not None or manager is not None
        if self._trims:
            pin_mmap_threshold()
        self._evictions_at_trim = 0

        self._misses = self._loads_found = self._evictions = 0
        self._syncs = self._writes = self._write_batches = self._inserts = 0
        self._capacity = _UNBOUNDED
        self._high_n = self._low_n = _UNBOUNDED
        self._manager: "CacheManager | None" = None
        if manager is not None:
            manager.register(self)  # attaches it and sets the byte budget through resize()
        else:
            self._recompute_capacity()

    # ------------------------------------------------------------ capacity
    def _recompute_capacity(self) -> None:
        capacity = self._max_entries if self._max_entries is not None else _UNBOUNDED
        if self._max_bytes is not None:
            entry_bytes = self._estimator.entry_bytes
            if entry_bytes > 0:
                capacity = min(capacity, max(1, int(self._max_bytes // entry_bytes)))
        self._capacity = capacity
        if self._watermarks and capacity < _UNBOUNDED:
            self._high_n = max(1, int(self._high * capacity))  # type: ignore[operator]
            self._low_n = min(self._high_n - 1, int(self._low * capacity))  # type: ignore[operator]
        else:
            self._high_n = self._low_n = _UNBOUNDED

    def attach(self, manager: "CacheManager | None") -> None:
        """The manager that grants this cache's bytes (called by its ``register``/``unregister``)."""
        self._manager = manager

    def resize(self, *, max_entries: Any = ..., max_bytes: Any = ...) -> None:
        """Change the bounds (``...`` keeps one) and evict down to them at once.

        A byte bound can be changed or dropped, and set only on a cache built
        with one (``max_bytes=`` or a manager): a cache built without it does
        not size the values its puts update, so it refuses ``max_bytes=``.
        """
        if max_entries is not ...:
            check_size("max_entries", max_entries)
            self._max_entries = max_entries
        if max_bytes is not ...:
            check_size("max_bytes", max_bytes)
            if max_bytes is not None and not self.sized:
                raise ValueError(
                    f"cache {self.cache_name!r} was built without a byte bound, so its puts do not size "
                    f"the values they update; build it with max_bytes= (any value) or a manager to "
                    f"resize it to max_bytes={max_bytes!r}"
                )
            self._max_bytes = max_bytes
            if max_bytes is not None and not self._trims:
                self._trims = True
                pin_mmap_threshold()
        self._recompute_capacity()
        self._evict_to_fit()
        self._bound_dirty()

    @property
    def sized(self) -> bool:
        """Whether a put re-measures the values it updates, so the cache can take a byte bound.

        True when built with ``max_bytes``, a manager or watermarks (see :meth:`resize`).
        """
        return self._after_put

    @property
    def capacity(self) -> int | None:
        """Current bound in entries (from max_entries and max_bytes), None if unbounded."""
        return None if self._capacity >= _UNBOUNDED else self._capacity

    # ------------------------------------------------------------ reads
    def get(self, key: Any, default: Any = None, _MISSING: Any = MISSING) -> Any:
        """The value of ``key`` (``default`` if it has none). A hit is O(1); a miss reads the backend."""
        # A bare int or str is its own normalized key, and a cached key was validated when it
        # entered, so a hit needs no normalization (a miss validates an int's range).
        if type(key) is int or type(key) is str:
            try:
                value = self._table[key]
            except KeyError:
                # Not remembered as _last: a policy may evict a new key at once (LFU: count 1).
                value = self._miss(normalize_key(key))
            else:
                self._last = key
        else:
            nkey = normalize_key(key)
            try:
                value = self._table[nkey]
            except KeyError:
                value = self._miss(nkey)
        return default if value is _MISSING else value

    def __contains__(self, key: Any) -> bool:
        return self.get(key, MISSING) is not MISSING

    def _miss(self, nkey: NormalizedKey) -> Any:
        self._misses += 1
        if self._closed:
            raise StoreClosedError(f"cache {self.cache_name!r} is closed")
        pending = self._pending
        if nkey in pending:
            raw = pending[nkey]
            value = MISSING if raw is None else self._loads(raw)
        else:
            value = self._backend._load(nkey)
            if value is not MISSING:
                self._loads_found += 1
        self._insert(nkey, value)
        return value

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """Values of ``keys``; all misses are loaded in one batched read of the backend."""
        nkeys = normalize_keys(keys)
        table = self._table
        out: list[Any] = [None] * len(nkeys)
        missed: dict[NormalizedKey, list[int]] = {}
        for i, nkey in enumerate(nkeys):
            if nkey in table:
                out[i] = table[nkey]
            else:
                missed.setdefault(nkey, []).append(i)
        if missed:
            if self._closed:
                raise StoreClosedError(f"cache {self.cache_name!r} is closed")
            self._misses += sum(len(v) for v in missed.values())
            pending = self._pending
            loads = self._loads
            values: dict[NormalizedKey, Any] = {}
            to_load = []
            for nkey in missed:
                if nkey in pending:
                    raw = pending[nkey]
                    values[nkey] = MISSING if raw is None else loads(raw)
                else:
                    to_load.append(nkey)
            for nkey, value in zip(to_load, self._backend._load_many(to_load)):
                values[nkey] = value
                if value is not MISSING:
                    self._loads_found += 1
            for nkey, positions in missed.items():
                value = values[nkey]
                if nkey not in table:  # an earlier insert of this batch may not have evicted it
                    self._insert(nkey, value)
                for i in positions:
                    out[i] = value
        if self._draining:
            self._sync(self._sync_step)
        return [default if v is MISSING else v for v in out]

    # ------------------------------------------------------------ writes
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` in the cache (dirty until written). O(1) plus any eviction."""
        # The key of the last get is cached and was validated (an eviction resets _last).
        if key is self._last or ((type(key) is int or type(key) is str) and key in self._table):
            self._table[key] = value
            self._dirty[key] = value
            if self._after_put:
                self._after_update(key, value)
            return
        self._put_normalized(normalize_key(key), value)

    def _put_normalized(self, nkey: NormalizedKey, value: Any) -> None:
        if nkey in self._table:
            self._table[nkey] = value
            self._dirty[nkey] = value
            if self._after_put:
                self._after_update(nkey, value)
        else:
            if self._closed:
                raise StoreClosedError(f"cache {self.cache_name!r} is closed")
            self._dirty[nkey] = value  # dirty before insert: insert may evict this very key
            self._insert(nkey, value)
            if self._watermarks:
                self._after_dirty(nkey)

    def delete(self, key: Any) -> None:
        nkey = normalize_key(key)
        if nkey in self._table:
            # Replace rather than read: a read would count as a hit.
            known_absent = self._policy.remove(nkey) is MISSING
            self._policy_insert(nkey, MISSING)
            if known_absent and nkey not in self._dirty:
                return  # known absent and clean: nothing to delete
            self._dirty[nkey] = MISSING
        else:
            if self._closed:
                raise StoreClosedError(f"cache {self.cache_name!r} is closed")
            self._dirty[nkey] = MISSING
            self._insert(nkey, MISSING)
        if self._watermarks:
            self._after_dirty(nkey)

    def put_many(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Put each pair; every key is validated before anything is written."""
        keys, values = split_pairs(pairs)
        put = self._put_normalized
        for nkey, value in zip(normalize_keys(keys), values):
            put(nkey, value)

    def delete_many(self, keys: Iterable[Any]) -> None:
        for nkey in normalize_keys(keys):
            self.delete(nkey)

    def pop_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """Delete distinct ``keys`` and return their values (``default`` where absent), caching nothing.

        What closing a window does: its state is read once more and deleted, and
        is never read again, so no key is inserted (or moved) in the cache's
        table on the way: a value not cached is read from the backend in one
        batch, each delete goes towards the backend as :meth:`delete_uncached`'s
        do. Every key is validated before anything is deleted. O(len(keys)).
        """
        checked = normalize_keys(keys)
        if len(set(checked)) != len(checked):
            raise ValueError("pop_many takes distinct keys")
        if self._closed:
            raise StoreClosedError(f"cache {self.cache_name!r} is closed")
        table, pending, remove = self._table, self._pending, self._policy.remove
        out: list[Any] = [MISSING] * len(checked)
        to_load: list[int] = []
        for i, nkey in enumerate(checked):
            if nkey in table:
                out[i] = remove(nkey)
            elif nkey in pending:
                raw = pending[nkey]
                if raw is not None:
                    out[i] = self._loads(raw)
            else:
                to_load.append(i)
        if to_load:
            self._misses += len(to_load)
            for i, value in zip(to_load, self._backend._load_many([checked[i] for i in to_load])):
                out[i] = value
        self._delete_uncached(checked)
        return [default if v is MISSING else v for v in out]

    def delete_uncached(self, keys: Iterable[Any]) -> None:
        """Delete keys that will not be read again, keeping no entry for them in the cache.

        :meth:`delete` caches each key's absence (a later read needs no lookup);
        keys that never come back (a closed window's) would fill the cache with
        such entries and push live ones out. Here each key leaves the cache and
        its delete goes towards the backend as an evicted entry's write does (in
        the write buffer until the next flush; a read meanwhile sees it gone).
        Every key is validated before anything is deleted.
        """
        self._delete_uncached(normalize_keys(keys))

    def _delete_uncached(self, checked: list[NormalizedKey]) -> None:
        if self._closed:
            raise StoreClosedError(f"cache {self.cache_name!r} is closed")
        table, dirty, remove = self._table, self._dirty, self._policy.remove
        self._last = _NOT_CACHED  # the key of the last get may be one of them
        for nkey in checked:
            if nkey in table:
                remove(nkey)
            dirty.pop(nkey, None)
        if self._buffered:  # one write of the tombstones (the buffer's batch size bounds pending, not this)
            self._pending.update(dict.fromkeys(checked))
            self._write_out()
        else:
            self._backend._write([(nkey, MISSING) for nkey in checked])
            self._writes += len(checked)

    def _after_update(self, nkey: NormalizedKey, value: Any) -> None:
        """After a put on a cached key: sample its (possibly grown) size when due, then the watermarks."""
        if self._watermarks:
            self._dirty.move_to_end(nkey)  # type: ignore[attr-defined]  # the most recently modified
        self._sample_countdown -= 1
        if self._sample_countdown <= 0:
            self._sample(nkey, value)
        if self._draining or len(self._dirty) > self._high_n:  # never without watermarks
            self._bound_dirty()

    def _after_dirty(self, nkey: NormalizedKey) -> None:
        """After a key became dirty (with watermarks): the most recently modified; dirty under the high watermark."""
        dirty = self._dirty
        if nkey in dirty:  # it may have been evicted by its own insert
            dirty.move_to_end(nkey)  # type: ignore[attr-defined]
        if self._draining or len(dirty) > self._high_n:
            self._bound_dirty()

    def _bound_dirty(self) -> None:
        dirty_count = len(self._dirty)
        if dirty_count > self._high_n:
            # Never above the high watermark after an operation; then drain to the low one.
            self._sync(dirty_count - self._high_n + self._sync_step)
            self._draining = len(self._dirty) > self._low_n
        elif self._draining:
            self._sync(self._sync_step)

    # ------------------------------------------------------------ insertion and eviction
    def _insert(self, nkey: NormalizedKey, value: Any) -> None:
        self._policy_insert(nkey, value)
        self._inserts += 1
        self._sample_countdown -= 1
        if self._sample_countdown <= 0 and value is not MISSING:
            self._sample(nkey, value)
        if len(self._table) > self._capacity:
            self._evict_to_fit()
        if self._manager is not None and self._inserts % self._manager.check_every == 0:
            self._manager.maybe_rebalance()

    def _sample(self, nkey: NormalizedKey, value: Any) -> None:
        """Sample one entry's size; with a byte bound, the capacity (and watermarks) follow."""
        estimator = self._estimator
        self._sample_countdown = estimator.next_interval()
        if estimator.sample(nkey, value) and self._max_bytes is not None:
            self._recompute_capacity()
            self._evict_to_fit()
            if self._watermarks:
                self._bound_dirty()  # a smaller capacity lowers the watermarks too

    def _evict_to_fit(self) -> None:
        table = self._table
        if len(table) <= self._capacity:
            return
        dirty = self._dirty
        self._last = _NOT_CACHED  # the key of the last get may be a victim
        evict = self._policy.evict
        while len(table) > self._capacity:
            victim, value = evict()
            self._evictions += 1
            if victim in dirty:
                del dirty[victim]
                try:
                    self._stage(victim, value)
                except BaseException:
                    # Keep what was accepted: the entry returns, dirty, and the error surfaces.
                    self._policy_insert(victim, value)
                    dirty[victim] = value
                    raise
            if len(dirty) > self._low_n:
                self._sync(self._sync_step)
        if self._trims and self._evictions - self._evictions_at_trim >= max(self._capacity, 65_536):
            self._evictions_at_trim = self._evictions
            release_free_memory()

    def _sync(self, count: int) -> None:
        """Write the ``count`` least recently modified dirty entries; they stay cached, clean.

        Only watermarks sync, so the dirty entries are an OrderedDict in order of modification.
        """
        dirty = self._dirty
        for _ in range(min(count, len(dirty))):
            nkey, value = dirty.popitem(last=False)  # type: ignore[call-arg]  # the least recently modified
            try:
                self._stage(nkey, value)
            except BaseException:
                dirty[nkey] = value  # still dirty, still the oldest
                dirty.move_to_end(nkey, last=False)  # type: ignore[attr-defined]
                raise
            self._syncs += 1
        if self._draining and len(dirty) <= self._low_n:
            self._draining = False

    def _stage(self, nkey: NormalizedKey, value: Any) -> None:
        """Send one entry towards the backend (through the write buffer when it batches)."""
        if self._buffered:
            self._pending[nkey] = self._serialize(nkey, value)
            if len(self._pending) >= self._write_batch_entries:
                self._write_out()
        else:
            self._backend._write(((nkey, value),))
            self._writes += 1

    def _serialize(self, nkey: NormalizedKey, value: Any) -> bytes | None:
        """The bytes the backend stores for ``value`` (None for a tombstone), or StateSerializationError."""
        if value is MISSING:
            return None
        try:
            return self._dumps(value)
        except Exception as exc:
            raise unserializable_value_error(self._backend, nkey, value, exc) from exc

    def _write_out(self) -> None:
        pending = self._pending
        if pending:
            self._backend._write_serialized(pending.items())
            self._writes += len(pending)
            self._write_batches += 1
            pending.clear()  # only after the backend took them

    # ------------------------------------------------------------ flush, iteration, lifecycle
    def flush(self, durable: bool = False) -> None:
        """Write every dirty entry to the backend in one write batch; return when the backend holds them.

        This is the synchronous part of a checkpoint: afterwards the backend
        answers every read as the cache does. The entries are as durable as the
        backend makes a write (RocksDB: in the memtable, and in the WAL if
        enabled). ``durable=True`` also asks the backend to persist
        (``backend.flush()``: RocksDB writes its memtables to SST files);
        ``close()`` always does.
        """
        dirty = self._dirty
        if dirty:
            if self._buffered:
                # Serialize everything before writing: a value that fails leaves every entry dirty.
                # A generator, not a list: thousands of live tuples would set off garbage collections.
                # One try for the batch; only a failure looks for the key that fails.
                dumps, missing = self._dumps, MISSING
                try:
                    self._pending.update(
                        (nkey, None if value is missing else dumps(value)) for nkey, value in dirty.items()
                    )
                except Exception as exc:
                    raise serialization_error(self._backend, list(dirty.items()), exc) from exc
            else:
                self._backend._write(list(dirty.items()))
                self._writes += len(dirty)
            dirty.clear()
        self._write_out()
        self._draining = False
        if durable:
            self._backend.flush()

    def _load(self, nkey: NormalizedKey) -> Any:
        return self._table[nkey] if nkey in self._table else self._miss(nkey)

    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        for nkey, value in items:
            if value is MISSING:
                self.delete(nkey)
            else:
                self.put(nkey, value)

    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        self._write_out()
        cached = dict(self._policy.items())
        seen: set[NormalizedKey] = set()
        for nkey, value in self._backend._iter_items():
            if nkey in cached:
                seen.add(nkey)
                value = cached[nkey]
                if value is MISSING:
                    continue
            yield nkey, value
        for nkey, value in cached.items():
            if value is not MISSING and nkey not in seen:
                yield nkey, value

    def table(self, name: str) -> Store:
        """The backend's sibling table (uncached: wrap it in its own cache if needed)."""
        return self._backend.table(name)

    def tables(self) -> list[str]:
        return self._backend.tables()

    @property
    def backend(self) -> Store:
        """The store behind the cache."""
        return self._backend

    @property
    def policy(self) -> CachePolicy:
        """The eviction policy in use."""
        return self._policy

    def dirty_count(self) -> int:
        """Cached entries not yet written to the backend."""
        return len(self._dirty)

    def __len__(self) -> int:
        """Cached entries (including cached absences), not the size of the backend."""
        return len(self._table)

    def estimated_bytes(self) -> int:
        """Cached entries times the sampled entry size (see MemoryEstimator)."""
        return self._estimator.estimate(len(self._table))

    def rebind(self, backend: Store) -> None:
        """Point a flushed cache at ``backend``: the same store reopened (its contents must be unchanged).

        Cached entries stay valid only because nothing wrote to the store in
        between; the caller guarantees that (see OperatorInstance.resume).
        """
        if self._dirty or self._pending:
            raise RuntimeError(f"{self.cache_name}: flush() before rebind(); {len(self._dirty)} entries are dirty")
        if backend.serializer is not self._backend.serializer and type(backend.serializer) is not type(self._backend.serializer):
            raise TypeError(f"{self.cache_name}: the new backend serializes differently ({backend.serializer!r})")
        self._backend = backend
        self._buffered = backend.batches_writes
        self._dumps = backend.serializer.dumps
        self._loads = backend.serializer.loads

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: hits, misses, hit_ratio, loads, evictions, dirty, entries, syncs, ..."""
        hits = self._policy.hits
        reads = hits + self._misses
        return {
            "hits": hits,
            "misses": self._misses,
            "hit_ratio": hits / reads if reads else 0.0,
            "loads": self._loads_found,
            "evictions": self._evictions,
            "dirty": len(self._dirty),
            "entries": len(self._table),
            "syncs": self._syncs,
            "writes": self._writes,
            "write_batches": self._write_batches,
            "pending": len(self._pending),
            "capacity": self.capacity,
            "max_entries": self._max_entries,
            "max_bytes": self._max_bytes,
            "granted_bytes": self._max_bytes if self._manager is not None else None,
            "estimated_bytes": self.estimated_bytes(),
            "entry_bytes": self._estimator.entry_bytes,
            "policy": self._policy.name,
        }

    def close(self) -> None:
        """Flush, detach from the manager, and close the backend."""
        if self._closed:
            return
        self.flush(durable=True)
        self._closed = True
        if self._manager is not None:
            self._manager.unregister(self)
        self._policy.clear()
        self._last = _NOT_CACHED
        self._backend.close()

    def __repr__(self) -> str:
        return (
            f"WriteBackCache({self._backend!r}, capacity={self.capacity}, policy={self._policy.name!r}, "
            f"entries={len(self._table)}, dirty={len(self._dirty)})"
        )


class UnsizedWriteBackCache(WriteBackCache):
    """The WriteBackCache made without ``max_bytes``, a manager and watermarks (``WriteBackCache(...)`` picks it).

    Nothing follows a put on a cached key (no size to sample, no watermark to
    check), so its put skips that check; for the same reason it refuses a byte
    bound later (:meth:`resize`).
    """

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` in the cache (dirty until written). O(1) plus any eviction."""
        if key is self._last or ((type(key) is int or type(key) is str) and key in self._table):
            self._table[key] = value
            self._dirty[key] = value
            return
        self._put_normalized(normalize_key(key), value)


class WatermarkedWriteBackCache(WriteBackCache):
    """The WriteBackCache made when watermarks are given (``WriteBackCache(...)`` picks it).

    Above the high watermark every access, reads included, syncs ``sync_step``
    dirty entries until dirty is back at the low watermark. A hit costs one
    more Python call than without watermarks.
    """

    def get(self, key: Any, default: Any = None, _get: Any = WriteBackCache.get) -> Any:
        """:meth:`WriteBackCache.get`, then one more sync step while draining."""
        value = _get(self, key, default)
        if self._draining:
            self._sync(self._sync_step)
        return value
