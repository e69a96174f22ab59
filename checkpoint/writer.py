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
  its snapshot: then it gets a SNAPSHOT (compaction), which replaces the chain
  (when the delta, estimated from ``DELTA_SAMPLE`` of its changed values, would
  be over ``DELTA_SKIP_MARGIN`` times its room, without reading the rest first);
* and a key group whose snapshot shares an SST file with one that gets a new
  snapshot gets one too (when this task owns it, changed or not), so that
  no SST file stays wanted only in part.

The snapshots of consecutive key groups written together share one SST file
per table (at most ``sst_key_groups`` key groups, aligned), next to the task
file: a restore ingests one file for many key groups (RocksDB fsyncs every
ingested file, one after the other, so the number of files bounds its speed)
and, on a local location, hard-links it instead of copying its bytes.

A full snapshot of every owned key group is written when there is no previous
version (``previous=None``), when ``changes`` is None (the changes are
unknown, e.g. change tracking was not on since the state was restored), or
when ``full=True``. Rescaling needs no full snapshot: chains are per key
group, so an instance that restored key groups at another parallelism can
write deltas on top of their chains, provided its stores have tracked changes
since the restore.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from rocksdict import Options, SstFileWriter

from state.raw import RawTable, key_group_of_raw

from .errors import CheckpointError, RetentionWarning, VersionExistsError
from .format import (
    DELTA,
    RECORDS,
    SNAPSHOT,
    SST,
    SST_FILE,
    Block,
    SstFileRef,
    TaskFileWriter,
    encode_records,
    encode_section,
    encode_sst_file_ref,
    encoded_records_size,
    encoded_section_size,
    file_hasher,
)
from .manifest import Manifest, SectionRef, TaskReport
from .staging import staging_dir
from .storage import CheckpointStorage, data_file_version

DEFAULT_MAX_CHAIN = 8
DEFAULT_MAX_DELTA_RATIO = 0.5
DEFAULT_RETAIN = 3
DEFAULT_SST_MIN_ENTRIES = 2048
DEFAULT_SST_KEY_GROUPS = 16
#: Changed values read per key group and table to estimate a delta's size before reading them all.
DELTA_SAMPLE = 8
#: A key group whose estimated delta is more than this many times its budget gets a snapshot unread.
DELTA_SKIP_MARGIN = 2.0
_COPY_CHUNK = 8 << 20


