"""CacheManager: one memory budget shared by every cache of a process.

After the ByteDance cache layer: memory is handed out in blocks; a memory
monitor measures the process (resident set size against a limit, and the
share of wall time spent in the garbage collector); under pressure the caches
with the largest size and the fewest loads shrink, and with room to spare the
caches that load the most from their stores grow.
"""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Protocol


class ManagedCache(Protocol):
    """What a :class:`CacheManager` asks of a cache it grants bytes to (``WriteBackCache``, ``KeyGroupCache``).

    A cache built with a manager registers itself and unregisters when it
    closes; :meth:`CacheManager.register` and :meth:`CacheManager.unregister`
    tell the cache through :meth:`attach`. In between the manager sets its
    byte bound through :meth:`resize`, and the cache calls
    :meth:`CacheManager.maybe_rebalance` now and then.
    """

    cache_name: str

    def attach(self, manager: "CacheManager | None") -> None:
        """The manager that grants the cache's bytes from now on (None: none any more)."""
        ...

    @property
    def sized(self) -> bool:
        """Whether the cache measures its bytes (it can take a byte bound)."""
        ...

    def resize(self, *, max_entries: Any = ..., max_bytes: Any = ...) -> None:
        """Change the bounds (``...`` keeps one) and evict down to them at once."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters; the manager reads ``"loads"`` (loads from the store: what more memory would save)."""
        ...


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4096


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _page_size()
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak * 1024 if os.uname().sysname == "Linux" else peak


def default_memory_limit() -> int:
    """The tightest of: physical memory, the cgroup limit, RLIMIT_AS (what Spark sets for Python workers)."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < 1 << 60:
                limits.append(int(text))
        except OSError:
            pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
        limits.append(soft)
    return min(limits) if limits else 8 << 30


class GCTimeMonitor:
    """Share of wall time spent in garbage collection since the last reading (gc.callbacks)."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._gc_seconds = 0.0
        self._since = time.perf_counter()
        self._callback = self._on_gc
        gc.callbacks.append(self._callback)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._gc_seconds += time.perf_counter() - self._started
            self._started = None

    def read(self) -> float:
        now = time.perf_counter()
        elapsed = now - self._since
        share = self._gc_seconds / elapsed if elapsed > 0 else 0.0
        self._gc_seconds = 0.0
        self._since = now
        return share

    def close(self) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass


@dataclass(frozen=True)
class MemoryReading:
    """One measurement of the process: RSS, its limit and the GC time share."""

    rss_bytes: int
    limit_bytes: int
    gc_time_share: float

    @property
    def rss_fraction(self) -> float:
        return self.rss_bytes / self.limit_bytes if self.limit_bytes else 0.0


