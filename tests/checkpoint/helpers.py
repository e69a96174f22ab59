"""Helpers of the checkpoint tests: stores with several tables, snapshots of their raw content, one-call versions."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from hypothesis import settings

from checkpoint import CheckpointStorage, CheckpointWriter, Manifest, commit, restore
from state import RocksDBStore

TABLES = ("state", "timers")


def hsettings(**kwargs: Any) -> settings:
    """Hypothesis settings for this suite: no deadline, no example database on disk."""
    kwargs.setdefault("deadline", None)
    kwargs.setdefault("database", None)
    return settings(**kwargs)


def open_tables(path: str | os.PathLike[str], names: Iterable[str] = TABLES, max_parallelism: int = 128,
                track: bool = False) -> dict[str, RocksDBStore]:
    """A fresh RocksDBStore at ``path`` with the given tables (the first opens the database)."""
    names = list(names)
    first = RocksDBStore(path, max_parallelism=max_parallelism, table=names[0])
    tables = {names[0]: first}
    for name in names[1:]:
        tables[name] = first.table(name)
    if track:
        for table in tables.values():
            table.track_changes()
    return tables


def close_tables(tables: Mapping[str, RocksDBStore]) -> None:
    next(iter(tables.values())).close()


def content(tables: Mapping[str, RocksDBStore], key_groups: range | None = None) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every raw entry of every table (optionally of a key-group range), in key order."""
    return {name: list(table.iter_raw(key_groups)) for name, table in sorted(tables.items())}


def checkpoint_version(
    storage: CheckpointStorage,
    version: int,
    tables: Mapping[str, RocksDBStore],
    *,
    key_groups: range | None = None,
    full: bool = False,
    metadata: Mapping[str, Any] | None = None,
    retain: int | None = None,
    **writer_kwargs: Any,
) -> Manifest:
    """Write ``version`` from ``tables`` (one task owning ``key_groups``, changes drained) and commit it."""
    mp = next(iter(tables.values())).max_parallelism
    previous = storage.latest_manifest(before=version)
    changes = {name: table.drain_changes() for name, table in tables.items()} if not full else None
    writer = CheckpointWriter(storage, key_groups=key_groups or range(mp), task="t0", **writer_kwargs)
    report = writer.write(version, tables, changes, previous, full=full)
    return commit(storage, version, [report], metadata, retain=retain)


def restored_content(storage: CheckpointStorage, version: int | None, path: str | os.PathLike[str],
                     names: Iterable[str] = TABLES, max_parallelism: int = 128,
                     key_groups: range | None = None) -> dict[str, list[tuple[bytes, bytes]]]:
    """Restore ``version`` into a fresh store at ``path`` and return its content."""
    tables = open_tables(path, names, max_parallelism)
    try:
        restore(storage, version, key_groups or range(max_parallelism), tables)
        return content(tables)
    finally:
        close_tables(tables)