def _check_range(key_groups: range, max_parallelism: int) -> range:
    if not isinstance(key_groups, range) or key_groups.step != 1:
        raise TypeError(f"key_groups must be a range with step 1, got {key_groups!r}")
    if key_groups.start < 0 or key_groups.stop > max_parallelism:
        raise ValueError(f"key_groups {key_groups!r} outside [0, max_parallelism={max_parallelism})")
    return key_groups


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
            ``"sst"``, the snapshots of consecutive key groups written together
            (at most ``sst_key_groups``, inside one aligned block of that many
            key groups) share one SST file per table, written next to the task
            file; a table with fewer than ``sst_min_entries`` entries in such a
            run is still written as records: ingesting a file costs a few
            milliseconds (RocksDB fsyncs it), about as much as writing a thousand records.
        sst_min_entries: see ``snapshot_encoding``.
        sst_key_groups: key groups per SST file at most (a power of two divides
            every parallelism's key-group ranges best). Fewer, larger files make
            restores faster (one fsync per file); a restore that wants only part
            of a file (rescaled to more than ``max_parallelism / sst_key_groups``
            instances, or some of its key groups were snapshotted again since)
            loads its key groups entry by entry from it. 1: one file per key group.
        tmp_dir: where SST files are built (default :func:`checkpoint.staging.fast_temp_dir`).
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
        sst_key_groups: int = DEFAULT_SST_KEY_GROUPS,
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
        if isinstance(sst_key_groups, bool) or not isinstance(sst_key_groups, int) or sst_key_groups < 1:
            raise ValueError(f"sst_key_groups must be an int >= 1, got {sst_key_groups!r}")
        self.storage = CheckpointStorage.of(storage)
        self.key_groups = key_groups
        self.task = str(task)
        self.max_parallelism = max_parallelism
        self.max_chain = max_chain
        self.max_delta_ratio = max_delta_ratio
        self.snapshot_encoding = snapshot_encoding
        self.sst_min_entries = sst_min_entries
        self.sst_key_groups = sst_key_groups
        self.tmp_dir = os.fspath(tmp_dir) if tmp_dir is not None else None
        self._sst_digests: dict[str, str] = {}  # SST file -> SHA-256, with a checkpoint key

    # ------------------------------------------------------------ the one entry point
    def write(
        self,
        version: int,
        tables: Mapping[str, RawTable],
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
                ``previous`` (``RawTable.drain_changes()``); a table missing
                here has no changes. None: unknown, write a full snapshot.
            previous: the manifest the stores' state was restored from (the
                latest committed version before ``version``), None if none.
            full: write a snapshot of every owned key group.

        Nothing is written (``report.file is None``) when no owned key group changed.
        """
        started = time.perf_counter()
        self._sst_digests.clear()
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
                    per_group[key_group_of_raw(raw)].append(raw)
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

        def delta_budget(g: int) -> float:
            """Bytes a DELTA section of ``g`` may take (negative: none), -1 without a chain to add to."""
            chain = previous.chain(g) if previous is not None else ()
            if full or not chain or len(chain) >= self.max_chain:
                return -1.0
            return self.max_delta_ratio * chain[0].bytes - sum(r.bytes for r in chain[1:])

        budgets = {g: delta_budget(g) for g in groups}

        def may_get_delta(g: int) -> bool:
            """Whether ``g`` may get a DELTA section, judged without its values (their sizes only add)."""
            least = encoded_section_size(
                (name, encoded_records_size(keys, ())) for name in names if (keys := changed[g].get(name))
            )
            return least <= budgets[g]

        candidates = [g for g in groups if may_get_delta(g)]
        # Under heavy updates the changed values of nearly every key group exceed its budget, and reading
        # them is wasted: the snapshot reads the key group anyway (100k keys, 4 instances: 60k reads of
        # 60k changed keys per batch, all for key groups then snapshotted). So a few values per key group
        # (evenly spaced, DELTA_SAMPLE) estimate the delta first; a key group estimated at more than
        # DELTA_SKIP_MARGIN times its budget is snapshotted unread, the others are judged exactly.
        # A wrong estimate costs bytes, never correctness: a snapshot is always a valid section.
        # The sampled values, by table (kept: a key group that may get a delta does not read them again).
        current: dict[str, dict[bytes, bytes | None]] = {name: {} for name in names}
        if candidates:
            samples = {g: {name: keys[:: max(1, len(keys) // DELTA_SAMPLE)][:DELTA_SAMPLE]
                           for name in names if (keys := changed[g].get(name))} for g in candidates}
            for name in names:
                keys = [k for g in candidates for k in samples[g].get(name, ())]
                if keys:
                    current[name].update(zip(keys, tables[name].get_raw_many(keys)))

            def estimated_delta(g: int) -> float:
                blocks = []
                for name, sample in samples[g].items():
                    keys, values = changed[g][name], current[name]
                    mean = sum(len(v) for k in sample if (v := values[k]) is not None) / len(sample)
                    blocks.append((name, encoded_records_size(keys, ()) + int(mean * len(keys))))
                return encoded_section_size(blocks)

            candidates = [g for g in candidates if estimated_delta(g) <= DELTA_SKIP_MARGIN * budgets[g]]

        # One multi-get per table for the other changed keys of the key groups that may get a delta, before
        # anything is written (a key group bound to be compacted is read by its snapshot instead).
        delta_candidates = set(candidates)
        for name in names:
            known = current[name]
            keys = [k for g in candidates for k in changed[g].get(name, ()) if k not in known]
            if keys:
                known.update(zip(keys, tables[name].get_raw_many(keys)))

        def gets_delta(g: int) -> bool:
            """Whether ``g`` gets a DELTA section (else a snapshot: compaction, or no chain yet)."""
            if g not in delta_candidates:
                return False
            size = encoded_section_size(
                (name, encoded_records_size(keys, map(current[name].__getitem__, keys)))
                for name in names if (keys := changed[g].get(name))
            )
            return size <= budgets[g]

        def delta_section(g: int) -> bytes:
            blocks = []
            for name in names:
                keys = changed[g].get(name)
                if keys:
                    values = current[name]
                    blocks.append(Block(name, RECORDS, encode_records(keys, [values[k] for k in keys])))
            return encode_section(g, DELTA, blocks)

        # Which key groups get a snapshot. A key group whose snapshot is in an SST file shared with other
        # key groups takes them along (those this task owns): a file wanted only in part would make
        # restores load it entry by entry.
        snapshots = set(groups) if full else {g for g in groups if not gets_delta(g)}
        if previous is not None and snapshots:

            def base_files(h: int) -> tuple[str, ...]:
                chain = previous.chain(h)
                return chain[0].sst_files if chain else ()

            sharing: dict[str, list[int]] = defaultdict(list)
            for h in self.key_groups:
                for name in base_files(h):
                    sharing[name].append(h)
            for g in list(snapshots):
                for name in base_files(g):
                    snapshots.update(sharing[name])
            groups = sorted(set(groups) | snapshots)

        path = self.storage.new_data_file(version, self.task)
        header = dict(report_args, key_groups=[self.key_groups.start, self.key_groups.stop], attempt=path,
                      created_at=time.time())
        refs: list[SectionRef] = []
        records = 0
        sst_files: dict[str, int] = {}  # SST files written next to the task file: name -> size

        tmp = staging_dir("ckpt", self.tmp_dir)
        try:
            with self.storage.open_write(path) as stream:
                out = TaskFileWriter(stream, header)
                i = 0
                while i < len(groups):
                    g = groups[i]
                    if g not in snapshots:
                        data = delta_section(g)
                        entry = out.add_section(g, DELTA, data)
                        refs.append(SectionRef(g, DELTA, path, entry.offset, entry.length, entry.checksum,
                                               digest=self._digest(data)))
                        records += sum(len(changed[g].get(n, ())) for n in names)
                        i += 1
                        continue
                    # A run of consecutive key groups that all get a snapshot, inside one aligned block of
                    # sst_key_groups: each table's entries of the run go to one SST file.
                    run = [g]
                    if self.snapshot_encoding == SST:
                        block_of = g // self.sst_key_groups
                        while (i + len(run) < len(groups) and groups[i + len(run)] == run[-1] + 1
                               and groups[i + len(run)] // self.sst_key_groups == block_of
                               and groups[i + len(run)] in snapshots):
                            run.append(groups[i + len(run)])
                    for snapshot in self._snapshot_run(run, tables, names, tmp, path, sst_files):
                        entry = out.add_section(snapshot.key_group, SNAPSHOT, snapshot.data)
                        refs.append(SectionRef(
                            snapshot.key_group, SNAPSHOT, path, entry.offset, entry.length, entry.checksum,
                            snapshot.sst_files, snapshot.sst_bytes, self._digest(snapshot.data),
                            tuple(self._sst_digests[f] for f in snapshot.sst_files) if self._keyed else (),
                        ))
                        records += snapshot.count
                    i += len(run)
                size = out.finish()
        except BaseException:
            self.storage.delete(path)
            for name in sst_files:
                self.storage.delete(name)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return TaskReport(file=path, sections=tuple(refs), bytes=size + sum(sst_files.values()), records=records,
                          seconds=time.perf_counter() - started, **report_args)

    @property
    def _keyed(self) -> bool:
        """With a checkpoint key, sections and SST files get SHA-256 digests (see SectionRef)."""
        return self.storage.checkpoint_key is not None

    def _digest(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest() if self._keyed else ""

    # ------------------------------------------------------------ snapshots
    def _snapshot_run(
        self,
        run: list[int],
        tables: Mapping[str, RawTable],
        names: list[str],
        tmp: str,
        path: str,
        sst_files: dict[str, int],
    ) -> list["_Snapshot"]:
        """The SNAPSHOT sections of the consecutive key groups ``run``, in order.

        Per table: when the run holds at least ``sst_min_entries`` entries (and the
        encoding is SST), they go to one SST file next to the task file
        (:func:`sst_file_name`) and every key group of the run with entries gets a
        reference to it; else each key group gets a records block. Entries are
        streamed into the SST file key group by key group (memory: one key group).
        """
        blocks: dict[int, list[Block]] = {g: [] for g in run}
        counts = dict.fromkeys(run, 0)
        shares = dict.fromkeys(run, 0)
        files: dict[int, list[str]] = {g: [] for g in run}
        for index, name in enumerate(names):
            try:
                result = self._table_run(run, tables[name], index, tmp, path)
            except _SstBuildError:
                if self.tmp_dir is not None:
                    raise
                # e.g. a RAM-backed tmp is full: build it again on the disk-backed temp
                with tempfile.TemporaryDirectory(prefix="opbuffer-ckpt-") as fallback:
                    result = self._table_run(run, tables[name], index, fallback, path)
            sst, per_group = result
            for g, n, payload in per_group:
                counts[g] += n
                if payload is not None:
                    blocks[g].append(Block(name, RECORDS, payload))
            if sst is not None:
                ref, raw_bytes = sst
                sst_files[ref.name] = ref.size
                reference = encode_sst_file_ref(ref)
                total_raw = sum(raw_bytes.values())
                for g in ref.key_groups:
                    blocks[g].append(Block(name, SST_FILE, reference))
                    files[g].append(ref.name)
                    shares[g] += ref.size * raw_bytes[g] // max(1, total_raw)
        return [_Snapshot(g, encode_section(g, SNAPSHOT, blocks[g]), counts[g], tuple(files[g]), shares[g])
                for g in run]

    def _table_run(
        self, run: list[int], table: RawTable, index: int, tmp: str, path: str
    ) -> tuple[tuple[SstFileRef, dict[int, int]] | None, list[tuple[int, int, bytes | None]]]:
        """One table's entries of ``run``: ``(SST file and raw bytes per key group, or None; per key group
        (key group, entries, records payload or None))``."""
        sst = self.snapshot_encoding == SST
        per_group: list[tuple[int, int, bytes | None]] = []
        pending: list[tuple[int, list[bytes], list[bytes]]] = []  # not yet in the SST file (maybe records)
        pending_entries = 0
        writer: SstFileWriter | None = None
        local = os.path.join(tmp, f"run-{run[0]}-{index}.sst")
        in_file: list[int] = []
        raw_bytes: dict[int, int] = {}

        def add(g: int, keys: list[bytes], values: list[bytes]) -> None:
            assert writer is not None
            try:
                for k, v in zip(keys, values):
                    writer[k] = v
            except Exception as exc:  # rocksdict raises plain Exception
                raise _SstBuildError(str(exc)) from exc
            in_file.append(g)
            raw_bytes[g] = sum(map(len, keys)) + sum(map(len, values))
            per_group.append((g, len(keys), None))

        for g in run:
            keys: list[bytes] = []
            values: list[bytes] = []
            add_key, add_value = keys.append, values.append
            for k, v in table.iter_raw(range(g, g + 1)):
                add_key(k)
                add_value(v)
            if not keys:
                continue
            if writer is not None:
                add(g, keys, values)
                continue
            pending.append((g, keys, values))
            pending_entries += len(keys)
            if sst and pending_entries >= self.sst_min_entries:
                try:
                    writer = SstFileWriter(_sst_options())
                    writer.open(local)
                except Exception as exc:
                    raise _SstBuildError(str(exc)) from exc
                for pg, pkeys, pvalues in pending:
                    add(pg, pkeys, pvalues)
                pending = []
        for g, keys, values in pending:
            per_group.append((g, len(keys), encode_records(keys, values)))
        per_group.sort(key=lambda item: item[0])
        if writer is None:
            return None, per_group
        try:
            writer.finish()
        except Exception as exc:
            raise _SstBuildError(str(exc)) from exc
        name = sst_file_name(path, in_file[0], in_file[-1] + 1, index)
        try:
            size, crc = self._publish(local, name)
        finally:
            os.remove(local)
        return (SstFileRef(name, size, crc, tuple(in_file)), raw_bytes), per_group

    def _publish(self, local: str, name: str) -> tuple[int, int]:
        """Copy a built SST file to ``name`` in the checkpoint location; returns its size and checksum.

        With a checkpoint key its SHA-256 goes to ``self._sst_digests[name]``.
        """
        hasher = file_hasher()
        sha = hashlib.sha256() if self._keyed else None
        size = 0
        with open(local, "rb") as src, self.storage.open_write(name) as dst:
            while True:
                chunk = src.read(_COPY_CHUNK)
                if not chunk:
                    break
                hasher.update(chunk)
                if sha is not None:
                    sha.update(chunk)
                dst.write(chunk)
                size += len(chunk)
        if sha is not None:
            self._sst_digests[name] = sha.hexdigest()
        return size, hasher.intdigest()


@dataclass(frozen=True)
class _Snapshot:
    key_group: int
    data: bytes  # the section
    count: int  # entries
    sst_files: tuple[str, ...]
    sst_bytes: int


class _SstBuildError(Exception):
    """Building an SST file in the temp directory failed."""


def sst_file_name(task_file: str, lo: int, hi: int, table_index: int) -> str:
    """The name of the SST file of key groups ``lo..hi-1`` of one table, next to its task file."""
    stem = task_file[: -len(".ckpt")] if task_file.endswith(".ckpt") else task_file
    return f"{stem}.kg{lo:05d}-{hi - 1:05d}.t{table_index}.sst"


def _sst_options() -> Options:
    return Options(raw_mode=True)


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
            Should retention fail (say, an older manifest is damaged), the version
            stays committed: a :class:`RetentionWarning` says why, and the next
            commit tries again.
        max_parallelism: only needed for a first version without reports.

    Returns the committed manifest. Raises VersionExistsError when ``version``
    (or a newer one) is already committed (a re-run of a committed batch: its
    recomputed files are orphans that retention deletes later) or was set
    aside (version numbers are never reused), and CheckpointError when a
    report does not fit or a reported file is missing; nothing is committed then.
    """
    storage = CheckpointStorage.of(storage)
    parsed = [r if isinstance(r, TaskReport) else TaskReport.from_dict(r) for r in reports]
    latest = storage.latest_version()
    if latest is not None and latest >= version:
        raise VersionExistsError(f"cannot commit version {version}: version {latest} is already committed")
    set_aside = storage.set_aside_versions()
    if set_aside and set_aside[-1] >= version:
        raise VersionExistsError(
            f"cannot commit version {version}: version {set_aside[-1]} was committed and then set aside "
            "(a runner started from an older version); version numbers are never reused"
        )
    previous = storage.read_manifest(latest) if latest is not None else None
    manifest = Manifest.build(previous, version, parsed, metadata, max_parallelism=max_parallelism)
    # One fresh listing of data/ (never a cached one: the tasks that wrote the files are other
    # processes) instead of one existence check per file: on an object store a LIST answers for
    # up to 1000 files in one round trip, where each check is a HEAD of its own.
    present = set(storage.data_files())
    for report in parsed:
        if report.file is not None and report.file not in present:
            raise CheckpointError(f"task {report.task!r} reported {report.file!r}, which does not exist")
        for name in sorted({f for ref in report.sections for f in ref.sst_files}):
            if name not in present:
                raise CheckpointError(f"task {report.task!r} reported the SST file {name!r}, which does not exist")
    storage.write_manifest(manifest)
    if retain is not None:
        try:
            apply_retention(storage, retain)
        except Exception as exc:  # the version is committed: its batch must not fail now
            warnings.warn(
                f"version {version} is committed in {storage.location!r}, but retention failed: {exc!r}; "
                "retention is tried again after the next commit",
                RetentionWarning,
                stacklevel=2,
            )
    return manifest


