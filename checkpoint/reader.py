"""Restoring a version into RocksDB tables, for the key groups of one operator instance.

``restore(storage, version, key_groups, tables)`` reads only the sections of
``key_groups`` (grouped by file, each file opened once; a local file is
memory-mapped) and the SST files their snapshots reference, verifies every
checksum *before* touching the stores, then per table deletes the key groups'
range (when it holds anything; then compacts it, so that ingested files land
in the bottom level instead of level 0), ingests the snapshots' SST files in
one call (no per-key work in Python) and applies record sections
(record-encoded snapshots and the deltas, in chain order) through write
batches of ``chunk_size`` entries.

Ingestion speed is bounded by the number of files: RocksDB fsyncs every
ingested file, one after the other. The writer therefore puts consecutive key
groups into one SST file of their own (format version 2); a restore that wants
every key group of such a file hard-links it into the store's directory when
the checkpoint is local and on the same filesystem (no bytes copied, and the
fsync finds nothing to write), else copies it. A file that also holds other
instances' key groups (restoring at a finer parallelism than it was written
at) is ingested whole and those key groups are deleted again (range
tombstones, flushed; only where the store holds nothing). A file some of
whose key groups have a newer snapshot in this restore (possible after
rescaling only: a writer snapshots the key groups it owns that share a file
together) is loaded entry by entry from a scratch RocksDB.

From an object store (any location that is not a local path) nothing is
read one file after the other: sections are fetched by concurrent ranged
requests (consecutive sections of a file by one request) and SST files by
ranged requests of the size the manifest records, ``FETCH_THREADS`` requests
at a time; no request asks for a file's size (a HEAD per file is a round trip
of its own, 10-50 ms on S3). A file of another size than recorded is still
caught: a short read, or the one byte asked past the recorded end.

Memory: one section at a time is read (local files: views of the mapping;
object stores: at most ``FETCH_AHEAD_BYTES`` fetched ahead);
SST payloads and copies are staged to files (written and fdatasync'ed by four
worker threads, overlapping the reads, so RocksDB's own fsync at ingestion is
cheap); record blocks are kept until they are applied, which is small for
deltas (and for record-encoded snapshots of small key groups).

With a checkpoint key (the manifest was verified against its signature),
nothing is read through a memory map or hard-linked: every section and SST
file is copied first and its checksum computed over the copy, so that a
writer of the location cannot change bytes between their verification and
their use.

A damaged, truncated or missing file (task file or SST file) raises
:class:`CheckpointCorruptError` naming the file and the key group, and leaves
the stores untouched; other versions that do not reference the damaged file
stay restorable. An SST file hard-linked into a store is never written to
(RocksDB opens it only to fsync it), so the checkpoint's copy stays intact.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import tempfile
import time
from collections import defaultdict, deque
from contextlib import nullcontext
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from state import RocksDBStore
from state.raw import RawTable

from .errors import CheckpointCorruptError, CheckpointError, CheckpointTrustError
from .format import (
    DELTA,
    SNAPSHOT,
    SST,
    SST_FILE,
    SstFileRef,
    checksum,
    decode_records,
    decode_section,
    decode_sst_file_ref,
    file_checksum,
    file_hasher,
)
from .manifest import Manifest, SectionRef
from .staging import staging_dir
from .storage import FETCH_THREADS, CheckpointStorage

DEFAULT_CHUNK = 100_000
_STAGING_THREADS = 4  # parallel fdatasyncs keep the disk's queue full
_MAX_IN_FLIGHT = 16  # SST payloads being written to the staging directory at once (bounds memory)
_COPY_CHUNK = 8 << 20
#: Object stores: consecutive sections of a file are fetched by one request when the gap between
#: them is at most this many bytes (reading a gap costs less than a round trip) ...
_COALESCE_GAP = 256 << 10
#: ... and the request stays at most this long (several requests of one file then run concurrently).
_MAX_REQUEST = 8 << 20


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


def _ingest(store: RawTable, paths: list[str], linked: Mapping[str, str]) -> None:
    """Ingest SST files into a table (the files are moved in when on the same filesystem).

    ``linked`` maps the files that are hard links of checkpoint files to them:
    should RocksDB refuse one (it reopens every ingested file for writing, to
    fsync it), they are replaced by copies and the ingestion is tried again.
    """
    try:
        store.ingest_sst_files(paths)
    except Exception:  # rocksdict raises plain Exception
        if not any(p in linked for p in paths):
            raise
        for p in paths:
            if p in linked:
                os.remove(p)  # never write through the link: it is the checkpoint's file
                _write_synced(p, _read_file(linked[p]))
        store.ingest_sst_files(paths)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_synced(path: str, payload: bytes | memoryview) -> None:
    """Write a staged SST file and flush it to disk (in a worker thread, overlapping the reads):
    RocksDB fsyncs every ingested file, which is then cheap."""
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fdatasync(f.fileno())


def _compact(store: RawTable, key_groups: range) -> None:
    """Compact a cleared key-group range, so that SST files ingested into it go to the bottom level."""
    store.compact_key_groups(key_groups)


def _is_empty(store: RawTable, key_groups: range) -> bool:
    return next(iter(store.iter_raw(key_groups)), None) is None


def _temp_dir_near(tables: Mapping[str, RawTable], tmp_dir: str | None) -> str:
    """A temp dir for SST files: ``tmp_dir``, else next to the first store (same filesystem: ingestion links)."""
    if tmp_dir is not None:
        return staging_dir("restore", tmp_dir)
    store = next(iter(tables.values()))
    try:
        return staging_dir("restore", os.path.dirname(os.path.abspath(store.path)), hidden=True)
    except OSError:
        return staging_dir("restore", tempfile.gettempdir())


def _corrupt_truncated(file: str, ref: SectionRef, got: int) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {file!r} is truncated: the {ref.kind} section of key group {ref.key_group} "
        f"needs bytes {ref.offset}..{ref.offset + ref.length}, only {got} could be read",
        file=file, key_group=ref.key_group,
    )


def _check(file: str, ref: SectionRef, data: bytes | memoryview) -> None:
    if len(data) != ref.length:
        raise _corrupt_truncated(file, ref, len(data))
    if checksum(data) != ref.checksum or (ref.digest and hashlib.sha256(data).hexdigest() != ref.digest):
        raise CheckpointCorruptError(
            f"checksum mismatch in checkpoint file {file!r}: the {ref.kind} section of key group "
            f"{ref.key_group} (bytes {ref.offset}..{ref.offset + ref.length}) is corrupt",
            file=file, key_group=ref.key_group,
        )


def _check_digests(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> None:
    """With a checkpoint key, every section (and SST file) must have a SHA-256 digest in the signed manifest:
    a plain xxh64 checksum can be forged, so without one the signature would not vouch for the bytes."""
    if storage.checkpoint_key is None:
        return
    for ref in refs:
        if not ref.digest or len(ref.sst_digests) != len(ref.sst_files):
            raise CheckpointTrustError(
                f"the {ref.kind} section of key group {ref.key_group} in {ref.file!r} has no SHA-256 digest in "
                "its manifest, and a checkpoint key is set: refused (it was written without the key)",
                file=ref.file, key_group=ref.key_group,
            )


def _missing(storage: CheckpointStorage, file: str, key_group: int) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {file!r} is missing (needed for key group {key_group}) in {storage.location!r}",
        file=file, key_group=key_group,
    )


def _iter_views(
    storage: CheckpointStorage, refs: Sequence[SectionRef]
) -> Iterator[tuple[int, SectionRef, bytes | memoryview]]:
    """Like :func:`iter_sections`, but a local file is memory-mapped and its sections are read-only views.

    The views read the page cache directly (no copy, no fresh buffer per
    section); they keep the mapping alive as long as they are referenced.
    """
    if not storage.is_local:
        yield from _iter_fetched(storage, refs)
        return
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_file[ref.file].append(i)
    for file, positions in by_file.items():
        positions.sort(key=lambda i: refs[i].offset)
        # With a key, bytes are copied before they are verified: a mapped file could change after its check.
        path = storage.local_path(file) if storage.checkpoint_key is None else None
        if path is None:
            yield from _iter_stream(storage, file, refs, positions)
            continue
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise _missing(storage, file, refs[positions[0]].key_group) from None
        with f:
            size = os.fstat(f.fileno()).st_size
            whole = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else memoryview(b"")
        for i in positions:
            ref = refs[i]
            data = whole[ref.offset : ref.offset + ref.length]
            _check(file, ref, data)
            yield i, ref, data


def _iter_stream(
    storage: CheckpointStorage, file: str, refs: Sequence[SectionRef], positions: list[int]
) -> Iterator[tuple[int, SectionRef, bytes]]:
    """The sections ``positions`` of ``refs`` in ``file`` (sorted by offset), read one at a time and verified."""
    try:
        stream = storage.open_read(file)
    except FileNotFoundError:
        raise _missing(storage, file, refs[positions[0]].key_group) from None
    with stream:
        for i in positions:
            ref = refs[i]
            stream.seek(ref.offset)
            data = stream.read(ref.length)
            _check(file, ref, data)
            yield i, ref, data


def _iter_fetched(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> Iterator[tuple[int, SectionRef, bytes]]:
    """Like :func:`iter_sections`, for an object store: the sections are fetched concurrently.

    Consecutive sections of a file (an instance's key groups are written next
    to each other) are fetched by one ranged request, up to ``_MAX_REQUEST``
    bytes; the requests run concurrently (``CheckpointStorage.read_ranges``),
    and their lengths come from the manifest, so no request asks for a size.
    A store answering in 10-50 ms per request then costs about one round trip
    per FETCH_THREADS requests instead of two per file.
    """
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_file[ref.file].append(i)
    requests: list[tuple[str, int, int]] = []
    members: list[list[int]] = []  # the refs each request covers
    for file, positions in by_file.items():
        positions.sort(key=lambda i: refs[i].offset)
        for i in positions:
            ref = refs[i]
            if requests and requests[-1][0] == file:
                _, start, length = requests[-1]
                end = max(start + length, ref.offset + ref.length)
                if start + length <= ref.offset <= start + length + _COALESCE_GAP and end - start <= _MAX_REQUEST:
                    requests[-1] = (file, start, end - start)
                    members[-1].append(i)
                    continue
            requests.append((file, ref.offset, ref.length))
            members.append([i])
    for n, ((file, start, _), future) in enumerate(storage.read_ranges(requests)):
        try:
            data = future.result()
        except FileNotFoundError:
            raise _missing(storage, file, refs[members[n][0]].key_group) from None
        for i in members[n]:
            ref = refs[i]
            section = data if len(members[n]) == 1 else data[ref.offset - start : ref.offset - start + ref.length]
            _check(file, ref, section)
            yield i, ref, section


def iter_sections(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> Iterator[tuple[int, SectionRef, bytes]]:
    """``(index in refs, ref, section bytes)`` of every ref, checksum verified, file by file in offset order.

    Each file is opened once; sections are read one at a time (memory: one section). On an
    object store the sections are fetched concurrently instead (:func:`_iter_fetched`).
    """
    if not storage.is_local:
        yield from _iter_fetched(storage, refs)
        return
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_file[ref.file].append(i)
    for file, positions in by_file.items():
        positions.sort(key=lambda i: refs[i].offset)
        yield from _iter_stream(storage, file, refs, positions)


def verify_sections(storage: CheckpointStorage, refs: Sequence[SectionRef]) -> int:
    """Read every section of ``refs`` and the SST files they reference, checking every checksum.

    Returns the bytes read.
    """
    _check_digests(storage, refs)
    total = 0
    uses: dict[tuple[str, str], _SstFileUse] = {}
    for _, ref, data in iter_sections(storage, refs):
        total += len(data)
        if ref.kind != SNAPSHOT:
            continue
        for block in decode_section(data, file=ref.file, key_group=ref.key_group, kind=ref.kind):
            if block.encoding == SST_FILE:
                sst = decode_sst_file_ref(block.payload, file=ref.file, key_group=ref.key_group)
                use = uses.setdefault((block.table, sst.name), _SstFileUse(block.table, sst, ref))
                use.wanted.append(ref.key_group)
    for use in uses.values():
        _copy_verified(storage, use, None)
        total += use.ref.size
    return total


def restore(
    storage: CheckpointStorage | str | os.PathLike[str],
    version: int | Manifest | None,
    key_groups: range,
    tables: Mapping[str, RawTable],
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
    and SST file is verified before the first write), CheckpointError/ValueError for
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
    _check_digests(storage, refs)
    in_flight: deque[Future] = deque()

    def stage(path: str, payload: bytes | memoryview) -> None:
        while len(in_flight) >= _MAX_IN_FLIGHT:  # bound the memory of staged payloads
            in_flight.popleft().result()
        in_flight.append(pool.submit(_write_synced, path, payload))

    tmp = _temp_dir_near(tables, None if tmp_dir is None else os.fspath(tmp_dir))
    pool = ThreadPoolExecutor(max_workers=_STAGING_THREADS, thread_name_prefix="opbuffer-restore")
    # SST files come from an object store by FETCH_THREADS concurrent downloads (waiting on the
    # network, not on the disk the staging threads fsync).
    fetch_pool = None if storage.is_local else ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="opbuffer-fetch")
    try:
        # Phase 1: read and verify everything, stage SST files; the stores are not touched yet.
        sst_paths: dict[str, list[str]] = defaultdict(list)  # per table: whole SST files to ingest
        spans: dict[str, list[range]] = defaultdict(list)  # per table: the key groups each of them spans
        sst_uses: dict[tuple[str, str], _SstFileUse] = {}  # (table, SST file) -> the key groups wanted from it
        record_blocks: list[tuple[int, int, str, Any]] = []
        total_bytes = 0
        for i, ref, data in _iter_views(storage, refs):
            total_bytes += len(data)
            pos = positions[i]
            mapped = isinstance(data, memoryview)
            for block in decode_section(data, file=ref.file, key_group=ref.key_group, kind=ref.kind):
                if block.table not in tables:
                    raise CheckpointCorruptError(
                        f"section of key group {ref.key_group} in {ref.file!r} has table {block.table!r}, "
                        f"which version {manifest.version} does not list", file=ref.file, key_group=ref.key_group,
                    )
                if block.encoding in (SST, SST_FILE) and (ref.kind != SNAPSHOT or pos != 0):
                    raise CheckpointCorruptError(
                        f"SST block in a {ref.kind} section of key group {ref.key_group} in {ref.file!r}",
                        file=ref.file, key_group=ref.key_group,
                    )
                if block.encoding == SST:
                    path = os.path.join(tmp, f"s{len(sst_paths[block.table])}-{ref.key_group}.sst")
                    stage(path, block.payload)
                    sst_paths[block.table].append(path)
                    spans[block.table].append(range(ref.key_group, ref.key_group + 1))
                elif block.encoding == SST_FILE:
                    sst = decode_sst_file_ref(block.payload, file=ref.file, key_group=ref.key_group)
                    use = sst_uses.setdefault((block.table, sst.name), _SstFileUse(block.table, sst, ref))
                    if ref.key_group not in sst.key_groups or use.ref != sst:
                        raise CheckpointCorruptError(
                            f"corrupt section of key group {ref.key_group} in {ref.file!r}: its reference to the "
                            f"SST file {sst.name!r} does not match", file=ref.file, key_group=ref.key_group,
                        )
                    use.wanted.append(ref.key_group)
                else:
                    # A read section's bytes are copied, so that they (maybe holding an SST payload) can be
                    # freed; a view of a mapped file costs nothing to keep.
                    payload = block.payload if mapped else bytes(block.payload)
                    record_blocks.append((ref.key_group, pos, block.table, (ref, payload)))
        record_blocks.sort(key=lambda b: (b[0], b[1]))

        # SST files of several key groups: verified whole, then hard-linked (local location on the
        # filesystem of the stores: no bytes copied, RocksDB's fsync finds nothing to write) or copied.
        parts: list[tuple[str, str, list[int]]] = []  # (table, staged file, wanted key groups): loaded per entry
        clips: list[tuple[_SstFileUse, str]] = []  # files also holding other instances' key groups
        linked: dict[str, str] = {}  # staged file -> the checkpoint file it is a hard link of
        downloads: list[tuple[_SstFileUse, Future]] = []
        for n, use in enumerate(sst_uses.values()):
            total_bytes += use.ref.size
            path = os.path.join(tmp, f"f{n}.sst")
            local = storage.local_path(use.ref.name) if storage.checkpoint_key is None else None
            if local is not None:
                view = _verified_sst_file(local, use)
                try:
                    os.link(local, path)
                except OSError:  # another filesystem, no hard links, not allowed
                    stage(path, view)
                else:
                    linked[path] = local
                del view
            else:
                downloads.append((use, (fetch_pool or pool).submit(_copy_verified, storage, use, path)))
            groups = use.ref.key_groups
            if use.whole:
                sst_paths[use.table].append(path)
                spans[use.table].append(range(groups[0], groups[-1] + 1))
            elif all(g not in key_groups for g in set(groups) - set(use.wanted)):
                clips.append((use, path))  # the rest belongs to other instances (rescaled): maybe clip
            else:
                parts.append((use.table, path, sorted(use.wanted)))
        for use, future in downloads:
            future.result()  # raises CheckpointCorruptError for a missing or damaged file
        while in_flight:
            in_flight.popleft().result()

        # Phase 2: clear, ingest snapshots, load parts of SST files, apply records in chain order.
        #
        # A file that also holds key groups of other instances is ingested whole and the others are
        # deleted again (one range tombstone each, flushed), provided the store holds nothing there and
        # the file spans no key group another ingested file spans; else it is loaded entry by entry.
        clipped: dict[str, list[range]] = defaultdict(list)
        for use, path in clips:
            groups = use.ref.key_groups
            span = range(groups[0], groups[-1] + 1)
            others = _runs(g for g in groups if g not in key_groups)
            table = tables[use.table]
            if (all(not (s.start < span.stop and span.start < s.stop) for s in spans[use.table])
                    and all(_is_empty(table, run) for run in others)):
                sst_paths[use.table].append(path)
                spans[use.table].append(span)
                clipped[use.table].extend(others)
            else:
                parts.append((use.table, path, sorted(use.wanted)))
        # An empty range is not cleared: a range tombstone would make RocksDB put every ingested file in
        # level 0 (slow reads, write stalls, a compaction storm); a cleared range is compacted before
        # ingestion.
        for name, table in tables.items():
            if not _is_empty(table, key_groups):
                table.delete_key_groups(key_groups)
                if sst_paths.get(name):
                    _compact(table, key_groups)
        sst_files = 0
        for name, paths in sst_paths.items():
            _ingest(tables[name], paths, linked)  # one call per table: every file in one ingestion
            sst_files += len(paths)
            for run in clipped.get(name, ()):
                tables[name].delete_key_groups(run)
            if clipped.get(name):
                tables[name].flush()  # the tombstones are as durable as the ingested files
        records = 0
        for n, (name, path, wanted) in enumerate(parts):
            records += _load_part(tables[name], path, wanted, os.path.join(tmp, f"part{n}"), mp, chunk_size, linked)
        pending: dict[str, tuple[list[bytes], list[bytes | None]]] = {}
        for _, _, name, (ref, payload) in record_blocks:
            keys, values = decode_records(payload, file=ref.file, key_group=ref.key_group)
            buf = pending.setdefault(name, ([], []))
            buf[0].extend(keys)
            buf[1].extend(values)
            records += len(keys)
            if len(buf[0]) >= chunk_size:
                tables[name].write_raw_columns(*buf)
                del pending[name]
        for name, buf in pending.items():
            tables[name].write_raw_columns(*buf)
    finally:
        pool.shutdown(wait=True)
        if fetch_pool is not None:
            fetch_pool.shutdown(wait=True, cancel_futures=True)
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


@dataclass
class _SstFileUse:
    """One SST file of several key groups and the key groups this restore wants from it."""

    table: str
    ref: SstFileRef
    section: SectionRef  # the first section referencing it (for messages)
    wanted: list[int] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """Every key group in the file is wanted (from this very file): ingest it as it is."""
        return sorted(self.wanted) == list(self.ref.key_groups)

    @property
    def digest(self) -> str:
        """The SHA-256 the referencing section's manifest entry gives the file ("" when written without a key)."""
        files, digests = self.section.sst_files, self.section.sst_digests
        return digests[files.index(self.ref.name)] if digests and self.ref.name in files else ""

    def corrupt(self, why: str) -> CheckpointCorruptError:
        g = min(self.wanted)
        groups = self.ref.key_groups
        return CheckpointCorruptError(
            f"checkpoint file {self.ref.name!r} (the SST file of key groups {groups[0]}..{groups[-1]} of table "
            f"{self.table!r}, referenced by {self.section.file!r}) {why}; needed for key group {g}",
            file=self.ref.name, key_group=g,
        )


