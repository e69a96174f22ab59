"""Writing a version: one task file per operator instance, then the driver's atomic commit.

On every task (operator instance owning ``key_groups``)::

    writer = CheckpointWriter(storage, key_groups=key_group_range(i, p), task=i)
    changes = {name: table.drain_changes() for name, table in tables.items()}
    report = writer.write(version, tables, changes, previous=manifest_of_the_restored_version)

and on the driver, once every task reported and the output is safe::

    commit(storage, version, reports, metadata={"watermark": ...})

Which key groups get which section:

* a key group none of whose keys changed gets nothing (its chain carries over);
* a changed key group gets a DELTA (the changed keys' current values, a
  tombstone for a deleted key), unless
* it has no chain yet, or the chain would grow past ``max_chain`` sections,
  or the chain's deltas would add up to more than ``max_delta_ratio`` times
  its snapshot: then it gets a SNAPSHOT (compaction), which replaces the chain.

A full snapshot of every owned key group is written when there is no previous
version (``previous=None``), when ``changes`` is None (the changes are
unknown, e.g. change tracking was not on since the state was restored), or
when ``full=True``. Rescaling needs no full snapshot: chains are per key
group, so an instance that restored key groups at another parallelism can
write deltas on top of their chains, provided its stores have tracked changes
since the restore.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import defaultdict
from typing import Any, Iterable, Mapping

from rocksdict import Options, SstFileWriter

from state import RocksDBStore

from .errors import CheckpointError, VersionExistsError
from .format import DELTA, RECORDS, SNAPSHOT, SST, Block, TaskFileWriter, encode_records, encode_section
from .manifest import Manifest, SectionRef, TaskReport
from .storage import CheckpointStorage, data_file_version

DEFAULT_MAX_CHAIN = 8
DEFAULT_MAX_DELTA_RATIO = 0.5
DEFAULT_RETAIN = 3
DEFAULT_SST_MIN_ENTRIES = 2048


def _check_range(key_groups: range, max_parallelism: int) -> range:
    if not isinstance(key_groups, range) or key_groups.step != 1:
        raise TypeError(f"key_groups must be a range with step 1, got {key_groups!r}")
    if key_groups.start < 0 or key_groups.stop > max_parallelism:
        raise ValueError(f"key_groups {key_groups!r} outside [0, max_parallelism={max_parallelism})")
    return key_groups


def fast_temp_dir() -> str:
    """A directory for short-lived SST files: ``/dev/shm`` when usable (no fsync cost), else the system temp.

    RocksDB's ``SstFileWriter.finish()`` fsyncs the file, which costs
    milliseconds per file on a disk; the files written here are read back
    and deleted at once, so a RAM-backed directory is the right place.
    """
    shm = "/dev/shm"
    try:
        if os.path.isdir(shm) and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            if stat.f_bavail * stat.f_frsize >= 256 << 20:
                return shm
    except OSError:
        pass
    return tempfile.gettempdir()


class CheckpointWriter:
    """Writes the task files of one operator instance (the key groups ``key_groups``).

    Args:
        storage: the checkpoint location (a CheckpointStorage, path or URL).
        key_groups: the contiguous key groups this instance owns.
        task: a name for this instance in file names and reports (e.g. its index).
        max_parallelism: key groups of the checkpoint; taken from the stores if None.
        max_chain: most sections in a key group's chain (1 snapshot + deltas) before compaction.
        max_delta_ratio: compact when a chain's deltas add up to more than this
            fraction of its snapshot's bytes.
        snapshot_encoding: ``"sst"`` (RocksDB SST files: the fastest restore, by
            file ingestion) or ``"records"`` (the portable record list). With
            ``"sst"``, a table whose key group has fewer than ``sst_min_entries``
            entries is still written as records: ingesting a file costs a few
            milliseconds (fsyncs), about as much as writing a thousand records.
        sst_min_entries: see ``snapshot_encoding``.
        tmp_dir: where SST files are built (default :func:`fast_temp_dir`).
    """

    def __init__(
        self,
        storage: CheckpointStorage | str | os.PathLike[str],
        *,
        key_groups: range,
        task: str | int = 0,
        max_parallelism: int | None = None,
        max_chain: int = DEFAULT_MAX_CHAIN,
        max_delta_ratio: float = DEFAULT_MAX_DELTA_RATIO,
        snapshot_encoding: str = SST,
        sst_min_entries: int = DEFAULT_SST_MIN_ENTRIES,
        tmp_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(key_groups, range) or key_groups.step != 1:
            raise TypeError(f"key_groups must be a range with step 1, got {key_groups!r}")
        if max_chain < 1:
            raise ValueError(f"max_chain must be >= 1, got {max_chain!r}")
        if max_delta_ratio < 0:
            raise ValueError(f"max_delta_ratio must be >= 0, got {max_delta_ratio!r}")
        if snapshot_encoding not in (SST, RECORDS):
            raise ValueError(f"snapshot_encoding must be {SST!r} or {RECORDS!r}, got {snapshot_encoding!r}")
        self.storage = CheckpointStorage.of(storage)
        self.key_groups = key_groups
        self.task = str(task)
        self.max_parallelism = max_parallelism
        self.max_chain = max_chain
        self.max_delta_ratio = max_delta_ratio
        self.snapshot_encoding = snapshot_encoding
        self.sst_min_entries = sst_min_entries
        self.tmp_dir = os.fspath(tmp_dir) if tmp_dir is not None else None

    # ------------------------------------------------------------ the one entry point
    def write(
        self,
        version: int,
        tables: Mapping[str, RocksDBStore],
        changes: Mapping[str, Iterable[bytes]] | None,
        previous: Manifest | None,
        *,
        full: bool = False,
    ) -> TaskReport:
        """Write this instance's task file of ``version`` and return the report for the driver.

        Args:
            version: the version being written (the Spark batch id).
            tables: every table of the operator's store, by name (user state,
                pending buffers, timers ...). Must include every table of ``previous``.
            changes: per table, the raw keys written or deleted since
                ``previous`` (``RocksDBStore.drain_changes()``); a table missing
                here has no changes. None: unknown, write a full snapshot.
            previous: the manifest the stores' state was restored from (the
                latest committed version before ``version``), None if none.
            full: write a snapshot of every owned key group.

        Nothing is written (``report.file is None``) when no owned key group changed.
        """
        started = time.perf_counter()
        if not tables:
            raise ValueError("tables must name at least one table")
        mp = self.max_parallelism
        for name, table in tables.items():
            if mp is None:
                mp = table.max_parallelism
            if table.max_parallelism != mp:
                raise ValueError(f"table {name!r} has max_parallelism {table.max_parallelism}, expected {mp}")
        assert mp is not None
        _check_range(self.key_groups, mp)
        if previous is not None:
            if previous.max_parallelism != mp:
                raise CheckpointError(
                    f"version {previous.version} has max_parallelism {previous.max_parallelism}, the stores {mp}"
                )
            if previous.version >= version:
                raise CheckpointError(f"cannot write version {version} on top of version {previous.version}")
            missing = [t for t in previous.tables if t not in tables]
            if missing:
                raise ValueError(f"tables {missing} of version {previous.version} are missing from tables")
        names = sorted(tables)

        full = full or previous is None or changes is None
        changed: dict[int, dict[str, list[bytes]]] = defaultdict(dict)
        if full:
            groups = list(self.key_groups)
        else:
            assert changes is not None
            lo, hi = self.key_groups.start, self.key_groups.stop
            for name, raw_keys in changes.items():
                if name not in tables:
                    raise ValueError(f"changes name table {name!r}, which is not in tables")
                per_group: dict[int, list[bytes]] = defaultdict(list)
                for raw in raw_keys:
                    per_group[(raw[0] << 8) | raw[1]].append(raw)
                for g, raws in per_group.items():
                    if not lo <= g < hi:
                        raise ValueError(
                            f"table {name!r} changed a key of key group {g}, outside this task's {self.key_groups}"
                        )
                    changed[g][name] = sorted(raws)
            groups = sorted(changed)

        report_args: dict[str, Any] = dict(
            version=version, task=self.task, key_groups=self.key_groups, max_parallelism=mp, tables=tuple(names),
            base_version=previous.version if previous is not None else None,
        )
        if not groups:
            return TaskReport(file=None, seconds=time.perf_counter() - started, **report_args)

        # One multi-get per table for every changed key (deltas), before anything is written.
        current: dict[str, dict[bytes, bytes | None]] = {}
        if not full:
            for name in names:
                keys = [k for g in groups for k in changed[g].get(name, ())]
                if keys:
                    current[name] = dict(zip(keys, tables[name].get_raw_many(keys)))

        path = self.storage.new_data_file(version, self.task)
        header = dict(report_args, key_groups=[self.key_groups.start, self.key_groups.stop], attempt=path,
                      created_at=time.time())
        refs: list[SectionRef] = []
        records = 0
        tmp = tempfile.mkdtemp(prefix="opbuffer-ckpt-", dir=self.tmp_dir or fast_temp_dir())
        try:
            with self.storage.open_write(path) as stream:
                out = TaskFileWriter(stream, header)
                for g in groups:
                    data: bytes | None = None
                    kind = SNAPSHOT
                    if not full and previous is not None and previous.chain(g):
                        blocks = []
                        for name in names:
                            keys = changed[g].get(name)
                            if keys:
                                values = current[name]
                                blocks.append(Block(name, RECORDS, encode_records(keys, [values[k] for k in keys])))
                        delta = encode_section(g, DELTA, blocks)
                        chain = previous.chain(g)
                        delta_bytes = sum(r.length for r in chain[1:]) + len(delta)
                        if len(chain) < self.max_chain and delta_bytes <= self.max_delta_ratio * chain[0].length:
                            data, kind = delta, DELTA
                            records += sum(len(changed[g].get(n, ())) for n in names)
                    if data is None:
                        data, count = self._snapshot(g, tables, names, tmp)
                        records += count
                    entry = out.add_section(g, kind, data)
                    refs.append(SectionRef(g, kind, path, entry.offset, entry.length, entry.checksum))
                size = out.finish()
        except BaseException:
            self.storage.delete(path)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return TaskReport(file=path, sections=tuple(refs), bytes=size, records=records,
                          seconds=time.perf_counter() - started, **report_args)

    # ------------------------------------------------------------ snapshots
    def _snapshot(self, key_group: int, tables: Mapping[str, RocksDBStore], names: list[str], tmp: str) -> tuple[bytes, int]:
        """The SNAPSHOT section of one key group and its entry count."""
        one = range(key_group, key_group + 1)
        blocks = []
        count = 0
        sst = self.snapshot_encoding == SST
        for i, name in enumerate(names):
            keys: list[bytes] = []
            values: list[bytes] = []
            add_key, add_value = keys.append, values.append
            for k, v in tables[name].iter_raw(one):
                add_key(k)
                add_value(v)
            if not keys:
                continue
            count += len(keys)
            if sst and len(keys) >= self.sst_min_entries:
                file_name = f"{key_group}-{i}.sst"
                try:
                    payload = _sst_bytes(keys, values, os.path.join(tmp, file_name))
                except Exception:  # rocksdict raises plain Exception, e.g. when a RAM-backed tmp is full
                    if self.tmp_dir is not None:
                        raise
                    with tempfile.TemporaryDirectory(prefix="opbuffer-ckpt-") as fallback:
                        payload = _sst_bytes(keys, values, os.path.join(fallback, file_name))
                blocks.append(Block(name, SST, payload))
            else:
                blocks.append(Block(name, RECORDS, encode_records(keys, values)))
        return encode_section(key_group, SNAPSHOT, blocks), count


def _sst_options() -> Options:
    return Options(raw_mode=True)


def _sst_bytes(keys: list[bytes], values: list[bytes], path: str) -> bytes:
    """The bytes of an SST file of sorted, non-empty ``keys`` and their values, built at ``path``."""
    writer = SstFileWriter(_sst_options())
    writer.open(path)
    for k, v in zip(keys, values):
        writer[k] = v
    writer.finish()
    try:
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.remove(path)


# ---------------------------------------------------------------- the driver
def commit(
    storage: CheckpointStorage | str | os.PathLike[str],
    version: int,
    reports: Iterable[TaskReport | Mapping[str, Any]],
    metadata: Mapping[str, Any] | None = None,
    *,
    retain: int | None = DEFAULT_RETAIN,
    max_parallelism: int | None = None,
) -> Manifest:
    """Commit ``version``: build its manifest from the latest committed one and the reports, and publish it atomically.

    Args:
        storage: the checkpoint location.
        version: must be newer than every committed version.
        reports: the reports of every task of the version (``TaskReport`` or its ``to_dict()``).
        metadata: free-form JSON-able data kept in the manifest (watermark, batch time, ...).
        retain: then apply :func:`apply_retention` keeping this many versions (None: keep everything).
        max_parallelism: only needed for a first version without reports.

    Returns the committed manifest. Raises VersionExistsError when ``version``
    (or a newer one) is already committed (a re-run of a committed batch: its
    recomputed files are orphans that retention deletes later), and
    CheckpointError when a report does not fit or a reported file is missing;
    nothing is committed then.
    """
    storage = CheckpointStorage.of(storage)
    parsed = [r if isinstance(r, TaskReport) else TaskReport.from_dict(r) for r in reports]
    latest = storage.latest_version()
    if latest is not None and latest >= version:
        raise VersionExistsError(f"cannot commit version {version}: version {latest} is already committed")
    previous = storage.read_manifest(latest) if latest is not None else None
    manifest = Manifest.build(previous, version, parsed, metadata, max_parallelism=max_parallelism)
    for report in parsed:
        if report.file is not None and not storage.exists(report.file):
            raise CheckpointError(f"task {report.task!r} reported {report.file!r}, which does not exist")
    storage.write_manifest(manifest)
    if retain is not None:
        apply_retention(storage, retain)
    return manifest


def apply_retention(storage: CheckpointStorage | str | os.PathLike[str], retain: int = DEFAULT_RETAIN) -> dict[str, list]:
    """Keep the newest ``retain`` versions; delete older manifests and every task file none of them needs.

    Manifests go first, then files, so a crash in between leaves orphans, never
    a manifest with missing files. Files of versions newer than the newest
    committed one (tasks still writing) are never touched; files of failed or
    superseded attempts of older versions are. Returns what was deleted.
    """
    if isinstance(retain, bool) or not isinstance(retain, int) or retain < 1:
        raise ValueError(f"retain must be an int >= 1, got {retain!r}")
    storage = CheckpointStorage.of(storage)
    versions = storage.versions()
    deleted: dict[str, list] = {"manifests": [], "files": []}
    if not versions:
        return deleted
    newest = versions[-1]
    keep = versions[-retain:]
    for v in versions[:-retain]:
        storage.delete_manifest(v)
        deleted["manifests"].append(v)
    referenced: set[str] = set()
    for v in keep:
        referenced |= storage.read_manifest(v).files()  # a corrupt manifest raises: delete nothing more
    for path in storage.data_files():
        v = data_file_version(path)
        if v is None or v > newest or path in referenced:
            continue
        storage.delete(path)
        deleted["files"].append(path)
    for path, v in storage.temp_manifests():
        if v <= newest:
            storage.delete(path)
    return deleted
