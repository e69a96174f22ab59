"""run_stream with a checkpoint key (signed manifests, verified in the tasks) and from an older version."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest

import buffering
from buffering.spark import run_stream
from checkpoint import KEY_ENV, CheckpointCorruptError, CheckpointStorage, read_state
from checkpoint.storage import manifest_path

from .helpers import collect_sink, count_views, stream_of, views, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "tweet long, user long, ts long"
KEY = "the stream's key"


OPERATOR = buffering.cached_state(max_entries=10, store="rocksdb")(count_views)


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture(scope="module")
def frames():
    return views(4, 800, 40, 300, seed=11)


def _run(spark, source, checkpoint, **kwargs):
    query = run_stream(stream_of(spark, source, SCHEMA), OPERATOR, key="tweet", output_schema="tweet long, views long",
                       checkpoint_location=checkpoint, sink=collect_sink([]), trigger={"availableNow": True}, **kwargs)
    query.awaitTermination()
    return query


def _views(frames, batches):
    rows = pd.concat([frames[b] for b in batches])
    return rows.groupby("tweet").size().sort_index().tolist()


def _state_views(checkpoint, **kwargs):
    state = read_state(checkpoint, **kwargs).sort_values("tweet")
    return [s[0] for s in state["state"]]


def test_a_keyed_stream_restarted_at_another_parallelism_restores_in_its_tasks(spark, frames, tmp_path):
    all_in = write_batches(str(tmp_path / "all"), frames[:2])
    source = str(tmp_path / "in")
    os.makedirs(source)
    checkpoint = str(tmp_path / "ck")
    for i, parallelism in enumerate((2, 3)):  # the restart at 3 restores every instance from the checkpoint
        shutil.copy2(os.path.join(all_in, f"part-{i:05d}.parquet"), source)
        _run(spark, source, checkpoint, parallelism=parallelism, checkpoint_key=KEY)
    storage = CheckpointStorage(checkpoint, checkpoint_key=KEY)
    assert storage.versions() == [0, 1]
    assert '"signature": "hmac-sha256:' in open(os.path.join(checkpoint, manifest_path(1))).read()
    assert all(ref.digest for chain in storage.read_manifest(1).chains.values() for ref in chain)
    assert _state_views(checkpoint, checkpoint_key=KEY) == _views(frames, [0, 1])


def test_a_stream_started_from_an_older_version_builds_on_it(spark, frames, tmp_path):
    all_in = write_batches(str(tmp_path / "all"), frames)
    source = str(tmp_path / "in")
    os.makedirs(source)
    checkpoint = str(tmp_path / "ck")
    for i in range(3):
        shutil.copy2(os.path.join(all_in, f"part-{i:05d}.parquet"), source)
    _run(spark, source, checkpoint, parallelism=2)
    path = os.path.join(checkpoint, manifest_path(2))
    with open(path, "r+b") as f:  # the latest version is damaged
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointCorruptError, match=r"start_version=N .*\[0, 1\]"):
        _run(spark, source, checkpoint, parallelism=2)
    shutil.copy2(os.path.join(all_in, "part-00003.parquet"), source)
    query = _run(spark, source, checkpoint, parallelism=2, start_version=1)
    assert [m.batch_id for m in query.batch_metrics] == [3]  # Spark's batch ids go on
    storage = CheckpointStorage(checkpoint)
    assert storage.versions() == [0, 1, 3] and storage.set_aside_versions() == []
    assert _state_views(checkpoint) == _views(frames, [0, 1, 3])  # batch 2's rows were set aside with it