def _verified_sst_file(path: str, use: _SstFileUse) -> memoryview:
    """A read-only view of a local SST file whose size and checksum match its reference."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise use.corrupt("is missing") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != use.ref.size:
            raise use.corrupt(f"is truncated or damaged: it has {size} bytes, the checkpoint wrote {use.ref.size}")
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else memoryview(b"")
    if file_checksum(view) != use.ref.checksum or (use.digest and hashlib.sha256(view).hexdigest() != use.digest):
        raise use.corrupt("is corrupt (checksum mismatch)")
    return view


def _chunks_of(storage: CheckpointStorage, use: _SstFileUse) -> Iterator[bytes]:
    """The bytes of an SST file in chunks: streamed from a local file; from an object store by ranged requests
    of the size the manifest records (no request for the size; the last one asks for one byte more, which
    only a file longer than the checkpoint wrote has)."""
    if storage.is_local:
        try:
            stream = storage.open_read(use.ref.name)
        except FileNotFoundError:
            raise use.corrupt("is missing") from None
        with stream:
            while True:
                chunk = stream.read(_COPY_CHUNK)
                if not chunk:
                    return
                yield chunk
    size = use.ref.size
    offset = 0
    while True:
        length = min(_COPY_CHUNK, size - offset)
        last = offset + length >= size
        try:
            chunk = storage.read_range(use.ref.name, offset, length + 1 if last else length)
        except FileNotFoundError:
            raise use.corrupt("is missing") from None
        if chunk:
            yield chunk
        offset += len(chunk)
        if last or len(chunk) < length:
            return


def _copy_verified(storage: CheckpointStorage, use: _SstFileUse, path: str | None) -> None:
    """Read an SST file (to ``path``, fdatasync'ed, unless None), verifying its size and checksum."""
    hasher = file_hasher()
    digest = use.digest
    sha = hashlib.sha256() if digest else None
    size = 0
    chunks = _chunks_of(storage, use)
    with (open(path, "wb") if path is not None else nullcontext()) as out:
        for chunk in chunks:
            hasher.update(chunk)
            if sha is not None:
                sha.update(chunk)
            if out is not None:
                out.write(chunk)
            size += len(chunk)
        if size < use.ref.size:
            raise use.corrupt(f"is truncated or damaged: it has {size} bytes, the checkpoint wrote {use.ref.size}")
        if size > use.ref.size:  # from an object store, only one byte past the recorded size is read
            raise use.corrupt(f"is damaged: it has more than the {use.ref.size} bytes the checkpoint wrote")
        if hasher.intdigest() != use.ref.checksum or (sha is not None and sha.hexdigest() != digest):
            raise use.corrupt("is corrupt (checksum mismatch)")
        if out is not None:
            out.flush()
            os.fdatasync(out.fileno())


def _runs(groups: Iterable[int]) -> list[range]:
    """Sorted key groups as maximal ranges of consecutive ones."""
    runs: list[range] = []
    for g in groups:
        if runs and runs[-1].stop == g:
            runs[-1] = range(runs[-1].start, g + 1)
        else:
            runs.append(range(g, g + 1))
    return runs


def _load_part(
    table: RawTable,
    path: str,
    wanted: list[int],
    scratch_dir: str,
    max_parallelism: int,
    chunk_size: int,
    linked: Mapping[str, str],
) -> int:
    """Load the entries of ``wanted`` key groups of an SST file through write batches; returns their count.

    (The file also holds key groups this restore must not load.) It is ingested
    into a scratch RocksDB and the wanted key groups are read back in key order.
    """
    scratch = RocksDBStore(scratch_dir, max_parallelism=max_parallelism)
    count = 0
    try:
        _ingest(scratch, [path], linked)
        for run in _runs(wanted):
            buf: list[tuple[bytes, bytes]] = []
            for pair in scratch.iter_raw(run):
                buf.append(pair)
                if len(buf) >= chunk_size:
                    table.write_raw(buf)
                    count += len(buf)
                    buf = []
            if buf:
                table.write_raw(buf)
                count += len(buf)
    finally:
        scratch.close()
    return count


__all__ = ["RestoreReport", "iter_sections", "restore", "verify_sections"]
