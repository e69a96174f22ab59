"""The binary format of a task file: one data file per operator instance and version.

All integers are little-endian. A task file is::

    file header   "OPBCKPT1" | u16 format version | u16 reserved | u32 n | n bytes of JSON
                  (version, task, attempt, key_groups [start, stop), max_parallelism,
                  tables, base_version, created_at: for inspection only)
    section *     one per key group written in this version (see below)
    index         u32 count | count x (u16 key group | u8 kind | u8 0 | u64 offset
                  | u64 length | u64 xxh64 of the section)
    footer        u64 index offset | u64 index length | u64 xxh64 of the index
                  | u16 format version | u16 0 | "OPBCKEND"          (36 bytes)

A section holds the entries of every table of one key group::

    section header  "KG" | u16 key group | u8 kind (1 snapshot, 2 delta) | u8 0 | u16 0
    block *         u8 encoding (1 records, 2 sst, 3 sst_file) | u8 0 | u16 n | u64 m
                    | n bytes: table name (UTF-8) | m bytes: payload

A table without entries in the section has no block. The section's checksum
(xxh64, seed 0, over the header and every block) is in the index and in the
manifest, so a reader that knows the section from the manifest reads just
``length`` bytes at ``offset`` and never needs the index.

Block payloads:

* ``records``: ``u32 n | n x u32 key length | n x u32 value length
  (0xFFFFFFFF = tombstone) | the n keys | the n values``. Keys are raw
  RocksDB keys (2-byte big-endian key group + canonical key bytes), sorted.
  Deltas are always records; a snapshot's records have no tombstones.
* ``sst``: a RocksDB SST file (``SstFileWriter``, bytewise comparator, raw
  mode) holding the table's entries of the key group. Only snapshots use it:
  a restore ingests it into RocksDB as it is, with no per-key work in Python.
  (Format version 1; still read, no longer written.)
* ``sst_file`` (format version 2): a reference to an SST file of its own
  next to the task file (``<task file stem>.kg<lo>-<hi>.t<table>.sst``),
  which holds the table's entries of *several consecutive* key groups
  written in the same version: ``u64 file size | u64 xxh3_64 of the file |
  u16 lo | u16 hi | u16 n | n bytes: bitmap of the key groups in [lo, hi)
  with entries in the file | file name (UTF-8, relative to the location)``.
  Every key group in the file has the same reference in its own snapshot
  section. A restore that wants every key group of the file hard-links it
  into RocksDB (local storage) or copies it, and ingests it: one file (one
  fsync) for many key groups, and no copy of the bytes at all when linked.

A *snapshot* section is the complete content of the key group; a *delta* is
applied on top of the sections before it in the key group's chain (a value
replaces, a tombstone deletes).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from itertools import accumulate
from typing import IO, Any, Callable, Iterable, Sequence

import numpy as np
import xxhash

from .errors import CheckpointCorruptError

# 2: ``sst_file`` blocks (SST files of several key groups next to the task file);
# 3: manifests carry a checksum (and a signature with a checkpoint key); manifests without one are refused.
FORMAT_VERSION = 3
FILE_MAGIC = b"OPBCKPT1"
FOOTER_MAGIC = b"OPBCKEND"

SNAPSHOT = "snapshot"
DELTA = "delta"
RECORDS = "records"
SST = "sst"
SST_FILE = "sst_file"

_KIND_CODES = {SNAPSHOT: 1, DELTA: 2}
_KIND_NAMES = {v: k for k, v in _KIND_CODES.items()}
_ENCODING_CODES = {RECORDS: 1, SST: 2, SST_FILE: 3}
_ENCODING_NAMES = {v: k for k, v in _ENCODING_CODES.items()}

TOMBSTONE_LENGTH = 0xFFFFFFFF

_FILE_HEADER = struct.Struct("<8sHHI")
_SECTION_HEADER = struct.Struct("<2sHBBH")
_SECTION_MAGIC = b"KG"
_BLOCK_HEADER = struct.Struct("<BBHQ")
_INDEX_ENTRY = struct.Struct("<HBBQQQ")
_U32 = struct.Struct("<I")
_FOOTER = struct.Struct("<QQQHH8s")
_SST_FILE_REF = struct.Struct("<QQHHH")
FOOTER_SIZE = _FOOTER.size


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The checksum of a section (xxh64, seed 0), as an unsigned 64-bit int."""
    return xxhash.xxh64_intdigest(data)


