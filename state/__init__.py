"""opbuffer's keyed state layer: keys and key groups, stores, and the write-back cache.

Nothing here imports Spark or the rest of opbuffer.

>>> from state import MemoryStore, WriteBackCache
>>> cache = WriteBackCache(MemoryStore(), max_entries=2)
>>> cache.put(("user", 1), 10); cache.get(("user", 1))
10
"""

from .base import MISSING, Store, StoreClosedError, StoreError, StoreLockedError
from .cache import (
    CacheManager,
    CachePolicy,
    ClockPolicy,
    LFUPolicy,
    LRUPolicy,
    MemoryEstimator,
    MemoryReading,
    StateSerializationError,
    WriteBackCache,
)
from .keygroups import DEFAULT_MAX_PARALLELISM, key_group_from_hash, key_group_range, operator_index
from .keys import decode_key, denormalize_key, encode_key, key_group, normalize_key, spark_hash
from .memory import MemoryStore
from .rocksdb import RocksDBStore
from .serializers import PickleSerializer, Serializer

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "MISSING",
    "CacheManager",
    "CachePolicy",
    "ClockPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "MemoryEstimator",
    "MemoryReading",
    "MemoryStore",
    "PickleSerializer",
    "RocksDBStore",
    "Serializer",
    "StateSerializationError",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "WriteBackCache",
    "decode_key",
    "denormalize_key",
    "encode_key",
    "key_group",
    "key_group_from_hash",
    "key_group_range",
    "normalize_key",
    "operator_index",
    "spark_hash",
]
