"""MemoryStore: the in-memory backend (a dict of live objects per table)."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from .base import MISSING, Store, StoreClosedError
from .keys import NormalizedKey, normalize_key
from .serializers import Serializer


class _ClosedData:
    """Replaces a closed table's dict: every use raises StoreClosedError."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _raise(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreClosedError(f"MemoryStore table {self._name!r} is closed")

    get = pop = items = __getitem__ = __setitem__ = __contains__ = __len__ = __iter__ = _raise


class MemoryStore(Store):
    """Keyed state in a Python dict, with named tables; the fastest store and the reference model.

    Not bounded: use it for small state or as a test double, and put a
    :class:`~state.WriteBackCache` over a :class:`~state.RocksDBStore` for large state.
    """

    def __init__(
        self,
        *,
        name: str = "default",
        max_parallelism: int = 128,
        key_types: Iterable[Any] | None = None,
        serializer: Serializer | None = None,
        _registry: dict[str, "MemoryStore"] | None = None,
    ) -> None:
        super().__init__(name=name, max_parallelism=max_parallelism, key_types=key_types, serializer=serializer)
        self._data: dict[NormalizedKey, Any] = {}
        self._owner = _registry is None  # the store that opened the tables closes them
        self._registry = _registry if _registry is not None else {}
        self._registry[name] = self
        self._closed = False

    # Hot paths: a bare int or str is its own normalized key, and a stored key was
    # validated when it was put, so only misses and new keys need normalize_key().
    def get(self, key: Any, default: Any = None) -> Any:
        if type(key) is int or type(key) is str:
            try:
                return self._data[key]
            except KeyError:
                pass
        return self._data.get(normalize_key(key), default)

    def put(self, key: Any, value: Any) -> None:
        data = self._data
        if (type(key) is int or type(key) is str) and key in data:
            data[key] = value
        else:
            data[normalize_key(key)] = value

    def __contains__(self, key: Any) -> bool:
        return normalize_key(key) in self._data

    def _load(self, nkey: NormalizedKey) -> Any:
        return self._data.get(nkey, MISSING)

    def _load_many(self, nkeys: Sequence[NormalizedKey]) -> list[Any]:
        get = self._data.get
        return [get(k, MISSING) for k in nkeys]

    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        data = self._data
        for nkey, value in items:
            if value is MISSING:
                data.pop(nkey, None)
            else:
                data[nkey] = value

    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        return iter(list(self._data.items()))

    def __len__(self) -> int:
        return len(self._data)

    def table(self, name: str) -> "MemoryStore":
        if self._closed:
            raise StoreClosedError(f"MemoryStore table {self.name!r} is closed")
        existing = self._registry.get(name)
        if existing is not None:
            return existing
        return MemoryStore(
            name=name,
            max_parallelism=self.max_parallelism,
            key_types=self.key_types,
            serializer=self.serializer,
            _registry=self._registry,
        )

    def tables(self) -> list[str]:
        return sorted(self._registry)

    def close(self) -> None:
        """Close this table; the store that opened the tables closes all of them."""
        tables = list(self._registry.values()) if self._owner else [self]
        for table in tables:
            table._closed = True
            table._data = _ClosedData(table.name)  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self._closed:
            return f"MemoryStore(table={self.name!r}, closed)"
        return f"MemoryStore(table={self.name!r}, entries={len(self._data)})"
