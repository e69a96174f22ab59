"""Manifests and batch records carry a checksum of their own; retention failing never fails a committed version."""

from __future__ import annotations

import json
import os
import uuid
import warnings

import pytest

from checkpoint import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointStorage,
    RetentionWarning,
    apply_retention,
    restore,
)
from checkpoint.storage import batch_record_path, manifest_path

from .helpers import checkpoint_version


def _path(storage, rel):
    return os.path.join(storage.location, *rel.split("/"))


@pytest.fixture
def small_version(storage, make_tables):
    """Version 3 of 8 key groups with a watermark and a time offset in its metadata; returns (storage, its bytes)."""
    tables = make_tables(max_parallelism=8, track=True)
    tables["state"].put_many(((i,), i) for i in range(40))
    meta = {"max_event_time_ms": 1_700_000_123_456, "time_offset_ms": 5_000, "key_columns": ["k"]}
    checkpoint_version(storage, 3, tables, metadata=meta, snapshot_encoding="records")
    with open(_path(storage, manifest_path(3)), "rb") as f:
        return storage, f.read()


def test_every_single_byte_flip_of_a_manifest_is_rejected_naming_the_manifest(small_version):
    _, original = small_version
    copy = CheckpointStorage(f"memory://flips-{uuid.uuid4().hex}")  # thousands of rewrites: in memory
    rel = manifest_path(3)
    copy.write_small_file(rel, original)
    assert copy.read_manifest(3).metadata["time_offset_ms"] == 5_000
    accepted = []
    for pos in range(len(original)):
        for mask in (0x01, 0x20):  # a neighbouring digit or character, and a case change (hex digits, 'e'/'E')
            flipped = bytearray(original)
            flipped[pos] ^= mask
            copy.write_small_file(rel, bytes(flipped))
            try:
                copy.read_manifest(3)
            except CheckpointCorruptError as exc:
                assert exc.file == rel and rel in str(exc), exc
            else:
                accepted.append((pos, mask, chr(original[pos])))
    assert accepted == []


def test_a_damaged_offset_in_a_manifest_is_blamed_on_the_manifest_not_the_data_file(small_version, make_tables):
    storage, original = small_version
    data = json.loads(original)
    group, chain = next(iter(data["key_groups"].items()))
    chain[0]["offset"] += 1  # as a flipped digit would: the section is looked for one byte further on
    with open(_path(storage, manifest_path(3)), "w") as f:
        f.write(json.dumps(data, indent=1))
    with pytest.raises(CheckpointCorruptError) as info:
        restore(storage, 3, range(8), make_tables(max_parallelism=8))
    assert info.value.file == manifest_path(3)
    assert "checksum mismatch" in str(info.value) and chain[0]["file"] not in str(info.value)


def test_a_manifest_without_a_checksum_is_refused(small_version):
    """Decision: refused, not accepted with a warning. A missing checksum field cannot be told apart from a
    damaged one (one flipped byte in its name), and there are no checkpoints of an opbuffer without
    checksums to keep (no users yet)."""
    storage, original = small_version
    data = json.loads(original)
    del data["checksum"]
    with open(_path(storage, manifest_path(3)), "w") as f:
        f.write(json.dumps(data, indent=1))
    with pytest.raises(CheckpointCorruptError, match="has no checksum") as info:
        storage.read_manifest(3)
    assert info.value.file == manifest_path(3)


def test_a_manifest_rendered_indented_as_earlier_versions_wrote_them_is_read(small_version):
    storage, original = small_version
    expected = storage.read_manifest(3)
    with open(_path(storage, manifest_path(3)), "w") as f:
        f.write(json.dumps(json.loads(original), indent=1))
    assert storage.read_manifest(3).to_dict() == expected.to_dict()


def test_a_manifest_equal_in_content_but_not_in_bytes_is_refused(small_version):
    storage, original = small_version
    with open(_path(storage, manifest_path(3)), "wb") as f:
        f.write(original.replace(b"\n", b"\n\t", 1))  # whitespace only: the same JSON
    with pytest.raises(CheckpointCorruptError, match="byte for byte"):
        storage.read_manifest(3)


