"""Batch metrics records: what a batch did, written beside its version, read back by another process."""

from __future__ import annotations

import os

import pytest

from checkpoint import CheckpointCorruptError, CheckpointStorage, CheckpointTrustError, apply_retention
from checkpoint.storage import batch_metrics_path

from .helpers import checkpoint_version


def _path(storage, rel):
    return os.path.join(storage.location, *rel.split("/"))


def test_metrics_written_for_a_batch_read_back_equal_through_another_storage_object(storage):
    metrics = {"batch_id": 7, "rows_in": 1500, "seconds": 0.25, "per_instance": [{"instance": 0, "start": "restored"}]}
    storage.write_batch_metrics(7, metrics)
    assert CheckpointStorage(storage.location).read_batch_metrics(7) == metrics


def test_a_batch_without_metrics_reads_as_none(storage):
    assert storage.read_batch_metrics(3) is None


def test_metrics_written_again_for_a_batch_replace_the_earlier_record(storage):
    storage.write_batch_metrics(4, {"rows_in": 1})
    storage.write_batch_metrics(4, {"rows_in": 2})
    assert storage.read_batch_metrics(4) == {"rows_in": 2}
    assert storage.batch_metrics_records() == [(batch_metrics_path(4), 4)]


def test_metrics_that_are_not_json_are_a_type_error_naming_the_batch(storage):
    with pytest.raises(TypeError, match="batch 5"):
        storage.write_batch_metrics(5, {"rows_in": object()})
    assert storage.read_batch_metrics(5) is None


def test_a_torn_metrics_record_is_an_error_naming_the_file(storage):
    rel = batch_metrics_path(6)
    storage.write_small_file(rel, b'{"version": 6, "metr')
    with pytest.raises(CheckpointCorruptError) as info:
        storage.read_batch_metrics(6)
    assert info.value.file == rel and rel in str(info.value)


def test_a_metrics_record_of_another_batch_is_refused(storage):
    storage.write_batch_metrics(6, {"rows_in": 1})
    os.replace(_path(storage, batch_metrics_path(6)), _path(storage, batch_metrics_path(7)))
    with pytest.raises(CheckpointCorruptError, match="expected version 7"):
        storage.read_batch_metrics(7)


def test_with_a_checkpoint_key_an_unsigned_metrics_record_is_refused(tmp_path):
    CheckpointStorage(tmp_path / "ckpt").write_batch_metrics(2, {"rows_in": 1})
    with pytest.raises(CheckpointTrustError):
        CheckpointStorage(tmp_path / "ckpt", checkpoint_key="k").read_batch_metrics(2)


def test_retention_prunes_metrics_records_of_versions_before_the_oldest_kept(storage, make_tables):
    tables = make_tables(max_parallelism=8, track=True)
    for version in range(6):
        tables["state"].put((version,), version)
        checkpoint_version(storage, version, tables, retain=None)
        storage.write_batch_metrics(version, {"batch_id": version})
    deleted = apply_retention(storage, retain=2)
    assert [v for _, v in storage.batch_metrics_records()] == [4, 5]
    assert deleted["batch_metrics"] == [batch_metrics_path(v) for v in range(4)]
