"""Key-group arithmetic, and nothing else (Flink's ``KeyGroupRangeAssignment``).

A key belongs to one of ``max_parallelism`` key groups; operator instance ``i``
of ``p`` owns a contiguous range of them. Because the ranges are computed from
``(i, p, max_parallelism)`` alone, any parallelism ``p <= max_parallelism``
can restore state written at any other parallelism.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_PARALLELISM = 128
#: Key groups are stored as 2 big-endian bytes in front of every RocksDB key.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15


def check_max_parallelism(max_parallelism: int) -> int:
    """Return ``max_parallelism`` if it is a valid key-group count, else raise ValueError."""
    if (
        isinstance(max_parallelism, bool)
        or not isinstance(max_parallelism, int)
        or not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM
    ):
        raise ValueError(
            f"max_parallelism must be an int in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {max_parallelism!r}"
        )
    return max_parallelism


def _check_parallelism(parallelism: int, max_parallelism: int) -> None:
    check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")


def key_group_from_hash(hash64: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """Spark's ``pmod(hash, n)`` for a 64-bit hash given signed or unsigned."""
    if hash64 >= 1 << 63:
        hash64 -= 1 << 64
    return hash64 % max_parallelism  # Python's % is already non-negative for n > 0


def key_group_range(index: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> range:
    """The key groups operator instance ``index`` of ``parallelism`` owns.

    ``[ceil(i*maxP/p), floor(((i+1)*maxP-1)/p)]``, returned as a ``range``.
    """
    _check_parallelism(parallelism, max_parallelism)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < parallelism:
        raise ValueError(f"index must be an int in [0, parallelism={parallelism}), got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def operator_index(key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The instance of ``parallelism`` that owns ``key_group`` (inverse of :func:`key_group_range`)."""
    _check_parallelism(parallelism, max_parallelism)
    if isinstance(key_group, bool) or not isinstance(key_group, int) or not 0 <= key_group < max_parallelism:
        raise ValueError(f"key_group must be an int in [0, max_parallelism={max_parallelism}), got {key_group!r}")
    return key_group * parallelism // max_parallelism


def operator_indexes(key_groups: Any, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> Any:
    """:func:`operator_index` of a whole integer array of key groups at once (numpy in, numpy out)."""
    _check_parallelism(parallelism, max_parallelism)
    return (key_groups.astype("int64") * parallelism) // max_parallelism
