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
exceeds the high watermark after an operation.

With the built-in LRU policy the cached entries live in an ``lru.LRU``
(lru-dict, a C hash table with a recency list): a hit is one C call that finds
the value, moves it to the front and counts the hit, so the hit path costs
little more than a dict lookup. Other policies keep a dict and order keys
themselves. A put right after a get of the same key (read-modify-write, what
operators do) skips the key checks: the get just validated it and made it the
most recent entry.

The contract: whatever the bounds, policy and watermarks, the cache over a
store behaves exactly like a dict.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from lru import LRU

from ..base import MISSING, Store, StoreClosedError, StoreError
from ..keys import NormalizedKey, denormalize_key, normalize_key
from .estimator import MemoryEstimator
from .policies import CachePolicy, LRUPolicy, make_policy

if TYPE_CHECKING:
    from .manager import CacheManager


class StateSerializationError(StoreError, TypeError):
    """A cached value could not be serialized for the store. The entry stays cached and dirty."""


class _NotCached:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_CACHED"


_NOT_CACHED: Any = _NotCached()
_UNBOUNDED = 1 << 62


def _ignore(key: Any) -> None:
    """touch/insert of the native LRU table, which orders its keys itself."""


def _check_size(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def _check_fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], got {value!r}")


class WriteBackCache(Store):
    """A bounded write-back cache over ``backend`` with the :class:`~state.Store` interface.

    Args:
        backend: the store that holds what does not fit (usually a RocksDBStore).
        max_entries: at most this many cached entries (None: no entry bound).
        max_bytes: at most this many estimated bytes (sampled serialized sizes).
        policy: ``"lru"`` (default), ``"clock"``, ``"lfu"`` or a CachePolicy.
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

    def __init__(
        self,
        backend: Store,
        *,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        policy: str | CachePolicy = "lru",
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
        _check_size("max_entries", max_entries)
        _check_size("max_bytes", max_bytes)
        _check_size("sync_step", sync_step)
        _check_size("write_batch_entries", write_batch_entries)
        if (low_watermark is None) != (high_watermark is None):
            raise ValueError(
                f"give both low_watermark and high_watermark or neither, got low={low_watermark!r} high={high_watermark!r}"
            )
        if low_watermark is not None:
            _check_fraction("low_watermark", low_watermark)
            _check_fraction("high_watermark", high_watermark)
            if not low_watermark < high_watermark:  # type: ignore[operator]
                raise ValueError(f"low_watermark {low_watermark!r} must be below high_watermark {high_watermark!r}")
            if max_entries is None and max_bytes is None and manager is None:
                raise ValueError("watermarks are fractions of capacity: set max_entries, max_bytes or a manager")
        super().__init__(
            name=backend.name,
            max_parallelism=backend.max_parallelism,
            key_types=backend.key_types,
            serializer=backend.serializer,
        )
        self.cache_name = name or f"{type(backend).__name__}:{backend.name}"
        self._backend = backend
        self._policy = make_policy(policy)
        self._native_lru = type(self._policy) is LRUPolicy
        self._sample_countdown = 1
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._low = low_watermark
        self._high = high_watermark
        self._watermarks = low_watermark is not None
        self._sync_step = sync_step
        self._write_batch_entries = write_batch_entries
        self._estimator = estimator if estimator is not None else MemoryEstimator()
        self._buffered = backend.batches_writes
        self._dumps = backend.serializer.dumps
        self._loads = backend.serializer.loads

        self._data: Any  # dict or lru.LRU: NormalizedKey -> value (MISSING: known absent)
        if self._native_lru:
            # The table keeps recency and counts hits itself; _choose_fast_class picks get() and put().
            self._data = LRU(_UNBOUNDED)
            self._touch = self._policy_insert = _ignore
        else:
            self._data = {}
            self._touch = self._policy.touch
            self._policy_insert = self._policy.insert
        self._data_get = self._data.get
        # The key of the last get: still cached and most recent until the next eviction.
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
        self._choose_fast_class()

        # _hits counts the hits of a dict table; the native LRU table counts its own hits, from
        # which stats() subtracts the table pops that it counts as hits too (_uncounted).
        self._hits = self._uncounted = self._misses = self._loads_found = self._evictions = 0
        self._syncs = self._writes = self._write_batches = self._inserts = 0
        self._capacity = _UNBOUNDED
        self._high_n = self._low_n = _UNBOUNDED
        self._manager: "CacheManager | None" = None
        if manager is not None:
            manager.register(self)  # sets the byte budget through resize()
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

    def resize(self, *, max_entries: Any = ..., max_bytes: Any = ...) -> None:
        """Change the bounds (``...`` keeps one) and evict down to them at once."""
        if max_entries is not ...:
            _check_size("max_entries", max_entries)
            self._max_entries = max_entries
        if max_bytes is not ...:
            _check_size("max_bytes", max_bytes)
            self._max_bytes = max_bytes
            if max_bytes is not None:
                self._after_put = True
                self._choose_fast_class()
        self._recompute_capacity()
        self._evict_to_fit()
        self._bound_dirty()

    @property
    def capacity(self) -> int | None:
        """Current bound in entries (from max_entries and max_bytes), None if unbounded."""
        return None if self._capacity >= _UNBOUNDED else self._capacity

    # ------------------------------------------------------------ reads
    def get(self, key: Any, default: Any = None) -> Any:
        # Hot path: a bare int or str is its own normalized key, and a key in the
        # cache was validated when it entered, so a hit needs no normalization.
        if type(key) is int or type(key) is str:
            try:
                value = self._data[key]
            except KeyError:
                value = self._miss(normalize_key(key))  # validates an int's range
                if self._draining:
                    self._sync(self._sync_step)
                return default if value is MISSING else value
            self._touch(key)
            self._hits += 1
            if self._draining:
                self._sync(self._sync_step)
            return default if value is MISSING else value
        return self._get_normalized(normalize_key(key), default)

    def _get_lru(self, key: Any, default: Any = None) -> Any:
        """get() with the native LRU table: the table counts the hit and moves the key to the front."""
        if type(key) is int or type(key) is str:
            try:
                value = self._data[key]
            except KeyError:
                value = self._miss(normalize_key(key))  # validates an int's range
            self._last = key  # the most recent entry now, even after a miss (its insert evicts others)
            if self._draining:
                self._sync(self._sync_step)
            return default if value is MISSING else value
        return self._get_normalized(normalize_key(key), default)

    def _get_normalized(self, nkey: NormalizedKey, default: Any) -> Any:
        value = self._data_get(nkey, _NOT_CACHED)
        if value is _NOT_CACHED:
            value = self._miss(nkey)
        else:
            self._touch(nkey)
            self._hits += 1
        if self._draining:
            self._sync(self._sync_step)
        return default if value is MISSING else value

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
        nkeys = [normalize_key(k) for k in keys]
        data_get = self._data_get
        touch = self._touch
        out: list[Any] = [None] * len(nkeys)
        missed: dict[NormalizedKey, list[int]] = {}
        for i, nkey in enumerate(nkeys):
            value = data_get(nkey, _NOT_CACHED)
            if value is _NOT_CACHED:
                missed.setdefault(nkey, []).append(i)
            else:
                touch(nkey)
                self._hits += 1
                out[i] = value
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
                if nkey not in self._data:  # an earlier insert of this batch may not have evicted it
                    self._insert(nkey, value)
                for i in positions:
                    out[i] = value
        if self._draining:
            self._sync(self._sync_step)
        return [default if v is MISSING else v for v in out]

    # ------------------------------------------------------------ writes
    def put(self, key: Any, value: Any) -> None:
        if type(key) is int or type(key) is str:
            data = self._data
            if key in data:  # validated when it entered
                self._touch(key)
                data[key] = value
                self._dirty[key] = value
                if self._after_put:
                    self._after_update(key, value)
                return
        self._put_normalized(normalize_key(key), value)

    def _choose_fast_class(self) -> None:
        """With the native LRU table, take the class whose get() and put() fit the bounds.

        A class rather than bound methods stored on the instance: those would make a
        reference cycle, so a dropped cache (and its state) would wait for the cyclic
        garbage collector.
        """
        if self._native_lru:
            self.__class__ = _CheckedLRUTableCache if self._after_put else _LRUTableCache

    def _put_lru_checked(self, key: Any, value: Any) -> None:
        """put() with the native LRU table under a byte bound, a manager or watermarks."""
        if key is self._last or ((type(key) is int or type(key) is str) and key in self._data):
            self._data[key] = value
            self._dirty[key] = value
            self._after_update(key, value)
            return
        self._put_normalized(normalize_key(key), value)

    def _put_lru(self, key: Any, value: Any) -> None:
        """put() with the native LRU table when no bound or watermark needs a look after a put."""
        # The key of the last get is cached and was validated (an eviction resets _last); setting
        # a cached key also moves it to the front.
        if key is self._last or ((type(key) is int or type(key) is str) and key in self._data):
            self._data[key] = value
            self._dirty[key] = value
            return
        self._put_normalized(normalize_key(key), value)

    def _put_normalized(self, nkey: NormalizedKey, value: Any) -> None:
        data = self._data
        if nkey in data:
            self._touch(nkey)
            data[nkey] = value
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
        data = self._data
        if nkey in data:
            # Replace rather than read: a read of the LRU table would count as a hit.
            known_absent = data.pop(nkey) is MISSING
            data[nkey] = MISSING
            self._uncounted += 1
            self._touch(nkey)
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
        checked = [(normalize_key(k), v) for k, v in pairs]
        put = self._put_normalized
        for nkey, value in checked:
            put(nkey, value)

    def delete_many(self, keys: Iterable[Any]) -> None:
        checked = [normalize_key(k) for k in keys]
        for nkey in checked:
            self.delete(nkey)

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
        self._data[nkey] = value
        self._policy_insert(nkey)
        self._inserts += 1
        self._sample_countdown -= 1
        if self._sample_countdown <= 0 and value is not MISSING:
            self._sample(nkey, value)
        if len(self._data) > self._capacity:
            self._evict_to_fit()
        if self._manager is not None and self._inserts % self._manager.check_every == 0:
            self._manager.maybe_rebalance()

    def _sample(self, nkey: NormalizedKey, value: Any) -> None:
        """Sample one entry's size; with a byte bound, the capacity (and watermarks) follow."""
        estimator = self._estimator
        self._sample_countdown = estimator.next_interval()
        if estimator.sample(nkey, value, self._dumps) and self._max_bytes is not None:
            self._recompute_capacity()
            self._evict_to_fit()
            if self._watermarks:
                self._bound_dirty()  # a smaller capacity lowers the watermarks too

    def _evict_to_fit(self) -> None:
        data = self._data
        dirty = self._dirty
        if len(data) <= self._capacity:
            return
        self._last = _NOT_CACHED  # the key of the last get may be a victim
        native = self._native_lru
        victim_of = self._policy.victim
        while len(data) > self._capacity:
            if native:
                victim, value = data.popitem()  # the least recent entry
            else:
                victim = victim_of()
                value = data.pop(victim)
            self._evictions += 1
            if victim in dirty:
                del dirty[victim]
                try:
                    self._stage(victim, value)
                except BaseException:
                    # Keep what was accepted: the entry returns, dirty (as the most recent with the
                    # native LRU table), and the error surfaces.
                    data[victim] = value
                    dirty[victim] = value
                    self._policy_insert(victim)
                    raise
            if len(dirty) > self._low_n:
                self._sync(self._sync_step)

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
            raise StateSerializationError(
                f"cannot serialize the state of key {denormalize_key(nkey)!r} "
                f"({type(value).__name__} value {value!r:.200}) for {self._backend!r}: {exc}"
            ) from exc

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
                serialize = self._serialize
                self._pending.update((nkey, serialize(nkey, value)) for nkey, value in dirty.items())
            else:
                self._backend._write(list(dirty.items()))
                self._writes += len(dirty)
            dirty.clear()
        self._write_out()
        self._draining = False
        if durable:
            self._backend.flush()

    def _load(self, nkey: NormalizedKey) -> Any:
        return self._data[nkey] if nkey in self._data else self._miss(nkey)

    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        for nkey, value in items:
            if value is MISSING:
                self.delete(nkey)
            else:
                self.put(nkey, value)

    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        self._write_out()
        cached = dict(self._data.items())
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
        return len(self._data)

    def estimated_bytes(self) -> int:
        """Cached entries times the sampled entry size (see MemoryEstimator)."""
        return self._estimator.estimate(len(self._data))

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
        hits = self._data.get_stats()[0] - self._uncounted if self._native_lru else self._hits
        reads = hits + self._misses
        return {
            "hits": hits,
            "misses": self._misses,
            "hit_ratio": hits / reads if reads else 0.0,
            "loads": self._loads_found,
            "evictions": self._evictions,
            "dirty": len(self._dirty),
            "entries": len(self._data),
            "syncs": self._syncs,
            "writes": self._writes,
            "write_batches": self._write_batches,
            "pending": len(self._pending),
            "capacity": self.capacity,
            "max_entries": self._max_entries,
            "max_bytes": self._max_bytes,
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
        self._data.clear()
        self._last = _NOT_CACHED
        self._backend.close()

    def __repr__(self) -> str:
        return (
            f"WriteBackCache({self._backend!r}, capacity={self.capacity}, policy={self._policy.name!r}, "
            f"entries={len(self._data)}, dirty={len(self._dirty)})"
        )


class _LRUTableCache(WriteBackCache):
    """A WriteBackCache with the native LRU table and nothing to check after a put (see _choose_fast_class)."""

    get = WriteBackCache._get_lru  # type: ignore[assignment]
    put = WriteBackCache._put_lru  # type: ignore[assignment]


class _CheckedLRUTableCache(_LRUTableCache):
    """A WriteBackCache with the native LRU table under a byte bound, a manager or watermarks."""

    put = WriteBackCache._put_lru_checked  # type: ignore[assignment]
