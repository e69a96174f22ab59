"""Per-key timeout timers: a sorted index in memory, the timestamps in a store table.

GroupState allows one timeout per key, so the table maps key -> timestamp;
the in-memory ``SortedList`` of ``(timestamp, canonical key bytes)`` finds the
due timers in order without scanning. The table is part of the checkpointed
state; the index is rebuilt from it after a restore.
"""

from __future__ import annotations

from typing import Any

from sortedcontainers import SortedList

from .base import Store
from .keys import NormalizedKey, decode_key, encode_key, normalize_key


class TimerService:
    """Timeout timestamps of keys, ordered by time."""

    def __init__(self, table: Store) -> None:
        self._table = table
        self._index: SortedList = SortedList()
        self._by_key: dict[NormalizedKey, int] = {}
        self.reload()

    def reload(self) -> None:
        """Rebuild the index from the table (after a restore)."""
        self._index.clear()
        self._by_key.clear()
        for key, timestamp in self._table.items():
            nkey = normalize_key(key)
            self._by_key[nkey] = timestamp
            self._index.add((timestamp, encode_key(nkey)))

    def get(self, nkey: NormalizedKey) -> int | None:
        return self._by_key.get(nkey)

    def set(self, nkey: NormalizedKey, timestamp: int) -> None:
        """Set (or move) the key's timer."""
        old = self._by_key.get(nkey)
        if old == timestamp:
            return
        encoded = encode_key(nkey)
        if old is not None:
            self._index.discard((old, encoded))
        self._by_key[nkey] = timestamp
        self._index.add((timestamp, encoded))
        self._table.put(nkey, timestamp)

    def clear(self, nkey: NormalizedKey) -> None:
        old = self._by_key.pop(nkey, None)
        if old is not None:
            self._index.discard((old, encode_key(nkey)))
            self._table.delete(nkey)

    def due(self, threshold: int) -> list[tuple[int, NormalizedKey]]:
        """Timers with timestamp < threshold, earliest first (they stay set until cleared)."""
        stop = self._index.bisect_left((threshold, b""))
        return [(timestamp, decode_key(encoded)) for timestamp, encoded in self._index[:stop]]

    def __len__(self) -> int:
        return len(self._by_key)

    def items(self) -> list[tuple[Any, int]]:
        return list(self._by_key.items())