# ---------------------------------------------------------------- batch records
def test_a_processing_time_record_round_trips(storage):
    assert storage.processing_time(7) is None
    storage.record_processing_time(7, 1_234)
    assert storage.processing_time(7) == 1_234


@pytest.mark.parametrize(
    "text",
    ['{"processing_time_ms": 12', "", '{"processing_time_ms": 1234}'],
    ids=["torn-json", "empty", "no-checksum"],
)
def test_a_torn_processing_time_record_is_an_error_naming_the_file(storage, text):
    rel = batch_record_path(7)
    storage.write_small_file(rel, text.encode())
    with pytest.raises(CheckpointCorruptError) as info:
        storage.processing_time(7)
    assert info.value.file == rel and rel in str(info.value)


def test_a_processing_time_record_missing_its_field_is_an_error_naming_the_file(storage):
    from checkpoint.storage import seal

    rel = batch_record_path(7)
    storage.write_small_file(rel, seal({"version": 7}, None))
    with pytest.raises(CheckpointCorruptError, match="processing_time_ms") as info:
        storage.processing_time(7)
    assert info.value.file == rel


def test_a_processing_time_record_of_another_batch_is_refused(storage):
    storage.record_processing_time(6, 1_000)
    os.replace(_path(storage, batch_record_path(6)), _path(storage, batch_record_path(7)))
    with pytest.raises(CheckpointCorruptError, match="expected version 7"):
        storage.processing_time(7)


def test_retention_prunes_processing_time_records_of_versions_before_the_oldest_kept(storage, make_tables):
    tables = make_tables(max_parallelism=8, track=True)
    for version in range(6):
        storage.record_processing_time(version, 1_000 * version)
        tables["state"].put((version,), version)
        checkpoint_version(storage, version, tables, retain=None)
    storage.record_processing_time(6, 6_000)  # a batch that has not committed yet keeps its record
    apply_retention(storage, retain=2)
    assert [v for _, v in storage.batch_records()] == [4, 5, 6]


# ---------------------------------------------------------------- retention failing
@pytest.fixture
def damaged_kept_manifest(storage, make_tables):
    """Versions 1..3 committed (retain 3); manifest 2 damaged. Returns (storage, tables)."""
    tables = make_tables(max_parallelism=8, track=True)
    for version in (1, 2, 3):
        tables["state"].put((version,), version)
        checkpoint_version(storage, version, tables, retain=3, full=True)
    path = _path(storage, manifest_path(2))
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0x01]))
    return storage, tables


def test_a_retention_failure_after_the_commit_is_a_warning_and_the_version_stays_committed(damaged_kept_manifest):
    storage, tables = damaged_kept_manifest
    tables["state"].put((4,), 4)
    with pytest.warns(RetentionWarning, match="v0000000002.json"):
        manifest = checkpoint_version(storage, 4, tables, retain=3, full=True)
    assert manifest.version == 4 and storage.latest_version() == 4
    tables["state"].put((5,), 5)
    checkpoint_version(storage, 5, tables, retain=3, full=True)  # the next version commits
    assert storage.versions() == [3, 4, 5]


def test_retention_that_failed_is_done_by_the_next_commit(damaged_kept_manifest):
    storage, tables = damaged_kept_manifest
    tables["state"].put((4,), 4)
    with pytest.warns(RetentionWarning):
        checkpoint_version(storage, 4, tables, retain=3, full=True)
    assert [f for f in storage.data_files() if "/v0000000001-" in f]  # left while manifest 2 was unreadable
    tables["state"].put((5,), 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RetentionWarning)
        checkpoint_version(storage, 5, tables, retain=3, full=True)
    assert storage.versions() == [3, 4, 5]
    assert not [f for f in storage.data_files() if "/v0000000001-" in f or "/v0000000002-" in f]
    with pytest.raises(CheckpointNotFoundError):
        storage.read_manifest(2)
