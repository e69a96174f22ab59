"""LocalRunner with its checkpoint in an object store: an S3 API server (moto) reached through s3fs."""

from __future__ import annotations

import numpy as np
import pytest

from buffering import LocalRunner, cached_state
from checkpoint import CheckpointStorage

from .helpers import Clock, count_sum, plain, random_batches, with_batch

OPERATOR = cached_state(max_entries=5, store="rocksdb")(count_sum)


def _batches():
    return random_batches(np.random.default_rng(5), 6, 30, 40)


def _run(location, batches, schedule, **kwargs):
    """Run ``batches``, restarting the runner at each parallelism of ``schedule`` (equal shares of the batches)."""
    clock = Clock()
    outputs = []
    per_run = len(batches) // len(schedule)
    state = None
    for run, parallelism in enumerate(schedule):
        runner = LocalRunner(OPERATOR, key="k", parallelism=parallelism, checkpoint_location=location, clock=clock, **kwargs)
        try:
            for i in range(run * per_run, (run + 1) * per_run):
                clock.now = 100 * i
                outputs.append(runner.process(batches[i]))
            state = plain(runner.state())
        finally:
            runner.close()
    return with_batch(outputs), state


@pytest.mark.slow
def test_local_runner_on_s3_emits_and_keeps_what_a_local_path_does(s3_location, s3_options, tmp_path):
    expected_out, expected_state = _run(tmp_path / "ckpt", _batches(), (2,))
    out, state = _run(s3_location, _batches(), (2,), storage_options=s3_options)
    assert out.equals(expected_out)
    assert state == expected_state
    assert CheckpointStorage(s3_location, storage_options=s3_options, create=False).latest_version() == 5


@pytest.mark.slow
def test_local_runner_on_s3_restarts_at_another_parallelism(s3_location, s3_options, tmp_path):
    expected_out, expected_state = _run(tmp_path / "ckpt", _batches(), (1,))
    out, state = _run(s3_location, _batches(), (1, 3, 2), storage_options=s3_options)
    assert out.equals(expected_out)
    assert state == expected_state


@pytest.mark.slow
def test_retention_on_s3_deletes_old_versions_and_their_files(s3_location, s3_options):
    _run(s3_location, _batches(), (2,), storage_options=s3_options)
    storage = CheckpointStorage(s3_location, storage_options=s3_options, create=False)
    assert storage.versions() == [3, 4, 5]  # the default retention keeps 3
    referenced = set().union(*(storage.read_manifest(v).files() for v in storage.versions()))
    assert set(storage.data_files()) == referenced  # no file of a deleted version is left
    assert [v for _, v in storage.batch_records()] == [3, 4, 5]


def test_storage_options_need_a_checkpoint_location():
    with pytest.raises(ValueError, match="storage_options"):
        LocalRunner(count_sum, key="k", storage_options={"anon": True})


def test_storage_options_beside_a_checkpoint_storage_are_refused(tmp_path):
    storage = CheckpointStorage(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="storage_options"):
        LocalRunner(count_sum, key="k", checkpoint_location=storage, storage_options={"anon": True})
