"""SST files of several key groups next to the task file: layout, hard-linked restores, partial use, damage."""

from __future__ import annotations

import os

import pytest

from checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointStorage,
    CheckpointWriter,
    apply_retention,
    commit,
    restore,
)
from checkpoint.reader import verify_sections
from state import RocksDBStore, key_group_range

from .helpers import checkpoint_version, content

MAX_P = 128


def _fill(tables, n=3000, value="v"):
    tables["state"].put_many(((i,), f"{value}{i}") for i in range(n))
    tables["timers"].put_many(((i,), [i]) for i in range(0, n, 2))


def _path(storage, rel):
    return os.path.join(storage.location, *rel.split("/"))


def _sst_files(manifest):
    return sorted({f for chain in manifest.chains.values() for ref in chain for f in ref.sst_files})


@pytest.fixture
def snapshot(storage, make_tables):
    """Version 1: a full snapshot in SST files of 16 key groups (tables with 3000 and 1500 entries)."""
    tables = make_tables(track=True)
    _fill(tables)
    manifest = checkpoint_version(storage, 1, tables, sst_min_entries=100)
    return storage, tables, manifest


def test_consecutive_key_groups_share_one_sst_file_per_table(snapshot):
    storage, _, manifest = snapshot
    files = _sst_files(manifest)
    # 128 key groups in aligned blocks of 16: 8 files per table
    assert len(files) == 16
    assert all(f.startswith("data/") and f.endswith(".sst") for f in files)
    assert manifest.files() == {next(iter(manifest.chains.values()))[0].file} | set(files)
    assert set(storage.data_files()) == manifest.files()
    for g, chain in manifest.chains.items():
        assert len(chain[0].sst_files) == 2 and chain[0].sst_bytes > 0
        assert {int(f.split(".kg")[1][:5]) for f in chain[0].sst_files} == {g // 16 * 16}
    assert manifest.total_bytes() >= sum(os.path.getsize(_path(storage, f)) for f in files)


def test_one_file_per_key_group_with_sst_key_groups_1(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    manifest = checkpoint_version(storage, 1, tables, sst_min_entries=1, sst_key_groups=1)
    assert all(len(chain[0].sst_files) == 2 for chain in manifest.chains.values())
    assert len(_sst_files(manifest)) == 2 * len(manifest.chains)
    assert all(f.split(".kg")[1][:5] == f.split(".kg")[1][6:11] for f in _sst_files(manifest))
    target = make_tables()
    restore(storage, 1, range(MAX_P), target)
    assert content(target) == content(tables)


def test_restore_hard_links_the_checkpoint_files_and_leaves_them_intact(snapshot, make_tables):
    storage, tables, manifest = snapshot
    files = [_path(storage, f) for f in _sst_files(manifest)]
    first = make_tables()
    report = restore(storage, 1, range(MAX_P), first)
    assert report.sst_files == 16 and report.records == 0
    assert content(first) == content(tables)
    assert all(os.stat(f).st_nlink == 2 for f in files)  # the checkpoint's file and the store's
    # the store keeps working on the linked files: writes, flush, compaction; the checkpoint is untouched
    first["state"].put_many(((i,), "changed") for i in range(0, 3000, 2))
    first["state"].flush()
    first["state"].compact_key_groups(range(MAX_P))
    assert verify_sections(storage, [ref for chain in manifest.chains.values() for ref in chain]) > 0
    second = make_tables()
    restore(storage, 1, range(MAX_P), second)
    assert content(second) == content(tables)


@pytest.mark.parametrize("parallelism", [3, 4, 32])
def test_rescaled_restores_ingest_whole_files_and_clip_the_other_key_groups(snapshot, make_tables, parallelism):
    storage, tables, _ = snapshot
    union: dict[str, list] = {"state": [], "timers": []}
    for index in range(parallelism):
        groups = key_group_range(index, parallelism, MAX_P)
        instance = make_tables()
        report = restore(storage, 1, groups, instance)
        assert report.records == 0  # every file ingested (4 key groups of 16-key-group files at p=32)
        assert content(instance) == content(tables, groups)  # nothing of other key groups is visible
        for name, entries in content(instance).items():
            union[name].extend(entries)
    assert union == content(tables)


def test_files_are_not_clipped_where_the_store_holds_other_key_groups(snapshot, make_tables):
    storage, tables, _ = snapshot
    groups = key_group_range(1, 32, MAX_P)  # key groups 4..7 of the file of key groups 0..15
    instance = make_tables()
    instance["state"].put_many(((i,), "other") for i in range(3000))  # every key group holds something
    before = content(instance)
    report = restore(storage, 1, groups, instance)
    assert report.records > 0  # loaded entry by entry
    assert content(instance, groups) == content(tables, groups)
    outside = [kv for kv in content(instance)["state"] if int.from_bytes(kv[0][:2], "big") not in groups]
    assert outside == [kv for kv in before["state"] if int.from_bytes(kv[0][:2], "big") not in groups]


def test_compacting_a_key_group_snapshots_the_key_groups_sharing_its_files(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    first = checkpoint_version(storage, 1, tables, sst_min_entries=100)
    g = tables["state"].key_group((7,))
    tables["state"].put((7,), "new")
    manifest = checkpoint_version(storage, 2, tables, sst_min_entries=100, max_chain=1)
    block = range(g // 16 * 16, g // 16 * 16 + 16)
    for h, chain in manifest.chains.items():
        assert len(chain) == 1
        assert (chain[0] != first.chain(h)[0]) == (h in block)  # the whole block has new snapshots
    target = make_tables()
    report = restore(storage, 2, range(MAX_P), target)
    assert content(target) == content(tables) and report.records == 0


def test_a_file_partly_superseded_after_rescaling_is_loaded_entry_by_entry(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables, sst_min_entries=100)
    # rescaled to 16 instances: instance 0 owns key groups 0..7 (half of the first file) and compacts one
    owned = key_group_range(0, 16, MAX_P)
    key = next(i for i in range(3000) if tables["state"].key_group((i,)) in owned)
    tables["state"].put((key,), "new")
    changes = {name: table.drain_changes() for name, table in tables.items()}
    writer = CheckpointWriter(storage, key_groups=owned, task="i0", sst_min_entries=100, max_chain=1)
    report = writer.write(2, tables, changes, storage.read_manifest(1))
    manifest = commit(storage, 2, [report])
    assert {h for h, chain in manifest.chains.items() if chain[0].file == report.file} == set(owned)
    target = make_tables()
    restored = restore(storage, 2, range(MAX_P), target)
    assert content(target) == content(tables)
    assert restored.records > 0  # key groups 8..15 of the first file, entry by entry


def test_deltas_on_top_of_sst_files_and_compaction_by_bytes(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    first = checkpoint_version(storage, 1, tables, sst_min_entries=100)
    for version in range(2, 5):
        tables["state"].put_many(((i,), f"v{version}") for i in range(0, 3000, 97))
        tables["state"].delete((version,))
        manifest = checkpoint_version(storage, version, tables)
        # small deltas stay deltas (the snapshot's size counts its share of the SST files): no new snapshot
        assert all(chain[0] == first.chain(g)[0] for g, chain in manifest.chains.items())
        assert max(len(chain) for chain in manifest.chains.values()) == version
    # a delta bigger than max_delta_ratio of its snapshot's bytes (SST share included) compacts the key group
    g = tables["state"].key_group((7,))
    tables["state"].put_many(((i,), "x" * 500) for i in range(3000) if tables["state"].key_group((i,)) == g)
    manifest = checkpoint_version(storage, 5, tables)
    assert len(manifest.chain(g)) == 1 and manifest.chain(g)[0].file != first.chain(g)[0].file
    target = make_tables()
    report = restore(storage, 5, range(MAX_P), target)
    assert content(target) == content(tables)
    assert report.sst_files == 14 and report.records > 0  # g's old file (2 tables) was loaded in part


def test_flipped_bit_in_an_sst_file_names_the_file_and_a_key_group(snapshot, make_tables):
    storage, _, manifest = snapshot
    name = _sst_files(manifest)[3]
    with open(_path(storage, name), "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x04]))
    target = make_tables()
    target["state"].put_many(((i,), "before") for i in range(50))
    before = content(target)
    with pytest.raises(CheckpointCorruptError, match="checksum") as info:
        restore(storage, 1, range(MAX_P), target)
    assert info.value.file == name and name in str(info.value)
    groups = next(ref for chain in manifest.chains.values() for ref in chain if name in ref.sst_files)
    assert f"key group {info.value.key_group}" in str(info.value)
    assert name in manifest.chain(info.value.key_group)[0].sst_files and groups is not None
    assert content(target) == before  # untouched
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        verify_sections(storage, [ref for chain in manifest.chains.values() for ref in chain])


def test_missing_or_truncated_sst_file_names_the_file_and_a_key_group(snapshot, make_tables):
    storage, _, manifest = snapshot
    missing, truncated = _sst_files(manifest)[:2]
    os.truncate(_path(storage, truncated), 100)
    with pytest.raises(CheckpointCorruptError, match="truncated") as info:
        restore(storage, 1, range(MAX_P), make_tables())
    assert info.value.file == truncated and f"key group {info.value.key_group}" in str(info.value)
    os.remove(_path(storage, missing))
    with pytest.raises(CheckpointCorruptError, match="missing") as info:
        restore(storage, 1, range(MAX_P), make_tables())
    assert info.value.file == missing and f"key group {info.value.key_group}" in str(info.value)
    assert missing in manifest.chain(info.value.key_group)[0].sst_files
    # key groups whose files are intact still restore
    intact = next(g for g, chain in manifest.chains.items() if not set(chain[0].sst_files) & {missing, truncated})
    restore(storage, 1, range(intact, intact + 1), make_tables())


def test_commit_refuses_a_report_whose_sst_file_is_gone(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    report = CheckpointWriter(storage, key_groups=range(MAX_P), sst_min_entries=100).write(1, tables, None, None)
    name = report.sections[0].sst_files[0]
    os.remove(_path(storage, name))
    with pytest.raises(CheckpointError, match="SST file"):
        commit(storage, 1, [report])
    assert storage.versions() == []


def test_retention_deletes_sst_files_no_retained_version_needs(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    for version in range(1, 5):
        tables["state"].put_many(((i,), version) for i in range(3000))
        checkpoint_version(storage, version, tables, sst_min_entries=100, full=True)
    apply_retention(storage, retain=2)
    needed = storage.read_manifest(3).files() | storage.read_manifest(4).files()
    assert set(storage.data_files()) == needed
    assert len([f for f in needed if f.endswith(".sst")]) == 32


def test_failed_write_deletes_its_sst_files(storage, make_tables, monkeypatch):
    tables = make_tables(track=True)
    _fill(tables)
    writer = CheckpointWriter(storage, key_groups=range(MAX_P), sst_min_entries=100)
    calls = []
    original = CheckpointWriter._publish

    def failing(self, local, name):
        calls.append(name)
        if len(calls) == 5:
            raise OSError("disk full")
        return original(self, local, name)

    monkeypatch.setattr(CheckpointWriter, "_publish", failing)
    with pytest.raises(OSError, match="disk full"):
        writer.write(1, tables, None, None)
    assert storage.data_files() == []


def test_refused_linked_files_are_ingested_as_copies(snapshot, make_tables, monkeypatch):
    storage, tables, manifest = snapshot
    original = RocksDBStore.ingest_sst_files
    calls = []

    def refuse_first(self, paths):
        calls.append(list(paths))
        if len(calls) == 1:
            raise Exception("IO error: Permission denied")  # what rocksdict raises
        return original(self, paths)

    monkeypatch.setattr(RocksDBStore, "ingest_sst_files", refuse_first)
    target = make_tables()
    restore(storage, 1, range(MAX_P), target)
    assert len(calls) == 3 and content(target) == content(tables)
    files = [_path(storage, f) for f in _sst_files(manifest)]
    assert all(os.stat(f).st_nlink == 1 for f in files if any(os.path.basename(f) in p for p in calls[0]))
    assert verify_sections(storage, [ref for chain in manifest.chains.values() for ref in chain]) > 0


def test_sst_files_on_an_fsspec_location(make_tables, tmp_path):
    pytest.importorskip("fsspec")
    storage = CheckpointStorage(f"memory://sst-files-{os.getpid()}-{id(tmp_path)}")
    tables = make_tables(track=True)
    _fill(tables)
    manifest = checkpoint_version(storage, 1, tables, sst_min_entries=100)
    assert len(_sst_files(manifest)) == 16
    for parallelism in (1, 32):
        union: dict[str, list] = {"state": [], "timers": []}
        for index in range(parallelism):
            instance = make_tables()
            restore(storage, 1, key_group_range(index, parallelism, MAX_P), instance)
            for name, entries in content(instance).items():
                union[name].extend(entries)
        assert union == content(tables)
    name = _sst_files(manifest)[0]
    data = bytearray(storage.read_small_file(name))
    data[500] ^= 1
    storage.write_small_file(name, bytes(data))
    with pytest.raises(CheckpointCorruptError, match="checksum") as info:
        restore(storage, 1, range(MAX_P), make_tables())
    assert info.value.file == name
