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
The index is in memory: a ``SortedDict`` of expiry time -> the keys expiring
then (an insertion-ordered dict used as a set), rebuilt from the table by
:meth:`ExpiryIndex.reload`. Keys updated in one batch share one expiry time,
so there are about as many buckets as batches within one TTL, and moving a
key is O(1) dict work; a sweep visits the due buckets and their keys only.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

from sortedcontainers import SortedDict

from .base import Store
from .keys import NormalizedKey


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