def file_checksum(data: bytes | bytearray | memoryview) -> int:
    """The checksum of an SST file of its own (xxh3_64, seed 0: about twice as fast as xxh64 on large inputs)."""
    return xxhash.xxh3_64_intdigest(data)


def file_hasher() -> Any:
    """A streaming hasher of :func:`file_checksum` (``update(bytes)``, ``intdigest()``)."""
    return xxhash.xxh3_64()


def kind_code(kind: str) -> int:
    try:
        return _KIND_CODES[kind]
    except KeyError:
        raise ValueError(f"section kind must be {SNAPSHOT!r} or {DELTA!r}, got {kind!r}") from None


# ---------------------------------------------------------------- records
def encode_records(keys: Sequence[bytes], values: Sequence[bytes | None]) -> bytes:
    """A records payload of parallel lists of raw keys and values (None = tombstone)."""
    n = len(keys)
    if len(values) != n:
        raise ValueError(f"{n} keys but {len(values)} values")
    value_lengths = [TOMBSTONE_LENGTH if v is None else len(v) for v in values]
    head = struct.pack(f"<I{2 * n}I", n, *map(len, keys), *value_lengths)
    return b"".join((head, b"".join(keys), b"".join(v for v in values if v is not None)))


def encoded_records_size(keys: Sequence[bytes], values: Iterable[bytes | None]) -> int:
    """``len(encode_records(keys, values))`` without encoding them."""
    return 4 + 8 * len(keys) + sum(map(len, keys)) + sum(len(v) for v in values if v is not None)


def encoded_section_size(blocks: Iterable[tuple[str, int]]) -> int:
    """``len(encode_section(...))`` of blocks given as ``(table, payload size)``."""
    return _SECTION_HEADER.size + sum(_BLOCK_HEADER.size + len(t.encode("utf-8")) + n for t, n in blocks)


def decode_records(payload: bytes | memoryview, *, file: str = "?", key_group: int | None = None) -> tuple[list[bytes], list[bytes | None]]:
    """Inverse of :func:`encode_records`: ``(keys, values)`` with None for tombstones.

    Keys (values) of one length, the usual case (one-column long keys, fixed-size
    values), are cut by numpy in one call instead of one slice each.
    """
    try:
        n = _U32.unpack_from(payload, 0)[0]
        lengths = struct.unpack_from(f"<{2 * n}I", payload, 4)
    except struct.error as exc:
        raise CheckpointCorruptError(
            f"corrupt records block in {file!r} (key group {key_group}): {exc}", file=file, key_group=key_group
        ) from exc
    size = len(payload)

    def corrupt(end: int) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"corrupt records block in {file!r} (key group {key_group}): lengths add up to {end} bytes, "
            f"the block has {size}",
            file=file,
            key_group=key_group,
        )

    data: Any = payload

    def sliceable() -> bytes:
        nonlocal data
        if not isinstance(data, bytes):
            data = bytes(data)
        return data

    key_lengths = lengths[:n]
    value_lengths = lengths[n:]
    pos = 4 + 8 * n
    keys: list[bytes]
    if n and key_lengths.count(key_lengths[0]) == n:
        keys, pos = _fixed_width(payload, pos, n, key_lengths[0], size, corrupt)
    else:
        key_ends = list(accumulate(key_lengths, initial=pos))
        buf = sliceable()
        keys = [buf[a:b] for a, b in zip(key_ends, key_ends[1:])]
        pos = key_ends[-1]
    values: list[bytes | None]
    if TOMBSTONE_LENGTH in value_lengths:
        buf = sliceable()
        values = []
        append = values.append
        for length in value_lengths:
            if length == TOMBSTONE_LENGTH:
                append(None)
            else:
                append(buf[pos : pos + length])
                pos += length
    elif n and value_lengths.count(value_lengths[0]) == n:
        values, pos = _fixed_width(payload, pos, n, value_lengths[0], size, corrupt)  # type: ignore[assignment]
    else:
        value_ends = list(accumulate(value_lengths, initial=pos))
        buf = sliceable()
        values = [buf[a:b] for a, b in zip(value_ends, value_ends[1:])]
        pos = value_ends[-1]
    if pos != size:
        raise corrupt(pos)
    return keys, values


