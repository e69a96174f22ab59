"""Writing a version and restoring it gives back exactly the stores' content."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from checkpoint import (
    DELTA,
    SNAPSHOT,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorage,
    CheckpointWriter,
    TaskReport,
    VersionExistsError,
    commit,
    restore,
)

from .helpers import checkpoint_version, content, restored_content

KEYS = [i for i in range(300)] + [("user", i) for i in range(200)] + [("d", dt.date(2024, 1, 1 + i % 28), i) for i in range(50)]


def _fill(tables, n_timers=40):
    tables["state"].put_many((k, {"count": i, "payload": "x" * (i % 17)}) for i, k in enumerate(KEYS))
    tables["timers"].put_many(((i,), [i * 1000]) for i in range(n_timers))


@pytest.mark.parametrize("encoding,sst_min_entries", [("sst", 1), ("sst", 2048), ("records", 1)])
def test_round_trip_of_a_version_restores_every_table(storage, make_tables, tmp_path, encoding, sst_min_entries):
    tables = make_tables(max_parallelism=16, track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables, snapshot_encoding=encoding, sst_min_entries=sst_min_entries)
    assert restored_content(storage, 1, tmp_path / "restored", max_parallelism=16) == content(tables)


def test_restore_replaces_what_the_target_held_in_its_key_groups(storage, make_tables):
    tables = make_tables(max_parallelism=16, track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables, sst_min_entries=1)
    target = make_tables(max_parallelism=16)
    target["state"].put_many((("stale", i), i) for i in range(100))
    target["timers"].put(("stale",), 1)
    restore(storage, 1, range(16), target)
    assert content(target) == content(tables)


def test_restore_leaves_keys_of_other_key_groups_alone(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables)
    target = make_tables()
    target["state"].put_many((("other", i), i) for i in range(200))
    outside = list(target["state"].iter_raw(range(64, 128)))
    restore(storage, 1, range(0, 64), target)
    assert list(target["state"].iter_raw(range(64, 128))) == outside
    assert list(target["state"].iter_raw(range(0, 64))) == list(tables["state"].iter_raw(range(0, 64)))


def test_restore_of_latest_with_nothing_committed_clears_the_key_groups(storage, make_tables):
    target = make_tables()
    target["state"].put_many((i, i) for i in range(50))
    report = restore(storage, None, range(128), target)
    assert report.version is None
    assert content(target) == {"state": [], "timers": []}


def test_restore_of_an_unknown_version_raises_not_found(storage, make_tables):
    with pytest.raises(CheckpointNotFoundError, match="version 7"):
        restore(storage, 7, range(128), make_tables())


def test_delta_version_holds_only_changed_key_groups(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    first = checkpoint_version(storage, 1, tables)
    tables["state"].put(("user", 1), "changed")
    tables["state"].delete(5)
    changes = {name: table.drain_changes() for name, table in tables.items()}
    report = CheckpointWriter(storage, key_groups=range(128)).write(2, tables, changes, first)
    changed = {tables["state"].key_group(("user", 1)), tables["state"].key_group(5)}
    assert {s.key_group for s in report.sections} == changed
    assert {s.kind for s in report.sections} == {DELTA}
    manifest = commit(storage, 2, [report])
    assert all(len(manifest.chain(g)) == 2 for g in changed)


def test_unchanged_task_writes_no_file_and_keeps_the_chains(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    first = checkpoint_version(storage, 1, tables)
    writer = CheckpointWriter(storage, key_groups=range(128))
    report = writer.write(2, tables, {"state": set(), "timers": set()}, first)
    assert report.file is None and report.sections == ()
    second = commit(storage, 2, [report], {"watermark": 5})
    assert second.chains == first.chains
    assert second.metadata == {"watermark": 5}


def test_first_version_is_a_snapshot_of_every_owned_key_group(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    manifest = checkpoint_version(storage, 1, tables, key_groups=range(10, 20))
    assert sorted(manifest.chains) == list(range(10, 20))
    assert all(len(c) == 1 and c[0].kind == SNAPSHOT for c in manifest.chains.values())


def test_report_survives_json_round_trip(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    report = CheckpointWriter(storage, key_groups=range(128), task=3).write(1, tables, None, None)
    again = TaskReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report


def test_a_reported_task_file_that_does_not_exist_is_refused_at_commit(storage, make_tables):
    tables = make_tables(max_parallelism=16, track=True)
    _fill(tables)
    report = CheckpointWriter(storage, key_groups=range(16), task="t0").write(1, tables, None, None, full=True)
    storage.delete(report.file)
    with pytest.raises(CheckpointError, match=f"reported {report.file!r}, which does not exist"):
        commit(storage, 1, [report])
    assert storage.versions() == []


def test_a_reported_sst_file_that_does_not_exist_is_refused_at_commit(storage, make_tables):
    tables = make_tables(max_parallelism=16, track=True)
    _fill(tables)
    report = CheckpointWriter(storage, key_groups=range(16), task="t0", sst_min_entries=1).write(
        1, tables, None, None, full=True)
    sst = next(name for ref in report.sections for name in ref.sst_files)
    storage.delete(sst)
    with pytest.raises(CheckpointError, match=f"the SST file {sst!r}, which does not exist"):
        commit(storage, 1, [report])
    assert storage.versions() == []


def test_committing_a_version_twice_is_refused(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables)
    report = CheckpointWriter(storage, key_groups=range(128)).write(1, tables, None, None)
    with pytest.raises(VersionExistsError, match="already committed"):
        commit(storage, 1, [report])


def test_delta_written_on_another_base_version_is_refused(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    first = checkpoint_version(storage, 1, tables)
    tables["state"].put(1, "a")
    checkpoint_version(storage, 2, tables)
    tables["state"].put(1, "b")
    stale = CheckpointWriter(storage, key_groups=range(128)).write(
        3, tables, {"state": tables["state"].drain_changes()}, first)
    with pytest.raises(CheckpointError, match="on top of version 1"):
        commit(storage, 3, [stale])


def test_two_reports_of_one_key_group_are_refused(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    a = CheckpointWriter(storage, key_groups=range(0, 64), task="a").write(1, tables, None, None)
    b = CheckpointWriter(storage, key_groups=range(0, 64), task="b").write(1, tables, None, None)
    with pytest.raises(CheckpointError, match="two tasks"):
        commit(storage, 1, [a, b])
    assert storage.versions() == []


def test_metadata_is_kept_in_the_manifest(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables, metadata={"watermark": 123, "batch_time_ms": 456})
    assert storage.read_manifest(1).metadata == {"watermark": 123, "batch_time_ms": 456}
    assert restore(storage, 1, range(4), make_tables()).metadata == {"watermark": 123, "batch_time_ms": 456}


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_round_trip_through_an_fsspec_url(make_tables, tmp_path, scheme):
    if scheme == "memory":
        pytest.importorskip("fsspec")
        location = f"memory://opbuffer-tests/{tmp_path.name}"
    else:
        location = f"file://{tmp_path / 'ckpt'}"
    storage = CheckpointStorage(location)
    tables = make_tables(max_parallelism=16, track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables, sst_min_entries=20)
    tables["state"].put(("user", 7), "new")
    checkpoint_version(storage, 2, tables)
    assert CheckpointStorage(location).versions() == [1, 2]
    assert restored_content(CheckpointStorage(location), 2, tmp_path / "restored", max_parallelism=16) == content(tables)


def test_restore_before_a_version_ignores_that_version(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    checkpoint_version(storage, 1, tables)
    v1 = content(tables)
    tables["state"].put(("user", 3), "v2")
    checkpoint_version(storage, 2, tables)
    target = make_tables()
    report = restore(storage, None, range(128), target, before=2)  # a re-run of batch 2 starts from version 1
    assert report.version == 1 and report.manifest == storage.read_manifest(1)
    assert content(target) == v1


def test_changes_outside_the_task_key_groups_are_refused(storage, make_tables):
    tables = make_tables(track=True)
    _fill(tables)
    previous = checkpoint_version(storage, 1, tables)
    key = next(k for k in KEYS if tables["state"].key_group(k) >= 64)
    tables["state"].put(key, "x")
    changes = {"state": tables["state"].drain_changes()}
    with pytest.raises(ValueError, match="outside"):
        CheckpointWriter(storage, key_groups=range(0, 64)).write(2, tables, changes, previous)


def test_documented_task_cycle_restores_processes_writes_and_commits(storage, make_tables):
    from state import key_group_range

    reference = make_tables()
    for batch in (1, 2, 3):
        reports = []
        for i in range(2):
            tables = make_tables()
            restored = restore(storage, None, key_group_range(i, 2), tables, before=batch)
            for t in tables.values():
                t.track_changes()
            for k in range(batch * 40):
                if tables["state"].key_group(("user", k)) in key_group_range(i, 2):
                    tables["state"].put(("user", k), batch)
                    reference["state"].put(("user", k), batch)
            writer = CheckpointWriter(storage, key_groups=key_group_range(i, 2), task=i)
            changes = {n: t.drain_changes() for n, t in tables.items()}
            reports.append(writer.write(batch, tables, changes, restored.manifest).to_dict())
        commit(storage, batch, reports, metadata={"batch": batch})
    final = make_tables()
    assert restore(storage, None, range(128), final).metadata == {"batch": 3}
    assert content(final) == content(reference)
