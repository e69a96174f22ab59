"""LocalRunner: run a decorated operator in one process, exactly-once, without Spark.

For unit tests of an operator and as an embedded engine. Each ``process(pdf)``
is one micro-batch: rows are routed to instances by key group, buffered,
flushed, timers fire, and (with a checkpoint location) the batch commits a
version. A new runner on the same location resumes from the latest committed
version at any parallelism; replaying the batches after ``version`` gives
exactly the output and state of an uninterrupted run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from checkpoint import CheckpointCorruptError, CheckpointStorage, Manifest, commit
from state.cache import CacheManager, check_memory_budget, shared_manager
from state.group_state import NO_TIMESTAMP, GroupStateTimeout, timeout_conf
from state.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism, key_group_from_hash, operator_indexes
from state.state_schema import StateSchema
from state.keys import key_groups_of_longs, normalize_key, normalize_types, spark_hash

from .aggregations.columnar import packed
from .buffer import factorize_keys
from .decorators import check_operator_key, spec_of
from .processor import check_initial_state, processor_timeout
from .frames import concat_frames
from .operator import OperatorInstance
from .windows import check_runner_settings
from .protocol import (
    WATERMARK_FIELD,
    check_checkpoint_fits,
    check_delay_ms,
    commit_metadata,
    drop_late_rows,
    late_rows_watermark,
    no_data_timeout,
    state_key_columns,
    watermark_for,
)

Clock = Callable[[], int]


def spark_type_of(dtype: Any) -> str:
    """The Spark type a pandas column of ``dtype`` becomes (what the key group is hashed as)."""
    kind = np.dtype(dtype).kind if not isinstance(dtype, pd.api.extensions.ExtensionDtype) else None
    name = str(dtype)
    if kind == "b" or name == "boolean":
        return "boolean"
    if kind in ("i", "u") or name.startswith(("Int", "UInt")):
        size = np.dtype(dtype).itemsize if kind else int("".join(c for c in name if c.isdigit()) or 64) // 8
        return "long" if size >= 8 else "int"
    if kind == "f" or name.startswith("Float"):
        return "double" if (np.dtype(dtype).itemsize if kind else 8) >= 8 else "float"
    if kind == "M" or name.startswith("datetime64"):
        return "timestamp"
    if kind == "S":
        return "binary"
    return "string"


def key_groups_of(frame: pd.DataFrame, key_columns: Sequence[str], key_types: Sequence[str], max_parallelism: int) -> np.ndarray:
    """Key group of every row: vectorized for one long column, per unique key otherwise."""
    if len(key_columns) == 1 and key_types[0] == "long" and frame[key_columns[0]].dtype.kind == "i":
        return key_groups_of_longs(frame[key_columns[0]].to_numpy(np.int64), max_parallelism)
    columns = list(key_columns)
    try:
        codes, uniques = factorize_keys(frame, columns, key_types)
    except TypeError:
        _raise_for_unhashable_keys(frame, columns)  # names the column and value when that is the cause
        raise
    groups = np.fromiter(
        (key_group_from_hash(spark_hash(k, key_types, columns), max_parallelism) for k in uniques),
        dtype=np.int64,
        count=len(uniques),
    )
    return groups[codes]


def _raise_for_unhashable_keys(frame: pd.DataFrame, key_columns: Sequence[str]) -> None:
    """A key column of lists, dicts or sets is an error naming the column and the first such value.

    Called only once grouping the keys failed: the per-row look is no cost of a good batch.
    """
    for column in key_columns:
        series = frame[column]
        if series.dtype != object:
            continue
        bad = series.map(lambda v: isinstance(v, (list, dict, set, np.ndarray)))
        if bad.any():
            value = series[bad.to_numpy()].iloc[0]
            raise TypeError(
                f"key column {column!r} holds a {type(value).__name__} ({value!r:.200}); "
                "key values must be scalars (a Spark grouping column cannot be an array or map either)"
            )


class LocalRunner:
    """Runs ``fn`` (decorated or ``buffering.aggregate(...)``) over pandas micro-batches.

    Args:
        fn: the operator: a function ``(key, rows, state) -> iterator of DataFrames``
            (with ``@mini_batch`` / ``@cached_state``) or ``buffering.aggregate(...)``.
        key: the key columns.
        parallelism: operator instances (each owns a contiguous key-group range).
        max_parallelism: key groups; fixed for the life of a checkpoint.
        checkpoint_location: local path or fsspec URL (``s3://bucket/prefix`` with the
            ``s3`` extra); None runs without checkpoints.
        storage_options: fsspec options of a URL ``checkpoint_location``, one mapping
            (e.g. ``{"client_kwargs": {"endpoint_url": ...}, "key": ..., "secret": ...}``
            for s3fs); None: the filesystem's defaults (for S3: the AWS environment).
        timeout: ``"none"``, ``"processing"`` or ``"event"`` (GroupStateTimeout).
        event_time: the event-time column (epoch ms or timestamps) for the watermark.
        watermark_delay_ms: allowed lateness: watermark = max event time - delay. With
            ``timeout="event"``, rows at or before the watermark the previous batch ran
            with are dropped as late, timeouts fire by the batch's own (as in Spark).
        clock: processing time in ms (default: wall clock); inject one in tests.
        key_types: Spark types of the key columns (default: from the first batch's dtypes).
        memory_budget: bytes that the state caches of all instances hold together (one
            :class:`~state.CacheManager` per process and budget, shared by every runner that
            names the same budget); each instance's grant is in
            ``stats()["instances"][i]["cache"]["granted_bytes"]``. RocksDB's own memory is
            capped per store (``block_cache_bytes``), not by this budget.
        start_version: start from this retained version instead of the latest (a way
            back, e.g. when the latest is damaged). Once it is restored, the versions
            after it are set aside (``CheckpointStorage.set_aside_after``); version
            numbers are never reused: the next batch commits the version after the
            highest one ever committed.
        checkpoint_key: sign manifests with this key and refuse any that is unsigned or
            signed with another key, before anything is unpickled (default:
            ``$OPBUFFER_CHECKPOINT_KEY`` when set). See the README on trust.
        state_schema: the state's StructType or DDL string, as applyInPandasWithState takes it:
            a stored state reads back converted as under Spark (an int in a double field is
            null, a datetime in a date field a date). None: state reads back as stored.
        time_mode: for a transformWithStateInPandas ``StatefulProcessor`` (``fn``): "None",
            "ProcessingTime" or "EventTime" (needs ``event_time``), as Spark's ``timeMode``.
        initial_state: for a processor: a pandas DataFrame with the key columns, handed to
            ``handleInitialState`` per key before the first batch (as Spark's ``initialState``).

    A failed ``process``/``advance_time`` leaves state, pending rows and timers at
    the last committed version (without a location the runner keeps a private
    temporary checkpoint for that), so calling it again counts each row once.
    """

    def __init__(
        self,
        fn: Any,
        key: Sequence[str] | str,
        *,
        parallelism: int = 1,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        checkpoint_location: Any = None,
        timeout: str = "none",
        event_time: Optional[str] = None,
        watermark_delay_ms: int = 0,
        clock: Optional[Clock] = None,
        key_types: Optional[Iterable[Any]] = None,
        start_version: Optional[int] = None,
        checkpoint_key: str | bytes | None = None,
        memory_budget: Optional[int] = None,
        state_schema: Any = None,
        storage_options: Optional[Mapping[str, Any]] = None,
        time_mode: Optional[str] = None,
        initial_state: Optional[pd.DataFrame] = None,
    ) -> None:
        self.spec = spec_of(fn)
        if self.spec.function is None and self.spec.aggregations is None and self.spec.processor is None:
            raise TypeError(f"{fn!r} has nothing to run")
        timeout = processor_timeout(self.spec, timeout, time_mode, initial_state)
        self.key_columns = [key] if isinstance(key, str) else list(key)
        if not self.key_columns or not all(isinstance(c, str) for c in self.key_columns):
            raise ValueError(f"key must name one or more columns, got {key!r}")
        check_operator_key(fn, self.key_columns)
        check_max_parallelism(max_parallelism)
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
            raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")
        check_delay_ms("watermark_delay_ms", watermark_delay_ms)
        self.timeout_conf = timeout_conf(timeout)
        if self.timeout_conf == GroupStateTimeout.EventTimeTimeout and event_time is None:
            raise ValueError("timeout='event' needs event_time= (the column that drives the watermark)")
        check_runner_settings(self.spec, event_time, self.timeout_conf)
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.event_time = event_time
        self.watermark_delay_ms = watermark_delay_ms
        self.clock: Clock = clock if clock is not None else (lambda: int(time.time() * 1000))
        self._time_offset_ms = 0
        budget = check_memory_budget(memory_budget)
        # One budget for the caches of every instance (of every runner of the process with this budget).
        self._manager: Optional[CacheManager] = shared_manager(budget) if budget is not None else None
        self.key_types = normalize_types(key_types)
        if self.key_types is not None and len(self.key_types) != len(self.key_columns):
            raise ValueError(
                f"key_types {list(self.key_types)} has {len(self.key_types)} types for the "
                f"{len(self.key_columns)} key column(s) {self.key_columns}"
            )
        if checkpoint_location is None and (
            start_version is not None or checkpoint_key is not None or storage_options is not None
        ):
            raise ValueError("start_version=, checkpoint_key= and storage_options= need a checkpoint_location")
        # Without a location the runner keeps its committed versions in a private temporary
        # checkpoint, so that a failed batch can always go back to the last one.
        self._private_dir: Optional[str] = None
        if checkpoint_location is None:
            self._private_dir = tempfile.mkdtemp(prefix="opbuffer-local-")
            self._private_cleanup = weakref.finalize(self, shutil.rmtree, self._private_dir, True)
            checkpoint_location = self._private_dir
        self.storage = CheckpointStorage.of(
            checkpoint_location, storage_options=storage_options, checkpoint_key=checkpoint_key
        )
        self.state_schema = StateSchema.of(state_schema) if state_schema is not None else None
        if initial_state is not None and not isinstance(initial_state, pd.DataFrame):
            raise TypeError(f"initial_state must be a pandas DataFrame, got {type(initial_state).__name__}")
        if initial_state is not None:
            check_initial_state(initial_state, self.key_columns)
        self.initial_state = initial_state
        self.version: Optional[int] = None
        self._highest_version: Optional[int] = None  # of every version ever committed, set-aside ones too
        self._max_event_time_ms = NO_TIMESTAMP
        self._manifest: Optional[Manifest] = None
        self._instances: Optional[list[OperatorInstance]] = None
        # An empty batch before the key types are known starts no instances, but it is a batch.
        self._processed_empty_batch = False
        self._closed = False
        self.last_batch_stats: dict[str, Any] = {}
        if self._private_dir is None:
            self._manifest = self.storage.start(start_version)
            self._highest_version = self.storage.highest_version()
            if self._manifest is not None:
                self.version = self._manifest.version
                meta = dict(self._manifest.metadata)
                self._max_event_time_ms = int(meta.get("max_event_time_ms", NO_TIMESTAMP))
                self._time_offset_ms = int(meta.get("time_offset_ms", 0))
            self.key_types = check_checkpoint_fits(
                self._manifest,
                repr(checkpoint_location),
                key_columns=self.key_columns,
                key_types=self.key_types,
                max_parallelism=max_parallelism,
            )
            if self.key_types is not None:
                self._start_instances()
            if start_version is not None:  # only once the start version fits and (key types known) restored
                self.storage.set_aside_after(start_version)

    # ------------------------------------------------------------ instances
    def _start_instances(self) -> None:
        self._instances = [
            OperatorInstance.for_runner(self, i, storage=self.storage, manager=self._manager)
            for i in range(self.parallelism)
        ]
        if self._manifest is not None:
            for instance in self._instances:
                try:
                    instance.restore(self._manifest)
                except CheckpointCorruptError as exc:
                    raise self.storage.way_back_error(exc, self._manifest.version) from exc

    @property
    def instances(self) -> list[OperatorInstance]:
        if self._instances is None:
            raise RuntimeError("no batch has been processed yet, so the key types are unknown")
        return self._instances

    @property
    def watermark_ms(self) -> int:
        """The event-time watermark for the next batch (max event time - delay; 0 before any event)."""
        return watermark_for(self._max_event_time_ms, self.watermark_delay_ms, self.event_time is not None)

    # ------------------------------------------------------------ batches
    def _processing_time(self, version: int) -> int:
        """Chosen once per batch and recorded before it runs, so a retry makes the same decisions."""
        recorded = self.storage.processing_time(version)
        if recorded is not None:
            return recorded
        now = int(self.clock() + self._time_offset_ms)
        self.storage.record_processing_time(version, now)
        return now

    def process(self, pdf: pd.DataFrame) -> pd.DataFrame:
        """Run one micro-batch; return its output rows."""
        self._reopen_if_closed()
        if not isinstance(pdf, pd.DataFrame):
            raise TypeError(f"process() takes a pandas DataFrame, got {type(pdf).__name__}")
        missing = [c for c in self.key_columns + ([self.event_time] if self.event_time else []) if c not in pdf.columns]
        if missing:
            raise KeyError(f"columns {missing} are missing from the batch (it has {list(pdf.columns)})")
        if self._instances is None:
            if self.key_types is None:
                if not len(pdf):
                    self._processed_empty_batch = True  # state() is the empty state from now on
                    return pdf.iloc[0:0]  # an empty batch says nothing of the key types: wait for rows
                self.key_types = tuple(spark_type_of(pdf[c].dtype) for c in self.key_columns)
            self._start_instances()
        return self._run_or_roll_back(pdf)

    def idle(self, ms: int = 0) -> pd.DataFrame:
        """A trigger that finds no new rows: move processing time by ``ms`` and run the batch without
        data that Spark would run now; return its output (empty when Spark runs none).

        Spark runs one for an operator that asks (:func:`buffering.protocol.no_data_timeout`):
        with a processing-time timeout at every trigger, with an event-time timeout,
        ``EventTime`` processor or windowed aggregate when the watermark moved since
        the last batch ran. So ``process(rows)`` then ``idle()`` is one scheduled
        ``availableNow`` run over a file's rows, and ``idle(ms)`` a live stream's
        trigger between bursts.
        """
        from state.group_state import GroupStateTimeout

        if ms < 0:
            raise ValueError(f"time only moves forward, got idle({ms!r})")
        timeout = no_data_timeout(self.spec, self.timeout_conf, self.event_time)
        due = timeout == GroupStateTimeout.ProcessingTimeTimeout
        if timeout == GroupStateTimeout.EventTimeTimeout and self._manifest is not None:
            ran_with = int(self._manifest.metadata.get(WATERMARK_FIELD, self.watermark_ms))
            due = self.watermark_ms > ran_with
        if not due:
            self._time_offset_ms += int(ms)
            return pd.DataFrame()
        return self.advance_time(ms)

    def advance_time(self, ms: int) -> pd.DataFrame:
        """Move processing time forward by ``ms`` and run an empty batch: time triggers and timeouts fire."""
        if ms < 0:
            raise ValueError(f"time only moves forward, got advance_time({ms!r})")
        self._reopen_if_closed()
        if self._instances is None:
            if self.key_types is None:
                self._time_offset_ms += int(ms)
                return pd.DataFrame()
            self._start_instances()
        offset = self._time_offset_ms
        self._time_offset_ms += int(ms)
        try:
            return self._run_or_roll_back(None)
        except BaseException:
            self._time_offset_ms = offset  # a retry moves time by ``ms`` again, not twice
            raise

    def _run_or_roll_back(self, pdf: Optional[pd.DataFrame]) -> pd.DataFrame:
        """Run one batch; if anything fails, every instance goes back to the last committed version.

        The instances are dropped without flushing (the cache may hold the
        failed batch's changes, even changed in place) and rebuilt from the
        last committed manifest: state, pending rows and timers as they were,
        so a retry counts each row once.
        """
        try:
            return self._run_batch(pdf)
        except BaseException:
            self._roll_back()
            raise

    def _roll_back(self) -> None:
        instances, self._instances = self._instances, None
        for instance in instances or ():
            try:
                instance.discard()
            except Exception:  # noqa: BLE001 - the batch's own error is the one to report
                pass
        if self.key_types is not None:
            self._start_instances()

    def _run_batch(self, pdf: Optional[pd.DataFrame]) -> pd.DataFrame:
        version = self._next_version()
        started = time.perf_counter()
        processing_time = self._processing_time(version)
        watermark = self.watermark_ms
        late_watermark = late_rows_watermark(
            watermark, dict(self._manifest.metadata) if self._manifest is not None else None
        )
        instances = self.instances
        outputs: list[pd.DataFrame] = []
        max_event_time = self._max_event_time_ms
        dropped_late = 0
        late_before = sum(instance.metrics.late_rows for instance in instances)  # windows' late rows
        if self.initial_state is not None and self._manifest is None:
            # Before the first committed version only (a retry of that batch applies it again).
            for i, part in self._parts(self.initial_state.reset_index(drop=True)):
                instances[i].apply_initial_state(part, processing_time, watermark)
        if pdf is not None and len(pdf):
            frame, dropped_late, batch_max = drop_late_rows(
                pdf.reset_index(drop=True), self.event_time, self.timeout_conf, late_watermark
            )
            max_event_time = max(max_event_time, batch_max)
            for i, part in self._parts(frame):
                outputs.extend(instances[i].process(part, processing_time, watermark, late_watermark))
        for instance in instances:
            outputs.extend(instance.end_of_batch(processing_time, watermark))
        dropped_late += sum(instance.metrics.late_rows for instance in instances) - late_before
        out = concat_frames(outputs)  # before the commit: a batch whose output fails commits nothing
        reports = [instance.checkpoint(version, self._manifest) for instance in instances]
        self._before_commit(version)
        self._manifest = commit(
            self.storage,
            version,
            reports,
            metadata=commit_metadata(
                max_event_time_ms=max_event_time,
                processing_time_ms=processing_time,
                key_columns=self.key_columns,
                key_types=self.key_types,
                parallelism=self.parallelism,
                state_key_columns=state_key_columns(self.spec, self.key_columns),
                time_offset_ms=self._time_offset_ms,
                **{WATERMARK_FIELD: watermark},
            ),
            max_parallelism=self.max_parallelism,
        )
        self.version = version
        self._max_event_time_ms = max_event_time
        self.last_batch_stats = {
            "version": version,
            "rows_out": len(out),
            "dropped_late_rows": dropped_late,
            "seconds": time.perf_counter() - started,
            "instances": [instance.stats() for instance in instances],
        }
        return out

    def _parts(self, frame: pd.DataFrame) -> list[tuple[int, pd.DataFrame]]:
        """``frame``'s rows by the instance that owns their key group."""
        assert self.key_types is not None
        # Computed at parallelism 1 too: it checks every key value against its column's type.
        groups = key_groups_of(frame, self.key_columns, self.key_types, self.max_parallelism)
        if self.parallelism == 1:
            return [(0, frame)]
        owners = operator_indexes(groups, self.parallelism, self.max_parallelism)
        order = np.argsort(owners, kind="stable")
        sorted_owners = owners[order]
        parts = []
        for i in np.unique(sorted_owners).tolist():
            lo, hi = np.searchsorted(sorted_owners, [i, i + 1])
            parts.append((i, frame.take(order[lo:hi]).reset_index(drop=True)))
        return parts

    def _next_version(self) -> int:
        """After the restored version and above every version ever committed (numbers are never reused)."""
        candidates = [v + 1 for v in (self.version, self._highest_version) if v is not None]
        return max(candidates, default=0)

    def _reopen_if_closed(self) -> None:
        """After close(): resume from the checkpoint, or refuse when there is none (the state is gone)."""
        if not self._closed:
            return
        if self._private_dir is not None:
            raise RuntimeError("this LocalRunner is closed and had no checkpoint location: its state is gone")
        self._closed = False
        self._manifest = self.storage.start()
        self._highest_version = self.storage.highest_version()
        self.version = self._manifest.version if self._manifest is not None else None
        if self.key_types is not None:
            self._start_instances()

    def _before_commit(self, version: int) -> None:
        """Hook between the task files and the manifest (tests inject crashes here)."""

    # ------------------------------------------------------------ inspection
    def _no_state_yet(self) -> bool:
        """Only empty batches so far: no instance (the key types are unknown) and no state."""
        return self._instances is None and self.key_types is None and self._processed_empty_batch

    def state(self) -> dict[tuple, Any]:
        """Every key's state across instances (keys as tuples); RuntimeError before any batch."""
        if self._no_state_yet():
            return {}
        out: dict[tuple, Any] = {}
        for instance in self.instances:
            out.update(instance.state_items())
        return out

    def get_state(self, key: Any) -> Any:
        """The state of one key (None when it has none), from whichever instance owns it."""
        nkey = normalize_key(key)
        if self._no_state_yet():
            return None
        for instance in self.instances:
            value = instance.state.get(nkey)
            if value is not None:
                return packed(value)  # an aggregate's packed accumulators as a mapping; anything else as is
        return None

    def stats(self) -> dict[str, Any]:
        """Counters of the last batch: rows out, late rows dropped, seconds, per-instance stats."""
        return dict(self.last_batch_stats)

    def close(self) -> None:
        """Release the instances' stores (the checkpoint stays; a runner without a location deletes its own)."""
        self._closed = True
        try:
            if self._instances is not None:
                for instance in self._instances:
                    instance.close()
                self._instances = None
        finally:
            if self._private_dir is not None:
                self._private_cleanup()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
