"""Memory estimation by sampling serialized sizes (never by serializing everything)."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable


class MemoryEstimator:
    """Mean entry size over a window of sampled entries.

    Every ``sample_every``-th observed entry (and the first ``warmup``) is
    serialized and its size recorded; the cache's size is then estimated as
    ``entries * (mean sampled size + entry_overhead)``. ``entry_overhead``
    approximates the per-entry bookkeeping (dict slot, policy node, key tuple)
    that a serialized size does not show.
    """

    __slots__ = ("sample_every", "window", "entry_overhead", "warmup", "_countdown", "_samples", "_sum", "samples_taken")

    def __init__(self, sample_every: int = 64, window: int = 256, entry_overhead: int = 96, warmup: int = 8) -> None:
        for name, value in (("sample_every", sample_every), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(entry_overhead, bool) or not isinstance(entry_overhead, int) or entry_overhead < 0:
            raise ValueError(f"entry_overhead must be an int >= 0, got {entry_overhead!r}")
        self.sample_every = sample_every
        self.window = window
        self.entry_overhead = entry_overhead
        self.warmup = warmup
        self._countdown = 1
        self._samples: deque[int] = deque()
        self._sum = 0
        self.samples_taken = 0

    def observe(self, key: Any, value: Any, dumps: Callable[[Any], bytes]) -> bool:
        """Count one entry written or loaded; sample it when due. True when the mean changed."""
        self._countdown -= 1
        if self._countdown > 0:
            return False
        self._countdown = self.next_interval()
        return self.sample(key, value, dumps)

    def next_interval(self) -> int:
        """Entries to count before the next sample (1 while warming up)."""
        return 1 if self.samples_taken + 1 < self.warmup else self.sample_every

    def sample(self, key: Any, value: Any, dumps: Callable[[Any], bytes]) -> bool:
        """Record the size of one entry now. True when the mean changed."""
        self.samples_taken += 1
        try:
            size = len(dumps(value))
        except Exception:  # an unserializable value is reported when it is written, not here
            return False
        columns = key if type(key) is tuple else (key,)
        size += sum(len(e) if type(e) in (str, bytes) else 9 for e in columns)
        self._samples.append(size)
        self._sum += size
        if len(self._samples) > self.window:
            self._sum -= self._samples.popleft()
        return True

    @property
    def has_samples(self) -> bool:
        return bool(self._samples)

    @property
    def entry_bytes(self) -> float:
        """Estimated bytes of one entry (mean sampled size plus overhead); 0 before any sample."""
        if not self._samples:
            return 0.0
        return self._sum / len(self._samples) + self.entry_overhead

    def estimate(self, entries: int) -> int:
        """Estimated bytes of ``entries`` entries."""
        return int(entries * self.entry_bytes)