class CacheManager:
    """One byte budget for every registered cache in the process (see :class:`ManagedCache`).

    Args:
        max_bytes: total bytes all caches may hold together.
        block_bytes: unit of allocation (default: 1/64 of max_bytes, at least 64 KiB).
        memory_limit: the process memory limit pressure is measured against
            (default: the tightest of physical memory, cgroup limit, RLIMIT_AS).
        high_pressure: RSS fraction of the limit above which caches shrink.
        low_pressure: RSS fraction below which caches may grow.
        gc_time_threshold: GC share of wall time above which caches shrink.
        shrink_fraction: share of a chosen cache's blocks taken per shrink.
        caches_per_step: caches resized per rebalance (the seed resizes 2-3).
        min_interval_s: least time between two rebalances.
        check_every: caches ask for a rebalance every this many inserts.
        probe: replaces the process measurement (returns a MemoryReading); for tests and custom monitors.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        block_bytes: int | None = None,
        memory_limit: int | None = None,
        high_pressure: float = 0.85,
        low_pressure: float = 0.6,
        gc_time_threshold: float = 0.2,
        shrink_fraction: float = 0.25,
        caches_per_step: int = 2,
        min_interval_s: float = 1.0,
        check_every: int = 4096,
        probe: Callable[[], MemoryReading] | None = None,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if block_bytes is None:
            block_bytes = max(64 << 10, max_bytes // 64)
        if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
            raise ValueError(f"block_bytes must be a positive int, got {block_bytes!r}")
        if block_bytes > max_bytes:
            raise ValueError(f"block_bytes {block_bytes} exceeds max_bytes {max_bytes}")
        if not 0 < low_pressure < high_pressure:
            raise ValueError(f"need 0 < low_pressure < high_pressure, got {low_pressure!r} and {high_pressure!r}")
        if not 0 < shrink_fraction <= 1:
            raise ValueError(f"shrink_fraction must be in (0, 1], got {shrink_fraction!r}")
        if memory_limit is not None and memory_limit < 1:
            raise ValueError(f"memory_limit must be positive, got {memory_limit!r}")
        if check_every < 1 or caches_per_step < 1:
            raise ValueError(f"check_every and caches_per_step must be >= 1, got {check_every!r}, {caches_per_step!r}")
        self.max_bytes = max_bytes
        self.block_bytes = block_bytes
        self.total_blocks = max_bytes // block_bytes
        self.memory_limit = memory_limit if memory_limit is not None else default_memory_limit()
        self.high_pressure = high_pressure
        self.low_pressure = low_pressure
        self.gc_time_threshold = gc_time_threshold
        self.shrink_fraction = shrink_fraction
        self.caches_per_step = caches_per_step
        self.min_interval_s = min_interval_s
        self.check_every = check_every
        self._probe = probe
        self._gc = GCTimeMonitor() if probe is None else None
        self._caches: "weakref.WeakKeyDictionary[ManagedCache, int]" = weakref.WeakKeyDictionary()
        self._loads_seen: "weakref.WeakKeyDictionary[ManagedCache, int]" = weakref.WeakKeyDictionary()
        self._last_rebalance = float("-inf")
        self.rebalances = 0
        self.shrinks = 0
        self.grows = 0
        self.last_reading: MemoryReading | None = None

    # ------------------------------------------------------------ blocks
    @property
    def free_blocks(self) -> int:
        return self.total_blocks - sum(self._caches.values())

    def _grant(self, cache: "ManagedCache", blocks: int) -> None:
        self._caches[cache] = blocks
        cache.resize(max_bytes=max(1, blocks * self.block_bytes))

    def register(self, cache: "ManagedCache") -> None:
        """Give ``cache`` an equal share of the budget, taking blocks from the largest caches if needed."""
        if cache in self._caches:
            return
        if not cache.sized:
            raise ValueError(
                f"cache {cache.cache_name!r} was built without a byte bound or a manager, so it cannot take "
                f"a share of this manager's bytes; build it with manager= (or max_bytes=)"
            )
        share = max(1, self.total_blocks // (len(self._caches) + 1))
        need = share - self.free_blocks
        for other in sorted(self._caches, key=lambda c: -self._caches[c]):
            if need <= 0:
                break
            give = min(need, self._caches[other] - share)
            if give > 0:
                self._grant(other, self._caches[other] - give)
                need -= give
        if self.free_blocks < 1:
            for other in sorted(self._caches, key=lambda c: -self._caches[c]):
                if self._caches[other] > 1:
                    self._grant(other, self._caches[other] - 1)
                    break
            else:
                raise ValueError(
                    f"CacheManager(max_bytes={self.max_bytes}) has {self.total_blocks} blocks of "
                    f"{self.block_bytes} bytes and {len(self._caches)} caches hold them all; "
                    "use a smaller block_bytes or a larger max_bytes"
                )
        self._loads_seen[cache] = cache.stats()["loads"]
        cache.attach(self)
        self._grant(cache, min(share, self.free_blocks))

    def unregister(self, cache: "ManagedCache") -> None:
        """Return the cache's blocks to the pool."""
        self._loads_seen.pop(cache, None)
        if cache in self._caches:
            del self._caches[cache]
            cache.attach(None)

    # ------------------------------------------------------------ pressure
    def measure(self) -> MemoryReading:
        """Measure the process now: RSS against the limit, and GC time share."""
        if self._probe is not None:
            reading = self._probe()
        else:
            assert self._gc is not None
            reading = MemoryReading(current_rss_bytes(), self.memory_limit, self._gc.read())
        self.last_reading = reading
        return reading

    def pressure(self, reading: MemoryReading | None = None) -> str:
        """``"high"`` (shrink), ``"low"`` (room to grow) or ``"normal"``."""
        reading = reading or self.measure()
        if reading.rss_fraction >= self.high_pressure or reading.gc_time_share >= self.gc_time_threshold:
            return "high"
        if reading.rss_fraction <= self.low_pressure and reading.gc_time_share < self.gc_time_threshold / 2:
            return "low"
        return "normal"

    def maybe_rebalance(self) -> bool:
        """Rebalance when ``min_interval_s`` has passed since the last one."""
        if time.monotonic() - self._last_rebalance < self.min_interval_s:
            return False
        return self.rebalance()

    def rebalance(self) -> bool:
        """Measure and resize: shrink under pressure, grow with room. True if a cache was resized."""
        self._last_rebalance = time.monotonic()
        self.rebalances += 1
        caches = list(self._caches)
        if not caches:
            return False
        level = self.pressure()
        # Loads since the last rebalance: how much each cache would gain from more memory.
        recent = {}
        for cache in caches:
            loads = cache.stats()["loads"]
            recent[cache] = loads - self._loads_seen.get(cache, 0)
            self._loads_seen[cache] = loads
        sizes = {c: self._caches[c] for c in caches}
        max_size = max(sizes.values()) or 1
        max_loads = max(recent.values()) or 1

        def weight(cache: "ManagedCache") -> float:
            # Normalized so that bytes and load counts weigh alike.
            return sizes[cache] / max_size - recent[cache] / max_loads

        changed = False
        if level == "high":
            for cache in sorted(caches, key=weight, reverse=True)[: self.caches_per_step]:
                blocks = sizes[cache]
                take = max(1, int(blocks * self.shrink_fraction)) if blocks > 1 else 0
                if take:
                    self._grant(cache, blocks - take)
                    self.shrinks += 1
                    changed = True
        elif level == "low" and self.free_blocks > 0:
            growers = sorted(caches, key=weight)[: self.caches_per_step]
            growers = [c for c in growers if recent[c] > 0] or growers[:1]
            per_cache = max(1, self.free_blocks // len(growers))
            for cache in growers:
                give = min(per_cache, self.free_blocks)
                if give <= 0:
                    break
                self._grant(cache, sizes[cache] + give)
                self.grows += 1
                changed = True
        return changed

    # ------------------------------------------------------------ reporting
    def blocks_of(self, cache: "ManagedCache") -> int:
        return self._caches.get(cache, 0)

    def stats(self) -> dict[str, Any]:
        """Per-cache stats (with blocks and granted bytes) and the manager's totals."""
        per_cache = {}
        for cache in list(self._caches):
            entry = dict(cache.stats())
            entry["blocks"] = self._caches[cache]
            entry["granted_bytes"] = self._caches[cache] * self.block_bytes
            per_cache[cache.cache_name] = entry
        reading = self.last_reading
        return {
            "caches": per_cache,
            "max_bytes": self.max_bytes,
            "block_bytes": self.block_bytes,
            "total_blocks": self.total_blocks,
            "free_blocks": self.free_blocks,
            "rebalances": self.rebalances,
            "shrinks": self.shrinks,
            "grows": self.grows,
            "rss_bytes": reading.rss_bytes if reading else None,
            "memory_limit": self.memory_limit,
            "gc_time_share": reading.gc_time_share if reading else None,
        }

    def close(self) -> None:
        if self._gc is not None:
            self._gc.close()

    def __repr__(self) -> str:
        return f"CacheManager(max_bytes={self.max_bytes}, caches={len(self._caches)}, free_blocks={self.free_blocks})"


_SHARED: dict[int, CacheManager] = {}
_SHARED_LOCK = threading.Lock()


def check_memory_budget(memory_budget: Any, argument: str = "memory_budget") -> int | None:
    """``memory_budget`` as bytes (None: no budget), or ValueError naming the argument and the value."""
    if memory_budget is None:
        return None
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1 << 20:
        raise ValueError(f"{argument} must be a number of bytes >= 1 MiB (an int) or None, got {memory_budget!r}")
    return memory_budget


def shared_manager(memory_budget: int) -> CacheManager:
    """The process's CacheManager of ``memory_budget`` bytes, made on first use.

    Every cache of the process that asks for the same budget shares it (the
    operator instances of a LocalRunner, or of every task a Spark Python worker
    runs: workers are reused across batches, and so is the manager).
    """
    budget = check_memory_budget(memory_budget)
    assert budget is not None
    with _SHARED_LOCK:
        manager = _SHARED.get(budget)
        if manager is None:
            manager = _SHARED[budget] = CacheManager(budget)
        return manager
