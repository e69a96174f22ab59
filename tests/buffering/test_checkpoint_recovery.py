"""The runners and the checkpoint: retention failing, batch records, a way back to an older version, signing."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner
from checkpoint import (
    DEFAULT_RETAIN,
    KEY_ENV,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointStorage,
    CheckpointTrustError,
    RetentionWarning,
)
from checkpoint.storage import batch_record_path, manifest_path

from .helpers import Clock, count_sum, plain

KEY = "the job's key"


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


def batch(i: int) -> pd.DataFrame:
    keys = np.arange(20)
    return pd.DataFrame({"k": keys, "v": keys + 100 * i})


def new_runner(location, **kwargs) -> LocalRunner:
    return LocalRunner(count_sum, key="k", checkpoint_location=location, clock=Clock(), **kwargs)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def five_versions(tmp_path):
    """Versions 0..4 (3 retained: 2, 3, 4) and the state after each batch."""
    location = str(tmp_path / "ckpt")
    runner = new_runner(location)
    states = []
    for i in range(5):
        runner.process(batch(i))
        states.append(plain(runner.state()))
    runner.close()
    return location, states


# ---------------------------------------------------------------- retention failing
def test_a_batch_whose_manifest_is_committed_does_not_fail_when_retention_fails(five_versions):
    location, states = five_versions
    flip(os.path.join(location, manifest_path(3)), 50)  # a kept older manifest: retention cannot read it
    runner = new_runner(location)
    with pytest.warns(RetentionWarning, match="v0000000003.json"):
        runner.process(batch(5))
    assert runner.version == 5
    runner.process(batch(6))  # no VersionExistsError: the runner moved on
    assert runner.version == 6
    assert CheckpointStorage(location).versions() == [4, 5, 6]


# ---------------------------------------------------------------- batch records
def test_batch_records_are_pruned_with_retention(tmp_path):
    location = str(tmp_path / "ckpt")
    runner = new_runner(location)
    for i in range(10):
        runner.process(batch(i))
    assert sorted(os.listdir(os.path.join(location, "batches"))) == [
        os.path.basename(batch_record_path(v)) for v in range(10 - DEFAULT_RETAIN, 10)
    ]


def test_a_torn_batch_record_is_an_error_naming_the_file(five_versions):
    location, _ = five_versions
    rel = batch_record_path(5)
    with open(os.path.join(location, rel), "w") as f:
        f.write('{"processing_time_ms": 17')  # the next batch's record, torn
    with pytest.raises(CheckpointCorruptError) as info:
        new_runner(location).process(batch(5))
    assert info.value.file == rel and rel in str(info.value)


# ---------------------------------------------------------------- a way back
def test_a_runner_started_from_an_older_version_has_that_versions_state(five_versions):
    location, states = five_versions
    runner = new_runner(location, start_version=2)  # key types come from the checkpoint: restored at once
    assert plain(runner.state()) == states[2]


def test_starting_from_an_older_version_sets_the_later_ones_aside_and_never_reuses_their_numbers(five_versions):
    location, states = five_versions
    runner = new_runner(location, start_version=2)
    storage = CheckpointStorage(location)
    assert storage.versions() == [2] and storage.set_aside_versions() == [3, 4]
    runner.process(batch(3))
    assert runner.version == 5  # not 3: a version number always means one content
    assert plain(runner.state()) == states[3]
    runner.close()
    resumed = new_runner(location)  # resumes from the new version, not from a set-aside one
    assert resumed.version == 5
    resumed.process(batch(4))
    assert plain(resumed.state()) == states[4]
    assert storage.set_aside_versions() == []  # below the newest version: retention deleted them


def test_a_damaged_latest_data_file_error_says_how_to_start_from_an_older_version(five_versions):
    location, _ = five_versions
    storage = CheckpointStorage(location)
    ref = next(ref for chain in storage.read_manifest(4).chains.values() for ref in chain
               if ref.file.startswith("data/v0000000004"))
    flip(os.path.join(location, *ref.file.split("/")), ref.offset + ref.length // 2)
    with pytest.raises(CheckpointCorruptError) as info:
        new_runner(location).process(batch(5))
    message = str(info.value)
    assert ref.file in message and "start_version=" in message and "[2, 3]" in message
    assert info.value.file == ref.file


def test_a_damaged_latest_manifest_error_says_how_to_start_from_an_older_version(five_versions):
    location, states = five_versions
    flip(os.path.join(location, manifest_path(4)), 30)
    with pytest.raises(CheckpointCorruptError) as info:
        new_runner(location)
    assert "start_version=" in str(info.value) and "[2, 3]" in str(info.value)
    runner = new_runner(location, start_version=3)  # the way it names works
    runner.process(batch(4))
    assert plain(runner.state()) == states[4]


def test_a_start_version_that_is_not_retained_is_refused_naming_the_retained_versions(five_versions):
    location, _ = five_versions
    with pytest.raises(CheckpointNotFoundError, match=r"start_version=0 .*retained versions: \[2, 3, 4\]"):
        new_runner(location, start_version=0)
    assert CheckpointStorage(location).versions() == [2, 3, 4]  # nothing was set aside


def test_a_damaged_start_version_sets_nothing_aside(five_versions):
    location, _ = five_versions
    flip(os.path.join(location, manifest_path(3)), 30)
    with pytest.raises(CheckpointCorruptError, match=r"start_version=N .*\[2\]"):
        new_runner(location, start_version=3)
    assert CheckpointStorage(location).versions() == [2, 3, 4]


def test_a_start_version_whose_data_file_is_damaged_sets_nothing_aside(five_versions):
    location, _ = five_versions
    storage = CheckpointStorage(location)
    ref = next(ref for chain in storage.read_manifest(3).chains.values() for ref in chain
               if ref.file.startswith("data/v0000000003"))
    flip(os.path.join(location, *ref.file.split("/")), ref.offset + ref.length // 2)
    with pytest.raises(CheckpointCorruptError, match=ref.file):
        new_runner(location, start_version=3)
    assert storage.versions() == [2, 3, 4] and storage.set_aside_versions() == []


def test_a_start_version_that_does_not_fit_the_runner_sets_nothing_aside(five_versions):
    location, _ = five_versions
    with pytest.raises(ValueError, match="max_parallelism"):
        new_runner(location, start_version=3, max_parallelism=64)
    assert CheckpointStorage(location).versions() == [2, 3, 4]


def test_start_version_needs_a_checkpoint_location():
    with pytest.raises(ValueError, match="start_version"):
        LocalRunner(count_sum, key="k", start_version=1)


# ---------------------------------------------------------------- signing
def test_a_runner_with_a_key_signs_its_manifests_and_resumes_with_it(tmp_path):
    location = str(tmp_path / "ckpt")
    runner = new_runner(location, checkpoint_key=KEY)
    runner.process(batch(0))
    state = plain(runner.state())
    runner.close()
    assert '"signature": "hmac-sha256:' in open(os.path.join(location, manifest_path(0))).read()
    assert plain(new_runner(location, checkpoint_key=KEY).state()) == state


def test_a_runner_with_a_key_refuses_an_unsigned_checkpoint(five_versions):
    location, _ = five_versions
    with pytest.raises(CheckpointTrustError, match="v0000000004.json") as info:
        new_runner(location, checkpoint_key=KEY)
    assert "start_version" not in str(info.value)  # an older version is no way out of another key


# ---------------------------------------------------------------- run_stream's driver (no Spark session needed)
def _stream_runner(location, **kwargs):
    from pyspark.sql.types import LongType, StructField, StructType

    from buffering.spark.stream import StreamRunner

    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    output = StructType([StructField("k", LongType()), StructField("n", LongType()), StructField("s", LongType())])
    return StreamRunner(count_sum, input_schema=schema, key="k", output_schema=output, checkpoint_location=location,
                        sink="noop", parallelism=1, **kwargs)


def test_run_stream_starts_from_start_version_and_builds_the_next_batch_on_it(five_versions):
    location, _ = five_versions
    runner = _stream_runner(location, start_version=3)
    storage = CheckpointStorage(location)
    assert storage.versions() == [2, 3] and storage.set_aside_versions() == [4]
    context, _ = runner.context(5)
    assert context.previous_version == 3


def test_run_stream_passes_the_key_to_its_tasks_without_showing_it(tmp_path):
    runner = _stream_runner(str(tmp_path / "ckpt"), checkpoint_key=KEY)
    assert runner.plan.checkpoint_key == KEY.encode()
    assert KEY not in repr(runner.plan) and KEY.encode().hex() not in repr(runner.plan)
    from buffering.spark import _task

    assert _task._storage(runner.plan).checkpoint_key == KEY.encode()


def test_run_stream_with_a_key_refuses_an_unsigned_checkpoint(five_versions):
    location, _ = five_versions
    with pytest.raises(CheckpointTrustError):
        _stream_runner(location, checkpoint_key=KEY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _stream_runner(location)  # without a key it is read as before
