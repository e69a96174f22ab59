"""The write-back cache, its eviction policies, memory estimator and the process-wide manager."""

from .estimator import MemoryEstimator, deep_sizeof
from .manager import (
    CacheManager,
    GCTimeMonitor,
    ManagedCache,
    MemoryReading,
    check_memory_budget,
    current_rss_bytes,
    default_memory_limit,
    shared_manager,
)
from .policies import POLICIES, CachePolicy, ClockPolicy, LFUPolicy, LRUPolicy, check_policy_spec, make_policy
from .writeback import StateSerializationError, UnsizedWriteBackCache, WatermarkedWriteBackCache, WriteBackCache, check_watermarks

__all__ = [
    "CacheManager",
    "CachePolicy",
    "ClockPolicy",
    "GCTimeMonitor",
    "LFUPolicy",
    "LRUPolicy",
    "ManagedCache",
    "MemoryEstimator",
    "MemoryReading",
    "POLICIES",
    "StateSerializationError",
    "UnsizedWriteBackCache",
    "WatermarkedWriteBackCache",
    "WriteBackCache",
    "check_memory_budget",
    "check_policy_spec",
    "check_watermarks",
    "current_rss_bytes",
    "deep_sizeof",
    "default_memory_limit",
    "make_policy",
    "shared_manager",
]
