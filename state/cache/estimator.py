"""Memory estimation: sampled in-memory sizes of live objects (never sizing every entry).

A byte bound has to bound what the process holds, and a pickle says little
about that: a small int pickles to 5 bytes and costs 28 in memory, plus its
key, plus the cache's own table slot and order node (about 170-280 bytes per
entry, by policy). So a sample measures the live key and value objects with
:func:`deep_sizeof`, and the cache adds its policy's measured per-entry
overhead (``CachePolicy.entry_overhead``) and the dirty-set slot.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any, Callable, Optional

_ATOMS = (int, float, complex, bool, str, bytes, type(None))
#: Items of one container looked at; a larger container is sized from them, scaled up.
_SAMPLE_ITEMS = 64
#: Objects looked at in one sizing, at most (beyond it the size is extrapolated from the mean).
_MAX_OBJECTS = 4096


def deep_sizeof(obj: Any) -> int:
    """Bytes held by ``obj`` and what it references (its own objects, each counted once).

    Containers (tuple, list, set, frozenset, dict, deque) are followed, a
    large one through a sample of its items scaled to its length; numpy
    arrays count their buffer (``nbytes``) when they own it; pandas objects
    count ``memory_usage(deep=True)``; other objects their ``__dict__`` and
    ``__slots__``. Objects shared with the rest of the program (small ints,
    interned strings, classes) are counted as if owned, which errs high.
    Cost: O(objects visited), at most a few thousand.
    """
    getsizeof = sys.getsizeof
    seen: set[int] = set()
    total = 0
    visited = 0
    stack: list[tuple[Any, float]] = [(obj, 1.0)]  # (object, how many objects it stands for)
    while stack:
        o, weight = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        visited += 1
        t = type(o)
        if t in _ATOMS:
            total += getsizeof(o) * weight
            continue
        if visited > _MAX_OBJECTS:
            total += getsizeof(o) * weight
            continue
        module = getattr(t, "__module__", "") or ""
        if module.startswith("pandas"):
            usage = getattr(o, "memory_usage", None)
            if usage is not None:
                try:
                    value = usage(deep=True)
                    total += int(value.sum() if hasattr(value, "sum") else value) * weight
                    continue
                except (TypeError, ValueError):
                    pass
        if module == "numpy" or module.startswith("numpy."):
            # numpy's __sizeof__ includes the buffer of an array that owns it (a view's belongs to its base).
            total += getsizeof(o) * weight
            dtype = getattr(o, "dtype", None)
            if dtype is not None and dtype.hasobject and getattr(o, "ndim", 0):
                _push_items(stack, o.ravel().tolist(), weight)  # type: ignore[union-attr]
            continue
        total += getsizeof(o) * weight
        if t is dict or isinstance(o, dict):
            _push_items(stack, list(o.items()), weight, pairs=True)
        elif t in (tuple, list, set, frozenset, deque) or isinstance(o, (tuple, list, set, frozenset, deque)):
            _push_items(stack, o if t in (tuple, list) else list(o), weight)
        else:
            d = getattr(o, "__dict__", None)
            if isinstance(d, dict):
                stack.append((d, weight))
            for cls in t.__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if name in ("__dict__", "__weakref__"):
                        continue
                    try:
                        stack.append((getattr(o, name), weight))
                    except AttributeError:
                        pass
    return int(total)


def _push_items(stack: list, items: Any, weight: float, pairs: bool = False) -> None:
    n = len(items)
    if n <= _SAMPLE_ITEMS:
        chosen, scale = items, weight
    else:
        step = n / _SAMPLE_ITEMS
        chosen = [items[int(i * step)] for i in range(_SAMPLE_ITEMS)]
        scale = weight * n / _SAMPLE_ITEMS
    if pairs:
        for k, v in chosen:
            stack.append((k, scale))
            stack.append((v, scale))
    else:
        for item in chosen:
            stack.append((item, scale))


class MemoryEstimator:
    """Mean in-memory size of an entry over a window of sampled entries.

    Every ``sample_every``-th observed entry (and the first ``warmup``) is
    sized with ``sizer`` (default :func:`deep_sizeof` of key and value) and
    the size recorded; an entry is then estimated at the mean sampled size
    plus ``entry_overhead``, the bookkeeping the sizes do not show (table
    slot, order node, dirty slot: set by the cache from its policy unless
    given here).
    """

    __slots__ = ("sample_every", "window", "entry_overhead", "warmup", "_sizer", "_samples", "_sum", "samples_taken")

    def __init__(
        self,
        sample_every: int = 64,
        window: int = 256,
        entry_overhead: Optional[int] = None,
        warmup: int = 8,
        sizer: Optional[Callable[[Any], int]] = None,
    ) -> None:
        for name, value in (("sample_every", sample_every), ("window", window), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if entry_overhead is not None and (
            isinstance(entry_overhead, bool) or not isinstance(entry_overhead, int) or entry_overhead < 0
        ):
            raise ValueError(f"entry_overhead must be an int >= 0 or None, got {entry_overhead!r}")
        self.sample_every = sample_every
        self.window = window
        self.entry_overhead = entry_overhead
        self.warmup = warmup
        self._sizer = sizer if sizer is not None else deep_sizeof
        self._samples: deque[int] = deque()
        self._sum = 0
        self.samples_taken = 0

    def next_interval(self) -> int:
        """Entries to count before the next sample (1 while warming up)."""
        return 1 if self.samples_taken + 1 < self.warmup else self.sample_every

    def sample(self, key: Any, value: Any) -> bool:
        """Record the size of one entry now. True when the mean changed."""
        self.samples_taken += 1
        try:
            size = self._sizer(key) + self._sizer(value)
        except Exception:  # a value the sizer cannot walk is sized when it is next sampled
            return False
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
        return self._sum / len(self._samples) + (self.entry_overhead or 0)

    def estimate(self, entries: int) -> int:
        """Estimated bytes of ``entries`` entries."""
        return int(entries * self.entry_bytes)
