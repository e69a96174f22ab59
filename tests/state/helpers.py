"""Shared helpers of the state tests: key pools, hypothesis strategies, counting stores."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Iterable

import numpy as np
import pandas as pd
from hypothesis import settings
from hypothesis import strategies as st

from state import MemoryReading, MemoryStore, WriteBackCache

UTC = dt.timezone.utc
PLUS_ONE = dt.timezone(dt.timedelta(hours=1))
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def hsettings(**kwargs: Any) -> settings:
    """Hypothesis settings for this suite: no deadline, no example database on disk."""
    kwargs.setdefault("deadline", None)
    kwargs.setdefault("database", None)
    return settings(**kwargs)


# ------------------------------------------------------------------ key pool
# (user key, identity, representative): keys with one identity must be one key
# everywhere; the representative is the tuple of Python scalars items() shows.
# Written out by hand, independently of state.keys.normalize_key.
KEY_POOL: list[tuple[Any, str]] = [
    (5, "i5"),
    (np.int64(5), "i5"),
    (np.int32(5), "i5"),
    ((5,), "i5"),
    ((np.int64(5),), "i5"),
    (5.0, "f5"),
    (np.float64(5.0), "f5"),
    (1, "i1"),
    (1.0, "f1"),
    (True, "bT"),
    (np.bool_(True), "bT"),
    (0, "i0"),
    (False, "bF"),
    (0.0, "f0"),
    (-0.0, "f0"),
    ("a", "sa"),
    (("a",), "sa"),
    (np.str_("a"), "sa"),
    (b"a", "ba"),
    (("a", 1), "a1"),
    (("a", np.int64(1)), "a1"),
    (("a", True), "aT"),
    (("a", 1.0), "af1"),
    ((b"a", "a"), "ba_sa"),
    (INT64_MIN, "imin"),
    (INT64_MAX, "imax"),
    (dt.date(2020, 1, 1), "d2020"),
    (dt.datetime(2020, 1, 1), "dt_naive"),
    (pd.Timestamp("2020-01-01"), "dt_naive"),
    (dt.datetime(2020, 1, 1, tzinfo=UTC), "dt_utc"),
    (dt.datetime(2020, 1, 1, 1, tzinfo=PLUS_ONE), "dt_utc"),
]

REPRESENTATIVE: dict[str, tuple] = {
    "i5": (5,),
    "f5": (5.0,),
    "i1": (1,),
    "f1": (1.0,),
    "bT": (True,),
    "i0": (0,),
    "bF": (False,),
    "f0": (0.0,),
    "sa": ("a",),
    "ba": (b"a",),
    "a1": ("a", 1),
    "aT": ("a", True),
    "af1": ("a", 1.0),
    "ba_sa": (b"a", "a"),
    "imin": (INT64_MIN,),
    "imax": (INT64_MAX,),
    "d2020": (dt.date(2020, 1, 1),),
    "dt_naive": (dt.datetime(2020, 1, 1),),
    "dt_utc": (dt.datetime(2020, 1, 1, tzinfo=UTC),),
}

assert {ident for _, ident in KEY_POOL} == set(REPRESENTATIVE)


def _aware(value: Any) -> Any:
    return value.tzinfo is not None if isinstance(value, dt.datetime) else None


def typed_key(key: tuple) -> tuple:
    """A key in which 1, 1.0 and True, or naive and aware datetimes, stay apart."""
    return tuple((type(e), _aware(e), e) for e in key)


def typed_items(pairs: Iterable[tuple[tuple, Any]]) -> dict[tuple, Any]:
    """``items()`` of a store as a dict of typed keys; fails if a key shows up twice."""
    pairs = list(pairs)
    out = {typed_key(k): v for k, v in pairs}
    assert len(out) == len(pairs), f"a key is listed twice by items(): {pairs!r}"
    return out


def expected_items(model: dict[str, Any]) -> dict[tuple, Any]:
    """The typed items a store holding ``model`` (identity -> value) must list."""
    return {typed_key(REPRESENTATIVE[ident]): value for ident, value in model.items()}


# ------------------------------------------------------------------ strategies
# Fixed UTC offsets: aware datetimes of one instant in several zones must be one key.
offsets = st.builds(
    dt.timezone, st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59))
)
scalar_values = st.one_of(
    st.integers(min_value=INT64_MIN, max_value=INT64_MAX),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["", "\x00", "é", "\ud800", "a\udfffb", "\U0001f600"]),
    st.binary(max_size=8),
    st.booleans(),
    st.dates(),
    # Years 2..9998: the ends of the calendar have their own test (test_keys.py).
    st.datetimes(
        min_value=dt.datetime(2, 1, 1),
        max_value=dt.datetime(9998, 12, 31),
        timezones=st.none() | st.just(UTC) | offsets,
    ),
)
key_tuples = st.lists(scalar_values, min_size=1, max_size=4).map(tuple)

state_values = st.one_of(
    st.integers(-3, 3),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from(["x" * 400, b"y" * 1500, "z" * 60]),
)


# ------------------------------------------------------------------ test doubles
class CountingMemoryStore(MemoryStore):
    """A MemoryStore that counts what reaches it (entries written, batched and single reads)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries_written = 0
        self.write_calls = 0
        self.load_many_calls = 0
        self.single_loads = 0

    def _write(self, items):  # type: ignore[override]
        items = list(items)
        self.entries_written += len(items)
        self.write_calls += 1
        super()._write(items)

    def _load_many(self, nkeys):  # type: ignore[override]
        self.load_many_calls += 1
        return super()._load_many(nkeys)

    def _load(self, nkey):  # type: ignore[override]
        self.single_loads += 1
        return super()._load(nkey)


def high_watermark_count(cache: WriteBackCache, high: float) -> int:
    """Most dirty entries allowed after an operation: floor(high * capacity), at least 1."""
    capacity = cache.capacity
    assert capacity is not None
    return max(1, math.floor(high * capacity))


def check_bounds(cache: WriteBackCache, watermarks: tuple[float, float] | None) -> None:
    """The bounds every operation must leave behind."""
    stats = cache.stats()
    entries = len(cache)
    assert stats["entries"] == entries
    if stats["max_entries"] is not None:
        assert entries <= stats["max_entries"], stats
    if cache.capacity is not None:
        assert entries <= cache.capacity, stats
    if stats["max_bytes"] is not None:
        assert cache.estimated_bytes() <= stats["max_bytes"] + stats["entry_bytes"], stats
    if watermarks is not None and cache.capacity is not None:
        assert cache.dirty_count() <= high_watermark_count(cache, watermarks[1]), stats
    assert stats["dirty"] == cache.dirty_count() <= entries


# ------------------------------------------------------------------ cache manager
class Probe:
    """A memory probe whose pressure the test sets: "high", "normal" or "low" (limit 100 bytes)."""

    RSS = {"high": 95, "normal": 70, "low": 10}

    def __init__(self, level: str = "normal") -> None:
        self.level = level
        self.calls = 0

    def __call__(self) -> MemoryReading:
        self.calls += 1
        return MemoryReading(rss_bytes=self.RSS[self.level], limit_bytes=100, gc_time_share=0.0)
