"""Retention, orphans of failed attempts, and versions that were never committed."""

from __future__ import annotations

import os

import pytest

from checkpoint import CheckpointNotFoundError, CheckpointWriter, apply_retention, commit, restore
from checkpoint.storage import data_file_version

from .helpers import checkpoint_version, content


def _version(storage, version, tables, key):
    tables["state"].put(key, version)
    return checkpoint_version(storage, version, tables)


def test_retention_deletes_only_unreferenced_files(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), 0) for i in range(300))
    checkpoint_version(storage, 1, tables)
    for version in range(2, 7):
        _version(storage, version, tables, (version % 2,))  # two key groups change; the rest stay on version 1
    deleted = apply_retention(storage, retain=2)
    assert storage.versions() == [5, 6]
    needed = storage.read_manifest(5).files() | storage.read_manifest(6).files()
    assert set(storage.data_files()) == needed
    assert "data/" in next(iter(needed)) and any(data_file_version(f) == 1 for f in needed)  # old snapshots kept
    assert deleted["manifests"] == [1, 2, 3, 4]
    for version in (5, 6):
        restore(storage, version, range(128), make_tables())


def test_commit_applies_retention_and_keeps_retained_versions_restorable(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), 0) for i in range(100))
    checkpoint_version(storage, 1, tables, retain=3)
    states = {}
    for version in range(2, 8):
        _version(storage, version, tables, (version,))
        commit_manifest = storage.read_manifest(version)
        assert commit_manifest.version == version
        states[version] = content(tables)
    apply_retention(storage, retain=3)
    assert storage.versions() == [5, 6, 7]
    for version in (5, 6, 7):
        target = make_tables()
        restore(storage, version, range(128), target)
        assert content(target) == states[version]


def test_orphans_of_failed_attempts_are_deleted_but_not_files_in_flight(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), 0) for i in range(100))
    checkpoint_version(storage, 1, tables)
    previous = storage.read_manifest(1)
    tables["state"].put((1,), "x")
    changes = {"state": tables["state"].drain_changes()}
    failed = CheckpointWriter(storage, key_groups=range(128), task=0).write(2, tables, changes, previous)
    retried = CheckpointWriter(storage, key_groups=range(128), task=0).write(2, tables, changes, previous)
    in_flight = CheckpointWriter(storage, key_groups=range(128), task=0).write(3, tables, None, None)
    commit(storage, 2, [retried], retain=3)
    files = set(storage.data_files())
    assert failed.file not in files
    assert retried.file in files and in_flight.file in files


def test_version_without_manifest_is_invisible_and_previous_restores(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put_many(((i,), i) for i in range(200))
    checkpoint_version(storage, 1, tables)
    v1 = content(tables)
    tables["state"].put_many(((i,), -i) for i in range(200))
    changes = {"state": tables["state"].drain_changes()}
    report = CheckpointWriter(storage, key_groups=range(128)).write(2, tables, changes, storage.read_manifest(1))
    assert os.path.exists(os.path.join(storage.location, report.file))  # data written, commit never done
    assert storage.versions() == [1] and storage.latest_version() == 1
    with pytest.raises(CheckpointNotFoundError):
        storage.read_manifest(2)
    target = make_tables()
    assert restore(storage, None, range(128), target).version == 1
    assert content(target) == v1


def test_leftover_temporary_manifest_is_not_a_version(storage, make_tables):
    tables = make_tables(track=True)
    tables["state"].put((1,), 1)
    checkpoint_version(storage, 1, tables)
    with open(os.path.join(storage.location, "manifests", ".tmp-v0000000002-abc123.json"), "w") as f:
        f.write("{")
    assert storage.versions() == [1]
    tables["state"].put((1,), 2)
    checkpoint_version(storage, 2, tables, retain=3)
    assert storage.versions() == [1, 2]
    assert not os.path.exists(os.path.join(storage.location, "manifests", ".tmp-v0000000002-abc123.json"))