def _fixed_width(
    payload: bytes | memoryview, pos: int, n: int, width: int, size: int, corrupt: Callable[[int], Exception]
) -> tuple[list[bytes], int]:
    """``n`` byte strings of ``width`` bytes each at ``pos``, and the position after them."""
    end = pos + n * width
    if end > size:
        raise corrupt(end)
    if width == 0:
        return [b""] * n, end
    return np.frombuffer(payload, dtype=f"V{width}", count=n, offset=pos).tolist(), end


# ---------------------------------------------------------------- SST file references
@dataclass(frozen=True)
class SstFileRef:
    """An SST file of its own holding one table's entries of several consecutive key groups."""

    name: str  # relative to the checkpoint location
    size: int
    checksum: int  # xxh3_64 of the whole file (file_checksum)
    key_groups: tuple[int, ...]  # sorted: the key groups with entries in the file


def encode_sst_file_ref(ref: SstFileRef) -> bytes:
    """The payload of an ``sst_file`` block."""
    groups = ref.key_groups
    if not groups or list(groups) != sorted(set(groups)):
        raise ValueError(f"key_groups must be sorted, distinct and non-empty, got {groups!r}")
    lo, hi = groups[0], groups[-1] + 1
    bitmap = bytearray((hi - lo + 7) // 8)
    for g in groups:
        bitmap[(g - lo) >> 3] |= 1 << ((g - lo) & 7)
    return _SST_FILE_REF.pack(ref.size, ref.checksum, lo, hi, len(bitmap)) + bytes(bitmap) + ref.name.encode("utf-8")


def decode_sst_file_ref(payload: bytes | memoryview, *, file: str = "?", key_group: int | None = None) -> SstFileRef:
    """Inverse of :func:`encode_sst_file_ref` (of a block whose section checksum was verified)."""
    try:
        size, crc, lo, hi, n = _SST_FILE_REF.unpack_from(payload, 0)
        start = _SST_FILE_REF.size
        bitmap = bytes(payload[start : start + n])
        name = str(payload[start + n :], "utf-8")
        if len(bitmap) != n or n != (hi - lo + 7) // 8 or not name:
            raise ValueError(f"bitmap of {len(bitmap)}/{n} bytes for key groups {lo}..{hi}, name {name!r}")
    except (struct.error, ValueError) as exc:
        raise CheckpointCorruptError(
            f"corrupt SST file reference in {file!r} (key group {key_group}): {exc}", file=file, key_group=key_group
        ) from exc
    groups = tuple(lo + i for i in range(hi - lo) if bitmap[i >> 3] & (1 << (i & 7)))
    return SstFileRef(name, size, crc, groups)


# ---------------------------------------------------------------- sections
@dataclass(frozen=True)
class Block:
    """The entries of one table in one section."""

    table: str
    encoding: str  # RECORDS, SST or SST_FILE
    payload: bytes | memoryview


def encode_section(key_group: int, kind: str, blocks: Iterable[Block]) -> bytes:
    """The bytes of one section (header and blocks)."""
    parts = [_SECTION_HEADER.pack(_SECTION_MAGIC, key_group, kind_code(kind), 0, 0)]
    for block in blocks:
        name = block.table.encode("utf-8")
        parts.append(_BLOCK_HEADER.pack(_ENCODING_CODES[block.encoding], 0, len(name), len(block.payload)))
        parts.append(name)
        parts.append(block.payload)
    return b"".join(parts)


def decode_section(data: bytes | memoryview, *, file: str, key_group: int, kind: str | None = None) -> list[Block]:
    """The blocks of a section whose checksum was already verified; checks its header against the reference."""

    def corrupt(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"corrupt section of key group {key_group} in {file!r}: {why}", file=file, key_group=key_group
        )

    if len(data) < _SECTION_HEADER.size:
        raise corrupt(f"{len(data)} bytes is shorter than a section header")
    magic, kg, code, _, _ = _SECTION_HEADER.unpack_from(data, 0)
    if magic != _SECTION_MAGIC:
        raise corrupt(f"bad section magic {magic!r}")
    if kg != key_group:
        raise corrupt(f"the section holds key group {kg}")
    if code not in _KIND_NAMES or (kind is not None and _KIND_NAMES[code] != kind):
        raise corrupt(f"section kind code {code}, expected {kind!r}")
    blocks = []
    view = memoryview(data)
    pos = _SECTION_HEADER.size
    end = len(data)
    while pos < end:
        if pos + _BLOCK_HEADER.size > end:
            raise corrupt("truncated block header")
        enc, _, name_len, payload_len = _BLOCK_HEADER.unpack_from(data, pos)
        pos += _BLOCK_HEADER.size
        if enc not in _ENCODING_NAMES or pos + name_len + payload_len > end:
            raise corrupt(f"bad block (encoding {enc}, {name_len}+{payload_len} bytes at {pos})")
        name = str(data[pos : pos + name_len], "utf-8")
        pos += name_len
        blocks.append(Block(name, _ENCODING_NAMES[enc], view[pos : pos + payload_len]))
        pos += payload_len
    return blocks


def section_kind(data: bytes) -> str:
    """The kind of a section from its header."""
    return _KIND_NAMES[_SECTION_HEADER.unpack_from(data, 0)[2]]


# ---------------------------------------------------------------- task files
@dataclass(frozen=True)
class IndexEntry:
    """One row of a task file's index (and the location of a section)."""

    key_group: int
    kind: str
    offset: int
    length: int
    checksum: int


class TaskFileWriter:
    """Writes a task file to a binary stream: header, then sections, then ``finish()`` adds index and footer."""

    def __init__(self, stream: IO[bytes], header: dict[str, Any]) -> None:
        self._stream = stream
        meta = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        head = _FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0, len(meta)) + meta
        stream.write(head)
        self.offset = len(head)
        self.entries: list[IndexEntry] = []

    def add_section(self, key_group: int, kind: str, data: bytes) -> IndexEntry:
        entry = IndexEntry(key_group, kind, self.offset, len(data), checksum(data))
        self._stream.write(data)
        self.offset += len(data)
        self.entries.append(entry)
        return entry

    def finish(self) -> int:
        """Write index and footer; returns the size of the file."""
        index = _U32.pack(len(self.entries)) + b"".join(
            _INDEX_ENTRY.pack(e.key_group, kind_code(e.kind), 0, e.offset, e.length, e.checksum) for e in self.entries
        )
        footer = _FOOTER.pack(self.offset, len(index), checksum(index), FORMAT_VERSION, 0, FOOTER_MAGIC)
        self._stream.write(index)
        self._stream.write(footer)
        self.offset += len(index) + len(footer)
        return self.offset


