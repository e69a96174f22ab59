"""Restoring a version into RocksDB tables, for the key groups of one operator instance.

``restore(storage, version, key_groups, tables)`` reads only the sections of
``key_groups`` (grouped by file, each file opened once), verifies every
checksum *before* touching the stores, then per table deletes the key groups'
range (when it holds anything; then compacts it, so that ingested files land
in the bottom level instead of level 0), ingests the snapshots' SST files (no
per-key work in Python) and applies record sections (record-encoded
snapshots and the deltas, in chain order) through write batches of
``chunk_size`` entries.

Memory: one section at a time is read; SST payloads are staged to files
(written and fdatasync'ed by four worker threads, overlapping the reads, so
RocksDB's own fsync at ingestion is cheap); record blocks are kept until
they are applied, which is small for deltas (and for record-encoded
snapshots of small key groups).

A damaged, truncated or missing file raises :class:`CheckpointCorruptError`
naming the file and the key group, and leaves the stores untouched; other
versions that do not reference the damaged file stay restorable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence


from state import RocksDBStore

from .errors import CheckpointCorruptError, CheckpointError
from .format import DELTA, SNAPSHOT, SST, checksum, decode_records, decode_section
from .manifest import Manifest, SectionRef
from .storage import CheckpointStorage

DEFAULT_CHUNK = 100_000
_STAGING_THREADS = 4  # parallel fdatasyncs keep the disk's queue full
_MAX_IN_FLIGHT = 16  # SST payloads being written to the staging directory at once (bounds memory)


@dataclass(frozen=True)
class RestoreReport:
    """What one restore did."""

    version: int | None  # None: nothing was committed, the key groups were only cleared
    key_groups: range
    sections: int = 0
    snapshots: int = 0
    deltas: int = 0
    bytes: int = 0  # section bytes read
    records: int = 0  # entries applied through write batches (SST entries not counted)
    sst_files: int = 0  # SST files ingested
    seconds: float = 0.0
    metadata: Mapping[str, Any] | None = None  # the manifest's metadata
    #: the restored manifest: what the instance's next ``CheckpointWriter.write`` builds on (``previous``)
    manifest: Manifest | None = field(default=None, repr=False, compare=False)


def _ingest(store: RocksDBStore, paths: list[str]) -> None:
    """Ingest SST files into a table (the files are moved in when on the same filesystem)."""
    store.ingest_sst_files(paths)


def _write_synced(path: str, payload: bytes | memoryview) -> None:
    """Write a staged SST file and flush it to disk (in a worker thread, overlapping the reads):
    RocksDB fsyncs every ingested file, which is then cheap."""
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fdatasync(f.fileno())


def _compact(store: RocksDBStore, key_groups: range) -> None:
    """Compact a cleared key-group range, so that SST files ingested into it go to the bottom level."""
    store.compact_key_groups(key_groups)


def _is_empty(store: RocksDBStore, key_groups: range) -> bool:
    return next(iter(store.iter_raw(key_groups)), None) is None


def _temp_dir_near(tables: Mapping[str, RocksDBStore], tmp_dir: str | None) -> str:
    """A temp dir for SST files: ``tmp_dir``, else next to the first store (same filesystem: ingestion links)."""
    if tmp_dir is not None:
        return tempfile.mkdtemp(prefix="opbuffer-restore-", dir=tmp_dir)
    store = next(iter(tables.values()))
    try:
        return tempfile.mkdtemp(prefix=".opbuffer-restore-", dir=os.path.dirname(os.path.abspath(store.path)))
    except OSError:
        return tempfile.mkdtemp(prefix="opbuffer-restore-")


def iter_sections(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> Iterator[tuple[int, SectionRef, bytes]]:
    """``(index in refs, ref, section bytes)`` of every ref, checksum verified, file by file in offset order.

    Each file is opened once; sections are read one at a time (memory: one section).
    """
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_file[ref.file].append(i)
    for file, positions in by_file.items():
        positions.sort(key=lambda i: refs[i].offset)
        try:
            stream = storage.open_read(file)
        except FileNotFoundError:
            g = refs[positions[0]].key_group
            raise CheckpointCorruptError(
                f"checkpoint file {file!r} is missing (needed for key group {g}) in {storage.location!r}",
                file=file, key_group=g,
            ) from None
        with stream:
            for i in positions:
                ref = refs[i]
                stream.seek(ref.offset)
                data = stream.read(ref.length)
                if len(data) != ref.length:
                    raise CheckpointCorruptError(
                        f"checkpoint file {file!r} is truncated: the {ref.kind} section of key group {ref.key_group} "
                        f"needs bytes {ref.offset}..{ref.offset + ref.length}, only {len(data)} could be read",
                        file=file, key_group=ref.key_group,
                    )
                if checksum(data) != ref.checksum:
                    raise CheckpointCorruptError(
                        f"checksum mismatch in checkpoint file {file!r}: the {ref.kind} section of key group "
                        f"{ref.key_group} (bytes {ref.offset}..{ref.offset + ref.length}) is corrupt",
                        file=file, key_group=ref.key_group,
                    )
                yield i, ref, data


def verify_sections(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> int:
    """Read every section of ``refs`` and check its checksum; returns the bytes read."""
    return sum(len(data) for _, _, data in iter_sections(storage, refs))


def restore(
    storage: CheckpointStorage | str | os.PathLike[str],
    version: int | Manifest | None,
    key_groups: range,
    tables: Mapping[str, RocksDBStore],
    *,
    before: int | None = None,
    tmp_dir: str | os.PathLike[str] | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> RestoreReport:
    """Make ``tables`` hold exactly the state of ``key_groups`` in ``version``.

    Args:
        storage: the checkpoint location.
        version: the committed version to restore (or its already read
            manifest); None: the latest (``< before`` when given), or, when
            there is none, empty state: the key groups are cleared.
        key_groups: the contiguous key groups of this instance (any
            parallelism: ``key_group_range(i, p, max_parallelism)``).
        tables: the stores to restore into, by table name; must include every
            table of the version (a table given but not in the version is cleared).
        tmp_dir: where SST files are staged before ingestion (default: next to
            the first store, so ingestion can hard-link them).
        chunk_size: entries per write batch for record sections.

    Keys of other key groups are not touched. Restored entries are not
    recorded as changes by the stores' change tracking.

    Raises CheckpointNotFoundError (no such version), CheckpointCorruptError
    (a damaged or missing file; the stores are untouched, since every section
    is verified before the first write), CheckpointError/ValueError for
    stores that do not fit the version. Should writing to the stores itself
    fail (disk full), the key groups are left half restored: restore again.
    """
    started = time.perf_counter()
    storage = CheckpointStorage.of(storage)
    if not tables:
        raise ValueError("tables must name at least one table")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    manifest: Manifest | None
    if isinstance(version, Manifest):
        manifest = version
    elif version is None:
        manifest = storage.latest_manifest(before)
    else:
        manifest = storage.read_manifest(version)
    mp = manifest.max_parallelism if manifest is not None else next(iter(tables.values())).max_parallelism
    for name, table in tables.items():
        if table.max_parallelism != mp:
            raise CheckpointError(
                f"table {name!r} has max_parallelism {table.max_parallelism}, the checkpoint {mp} (fixed for its life)"
            )
    if not isinstance(key_groups, range) or key_groups.step != 1 or key_groups.start < 0 or key_groups.stop > mp:
        raise ValueError(f"key_groups must be a step-1 range inside [0, {mp}), got {key_groups!r}")
    if manifest is None:
        for table in tables.values():
            table.delete_key_groups(key_groups)
        return RestoreReport(None, key_groups, seconds=time.perf_counter() - started)
    missing = [t for t in manifest.tables if t not in tables]
    if missing:
        raise ValueError(f"version {manifest.version} has tables {missing} that are not in tables")

    positions = [pos for g in key_groups for pos in range(len(manifest.chain(g)))]
    refs: list[SectionRef] = [ref for g in key_groups for ref in manifest.chain(g)]
    in_flight: deque[Future] = deque()

    tmp = _temp_dir_near(tables, None if tmp_dir is None else os.fspath(tmp_dir))
    pool = ThreadPoolExecutor(max_workers=_STAGING_THREADS, thread_name_prefix="opbuffer-restore")
    try:
        # Phase 1: read and verify everything, stage SST payloads; the stores are not touched yet.
        sst_paths: dict[str, list[str]] = defaultdict(list)
        record_blocks: list[tuple[int, int, str, Any]] = []
        total_bytes = 0
        for i, ref, data in iter_sections(storage, refs):
            total_bytes += len(data)
            pos = positions[i]
            for block in decode_section(data, file=ref.file, key_group=ref.key_group, kind=ref.kind):
                if block.table not in tables:
                    raise CheckpointCorruptError(
                        f"section of key group {ref.key_group} in {ref.file!r} has table {block.table!r}, "
                        f"which version {manifest.version} does not list", file=ref.file, key_group=ref.key_group,
                    )
                if block.encoding == SST:
                    if ref.kind != SNAPSHOT or pos != 0:
                        raise CheckpointCorruptError(
                            f"SST block in a {ref.kind} section of key group {ref.key_group} in {ref.file!r}",
                            file=ref.file, key_group=ref.key_group,
                        )
                    path = os.path.join(tmp, f"{len(sst_paths[block.table])}-{ref.key_group}-{block.table}.sst")
                    while len(in_flight) >= _MAX_IN_FLIGHT:  # bound the memory of staged payloads
                        in_flight.popleft().result()
                    in_flight.append(pool.submit(_write_synced, path, block.payload))
                    sst_paths[block.table].append(path)
                else:
                    # A copy, so that the section's bytes (maybe holding an SST payload) can be freed.
                    record_blocks.append((ref.key_group, pos, block.table, (ref, bytes(block.payload))))
        record_blocks.sort(key=lambda b: (b[0], b[1]))
        while in_flight:
            in_flight.popleft().result()

        # Phase 2: clear, ingest snapshots, apply records in chain order. An empty range is not
        # cleared: a range tombstone would make RocksDB put every ingested file in level 0 (slow
        # reads, write stalls, a compaction storm); a cleared range is compacted before ingestion.
        for name, table in tables.items():
            if not _is_empty(table, key_groups):
                table.delete_key_groups(key_groups)
                if sst_paths.get(name):
                    _compact(table, key_groups)
        sst_files = 0
        for name, paths in sst_paths.items():
            _ingest(tables[name], paths)
            sst_files += len(paths)
        records = 0
        pending: dict[str, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        for _, _, name, (ref, payload) in record_blocks:
            keys, values = decode_records(payload, file=ref.file, key_group=ref.key_group)
            buf = pending[name]
            buf.extend(zip(keys, values))
            records += len(keys)
            if len(buf) >= chunk_size:
                tables[name].write_raw(buf)
                pending[name] = []
        for name, buf in pending.items():
            if buf:
                tables[name].write_raw(buf)
    finally:
        pool.shutdown(wait=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return RestoreReport(
        version=manifest.version,
        key_groups=key_groups,
        sections=len(refs),
        snapshots=sum(1 for r in refs if r.kind == SNAPSHOT),
        deltas=sum(1 for r in refs if r.kind == DELTA),
        bytes=total_bytes,
        records=records,
        sst_files=sst_files,
        seconds=time.perf_counter() - started,
        metadata=dict(manifest.metadata),
        manifest=manifest,
    )


__all__ = ["RestoreReport", "iter_sections", "restore", "verify_sections"]
