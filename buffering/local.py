"""LocalRunner: run a decorated operator in one process, exactly-once, without Spark.

For unit tests of an operator and as an embedded engine. Each ``process(pdf)``
is one micro-batch: rows are routed to instances by key group, buffered,
flushed, timers fire, and (with a checkpoint location) the batch commits a
version. A new runner on the same location resumes from the latest committed
version at any parallelism; replaying the batches after ``version`` gives
exactly the output and state of an uninterrupted run.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from checkpoint import CheckpointStorage, Manifest, commit
from state.group_state import NO_TIMESTAMP, GroupStateTimeout, timeout_conf
from state.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism, key_group_from_hash, operator_indexes
from state.state_schema import StateSchema
from state.keys import key_groups_of_longs, normalize_key, normalize_types, spark_hash

from .buffer import factorize_keys
from .decorators import check_operator_key, spec_of
from .frames import concat_frames
from .operator import OperatorInstance
from .protocol import event_time_ms

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
    codes, uniques = factorize_keys(frame, list(key_columns), key_types)
    groups = np.fromiter(
        (key_group_from_hash(spark_hash(k, key_types), max_parallelism) for k in uniques),
        dtype=np.int64,
        count=len(uniques),
    )
    return groups[codes]


class LocalRunner:
    """Runs ``fn`` (decorated or ``buffering.aggregate(...)``) over pandas micro-batches.

    Args:
        fn: the operator: a function ``(key, rows, state) -> iterator of DataFrames``
            (with ``@mini_batch`` / ``@cached_state``) or ``buffering.aggregate(...)``.
        key: the key columns.
        parallelism: operator instances (each owns a contiguous key-group range).
        max_parallelism: key groups; fixed for the life of a checkpoint.
        checkpoint_location: local path or fsspec URL; None runs without checkpoints.
        timeout: ``"none"``, ``"processing"`` or ``"event"`` (GroupStateTimeout).
        event_time: the event-time column (epoch ms or timestamps) for the watermark.
        watermark_delay_ms: allowed lateness: watermark = max event time - delay.
        clock: processing time in ms (default: wall clock); inject one in tests.
        key_types: Spark types of the key columns (default: from the first batch's dtypes).
        state_schema: the state's StructType or DDL string, as applyInPandasWithState takes it:
            a stored state reads back converted as under Spark (an int in a double field is
            null, a datetime in a date field a date). None: state reads back as stored.
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
        state_schema: Any = None,
    ) -> None:
        self.spec = spec_of(fn)
        if self.spec.function is None and self.spec.aggregations is None:
            raise TypeError(f"{fn!r} has nothing to run")
        self.key_columns = [key] if isinstance(key, str) else list(key)
        if not self.key_columns or not all(isinstance(c, str) for c in self.key_columns):
            raise ValueError(f"key must name one or more columns, got {key!r}")
        check_operator_key(fn, self.key_columns)
        check_max_parallelism(max_parallelism)
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
            raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")
        if watermark_delay_ms < 0:
            raise ValueError(f"watermark_delay_ms must be >= 0, got {watermark_delay_ms!r}")
        self.timeout_conf = timeout_conf(timeout)
        if self.timeout_conf == GroupStateTimeout.EventTimeTimeout and event_time is None:
            raise ValueError("timeout='event' needs event_time= (the column that drives the watermark)")
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.event_time = event_time
        self.watermark_delay_ms = watermark_delay_ms
        self.clock: Clock = clock if clock is not None else (lambda: int(time.time() * 1000))
        self._time_offset_ms = 0
        self.key_types = normalize_types(key_types)
        self.state_schema = StateSchema.of(state_schema) if state_schema is not None else None
        self.storage = CheckpointStorage.of(checkpoint_location) if checkpoint_location is not None else None
        self.version: Optional[int] = None
        self._max_event_time_ms = NO_TIMESTAMP
        self._manifest: Optional[Manifest] = None
        self._instances: Optional[list[OperatorInstance]] = None
        self._closed = False
        self.last_batch_stats: dict[str, Any] = {}
        if self.storage is not None:
            latest = self.storage.latest_version()
            if latest is not None:
                self._manifest = self.storage.read_manifest(latest)
                self.version = latest
                meta = dict(self._manifest.metadata)
                self._max_event_time_ms = int(meta.get("max_event_time_ms", NO_TIMESTAMP))
                self._time_offset_ms = int(meta.get("time_offset_ms", 0))
                stored = meta.get("key_columns")
                if stored is not None and list(stored) != self.key_columns:
                    raise ValueError(f"checkpoint at {checkpoint_location!r} was written for key {stored}, not {self.key_columns}")
                if self.key_types is None and meta.get("key_types") is not None:
                    self.key_types = tuple(meta["key_types"])
                if self._manifest.max_parallelism != max_parallelism:
                    raise ValueError(
                        f"checkpoint at {checkpoint_location!r} has max_parallelism {self._manifest.max_parallelism}, "
                        f"not {max_parallelism}: it is fixed for the life of a checkpoint"
                    )
            if self.key_types is not None:
                self._start_instances()

    # ------------------------------------------------------------ instances
    def _start_instances(self) -> None:
        watermark_present = self.event_time is not None
        self._instances = [
            OperatorInstance(
                self.spec,
                key_columns=self.key_columns,
                key_types=self.key_types,
                index=i,
                parallelism=self.parallelism,
                max_parallelism=self.max_parallelism,
                timeout_conf=self.timeout_conf,
                watermark_present=watermark_present,
                storage=self.storage,
                state_schema=self.state_schema,
            )
            for i in range(self.parallelism)
        ]
        if self._manifest is not None:
            for instance in self._instances:
                instance.restore(self._manifest)

    @property
    def instances(self) -> list[OperatorInstance]:
        if self._instances is None:
            raise RuntimeError("no batch has been processed yet, so the key types are unknown")
        return self._instances

    @property
    def watermark_ms(self) -> int:
        """The event-time watermark for the next batch (max event time - delay; 0 before any event)."""
        if self.event_time is None:
            return NO_TIMESTAMP
        if self._max_event_time_ms == NO_TIMESTAMP:
            return 0
        return max(0, self._max_event_time_ms - self.watermark_delay_ms)

    # ------------------------------------------------------------ batches
    def _processing_time(self, version: int) -> int:
        """Chosen once per batch and recorded before it runs, so a retry makes the same decisions."""
        if self.storage is None:
            return self.clock() + self._time_offset_ms
        path = f"batches/v{version:010d}.json"
        recorded = self.storage.read_small_file(path)
        if recorded is not None:
            return int(json.loads(recorded)["processing_time_ms"])
        now = self.clock() + self._time_offset_ms
        self.storage.write_small_file(path, json.dumps({"processing_time_ms": now}).encode())
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
                self.key_types = tuple(spark_type_of(pdf[c].dtype) for c in self.key_columns)
            self._start_instances()
        return self._run_batch(pdf)

    def advance_time(self, ms: int) -> pd.DataFrame:
        """Move processing time forward by ``ms`` and run an empty batch: time triggers and timeouts fire."""
        if ms < 0:
            raise ValueError(f"time only moves forward, got advance_time({ms!r})")
        self._reopen_if_closed()
        self._time_offset_ms += int(ms)
        if self._instances is None:
            if self.key_types is None:
                return pd.DataFrame()
            self._start_instances()
        return self._run_batch(None)

    def _run_batch(self, pdf: Optional[pd.DataFrame]) -> pd.DataFrame:
        version = 0 if self.version is None else self.version + 1
        started = time.perf_counter()
        processing_time = self._processing_time(version)
        watermark = self.watermark_ms
        instances = self.instances
        outputs: list[pd.DataFrame] = []
        max_event_time = self._max_event_time_ms
        dropped_late = 0
        if pdf is not None and len(pdf):
            frame = pdf.reset_index(drop=True)
            if self.event_time is not None:
                event_ms = event_time_ms(frame[self.event_time])
                # As Spark's (flat)MapGroupsWithState: with an event-time timeout, rows at or
                # before the watermark are late and dropped; otherwise every row is processed.
                if self.timeout_conf == GroupStateTimeout.EventTimeTimeout:
                    late = event_ms <= watermark
                else:
                    late = np.zeros(len(event_ms), dtype=bool)
                if late.any():
                    dropped_late = int(late.sum())
                    frame = frame.loc[~late].reset_index(drop=True)
                    event_ms = event_ms[~late]
                if len(event_ms):
                    max_event_time = max(max_event_time, int(event_ms.max()))
            assert self.key_types is not None
            groups = key_groups_of(frame, self.key_columns, self.key_types, self.max_parallelism)
            owners = operator_indexes(groups, self.parallelism, self.max_parallelism)
            if self.parallelism == 1:
                parts = [(0, frame)]
            else:
                order = np.argsort(owners, kind="stable")
                sorted_owners = owners[order]
                parts = []
                for i in np.unique(sorted_owners).tolist():
                    lo, hi = np.searchsorted(sorted_owners, [i, i + 1])
                    parts.append((i, frame.take(order[lo:hi]).reset_index(drop=True)))
            for i, part in parts:
                outputs.extend(instances[i].process(part, processing_time, watermark))
        for instance in instances:
            outputs.extend(instance.end_of_batch(processing_time, watermark))
        if self.storage is not None:
            reports = [instance.checkpoint(version, self._manifest) for instance in instances]
            self._before_commit(version)
            self._manifest = commit(
                self.storage,
                version,
                reports,
                metadata={
                    "max_event_time_ms": max_event_time,
                    "processing_time_ms": processing_time,
                    "time_offset_ms": self._time_offset_ms,
                    "key_columns": self.key_columns,
                    "key_types": list(self.key_types or ()),
                    "parallelism": self.parallelism,
                },
                max_parallelism=self.max_parallelism,
            )
        self.version = version
        self._max_event_time_ms = max_event_time
        out = concat_frames(outputs)
        self.last_batch_stats = {
            "version": version,
            "rows_out": len(out),
            "dropped_late_rows": dropped_late,
            "seconds": time.perf_counter() - started,
            "instances": [instance.stats() for instance in instances],
        }
        return out

    def _reopen_if_closed(self) -> None:
        """After close(): resume from the checkpoint, or refuse when there is none (the state is gone)."""
        if not self._closed:
            return
        if self.storage is None:
            raise RuntimeError("this LocalRunner is closed and had no checkpoint location: its state is gone")
        self._closed = False
        latest = self.storage.latest_version()
        self._manifest = self.storage.read_manifest(latest) if latest is not None else None
        self.version = latest
        if self.key_types is not None:
            self._start_instances()

    def _before_commit(self, version: int) -> None:
        """Hook between the task files and the manifest (tests inject crashes here)."""

    # ------------------------------------------------------------ inspection
    def state(self) -> dict[tuple, Any]:
        """Every key's state across instances (keys as tuples)."""
        out: dict[tuple, Any] = {}
        for instance in self.instances:
            out.update(instance.state_items())
        return out

    def get_state(self, key: Any) -> Any:
        """The state of one key (None when it has none), from whichever instance owns it."""
        nkey = normalize_key(key)
        for instance in self.instances:
            value = instance.state.get(nkey)
            if value is not None:
                return value
        return None

    def stats(self) -> dict[str, Any]:
        """Counters of the last batch: rows out, late rows dropped, seconds, per-instance stats."""
        return dict(self.last_batch_stats)

    def close(self) -> None:
        """Release the instances' stores (the checkpoint stays)."""
        self._closed = True
        if self._instances is not None:
            for instance in self._instances:
                instance.close()
            self._instances = None

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
