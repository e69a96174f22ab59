"""Damaged or missing files are detected, named, and do not affect other versions."""

from __future__ import annotations

import json
import os

import pytest

from checkpoint import CheckpointCorruptError, restore

from .helpers import checkpoint_version, content


@pytest.fixture
def two_versions(storage, make_tables):
    """Version 1 and a full version 2 in its own file; returns (storage, source content at v1, v2 manifest)."""
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), i) for i in range(600))
    tables["timers"].put_many(((i,), [i]) for i in range(50))
    checkpoint_version(storage, 1, tables, sst_min_entries=3)
    v1 = content(tables)
    tables["state"].put_many(((i,), -i) for i in range(0, 600, 3))
    manifest = checkpoint_version(storage, 2, tables, full=True, sst_min_entries=3)
    return storage, v1, manifest


def _path(storage, rel):
    return os.path.join(storage.location, *rel.split("/"))


def _victim(manifest, kind_pick=0):
    """A key group of version 2 and its (only) section."""
    g = sorted(manifest.chains)[len(manifest.chains) // 2]
    return g, manifest.chain(g)[0]


def test_flipped_bit_is_detected_naming_file_and_key_group(two_versions, make_tables):
    storage, _, manifest = two_versions
    g, ref = _victim(manifest)
    path = _path(storage, ref.file)
    with open(path, "r+b") as f:
        f.seek(ref.offset + ref.length // 2)
        byte = f.read(1)
        f.seek(ref.offset + ref.length // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointCorruptError) as info:
        restore(storage, 2, range(128), make_tables())
    assert info.value.file == ref.file and info.value.key_group == g
    assert ref.file in str(info.value) and f"key group {g}" in str(info.value)


def test_truncated_file_is_detected_naming_file_and_key_group(two_versions, make_tables):
    storage, _, manifest = two_versions
    g, ref = _victim(manifest)
    os.truncate(_path(storage, ref.file), ref.offset + ref.length - 1)
    with pytest.raises(CheckpointCorruptError, match="truncated") as info:
        restore(storage, 2, range(g, g + 1), make_tables())
    assert info.value.file == ref.file and info.value.key_group == g
    assert ref.file in str(info.value) and f"key group {g}" in str(info.value)


def test_missing_file_is_detected_naming_file_and_key_group(two_versions, make_tables):
    storage, _, manifest = two_versions
    g, ref = _victim(manifest)
    os.remove(_path(storage, ref.file))
    with pytest.raises(CheckpointCorruptError, match="missing") as info:
        restore(storage, 2, range(g, g + 1), make_tables())
    assert info.value.file == ref.file and f"key group {g}" in str(info.value)


def test_previous_version_still_restores_after_corruption(two_versions, make_tables):
    storage, v1, manifest = two_versions
    _, ref = _victim(manifest)
    os.truncate(_path(storage, ref.file), ref.offset + 10)
    with pytest.raises(CheckpointCorruptError):
        restore(storage, 2, range(128), make_tables())
    target = make_tables()
    restore(storage, 1, range(128), target)
    assert content(target) == v1


def test_failed_restore_leaves_the_target_untouched(two_versions, make_tables):
    storage, _, manifest = two_versions
    g, ref = _victim(manifest)
    with open(_path(storage, ref.file), "r+b") as f:
        f.seek(ref.offset + 3)
        f.write(b"\xff")
    target = make_tables()
    target["state"].put_many(((i,), "before") for i in range(100))
    before = content(target)
    with pytest.raises(CheckpointCorruptError):
        restore(storage, 2, range(128), target)
    assert content(target) == before


def test_corrupt_manifest_is_reported_by_name(two_versions, make_tables):
    storage, _, _ = two_versions
    path = _path(storage, "manifests/v0000000002.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(CheckpointCorruptError, match="v0000000002.json"):
        restore(storage, 2, range(128), make_tables())
    json.loads(open(_path(storage, "manifests/v0000000001.json")).read())  # the other manifest is intact
