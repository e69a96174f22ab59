"""Deltas on top of snapshots, and compaction of delta chains."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint import DELTA, SNAPSHOT, CheckpointStorage, restore
from checkpoint.writer import CheckpointWriter, commit

from .helpers import TABLES, checkpoint_version, close_tables, content, hsettings, open_tables, restored_content

MAX_P = 8  # few key groups: long chains and many changes per key group

KEYS = st.one_of(st.integers(0, 30), st.tuples(st.just("u"), st.integers(0, 10)))
OP = st.tuples(st.sampled_from(TABLES), st.sampled_from(["put", "put", "delete"]), KEYS, st.integers(0, 1000))
VERSIONS = st.lists(st.lists(OP, max_size=25), min_size=1, max_size=5)


@hsettings(max_examples=10)
@given(VERSIONS, st.integers(2, 4), st.sampled_from([(1, "sst"), (2048, "sst"), (1, "records")]))
def test_chain_of_deltas_restores_the_same_state_as_a_full_snapshot(versions, max_chain, encoding):
    sst_min_entries, snapshot_encoding = encoding
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        chained = CheckpointStorage(root / "chained")
        tables = open_tables(root / "src", max_parallelism=MAX_P, track=True)
        target = open_tables(root / "target", max_parallelism=MAX_P)  # restored into again and again
        try:
            expected: dict[str, dict] = {name: {} for name in TABLES}
            for version, ops in enumerate(versions, start=1):
                for table, op, key, value in ops:
                    if op == "put":
                        tables[table].put(key, value)
                        expected[table][key] = value
                    else:
                        tables[table].delete(key)
                        expected[table].pop(key, None)
                manifest = checkpoint_version(chained, version, tables, max_chain=max_chain, max_delta_ratio=100.0,
                                              snapshot_encoding=snapshot_encoding, sst_min_entries=sst_min_entries)
                assert max((len(c) for c in manifest.chains.values()), default=0) <= max_chain
                restore(chained, version, range(MAX_P), target)
                assert content(target) == content(tables)
            got = {name: {k if len(k) > 1 else k[0]: v for k, v in target[name].items()} for name in TABLES}
            assert got == expected
            full = CheckpointStorage(root / "full")
            checkpoint_version(full, 1, tables, full=True)
            assert restored_content(full, 1, root / "full-db", max_parallelism=MAX_P) == content(tables)
        finally:
            close_tables(target)
            close_tables(tables)


def _churn(tables, version, keys_per_version=60):
    for i in range(keys_per_version):
        tables["state"].put(("k", (version * 7 + i) % 200), version)
    tables["timers"].put((version,), [version])


def test_compaction_bounds_chain_length_and_keeps_state(storage, make_tables, tmp_path):
    tables = make_tables(max_parallelism=16, track=True)
    tables["state"].put_many((("k", i), 0) for i in range(200))
    for version in range(1, 16):
        if version > 1:
            _churn(tables, version)
        manifest = checkpoint_version(storage, version, tables, max_chain=3, max_delta_ratio=100.0)
        assert max(len(c) for c in manifest.chains.values()) <= 3
        assert all(c[0].kind == SNAPSHOT and all(r.kind == DELTA for r in c[1:]) for c in manifest.chains.values())
    assert restored_content(storage, 15, tmp_path / "restored", max_parallelism=16) == content(tables)


def test_compaction_bounds_delta_bytes_by_ratio_of_snapshot(storage, make_tables, tmp_path):
    tables = make_tables(max_parallelism=16, track=True)
    tables["state"].put_many((("k", i), "v" * 50) for i in range(400))
    snapshots_seen = 0
    for version in range(1, 12):
        if version > 1:
            tables["state"].put_many((("k", (version * 13 + i) % 400), "w" * 50) for i in range(40))
        manifest = checkpoint_version(storage, version, tables, max_chain=100, max_delta_ratio=0.25)
        for chain in manifest.chains.values():
            assert sum(r.length for r in chain[1:]) <= 0.25 * chain[0].length
        snapshots_seen += sum(t["snapshots"] for t in manifest.tasks) if version > 1 else 0
    assert snapshots_seen > 0  # the ratio did trigger compactions
    assert restored_content(storage, 11, tmp_path / "restored", max_parallelism=16) == content(tables)


def _count_raw_reads(table):
    reads = []
    get_raw_many = table.get_raw_many

    def counting(keys):
        reads.extend(keys)
        return get_raw_many(keys)

    table.get_raw_many = counting
    return reads


def test_key_groups_whose_changes_far_exceed_the_delta_budget_are_snapshotted_without_reading_every_change(
    storage, make_tables, tmp_path
):
    from checkpoint.writer import DELTA_SAMPLE

    tables = make_tables(max_parallelism=4, track=True)
    tables["state"].put_many((("k", i), "v" * 50) for i in range(400))
    first = checkpoint_version(storage, 1, tables, max_delta_ratio=0.5)
    tables["state"].put_many((("k", i), "w" * 500) for i in range(400))  # every value, 10x larger
    reads = _count_raw_reads(tables["state"])
    manifest = checkpoint_version(storage, 2, tables, max_delta_ratio=0.5)
    old_files = {chain[0].file for chain in first.chains.values()}
    assert all(len(chain) == 1 and chain[0].kind == SNAPSHOT and chain[0].file not in old_files
               for chain in manifest.chains.values())
    assert len(reads) <= DELTA_SAMPLE * 4
    assert restored_content(storage, 2, tmp_path / "restored", max_parallelism=4) == content(tables)


def test_key_groups_whose_changes_fit_the_delta_budget_still_get_a_delta(storage, make_tables, tmp_path):
    tables = make_tables(max_parallelism=4, track=True)
    tables["state"].put_many((("k", i), "v" * 50) for i in range(400))
    checkpoint_version(storage, 1, tables, max_delta_ratio=0.5)
    tables["state"].put_many((("k", i), "w" * 50) for i in range(0, 400, 5))  # a fifth of the keys
    manifest = checkpoint_version(storage, 2, tables, max_delta_ratio=0.5)
    assert [chain[-1].kind for chain in manifest.chains.values()] == [DELTA] * 4
    assert restored_content(storage, 2, tmp_path / "restored", max_parallelism=4) == content(tables)


def test_each_changed_value_of_a_key_group_that_gets_a_delta_is_read_once(storage, make_tables):
    tables = make_tables(max_parallelism=4, track=True)
    tables["state"].put_many((("k", i), "v" * 50) for i in range(400))
    checkpoint_version(storage, 1, tables, max_delta_ratio=0.5)
    changed = [("k", i) for i in range(0, 400, 5)]
    tables["state"].put_many((key, "w" * 50) for key in changed)
    reads = _count_raw_reads(tables["state"])
    manifest = checkpoint_version(storage, 2, tables, max_delta_ratio=0.5)
    assert [chain[-1].kind for chain in manifest.chains.values()] == [DELTA] * 4
    assert len(reads) == len(set(reads)) == len(changed)


def test_a_failed_read_of_the_sampled_values_writes_nothing_and_the_retry_writes_the_version(
    storage, make_tables, tmp_path
):
    tables = make_tables(max_parallelism=4, track=True)
    tables["state"].put_many((("k", i), "v" * 50) for i in range(400))
    checkpoint_version(storage, 1, tables, max_delta_ratio=0.5)
    files_of_version_1 = set(storage.data_files())
    tables["state"].put_many((("k", i), "w" * 500) for i in range(400))
    changes = {name: table.drain_changes() for name, table in tables.items()}
    previous = storage.latest_manifest(before=2)
    writer = CheckpointWriter(storage, key_groups=range(4), task="t0", max_delta_ratio=0.5)
    get_raw_many = tables["state"].get_raw_many

    def failing(keys):
        raise OSError("read failed")

    tables["state"].get_raw_many = failing
    with pytest.raises(OSError, match="read failed"):
        writer.write(2, tables, changes, previous)
    assert set(storage.data_files()) == files_of_version_1
    tables["state"].get_raw_many = get_raw_many
    commit(storage, 2, [writer.write(2, tables, changes, previous)])
    assert restored_content(storage, 2, tmp_path / "restored", max_parallelism=4) == content(tables)
