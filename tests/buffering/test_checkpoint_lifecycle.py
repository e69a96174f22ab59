"""Checkpoints written by the runner over many versions: retention deletes only unreferenced files,
and compaction of long delta chains keeps the state identical."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner, cached_state
from checkpoint import DEFAULT_MAX_CHAIN, DEFAULT_RETAIN, CheckpointStorage, apply_retention, describe
from checkpoint.storage import data_file_version

from .helpers import Clock, checkpoint_table, count_sum, plain

OPERATOR = cached_state(max_entries=8, store="rocksdb")(count_sum)


def new_runner(location, **kwargs) -> LocalRunner:
    kwargs.setdefault("max_parallelism", 4)
    return LocalRunner(OPERATOR, key="k", checkpoint_location=location, clock=Clock(), **kwargs)


def files_on_disk(location) -> set[str]:
    return {f"data/{name}" for name in os.listdir(os.path.join(location, "data"))}


def referenced(location) -> set[str]:
    storage = CheckpointStorage(location)
    return set().union(*(storage.read_manifest(v).files() for v in storage.versions()))


def one_key_batches(n: int, keys: int, seed: int) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"k": [int(rng.integers(0, keys))], "v": [int(rng.integers(0, 100))]}) for _ in range(n)]


# ---------------------------------------------------------------- retention
def test_retention_keeps_the_newest_versions_and_exactly_the_files_they_reference(tmp_path):
    location = tmp_path / "ckpt"
    runner = new_runner(location)
    states = {}
    runner.process(pd.DataFrame({"k": np.arange(40), "v": np.arange(40)}))
    states[0] = plain(runner.state())
    for i, b in enumerate(one_key_batches(12, 40, seed=1), start=1):
        runner.process(b)
        states[i] = plain(runner.state())
    storage = CheckpointStorage(location)
    assert storage.versions() == list(range(13 - DEFAULT_RETAIN, 13))
    assert files_on_disk(location) == referenced(location)  # nothing referenced is gone, nothing else is left
    for v in storage.versions():
        assert checkpoint_table(location, version=v) == states[v]
    runner.close()


def test_retention_keeps_an_old_file_while_a_key_group_still_reads_it(tmp_path):
    location = tmp_path / "ckpt"
    runner = new_runner(location)
    runner.process(pd.DataFrame({"k": np.arange(40), "v": np.arange(40)}))
    first_files = {f for f in files_on_disk(location) if data_file_version(f) == 0}
    assert first_files
    # later batches touch only key 0: key groups without key 0 keep their version-0 snapshot
    for _ in range(10):
        runner.process(pd.DataFrame({"k": [0], "v": [1]}))
    still_needed = {f for f in first_files if f in referenced(location)}
    assert still_needed, "some key group should still read its version-0 snapshot"
    assert still_needed <= files_on_disk(location)
    expected = {(k,): (1, k) for k in range(40)}
    expected[(0,)] = (11, 10)
    assert checkpoint_table(location) == expected
    runner.close()


def test_a_crashed_attempts_task_files_are_deleted_once_their_version_is_committed(tmp_path):
    location = tmp_path / "ckpt"
    runner = new_runner(location, parallelism=2)
    runner.process(pd.DataFrame({"k": np.arange(20), "v": np.arange(20)}))

    def crash(version):
        raise RuntimeError("crash between the task files and the manifest")

    runner._before_commit = crash
    with pytest.raises(RuntimeError):
        runner.process(pd.DataFrame({"k": np.arange(20), "v": np.ones(20, dtype=np.int64)}))
    orphans = {f for f in files_on_disk(location) if data_file_version(f) == 1}
    assert orphans, "the crashed attempt wrote task files"
    apply_retention(location, DEFAULT_RETAIN)  # a version newer than the newest committed may be in flight
    assert orphans <= files_on_disk(location)

    recovered = new_runner(location, parallelism=2)
    recovered.process(pd.DataFrame({"k": np.arange(20), "v": np.ones(20, dtype=np.int64)}))
    assert not orphans & files_on_disk(location)
    assert files_on_disk(location) == referenced(location)
    assert checkpoint_table(location) == {(k,): (2, k + 1) for k in range(20)}
    recovered.close()


# ---------------------------------------------------------------- compaction
def test_compaction_of_many_small_deltas_keeps_the_state_identical(tmp_path):
    location = tmp_path / "ckpt"
    runner = new_runner(location)
    first = pd.DataFrame({"k": np.arange(60), "v": np.arange(60)})
    batches = [first] + one_key_batches(60, 60, seed=2)
    storage = CheckpointStorage(location)
    for i, b in enumerate(batches):
        runner.process(b)
        info = describe(location)["version"]
        assert info["chain_length"]["max"] <= DEFAULT_MAX_CHAIN, f"version {i}"
    manifest = storage.read_manifest()
    kinds = describe(location)["version"]["key_groups"]
    assert any("D" in g["kinds"] for g in kinds), "small changes should be written as deltas"
    compacted = [g for g, chain in manifest.chains.items() if data_file_version(chain[0].file) > 0]
    assert compacted, "some key group's chain should have been compacted into a newer snapshot"
    reference = pd.concat(batches).groupby("k")["v"].agg(["size", "sum"])
    expected = {(k,): (int(r["size"]), int(r["sum"])) for k, r in reference.iterrows()}
    assert checkpoint_table(location) == expected
    assert plain(runner.state()) == expected
    runner.close()
    restored = new_runner(location, parallelism=3)
    assert plain(restored.state()) == expected
    restored.close()
