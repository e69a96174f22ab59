"""The raw, change-tracking table that checkpoints read and restores write: a ``typing.Protocol``.

``checkpoint/`` never sees Python keys or values: it moves raw RocksDB
records (key bytes = a 2-byte big-endian key group, then the encoded key;
value bytes = the serialized value) between a table and the checkpoint files.
:class:`state.RocksDBStore` implements it; any table that implements these
methods can be checkpointed and restored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

#: Bytes of the key-group prefix of every raw key.
KEY_GROUP_BYTES = 2


def key_group_of_raw(raw_key: bytes) -> int:
    """The key group in front of a raw key (its first two bytes, big-endian)."""
    return (raw_key[0] << 8) | raw_key[1]


def key_groups_of_raw(raw_keys: Sequence[bytes]) -> "np.ndarray":
    """:func:`key_group_of_raw` of each of ``raw_keys``, as uint16: read from the joined keys at each
    key's start, O(keys) in numpy with no Python slice per key. ValueError for a key shorter than the
    prefix."""
    import numpy as np

    n = len(raw_keys)
    lengths = np.fromiter(map(len, raw_keys), dtype=np.int64, count=n)
    if n and int(lengths.min()) < KEY_GROUP_BYTES:
        raise ValueError(f"a raw key is shorter than its key group prefix: {min(raw_keys, key=len)!r}")
    joined = np.frombuffer(b"".join(raw_keys), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    return (joined[starts].astype(np.uint16) << 8) | joined[starts + 1]


def fixed_width_cuts(buffer: "Any", width: int, count: int, offset: int = 0) -> list[bytes]:
    """``count`` consecutive byte strings of ``width`` bytes from ``buffer`` (anything exposing the buffer
    protocol, e.g. bytes or a numpy structured array), starting at byte ``offset``: raw keys of
    fixed-width columns, cut by one cast to a numpy void dtype (which, unlike ``S``, keeps trailing zero
    bytes) instead of a Python slice per key, several times faster."""
    import numpy as np

    return np.frombuffer(buffer, dtype=f"V{width}", count=count, offset=offset).tolist()


class RawTable(Protocol):
    """One table of an operator's working store, as the checkpoint layer uses it."""

    @property
    def max_parallelism(self) -> int:
        """Key groups of the table's keys (fixed for the life of a checkpoint)."""
        ...

    @property
    def path(self) -> str:
        """The store's directory (restores stage SST files beside it, on the same file system)."""
        ...

    def track_changes(self, enabled: bool = True) -> None:
        """Record the raw keys written or deleted from now on."""
        ...

    def drain_changes(self) -> set[bytes]:
        """The raw keys written or deleted since tracking started or the last drain; resets them."""
        ...

    def get_raw_many(self, raw_keys: Sequence[bytes]) -> list[bytes | None]:
        """Raw values of raw keys (None where absent), in one multi-get."""
        ...

    def iter_raw(self, key_groups: range | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Raw records, optionally of a contiguous key-group range, in key order."""
        ...

    def delete_key_groups(self, key_groups: range) -> None:
        """Delete every record of a contiguous key-group range."""
        ...

    def write_raw(self, pairs: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Write raw pairs (None deletes) in one batch, not recorded as changes."""
        ...

    def write_raw_columns(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """:meth:`write_raw` of parallel sequences."""
        ...

    def ingest_sst_files(self, paths: Sequence[str]) -> None:
        """Bulk-load SST files built with this table's raw keys."""
        ...

    def compact_key_groups(self, key_groups: range) -> None:
        """Compact the key range of ``key_groups``."""
        ...

    def flush(self) -> None:
        """Make every write durable in the table's files."""
        ...
