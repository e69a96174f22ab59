"""State TTL: when each key's state expires, kept in a store table and indexed by expiry time.

One mechanism for every kind of TTL'd state: ``cached_state(ttl_ms=...)``
(applyInPandasWithState-shaped state) and the per-variable ``ttlDurationMs``
of transformWithStateInPandas processors (composite keys too: the index only
needs normalized keys).

Semantics are Spark's (``StateTTL`` in Spark's ``TTLState.scala``): every
update of a key's state sets its expiry to the batch's processing time plus
the TTL (:func:`expiry_for`), and the state is expired once
``expires_at_ms <= batch processing time`` (:func:`is_expired`). Expired
state is invisible to reads at once and removed by a sweep at the end of the
batch.

The table (key -> expires_at_ms) is the record: it lives in the operator
instance's working store next to the state, so it is checkpointed per key
group with the state and comes back with it after a restore or a rescale.
Two indexes order it by expiry time, with one contract:

- :class:`OrderedExpiryIndex` keeps the order in RocksDB too, in a second
  checkpointed table whose keys sort by (key group, expiry, key): memory is
  one int per key group, a restore costs one seek per key group, a sweep one
  seek per key group with something due plus the entries due. Lookups and
  updates are RocksDB reads and writes. The operator uses it over its
  RocksDB working store (the state's memory stays bounded by the cache).
- :class:`ExpiryIndex` keeps the order in memory: a ``SortedDict`` of expiry
  time -> the keys expiring then (an insertion-ordered dict used as a set),
  rebuilt from the table by :meth:`ExpiryIndex.reload` (O(n), ~150 bytes per
  key). Keys updated in one batch share one expiry time, so there are about
  as many buckets as batches within one TTL, and moving a key is O(1) dict
  work; a sweep visits the due buckets and their keys only. For tables in
  memory, or where O(1) lookups matter more than memory.
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator, Optional, Sequence, Union

from sortedcontainers import SortedDict

from .base import Store
from .keys import NormalizedKey, decode_key
from .raw import KEY_GROUP_BYTES
from .rocksdb import RocksDBStore


def expiry_for(now_ms: int, ttl_ms: int) -> int:
    """When state updated at processing time ``now_ms`` expires: ``now_ms + ttl_ms`` (Spark's rule)."""
    return int(now_ms) + int(ttl_ms)


def is_expired(expires_at_ms: int, now_ms: int) -> bool:
    """Spark's ``StateTTL.isExpired``: expired once the batch's processing time reaches the expiry."""
    return expires_at_ms <= now_ms


def check_ttl_ms(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a positive int (milliseconds) or None; the message names ``name``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (milliseconds) or None, got {value!r}")


class ExpiryIndex:
    """Expiry times of keys over a store table (key -> expires_at_ms), ordered by time in memory.

    Shaped like :class:`state.timers.TimerService`: every change is written to
    the table at once (so the table is always what a checkpoint must hold),
    and :meth:`reload` rebuilds the in-memory index after the table was
    restored. Keys are normalized keys (:func:`state.keys.normalize_key`).

    Costs (n keys with an expiry, b distinct expiry times, k keys returned):
    ``expires_at``/``expired``/``in`` O(1); ``set``/``remove`` O(1) dict work
    (O(log b) when a bucket is created or emptied) plus one table write;
    ``set_many``/``remove_many`` the same per key and one batched table
    write; ``due``/``pop_due`` O(log b + buckets due + k), independent of n,
    ``pop_due`` with one batched table delete; ``reload`` O(n) table reads.
    """

    def __init__(self, table: Store) -> None:
        self._table = table
        self._by_key: dict[NormalizedKey, int] = {}
        self._buckets: SortedDict = SortedDict()  # expires_at_ms -> {nkey: None}, insertion-ordered
        self.reload()

    @property
    def table(self) -> Store:
        """The table that records the expiries (checkpointed with the state it expires)."""
        return self._table

    def reload(self) -> None:
        """Rebuild the index from the table (after a restore or an adopted working store). O(n)."""
        self._by_key.clear()
        self._buckets.clear()
        add = self._add
        for nkey, expires_at in self._table._iter_items():  # normalized keys: no denormalize/normalize round trip
            add(nkey, int(expires_at))

    # ------------------------------------------------------------ reads
    def expires_at(self, nkey: NormalizedKey) -> Optional[int]:
        """The key's expiry time in ms (None: no expiry recorded). O(1)."""
        return self._by_key.get(nkey)

    def expired(self, nkey: NormalizedKey, now_ms: int) -> bool:
        """True when the key has an expiry and it is at or before ``now_ms`` (its state is invisible). O(1)."""
        expires_at = self._by_key.get(nkey)
        return expires_at is not None and expires_at <= now_ms

    def expired_many(self, nkeys: Sequence[NormalizedKey], now_ms: int) -> list[bool]:
        """:meth:`expired` of many keys. O(len(nkeys))."""
        get = self._by_key.get
        return [(expires_at := get(nkey)) is not None and expires_at <= now_ms for nkey in nkeys]

    def due(self, now_ms: int) -> list[NormalizedKey]:
        """Keys expired at ``now_ms``, earliest expiry first; they stay indexed. O(log b + buckets due + k)."""
        out: list[NormalizedKey] = []
        for expires_at in self._buckets.irange(maximum=now_ms):
            out.extend(self._buckets[expires_at])
        return out

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, nkey: object) -> bool:
        return nkey in self._by_key

    def items(self) -> Iterator[tuple[NormalizedKey, int]]:
        """``(nkey, expires_at_ms)`` of every indexed key (O(n); for inspection and tests)."""
        return iter(list(self._by_key.items()))

    # ------------------------------------------------------------ writes
    def set(self, nkey: NormalizedKey, expires_at_ms: int) -> None:
        """Set (or move) the key's expiry; one table write unless it is unchanged."""
        if self._move(nkey, int(expires_at_ms)):
            self._table.put(nkey, int(expires_at_ms))

    def set_many(self, pairs: Iterable[tuple[NormalizedKey, int]]) -> None:
        """Set the expiries of ``(nkey, expires_at_ms)`` pairs, with one batched table write."""
        changed = [(nkey, int(expires_at)) for nkey, expires_at in pairs if self._move(nkey, int(expires_at))]
        if changed:
            self._table.put_many(changed)

    def remove(self, nkey: NormalizedKey) -> None:
        """Forget the key's expiry (its state was removed); no table write when it had none."""
        if self._discard(nkey):
            self._table.delete(nkey)

    def remove_many(self, nkeys: Iterable[NormalizedKey]) -> None:
        """:meth:`remove` of many keys, with one batched table delete."""
        removed = [nkey for nkey in nkeys if self._discard(nkey)]
        if removed:
            self._table.delete_many(removed)

    def pop_due(self, now_ms: int) -> list[NormalizedKey]:
        """Remove and return the keys expired at ``now_ms`` (earliest first), with one batched table delete.

        O(log b + buckets due + k): the keys that do not expire are not visited.
        The caller deletes the returned keys' state.
        """
        buckets = self._buckets
        out: list[NormalizedKey] = []
        while buckets:
            expires_at = buckets.peekitem(0)[0]
            if expires_at > now_ms:
                break
            keys = buckets.popitem(0)[1]
            out.extend(keys)
        if out:
            by_key = self._by_key
            for nkey in out:
                del by_key[nkey]
            self._table.delete_many(out)
        return out

    # ------------------------------------------------------------ the index
    def _add(self, nkey: NormalizedKey, expires_at: int) -> None:
        self._by_key[nkey] = expires_at
        bucket = self._buckets.get(expires_at)
        if bucket is None:
            self._buckets[expires_at] = bucket = {}
        bucket[nkey] = None

    def _discard(self, nkey: NormalizedKey) -> bool:
        old = self._by_key.pop(nkey, None)
        if old is None:
            return False
        bucket = self._buckets[old]
        del bucket[nkey]
        if not bucket:
            del self._buckets[old]
        return True

    def _move(self, nkey: NormalizedKey, expires_at: int) -> bool:
        """Index the key at ``expires_at``; False when it already was (nothing to write)."""
        if self._by_key.get(nkey) == expires_at:
            return False
        self._discard(nkey)
        self._add(nkey, expires_at)
        return True


_pack_be_q = struct.Struct(">q").pack
_unpack_be_q = struct.Struct(">q").unpack_from
#: Bytes of an order key before the state key's canonical bytes: key group (2), int tag (1), expiry (8).
_ORDER_HEAD = KEY_GROUP_BYTES + 1 + 8
_INT_TAG = b"\x01"


def _key_group_of(raw_key: bytes) -> int:
    return (raw_key[0] << 8) | raw_key[1]


def _prefix(key_group: int) -> bytes:
    return key_group.to_bytes(KEY_GROUP_BYTES, "big")


class OrderedExpiryIndex:
    """:class:`ExpiryIndex`'s contract with the order by expiry kept in RocksDB, not in memory.

    Two tables of one RocksDB working store, both checkpointed per key group:
    ``table`` (key -> expires_at_ms, what lookups read) and ``order``, whose
    raw keys are the state key's key group, then ``(expires_at_ms, *key)``
    in canonical key bytes (``read_state(table=...)`` shows them as such), so
    that within a key group the entries sort by expiry. Its memory is one int
    per key group that has entries (a lower bound of its earliest expiry),
    and a restore costs one seek per key group instead of reading every key.

    Costs (k keys returned or given, g key groups with something due, at most
    the instance's key groups): ``expires_at``/``expired`` one point read;
    ``expired_many`` no read at all unless a key's key group has something
    due, else one multi-get of those keys; ``set_many``/``remove_many`` one
    multi-get and one write batch per table; ``due``/``pop_due`` one seek per
    key group with something due plus the k entries due (and one entry past
    them per key group), O(g + k log k), independent of the number of keys;
    ``reload`` one seek per key group. Expiries must be >= 0 (the order
    compares signed big-endian bytes), as processing times are.
    """

    def __init__(self, table: RocksDBStore, order: RocksDBStore, key_groups: Optional[range] = None) -> None:
        if order.max_parallelism != table.max_parallelism:
            raise ValueError(
                f"order table has max_parallelism {order.max_parallelism}, the expiry table {table.max_parallelism}"
            )
        self._table = table
        self._order = order
        self._key_groups = range(table.max_parallelism) if key_groups is None else key_groups
        self._loads = table.serializer.loads
        self._marker = order.serializer.dumps(None)
        # key group -> a lower bound of the earliest expiry in its order range (absent: no entries)
        self._earliest: dict[int, int] = {}
        self.reload()

    @property
    def table(self) -> Store:
        """The table that records the expiries (key -> expires_at_ms)."""
        return self._table

    def reload(self) -> None:
        """Find each key group's earliest expiry: one seek per key group, no key read beyond it."""
        self._earliest.clear()
        for key_group in self._key_groups:
            head = _prefix(key_group)
            for raw in self._order.iter_raw_keys(head, _prefix(key_group + 1)):
                self._earliest[key_group] = _unpack_be_q(raw, KEY_GROUP_BYTES + 1)[0]
                break

    # ------------------------------------------------------------ reads
    def expires_at(self, nkey: NormalizedKey) -> Optional[int]:
        """The key's expiry time in ms (None: no expiry recorded). One point read."""
        value = self._table.get(nkey)
        return None if value is None else int(value)

    def expired(self, nkey: NormalizedKey, now_ms: int) -> bool:
        """True when the key has an expiry at or before ``now_ms``."""
        return self.expired_many([nkey], now_ms)[0]

    def expired_many(self, nkeys: Sequence[NormalizedKey], now_ms: int) -> list[bool]:
        """:meth:`expired` of many keys; reads only keys of key groups with something due, in one multi-get."""
        out = [False] * len(nkeys)
        due_groups = {g for g, earliest in self._earliest.items() if earliest <= now_ms}
        if not due_groups or not nkeys:
            return out
        raws = self._table.raw_keys(nkeys)
        positions = [i for i, raw in enumerate(raws) if _key_group_of(raw) in due_groups]
        if not positions:
            return out
        loads = self._loads
        for i, value in zip(positions, self._table.get_raw_many([raws[i] for i in positions])):
            if value is not None and loads(value) <= now_ms:
                out[i] = True
        return out

    def due(self, now_ms: int) -> list[NormalizedKey]:
        """Keys expired at ``now_ms``, earliest expiry first; they stay indexed. O(g + k log k)."""
        return [decode_key(raw, _ORDER_HEAD) for raw in self._due_order_keys(now_ms)[0]]

    def __contains__(self, nkey: object) -> bool:
        return nkey in self._table

    def items(self) -> Iterator[tuple[NormalizedKey, int]]:
        """``(nkey, expires_at_ms)`` of every key with an expiry (reads the whole table; for inspection and tests)."""
        return ((nkey, int(value)) for nkey, value in self._table._iter_items())

    # ------------------------------------------------------------ writes
    def set(self, nkey: NormalizedKey, expires_at_ms: int) -> None:
        """Set (or move) the key's expiry."""
        self.set_many([(nkey, expires_at_ms)])

    def set_many(self, pairs: Iterable[tuple[NormalizedKey, int]]) -> None:
        """Set the expiries of ``(nkey, expires_at_ms)`` pairs (the last one of a key wins): one multi-get, one batch per table."""
        wanted = {nkey: int(expires_at) for nkey, expires_at in pairs}
        if not wanted:
            return
        negative = [e for e in wanted.values() if e < 0]
        if negative:
            raise ValueError(f"expiry times are processing times in ms >= 0, got {negative[0]!r}")
        nkeys = list(wanted)
        raws = self._table.raw_keys(nkeys)
        loads, marker, earliest = self._loads, self._marker, self._earliest
        table_writes: list[tuple[bytes, Optional[bytes]]] = []
        order_writes: list[tuple[bytes, Optional[bytes]]] = []
        dumps = self._table.serializer.dumps
        for nkey, raw, old in zip(nkeys, raws, self._table.get_raw_many(raws)):
            expires_at = wanted[nkey]
            if old is not None:
                old_expires_at = loads(old)
                if old_expires_at == expires_at:
                    continue
                order_writes.append((self._order_key(raw, old_expires_at), None))
            table_writes.append((raw, dumps(expires_at)))
            order_writes.append((self._order_key(raw, expires_at), marker))
            group = _key_group_of(raw)
            if expires_at < earliest.get(group, expires_at + 1):
                earliest[group] = expires_at
        self._write(table_writes, order_writes)

    def remove(self, nkey: NormalizedKey) -> None:
        """Forget the key's expiry (its state was removed)."""
        self.remove_many([nkey])

    def remove_many(self, nkeys: Iterable[NormalizedKey]) -> None:
        """:meth:`remove` of many keys: one multi-get, one batch per table."""
        nkeys = list(dict.fromkeys(nkeys))
        if not nkeys:
            return
        raws = self._table.raw_keys(nkeys)
        loads = self._loads
        table_writes: list[tuple[bytes, Optional[bytes]]] = []
        order_writes: list[tuple[bytes, Optional[bytes]]] = []
        for raw, old in zip(raws, self._table.get_raw_many(raws)):
            if old is not None:
                table_writes.append((raw, None))
                order_writes.append((self._order_key(raw, loads(old)), None))
        self._write(table_writes, order_writes)  # a stale lower bound in _earliest only costs a seek

    def pop_due(self, now_ms: int) -> list[NormalizedKey]:
        """Remove and return the keys expired at ``now_ms`` (earliest first), one delete batch per table.

        O(g + k log k): one seek per key group with something due, the k due
        entries, and the next entry of each such key group (its new earliest).
        """
        order_keys, next_earliest = self._due_order_keys(now_ms, peek=True)
        for group, earliest in next_earliest.items():
            if earliest is None:
                self._earliest.pop(group, None)
            else:
                self._earliest[group] = earliest
        if not order_keys:
            return []
        table_raws = [raw[:KEY_GROUP_BYTES] + raw[_ORDER_HEAD:] for raw in order_keys]
        self._write([(raw, None) for raw in table_raws], [(raw, None) for raw in order_keys])
        return [decode_key(raw, _ORDER_HEAD) for raw in order_keys]

    # ------------------------------------------------------------ the order
    @staticmethod
    def _order_key(raw_key: bytes, expires_at: int) -> bytes:
        return raw_key[:KEY_GROUP_BYTES] + _INT_TAG + _pack_be_q(expires_at) + raw_key[KEY_GROUP_BYTES:]

    def _due_order_keys(self, now_ms: int, peek: bool = False) -> tuple[list[bytes], dict[int, Optional[int]]]:
        """Order keys due at ``now_ms`` sorted by expiry, and (``peek``) each scanned key group's next expiry."""
        found: list[bytes] = []
        next_earliest: dict[int, Optional[int]] = {}
        for group in sorted(g for g, earliest in self._earliest.items() if earliest <= now_ms):
            head = _prefix(group) + _INT_TAG
            stop = head + _pack_be_q(now_ms + 1)
            upper = _prefix(group + 1) if peek else stop
            following: Optional[int] = None
            for raw in self._order.iter_raw_keys(head, upper):
                if raw >= stop:
                    following = _unpack_be_q(raw, KEY_GROUP_BYTES + 1)[0]
                    break
                found.append(raw)
            next_earliest[group] = following
        found.sort(key=lambda raw: raw[KEY_GROUP_BYTES:_ORDER_HEAD])  # by expiry across key groups (stable)
        return found, next_earliest

    def _write(self, table_writes: list[tuple[bytes, Optional[bytes]]], order_writes: list[tuple[bytes, Optional[bytes]]]) -> None:
        # Tracked: both tables are checkpointed by their changes.
        if table_writes:
            self._table.write_raw(table_writes, track=True)
        if order_writes:
            self._order.write_raw(order_writes, track=True)


#: Either index: the operator uses the RocksDB order next to a RocksDB working store, the in-memory one otherwise.
AnyExpiryIndex = Union[ExpiryIndex, OrderedExpiryIndex]
