"""Eviction policies of the write-back cache: each owns the table of cached entries.

After cachetools: a policy is a small class that owns its table of cached
entries (key -> value) and the order it evicts in. The cache uses:

- ``table[key]``: the value, counting a hit and the access (recency, reference
  bit, frequency); ``KeyError`` when the key is not cached.
- ``table[key] = value`` on a cached key: a new value (an access too).
- ``key in table``, ``len(table)``: plain membership and size.
- ``insert(key, value)``: a key that is not cached enters.
- ``remove(key)``: a key leaves other than by eviction; returns its value.
- ``evict()``: picks, removes and returns ``(key, value)`` of the victim.
- ``items()`` (without touching the order), ``clear()``, ``hits``.

Each operation is O(1) (CLOCK's ``evict`` amortized O(1)). The LRU policy's
table is an ``lru.LRU`` (lru-dict, C), so a cache hit and a put are single C
subscript operations; the other policies' tables are dicts whose subscript
does their bookkeeping in Python.

A policy instance belongs to one cache: :func:`make_policy` builds one per
cache from a name, a class or a factory, and refuses an instance that another
cache already owns.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, MutableMapping, Union

from lru import LRU

_UNBOUNDED = 1 << 62


class CachePolicy(ABC):
    """Owns the cached entries of one cache and chooses the victim when it is full."""

    #: The name in stats (``"lru"``, ``"clock"``, ``"lfu"``; a custom policy sets its own).
    name: str = "custom"
    #: Bytes of bookkeeping per entry beyond the key and value objects (table slot, order node),
    #: measured with tracemalloc while keys churn; tests/state/test_memory_bound.py checks the
    #: resulting bound by the process's RSS.
    entry_overhead: int = 160

    #: The cached entries: subscript read is an access (and a hit), subscript write updates.
    table: MutableMapping[Hashable, Any]

    def __init__(self) -> None:
        self._owner: "weakref.ref[Any] | None" = None

    #: A key that is not cached enters (an attribute: the LRU policy binds its table's C method).
    insert: Callable[[Hashable, Any], None]

    @abstractmethod
    def remove(self, key: Hashable) -> Any: ...

    @abstractmethod
    def evict(self) -> tuple[Hashable, Any]: ...

    def __contains__(self, key: Hashable) -> bool:
        return key in self.table

    def __len__(self) -> int:
        return len(self.table)

    @abstractmethod
    def items(self) -> Iterator[tuple[Hashable, Any]]: ...

    @abstractmethod
    def clear(self) -> None: ...

    @property
    @abstractmethod
    def hits(self) -> int: ...

    def bind(self, owner: Any) -> None:
        """Make this policy the table of ``owner`` (one cache only; held weakly, so no reference cycle)."""
        current = self._owner() if self._owner is not None else None
        if current is not None and current is not owner:
            raise ValueError(
                f"the {type(self).__name__} policy instance is already the table of another cache; "
                "give each cache its own: pass the policy class or a factory, not an instance"
            )
        self._owner = weakref.ref(owner)


class LRUPolicy(CachePolicy):
    """Least recently used, in an ``lru.LRU`` (lru-dict, C): a hit is one C call that finds, reorders and counts."""

    name = "lru"
    entry_overhead = 150  # lru-dict hash slot + node: 100 bytes measured (tracemalloc) fresh, 144 under churn

    def __init__(self) -> None:
        super().__init__()
        self._table = self.table = LRU(_UNBOUNDED)  # reading counts the hit and moves the key to the front
        self._uncounted = 0  # table reads that are not hits (remove), subtracted from the table's count
        self.insert = self._table.__setitem__  # type: ignore[method-assign]

    def remove(self, key: Hashable) -> Any:
        self._uncounted += 1  # pop counts as a hit in the table's statistics
        return self._table.pop(key)

    def evict(self) -> tuple[Hashable, Any]:
        # Not popitem(): lru-dict 1.4.1 keeps a reference to what popitem returns (its issue #64),
        # so every evicted key and value would leak. peek + del releases both.
        key, value = self._table.peek_last_item()
        del self._table[key]
        return key, value

    def items(self) -> Iterator[tuple[Hashable, Any]]:
        return iter(self._table.items())

    def clear(self) -> None:
        self._table.clear()

    @property
    def hits(self) -> int:
        return int(self._table.get_stats()[0]) - self._uncounted


class _AccessTable(dict):
    """A dict whose subscript read (a hit, counted) and write are accesses the subclass records.

    The order bookkeeping lives on the table itself, so nothing refers back to
    the policy or the cache: a dropped cache frees its entries at once.
    """

    __slots__ = ("hits",)

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def _access(self, key: Hashable) -> None:
        raise NotImplementedError

    def __getitem__(self, key: Hashable) -> Any:
        value = dict.__getitem__(self, key)
        self._access(key)
        self.hits += 1
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._access(key)


class _DictPolicy(CachePolicy):
    """A policy whose entries and order live in an _AccessTable."""

    _table: Any

    def items(self) -> Iterator[tuple[Hashable, Any]]:
        return iter(dict.items(self._table))

    @property
    def hits(self) -> int:
        return int(self._table.hits)


class _ClockTable(_AccessTable):
    __slots__ = ("ring", "referenced")

    def __init__(self) -> None:
        super().__init__()
        self.ring: OrderedDict[Hashable, None] = OrderedDict()
        self.referenced: set[Hashable] = set()

    def _access(self, key: Hashable) -> None:
        self.referenced.add(key)


class ClockPolicy(_DictPolicy):
    """CLOCK (second chance): an access only sets a reference bit.

    Victim search walks the ring from the hand: a referenced key loses its bit
    and goes behind the hand, the first unreferenced key is evicted.
    """

    name = "clock"
    entry_overhead = 210  # dict slot + ring node + reference-set slot: 158 bytes measured fresh, more under churn

    def __init__(self) -> None:
        super().__init__()
        self._table = self.table = _ClockTable()

    def insert(self, key: Hashable, value: Any) -> None:
        table = self._table
        dict.__setitem__(table, key, value)
        table.ring[key] = None

    def remove(self, key: Hashable) -> Any:
        table = self._table
        table.ring.pop(key, None)
        table.referenced.discard(key)
        return table.pop(key)

    def evict(self) -> tuple[Hashable, Any]:
        table = self._table
        ring = table.ring
        referenced = table.referenced
        while True:
            key = ring.popitem(last=False)[0]
            if key in referenced:
                referenced.discard(key)
                ring[key] = None
            else:
                return key, table.pop(key)

    def clear(self) -> None:
        self._table.clear()
        self._table.ring.clear()
        self._table.referenced.clear()


class _LFUTable(_AccessTable):
    __slots__ = ("count", "buckets", "min", "max_count")

    def __init__(self, max_count: int) -> None:
        super().__init__()
        self.count: dict[Hashable, int] = {}
        self.buckets: dict[int, OrderedDict[Hashable, None]] = {}
        self.min = 0
        self.max_count = max_count

    def _access(self, key: Hashable) -> None:
        count = self.count[key]
        bucket = self.buckets[count]
        del bucket[key]
        if not bucket:
            del self.buckets[count]
            if self.min == count:
                self.min = count + 1
        count += 1
        self.count[key] = count
        self.buckets.setdefault(count, OrderedDict())[key] = None
        if count >= self.max_count:
            self._age()

    def _age(self) -> None:
        counts = {k: max(1, c // 2) for k, c in self.count.items()}
        self.count = counts
        self.buckets = {}
        for key, count in counts.items():
            self.buckets.setdefault(count, OrderedDict())[key] = None
        self.min = min(self.buckets) if self.buckets else 0


class LFUPolicy(_DictPolicy):
    """Least frequently used with O(1) buckets; ties go to the least recently used.

    Frequencies are halved when one reaches ``max_count`` so that yesterday's
    hot keys can age out.
    """

    name = "lfu"
    entry_overhead = 310  # dict slot + count slot + bucket node: 210 bytes measured fresh, 300 under churn (tracemalloc)

    def __init__(self, max_count: int = 1 << 16) -> None:
        super().__init__()
        self._table = self.table = _LFUTable(max_count)

    def insert(self, key: Hashable, value: Any) -> None:
        table = self._table
        dict.__setitem__(table, key, value)
        table.count[key] = 1
        table.buckets.setdefault(1, OrderedDict())[key] = None
        table.min = 1

    def remove(self, key: Hashable) -> Any:
        table = self._table
        count = table.count.pop(key)
        bucket = table.buckets[count]
        del bucket[key]
        if not bucket:
            del table.buckets[count]
            if table.min == count:
                table.min = min(table.buckets) if table.buckets else 0
        return table.pop(key)

    def evict(self) -> tuple[Hashable, Any]:
        table = self._table
        bucket = table.buckets[table.min]
        key, _ = bucket.popitem(last=False)
        del table.count[key]
        if not bucket:
            del table.buckets[table.min]
            table.min = min(table.buckets) if table.buckets else 0
        return key, table.pop(key)

    def clear(self) -> None:
        table = self._table
        table.clear()
        table.count = {}
        table.buckets = {}
        table.min = 0


POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUPolicy, "clock": ClockPolicy, "lfu": LFUPolicy}

PolicySpec = Union[str, type[CachePolicy], Callable[[], CachePolicy], CachePolicy]


def check_policy_spec(policy: Any) -> None:
    """Refuse what :func:`make_policy` would refuse, without building anything (for configuration objects)."""
    if isinstance(policy, str):
        if policy.lower() not in POLICIES:
            raise ValueError(f"unknown cache policy {policy!r}; choose one of {sorted(POLICIES)}, a CachePolicy class or a factory")
    elif not (isinstance(policy, CachePolicy) or callable(policy)):
        raise ValueError(f"policy must be a name ({sorted(POLICIES)}), a CachePolicy class or a factory, got {policy!r}")


def make_policy(policy: PolicySpec) -> CachePolicy:
    """A new policy from a name (``"lru"``, ``"clock"``, ``"lfu"``), a CachePolicy class or a factory.

    An instance is taken as it is (it is refused when bound to a second cache).
    """
    if isinstance(policy, CachePolicy):
        return policy
    check_policy_spec(policy)
    if isinstance(policy, str):
        return POLICIES[policy.lower()]()
    made = policy()
    if not isinstance(made, CachePolicy):
        raise TypeError(f"the policy factory {policy!r} returned {made!r}, not a CachePolicy")
    return made
