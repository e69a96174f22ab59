"""Eviction policies of the write-back cache (pluggable, as the ByteDance cache layer's CacheStrategy).

A policy only orders keys; the cache owns the values. ``touch`` is on the hit
path, so each policy binds it to a C-level method where it can (no Python
frame per hit).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Callable, Hashable


class CachePolicy(ABC):
    """Chooses the victim when the cache is full.

    ``insert(key)`` when a key enters, ``touch(key)`` on every hit,
    ``remove(key)`` when a key leaves other than by eviction, ``victim()``
    picks, forgets and returns the key to evict.
    """

    name: str = "?"
    touch: Callable[[Hashable], object]
    insert: Callable[[Hashable], object]

    @abstractmethod
    def remove(self, key: Hashable) -> None: ...

    @abstractmethod
    def victim(self) -> Hashable: ...

    @abstractmethod
    def __len__(self) -> int: ...


class LRUPolicy(CachePolicy):
    """Least recently used: an OrderedDict in access order."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()
        self.touch = self._order.move_to_end  # type: ignore[assignment]
        # setdefault(key) appends a new key with value None: insert as a C call.
        self.insert = self._order.setdefault  # type: ignore[assignment]

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def victim(self) -> Hashable:
        return self._order.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self._order)


class ClockPolicy(CachePolicy):
    """CLOCK (second chance): a hit only sets a reference bit, the cheapest hit path.

    Victim search walks the ring from the hand: a referenced key loses its bit
    and goes behind the hand, the first unreferenced key is evicted.
    """

    name = "clock"

    def __init__(self) -> None:
        self._ring: OrderedDict[Hashable, None] = OrderedDict()
        self._referenced: set[Hashable] = set()
        self.touch = self._referenced.add  # type: ignore[assignment]
        self.insert = self._ring.setdefault  # type: ignore[assignment]

    def remove(self, key: Hashable) -> None:
        self._ring.pop(key, None)
        self._referenced.discard(key)

    def victim(self) -> Hashable:
        ring = self._ring
        referenced = self._referenced
        while True:
            key = ring.popitem(last=False)[0]
            if key in referenced:
                referenced.discard(key)
                ring[key] = None
            else:
                return key

    def __len__(self) -> int:
        return len(self._ring)


class LFUPolicy(CachePolicy):
    """Least frequently used with O(1) buckets; ties go to the least recently used.

    Frequencies are halved when they reach ``max_count`` so that yesterday's
    hot keys can age out.
    """

    name = "lfu"

    def __init__(self, max_count: int = 1 << 16) -> None:
        self._count: dict[Hashable, int] = {}
        self._buckets: dict[int, OrderedDict[Hashable, None]] = {}
        self._min = 0
        self._max_count = max_count

    def insert(self, key: Hashable) -> None:
        self._count[key] = 1
        self._buckets.setdefault(1, OrderedDict())[key] = None
        self._min = 1

    def touch(self, key: Hashable) -> None:  # type: ignore[override]
        count = self._count[key]
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]
            if self._min == count:
                self._min = count + 1
        count += 1
        self._count[key] = count
        self._buckets.setdefault(count, OrderedDict())[key] = None
        if count >= self._max_count:
            self._age()

    def _age(self) -> None:
        counts = {k: max(1, c // 2) for k, c in self._count.items()}
        self._count = counts
        self._buckets = {}
        for key, count in counts.items():
            self._buckets.setdefault(count, OrderedDict())[key] = None
        self._min = min(self._buckets) if self._buckets else 0

    def remove(self, key: Hashable) -> None:
        count = self._count.pop(key, None)
        if count is None:
            return
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]
            if self._min == count:
                self._min = min(self._buckets) if self._buckets else 0

    def victim(self) -> Hashable:
        bucket = self._buckets[self._min]
        key, _ = bucket.popitem(last=False)
        del self._count[key]
        if not bucket:
            del self._buckets[self._min]
            self._min = min(self._buckets) if self._buckets else 0
        return key

    def __len__(self) -> int:
        return len(self._count)


POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUPolicy, "clock": ClockPolicy, "lfu": LFUPolicy}


def make_policy(policy: str | CachePolicy) -> CachePolicy:
    """A policy instance from a name (``"lru"``, ``"clock"``, ``"lfu"``) or an instance."""
    if isinstance(policy, CachePolicy):
        return policy
    if isinstance(policy, str) and policy.lower() in POLICIES:
        return POLICIES[policy.lower()]()
    raise ValueError(f"unknown cache policy {policy!r}; choose one of {sorted(POLICIES)} or pass a CachePolicy")
