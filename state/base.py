"""The one interface every keyed store implements (memory, RocksDB, the write-back cache).

Public methods take user keys (a scalar or a tuple of scalars, see
:mod:`state.keys`). Subclasses implement a small set of primitives on
*normalized* keys, which lets a cache that has already normalized a key talk
to its backend without doing it twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator, Sequence

from .keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism, key_group_from_hash
from .keys import NormalizedKey, denormalize_key, normalize_key, normalize_keys, normalize_types, spark_hash, split_pairs
from .serializers import DEFAULT_SERIALIZER, Serializer


class _Missing:
    """Sentinel for "no value": an absent key in a load, a delete in a write."""

    __slots__ = ()
    _instance: "_Missing | None" = None

    def __new__(cls) -> "_Missing":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class StoreError(RuntimeError):
    """Base class of store errors."""


class StoreClosedError(StoreError):
    """An operation on a store after ``close()``."""


class StoreLockedError(StoreError):
    """The store's files are held by another process (or another open store)."""


class StateSerializationError(StoreError, TypeError):
    """A state value could not be serialized for its store.

    The message names the key (as ``store.items()`` gives it) and the store with its
    table; ``__cause__`` is the serializer's own exception. A TypeError too, as
    pickle's own error is, so handlers of that still catch it. Nothing of the
    failing write reached the store (a cache keeps the entry cached and dirty).
    """


