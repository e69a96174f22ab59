"""Restoring at another parallelism: every instance restores its key-group range."""

from __future__ import annotations

import pytest

from checkpoint import CheckpointWriter, commit, restore
from state import key_group_range, operator_index

from .helpers import content

MAX_P = 128


def _fill(tables):
    tables["state"].put_many(((i,), {"n": i}) for i in range(1500))
    tables["state"].put_many((("s", i), str(i)) for i in range(500))
    tables["timers"].put_many(((i,), [i]) for i in range(300))


@pytest.mark.parametrize("parallelism", [3, 8])
def test_restore_at_another_parallelism_splits_the_state_exactly(storage, make_tables, parallelism):
    source = make_tables(track=True)
    _fill(source)
    writer = CheckpointWriter(storage, key_groups=key_group_range(0, 1, MAX_P), task=0, sst_min_entries=20)
    commit(storage, 1, [writer.write(1, source, None, None)])

    union: dict[str, list] = {"state": [], "timers": []}
    for index in range(parallelism):
        groups = key_group_range(index, parallelism, MAX_P)
        instance = make_tables()
        restore(storage, 1, groups, instance)
        for name, entries in content(instance).items():
            assert all(operator_index(int.from_bytes(k[:2], "big"), parallelism, MAX_P) == index for k, _ in entries)
            union[name].extend(entries)
    assert {name: sorted(entries) for name, entries in union.items()} == content(source)


def test_rescaled_instances_write_deltas_on_top_of_the_old_chains(storage, make_tables, tmp_path):
    source = make_tables(track=True)
    _fill(source)
    commit(storage, 1, [CheckpointWriter(storage, key_groups=range(MAX_P)).write(1, source, None, None)])
    previous = storage.read_manifest(1)

    reports = []
    instances = []
    for index in range(3):
        groups = key_group_range(index, 3, MAX_P)
        instance = make_tables(track=True)
        restore(storage, 1, groups, instance)
        instance["state"].drain_changes()
        for i in range(0, 1500, 7):
            key = (i,)
            if groups.start <= instance["state"].key_group(key) < groups.stop:
                instance["state"].put(key, {"n": -i})
                source["state"].put(key, {"n": -i})
        changes = {name: table.drain_changes() for name, table in instance.items()}
        report = CheckpointWriter(storage, key_groups=groups, task=index).write(2, instance, changes, previous)
        assert report.snapshots == 0 and report.deltas > 0
        reports.append(report)
        instances.append(instance)
    commit(storage, 2, reports)

    merged = make_tables()
    restore(storage, 2, range(MAX_P), merged)
    assert content(merged) == content(source)