def read_task_file_index(
    read: Callable[[int, int], bytes], size: int, *, file: str = "?"
) -> tuple[dict[str, Any], list[IndexEntry]]:
    """``(header JSON, index entries)`` of a task file, checking magic numbers and the index checksum.

    ``read(offset, length)`` reads bytes of the file, ``size`` is its length.
    """

    def corrupt(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"corrupt task file {file!r}: {why}", file=file)

    if size < _FILE_HEADER.size + FOOTER_SIZE:
        raise corrupt(f"{size} bytes is too short for a task file (truncated?)")
    magic, fmt, _, meta_len = _FILE_HEADER.unpack(read(0, _FILE_HEADER.size))
    if magic != FILE_MAGIC:
        raise corrupt(f"bad magic {magic!r} (not an opbuffer task file)")
    if fmt > FORMAT_VERSION:
        raise corrupt(f"format version {fmt} is newer than this reader ({FORMAT_VERSION})")
    try:
        header = json.loads(read(_FILE_HEADER.size, meta_len))
    except ValueError as exc:
        raise corrupt(f"unreadable header: {exc}") from exc
    index_offset, index_length, index_sum, _, _, end_magic = _FOOTER.unpack(read(size - FOOTER_SIZE, FOOTER_SIZE))
    if end_magic != FOOTER_MAGIC:
        raise corrupt(f"bad footer magic {end_magic!r} (truncated?)")
    if index_offset + index_length + FOOTER_SIZE != size:
        raise corrupt(f"index at {index_offset}+{index_length} does not end at the footer ({size - FOOTER_SIZE})")
    index = read(index_offset, index_length)
    if checksum(index) != index_sum:
        raise corrupt("index checksum mismatch")
    (count,) = _U32.unpack_from(index, 0)
    if 4 + count * _INDEX_ENTRY.size != index_length:
        raise corrupt(f"index of {index_length} bytes cannot hold {count} entries")
    entries = []
    for i in range(count):
        kg, code, _, offset, length, crc = _INDEX_ENTRY.unpack_from(index, 4 + i * _INDEX_ENTRY.size)
        entries.append(IndexEntry(kg, _KIND_NAMES.get(code, f"?{code}"), offset, length, crc))
    return header, entries
