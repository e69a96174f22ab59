"""A damaged checkpoint seen through the runner: an error naming file and key group; the previous version restores.

DESIGN "Checkpoints": a corrupt or missing section is a clear error naming the
file and key group; the previous version stays restorable.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner, cached_state, mini_batch
from checkpoint import CheckpointCorruptError, CheckpointStorage, read_state

from .helpers import Clock, checkpoint_table, count_sum, plain

OPERATOR = mini_batch(max_rows=5)(cached_state(max_entries=4, store="rocksdb")(count_sum))
N_KEYS = 30


def batch(i: int) -> pd.DataFrame:
    """Every key in every batch, so every key group with keys changes in every version."""
    keys = np.arange(N_KEYS)
    return pd.DataFrame({"k": keys, "v": keys * 10 + i})


def new_runner(location, parallelism: int = 2) -> LocalRunner:
    return LocalRunner(OPERATOR, key="k", parallelism=parallelism, checkpoint_location=location, clock=Clock())


@pytest.fixture
def committed(tmp_path):
    """A location with versions 0..2 and the runner's state after each version."""
    location = tmp_path / "ckpt"
    runner = new_runner(location)
    states = []
    for i in range(3):
        runner.process(batch(i))
        states.append(plain(runner.state()))
    runner.close()
    return location, states


def sections_of_latest_file(location) -> tuple[str, list]:
    """The newest version's first task file (relative path) and the sections the manifest reads from it."""
    storage = CheckpointStorage(location)
    manifest = storage.read_manifest(storage.latest_version())
    prefix = f"data/v{manifest.version:010d}"
    refs = [ref for chain in manifest.chains.values() for ref in chain if ref.file.startswith(prefix)]
    files = sorted({ref.file for ref in refs})
    assert files, "the newest version wrote no task file"
    file = files[0]
    return file, sorted((ref for ref in refs if ref.file == file), key=lambda r: r.offset)


def flip_bit(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def remove_manifest(location, version: int) -> None:
    os.remove(os.path.join(location, "manifests", f"v{version:010d}.json"))


def test_a_flipped_bit_in_the_latest_data_file_is_an_error_naming_the_file_and_key_group(committed):
    location, _ = committed
    file, refs = sections_of_latest_file(location)
    damaged = refs[len(refs) // 2]
    flip_bit(os.path.join(location, *file.split("/")), damaged.offset + damaged.length // 2)
    with pytest.raises(CheckpointCorruptError) as info:
        new_runner(location)
    assert info.value.file == file
    assert info.value.key_group == damaged.key_group
    assert file in str(info.value)
    assert f"key group {damaged.key_group}" in str(info.value)


def test_a_truncated_latest_data_file_is_an_error_naming_the_file_and_a_lost_key_group(committed):
    location, _ = committed
    file, refs = sections_of_latest_file(location)
    cut = refs[len(refs) // 2]
    with open(os.path.join(location, *file.split("/")), "r+b") as f:
        f.truncate(cut.offset + 1)
    lost = {ref.key_group for ref in refs if ref.offset + ref.length > cut.offset + 1}
    with pytest.raises(CheckpointCorruptError) as info:
        new_runner(location)
    assert info.value.file == file
    assert info.value.key_group in lost
    assert file in str(info.value) and str(info.value.key_group) in str(info.value)


def test_a_missing_latest_data_file_is_an_error_naming_it(committed):
    location, _ = committed
    file, _ = sections_of_latest_file(location)
    os.remove(os.path.join(location, *file.split("/")))
    with pytest.raises(CheckpointCorruptError, match="missing") as info:
        new_runner(location)
    assert info.value.file == file


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_after_deleting_the_corrupt_versions_manifest_the_previous_version_restores(committed, damage):
    location, states = committed
    file, refs = sections_of_latest_file(location)
    path = os.path.join(location, *file.split("/"))
    if damage == "flip":
        flip_bit(path, refs[0].offset + refs[0].length // 2)
    else:
        with open(path, "r+b") as f:
            f.truncate(refs[0].offset + 3)
    with pytest.raises(CheckpointCorruptError):
        read_state(location)
    assert checkpoint_table(location, version=1) == states[1]  # the previous version is untouched

    remove_manifest(location, 2)
    rescaled = new_runner(location, parallelism=3)
    assert rescaled.version == 1
    assert plain(rescaled.state()) == states[1]
    rescaled.close()
    runner = new_runner(location)  # the parallelism of the original run: the same flushes
    runner.process(batch(2))  # redo the lost batch: version 2 again, from intact files
    assert runner.version == 2
    assert plain(runner.state()) == states[2]
    assert checkpoint_table(location) == states[2]
    runner.close()


def test_damage_to_an_older_unreferenced_region_does_not_stop_a_restore(committed):
    """Only sections the latest manifest reads matter: a file no kept version needs may be anything."""
    location, states = committed
    storage = CheckpointStorage(location)
    needed = storage.read_manifest(2).files()
    junk = "data/v0000000000-junk-0.ckpt"
    assert junk not in needed
    with open(os.path.join(location, "data", "v0000000000-junk-0.ckpt"), "wb") as f:
        f.write(b"not a checkpoint")
    runner = new_runner(location)
    assert plain(runner.state()) == states[2]
    runner.close()