def apply_retention(storage: CheckpointStorage | str | os.PathLike[str], retain: int = DEFAULT_RETAIN) -> dict[str, list]:
    """Keep the newest ``retain`` versions; delete older manifests and every task file none of them needs.

    Manifests go first, then files, so a crash in between leaves orphans, never
    a manifest with missing files. Files of versions newer than the newest
    committed one (tasks still writing) are never touched; files of failed or
    superseded attempts of older versions are. Processing-time records
    (``batches/``) and batch metrics records (``metrics/``) of versions older
    than the oldest kept one go too, and so
    do set-aside manifests of versions below the newest (their numbers can no
    longer be committed; their files are unreferenced). Returns what was deleted.

    Raises CheckpointCorruptError when a kept manifest cannot be read; then no
    file is deleted (which files it needs is unknown).
    """
    if isinstance(retain, bool) or not isinstance(retain, int) or retain < 1:
        raise ValueError(f"retain must be an int >= 1, got {retain!r}")
    storage = CheckpointStorage.of(storage)
    versions = storage.versions()
    deleted: dict[str, list] = {"manifests": [], "files": [], "set_aside": [], "batch_records": [], "batch_metrics": []}
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
    for path, v in storage.set_aside_manifests():
        if v < newest:
            storage.delete(path)
            deleted["set_aside"].append(v)
    for path, v in storage.batch_records():
        if v < keep[0]:
            storage.delete(path)
            deleted["batch_records"].append(path)
    for path, v in storage.batch_metrics_records():
        if v < keep[0]:
            storage.delete(path)
            deleted["batch_metrics"].append(path)
    return deleted
