"""The write-back cache, its eviction policies, memory estimator and the process-wide manager."""

from .estimator import MemoryEstimator
from .manager import CacheManager, GCTimeMonitor, MemoryReading, current_rss_bytes, default_memory_limit
from .policies import POLICIES, CachePolicy, ClockPolicy, LFUPolicy, LRUPolicy, make_policy
from .writeback import StateSerializationError, WriteBackCache

__all__ = [
    "CacheManager",
    "CachePolicy",
    "ClockPolicy",
    "GCTimeMonitor",
    "LFUPolicy",
    "LRUPolicy",
    "MemoryEstimator",
    "MemoryReading",
    "POLICIES",
    "StateSerializationError",
    "WriteBackCache",
    "current_rss_bytes",
    "default_memory_limit",
    "make_policy",
]
