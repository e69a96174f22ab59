"""Checkpoints in an object store: an S3 API server (moto, started by the ``s3_server`` fixture) through s3fs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import contextmanager

import pytest

from checkpoint import RECORDS, SST, CheckpointCorruptError, CheckpointStorage, CheckpointWriter, commit, read_state, restore

from .helpers import checkpoint_version, content, open_tables, close_tables

MP = 16


def _fill(tables, n=400):
    tables["state"].put_many(((f"user{i}", i), {"n": i}) for i in range(n))
    tables["timers"].put(("user1", 1), [10])


def _elsewhere(location, options):
    """The location as another process sees it: through an s3fs instance of its own, not this process's."""
    return CheckpointStorage(location, storage_options={**options, "skip_instance_cache": True})


def _four_tasks(storage, tables, version=1, encoding=SST):
    """Commit ``version`` written by four tasks (four task files; with SST encoding, each with its own SST files)."""
    previous = storage.latest_manifest(before=version)
    reports = [
        CheckpointWriter(storage, key_groups=range(lo, lo + MP // 4), task=f"t{lo}", sst_min_entries=10,
                         snapshot_encoding=encoding)
        .write(version, tables, None, previous, full=True)
        for lo in range(0, MP, MP // 4)
    ]
    return commit(storage, version, reports)


@contextmanager
def _s3_requests(storage, delay=0.0):
    """Record the S3 operations ``storage`` sends (names, and the most in flight at once).

    With ``delay`` every request waits that long before it is sent, so that
    requests made concurrently are in flight together.
    """
    fs = storage._fs.fs  # the s3fs filesystem behind the location
    fs.ls(fs._strip_protocol(storage.location).split("/")[0])  # connect: fs.s3 exists from here on
    seen = {"ops": [], "in_flight": 0, "max_in_flight": 0}

    async def before(event_name, **_):
        seen["ops"].append(event_name.rsplit(".", 1)[-1])
        seen["in_flight"] += 1
        seen["max_in_flight"] = max(seen["max_in_flight"], seen["in_flight"])
        if delay:
            await asyncio.sleep(delay)

    def after(**_):
        seen["in_flight"] -= 1

    events = fs.s3.meta.events
    events.register("before-call.s3", before)
    events.register("after-call.s3", after)
    try:
        yield seen
    finally:
        events.unregister("before-call.s3", before)
        events.unregister("after-call.s3", after)


@pytest.fixture
def s3_storage(s3_location, s3_options):
    return CheckpointStorage(s3_location, storage_options=s3_options)


@pytest.fixture
def tables(tmp_path):
    made = open_tables(tmp_path / "db", max_parallelism=MP, track=True)
    yield made
    close_tables(made)


# ---------------------------------------------------------------- listings are never cached
@pytest.mark.slow
def test_commit_finds_task_files_another_process_wrote_after_retention_listed_them(
    s3_storage, s3_location, s3_options, tables
):
    _fill(tables)
    checkpoint_version(s3_storage, 1, tables, retain=1)  # retention lists data/
    tables["state"].put(("user1", 1), "changed")
    task = CheckpointWriter(_elsewhere(s3_location, s3_options), key_groups=range(MP), task="t0")
    report = task.write(2, tables, {n: t.drain_changes() for n, t in tables.items()}, s3_storage.read_manifest(1))
    assert commit(s3_storage, 2, [report], retain=1).version == 2


@pytest.mark.slow
def test_versions_another_process_committed_are_seen(s3_storage, s3_location, s3_options, tables):
    _fill(tables)
    checkpoint_version(s3_storage, 1, tables)
    assert s3_storage.versions() == [1]  # lists manifests/
    tables["state"].put(("user1", 1), "changed")
    checkpoint_version(_elsewhere(s3_location, s3_options), 2, tables)
    assert s3_storage.versions() == [1, 2]


def test_a_listings_cache_is_refused():
    pytest.importorskip("fsspec")
    with pytest.raises(ValueError, match="use_listings_cache"):
        CheckpointStorage("memory://opbuffer-tests/cached", storage_options={"use_listings_cache": True})


def test_storage_options_that_are_not_a_mapping_are_refused():
    pytest.importorskip("fsspec")
    with pytest.raises(TypeError, match="storage_options .* must be a mapping"):
        CheckpointStorage("memory://opbuffer-tests/options", storage_options=[("key", "x")])


# ---------------------------------------------------------------- restore
@pytest.mark.slow
def test_restore_from_s3_gives_the_stored_content(s3_storage, tables, tmp_path):
    _fill(tables)
    _four_tasks(s3_storage, tables)
    target = open_tables(tmp_path / "restored", max_parallelism=MP)
    try:
        restore(s3_storage, 1, range(MP), target)
        assert content(target) == content(tables)
    finally:
        close_tables(target)


@pytest.mark.slow
def test_restore_from_s3_asks_for_no_file_size(s3_storage, s3_location, s3_options, tables, tmp_path):
    _fill(tables)
    _four_tasks(s3_storage, tables)
    reader = _elsewhere(s3_location, s3_options)  # a restoring worker: nothing listed or cached yet
    target = open_tables(tmp_path / "restored", max_parallelism=MP)
    try:
        with _s3_requests(reader) as seen:
            restore(reader, 1, range(MP), target)
    finally:
        close_tables(target)
    assert "HeadObject" not in seen["ops"]  # the manifest records every size
    assert seen["ops"].count("GetObject") > 4


@pytest.mark.slow
@pytest.mark.parametrize("encoding", [RECORDS, SST])
def test_restore_from_s3_fetches_files_concurrently(s3_storage, s3_location, s3_options, tables, tmp_path, encoding):
    _fill(tables)
    manifest = _four_tasks(s3_storage, tables, encoding=encoding)
    reader = _elsewhere(s3_location, s3_options)
    target = open_tables(tmp_path / "restored", max_parallelism=MP)
    try:
        with _s3_requests(reader, delay=0.05) as seen:
            restore(reader, manifest, range(MP), target)
    finally:
        close_tables(target)
    assert seen["ops"].count("GetObject") >= 4  # four task files at least
    assert seen["max_in_flight"] >= 4


@pytest.mark.slow
@pytest.mark.parametrize("change", [b"", b"x"], ids=["truncated", "extended"])
def test_restore_from_s3_of_an_sst_file_of_another_size_names_the_file(s3_storage, tables, tmp_path, change):
    _fill(tables)
    manifest = _four_tasks(s3_storage, tables)
    sst = next(name for chain in manifest.chains.values() for ref in chain for name in ref.sst_files)
    fs = s3_storage._fs.fs
    path = f"{s3_storage._fs.root}/{sst}"
    data = fs.cat_file(path)
    fs.pipe_file(path, data[:-1] if not change else data + change)
    target = open_tables(tmp_path / "restored", max_parallelism=MP)
    try:
        with pytest.raises(CheckpointCorruptError, match=sst):
            restore(s3_storage, 1, range(MP), target)
    finally:
        close_tables(target)


@pytest.mark.slow
@pytest.mark.parametrize("keep", [8, 0.5], ids=["before-the-first-section", "half"])
def test_restore_from_s3_of_a_truncated_task_file_names_the_file(s3_storage, tables, tmp_path, keep):
    _fill(tables)
    manifest = _four_tasks(s3_storage, tables, encoding=RECORDS)
    task_file = manifest.chain(0)[0].file
    fs = s3_storage._fs.fs
    path = f"{s3_storage._fs.root}/{task_file}"
    data = fs.cat_file(path)
    fs.pipe_file(path, data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    target = open_tables(tmp_path / "restored", max_parallelism=MP)
    try:
        with pytest.raises(CheckpointCorruptError, match=f"{task_file}.* is truncated"):
            restore(s3_storage, 1, range(MP), target)
    finally:
        close_tables(target)


# ---------------------------------------------------------------- read_state and inspect
@pytest.mark.slow
def test_read_state_reads_an_s3_location_with_storage_options(s3_location, s3_options, tables):
    _fill(tables, n=30)
    checkpoint_version(CheckpointStorage(s3_location, storage_options=s3_options), 1, tables)
    frame = read_state(s3_location, storage_options=s3_options, key_names=["name", "id"])
    assert sorted(zip(frame["name"], frame["id"], frame["state"])) == sorted(
        (f"user{i}", i, {"n": i}) for i in range(30)
    )


def _inspect(*args):
    return subprocess.run([sys.executable, "-m", "checkpoint", "inspect", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_inspect_takes_storage_options_one_by_one(s3_location, s3_server, tables):
    _fill(tables, n=30)
    checkpoint_version(CheckpointStorage(s3_location, storage_options=s3_server.storage_options), 1, tables)
    result = _inspect(
        s3_location, "--verify",
        "--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}",
        "--storage-option", "key=testing", "--storage-option", "secret=testing",
    )
    assert result.returncode == 0, result.stderr
    assert "versions: 1 (latest 1)" in result.stdout and "every checksum matches" in result.stdout


@pytest.mark.slow
def test_inspect_takes_storage_options_as_json(s3_location, s3_options, tables):
    _fill(tables, n=30)
    checkpoint_version(CheckpointStorage(s3_location, storage_options=s3_options), 1, tables)
    result = _inspect(s3_location, "--json", "--storage-options", json.dumps(s3_options))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["versions"] == [1]