def _short_repr(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an error message must not fail on the value's repr
        return f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[:limit] + "..."


def unserializable_value_error(store: "Store", nkey: NormalizedKey, value: Any, exc: BaseException) -> StateSerializationError:
    """The error for ``value`` of ``nkey`` that ``store.serializer`` failed on with ``exc`` (raise it ``from exc``)."""
    return StateSerializationError(
        f"cannot serialize the state of key {denormalize_key(nkey)!r} "
        f"({type(value).__name__} value {_short_repr(value)}) for {store!r}: {exc}"
    )


def serialization_error(
    store: "Store", items: Iterable[tuple[NormalizedKey, Any]], exc: BaseException
) -> StateSerializationError:
    """The error for a batch of ``(nkey, value)`` pairs (MISSING: a delete) whose serialization raised ``exc``.

    Only once a batch failed: serializes its values again one by one to name the first
    key that fails (raise the result ``from exc``). ``items`` must be the batch itself
    (a list or tuple), not a spent iterator.
    """
    dumps = store.serializer.dumps
    for nkey, value in items:
        if value is MISSING:
            continue
        try:
            dumps(value)
        except Exception:  # noqa: BLE001 - the batch's own exception is the cause
            return unserializable_value_error(store, nkey, value, exc)
    return StateSerializationError(f"cannot serialize a state value for {store!r}: {exc}")


class Store(ABC):
    """A dict-like keyed store of one named table.

    ``get(key, default=None)``, ``put(key, value)``, ``delete(key)``,
    ``get_many(keys) -> list``, ``put_many(pairs)``, ``key in store``,
    ``items()``, ``flush()``, ``close()``. ``table(name)`` opens a sibling
    table in the same store (RocksDB: a column family).

    Values are live objects: ``get`` may return the stored object itself, so
    mutate a value and ``put`` it again to change the state, as with any
    write-back state backend.
    """

    #: True when the backend serializes values and writes faster in batches
    #: (the cache then queues evictions into write batches).
    batches_writes: bool = False

    def __init__(
        self,
        *,
        name: str = "default",
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        key_types: Iterable[Any] | None = None,
        serializer: Serializer | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"table name must be a non-empty str, got {name!r}")
        self.name = name
        self.max_parallelism = check_max_parallelism(max_parallelism)
        self.key_types = normalize_types(key_types)
        self.serializer: Serializer = serializer if serializer is not None else DEFAULT_SERIALIZER

    # ------------------------------------------------------------ primitives
    @abstractmethod
    def _load(self, nkey: NormalizedKey) -> Any:
        """The value of a normalized key, or MISSING."""

    def _load_many(self, nkeys: Sequence[NormalizedKey]) -> list[Any]:
        """Values (or MISSING) of normalized keys, in order, in as few round trips as possible."""
        load = self._load
        return [load(k) for k in nkeys]

    @abstractmethod
    def _write(self, items: Iterable[tuple[NormalizedKey, Any]]) -> None:
        """Apply ``(nkey, value)`` pairs atomically; a value of MISSING deletes the key."""

    def _write_serialized(self, items: Iterable[tuple[NormalizedKey, bytes | None]]) -> None:
        """Like :meth:`_write` with values already serialized by ``self.serializer`` (None deletes)."""
        loads = self.serializer.loads
        self._write([(k, MISSING if v is None else loads(v)) for k, v in items])

    @abstractmethod
    def _iter_items(self) -> Iterator[tuple[NormalizedKey, Any]]:
        """Every ``(nkey, value)`` of the table."""

    @abstractmethod
    def table(self, name: str) -> "Store":
        """The sibling table ``name`` of this store, created if needed."""

    @abstractmethod
    def tables(self) -> list[str]:
        """Names of the tables of this store."""

    # ------------------------------------------------------------ public API
    def key_group(self, key: Any) -> int:
        """The key group of ``key`` under this store's ``max_parallelism`` and key types."""
        return key_group_from_hash(spark_hash(normalize_key(key), self.key_types), self.max_parallelism)

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._load(normalize_key(key))
        return default if value is MISSING else value

    def put(self, key: Any, value: Any) -> None:
        self._write(((normalize_key(key), value),))

    def delete(self, key: Any) -> None:
        """Remove ``key`` (no error when it is absent)."""
        self._write(((normalize_key(key), MISSING),))

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """Values of ``keys`` in order (``default`` for absent ones), in one batched read."""
        values = self._load_many(normalize_keys(keys))
        return [default if v is MISSING else v for v in values]

    def put_many(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Write ``(key, value)`` pairs in one batch; every key is validated before anything is written."""
        keys, values = split_pairs(pairs)
        self._write(list(zip(normalize_keys(keys), values)))

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Remove ``keys`` in one batch; every key is validated before anything is deleted."""
        self._write([(nkey, MISSING) for nkey in normalize_keys(keys)])

    def pop_many(self, keys: Iterable[Any], default: Any = None) -> list[Any]:
        """Delete distinct ``keys`` and return their values (``default`` where absent).

        One batched read and one write batch. Every key is validated (and
        checked distinct) before anything is deleted. A cache in front of a
        store overrides this to keep no entry for the keys on the way (state
        that is popped is never read again, e.g. a closed window's). O(len(keys)).
        """
        checked = normalize_keys(keys)
        if len(set(checked)) != len(checked):
            raise ValueError("pop_many takes distinct keys")
        values = self._load_many(checked)
        self._write([(nkey, MISSING) for nkey in checked])
        return [default if v is MISSING else v for v in values]

    def delete_uncached(self, keys: Iterable[Any]) -> None:
        """Delete keys that will not be read again: :meth:`delete_many` here; a cache in front of a
        store overrides it to keep no entry (not even the keys' absence) for them."""
        self.delete_many(keys)

    def __contains__(self, key: Any) -> bool:
        return self._load(normalize_key(key)) is not MISSING

    def items(self) -> Iterator[tuple[tuple, Any]]:
        """``(key, value)`` pairs; keys are tuples of Python scalars."""
        for nkey, value in self._iter_items():
            yield denormalize_key(nkey), value

    def keys(self) -> Iterator[tuple]:
        """Every key, as a tuple of Python scalars."""
        for key, _ in self.items():
            yield key

    def flush(self) -> None:
        """Make every write so far durable in the store (no-op for memory)."""

    def close(self) -> None:
        """Flush and release the store; later calls raise StoreClosedError."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(table={self.name!r})"
