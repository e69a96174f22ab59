"""One operator instance: buffer + state + timers + checkpoint for a contiguous key-group range.

The runners (local, Spark) route rows here by key group; an instance owns
``key_group_range(index, parallelism, max_parallelism)``. Its state lives in
three tables: ``state`` (the user's state, behind the write-back cache),
``pending`` (what the mini-batch buffer holds at a checkpoint) and
``timers`` (timeout timestamps), and with ``cached_state(ttl_ms=...)`` a
fourth, ``ttl`` (each key's expiry time, see :mod:`state.ttl`). All are
checkpointed together, so a restore at any parallelism brings back state,
pending rows, timers and expiries.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol, Sequence

import pandas as pd

from checkpoint import CheckpointStorage, CheckpointWriter, Manifest, TaskReport, restore
from checkpoint.staging import sweep_stale_staging
from state import MemoryStore, RocksDBStore, Store, WriteBackCache, key_group_range
from state.blocks import KeyGroupCache, holds_per_key_records, split_blocks
from state.cache import CacheManager
from state.group_state import NO_TIMESTAMP, GroupState, GroupStateTimeout
from state.keys import NormalizedKey, denormalize_key, key_column_values, normalize_key
from state.locks import FileLock, directory_lock
from state.raw import RawTable
from state.state_schema import StateSchema
from state.timers import TimerService
from state.ttl import AnyExpiryIndex, ExpiryIndex, OrderedExpiryIndex, expiry_for

from .aggregations.columnar import ColumnarLayout, PackedSerializer, packed
from .buffer import MiniBatchBuffer, RowPartials
from .frames import FrameCollector
from .protocol import call_function, spark_key_function
from .decorators import OperatorSpec
from .errors import annotate
from .processor import ProcessorRuntime
from .windows import WindowRuntime, check_window_columns

STATE_TABLE = "state"
PENDING_TABLE = "pending"
TIMERS_TABLE = "timers"
#: Expiry times of keys, and the same ordered by expiry within each key group (see state.ttl.OrderedExpiryIndex);
#: only for an operator with cached_state(ttl_ms=...), or restored from one.
TTL_TABLE = "ttl"
TTL_ORDER_TABLE = "ttl.order"
TTL_TABLES = (TTL_TABLE, TTL_ORDER_TABLE)
TABLES = (STATE_TABLE, PENDING_TABLE, TIMERS_TABLE, *TTL_TABLES)


@dataclass
class InstanceMetrics:
    """Counters of one instance since it started."""

    rows_in: int = 0
    flushes: int = 0
    calls: int = 0
    timeouts: int = 0
    rows_out: int = 0
    checkpoint_bytes: int = 0
    expired: int = 0  # keys whose state the TTL sweeps removed (windows: windows closed)
    late_rows: int = 0  # windowed aggregate: (row, window) pairs dropped because the window had closed


class _WorkingFiles:
    """What an instance holds on disk: its working store, the claim on its directory, a temp dir it made.

    Kept apart from the instance so that a finalizer can release them without
    keeping the instance alive: a runner dropped without ``close()`` still
    closes its store, gives up its claim and removes its temporary directory.
    """

    __slots__ = ("root", "lock", "owned_dir")

    def __init__(self) -> None:
        self.root: Optional[Store] = None
        self.lock: Optional[FileLock] = None
        self.owned_dir: Optional[str] = None

    def release(self) -> None:
        root, self.root = self.root, None
        try:
            if root is not None:
                root.close()
        finally:
            lock, self.lock = self.lock, None
            if lock is not None:
                lock.release()
            owned, self.owned_dir = self.owned_dir, None
            if owned is not None:
                shutil.rmtree(owned, ignore_errors=True)


class RunnerSettings(Protocol):
    """What every instance of one operator shares, as a runner holds it (a LocalRunner, a Spark task plan)."""

    @property
    def spec(self) -> OperatorSpec: ...
    @property
    def key_columns(self) -> list[str]: ...
    @property
    def key_types(self) -> Optional[tuple[str, ...]]: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def max_parallelism(self) -> int: ...
    @property
    def timeout_conf(self) -> str: ...
    @property
    def event_time(self) -> Optional[str]: ...
    @property
    def state_schema(self) -> Optional[StateSchema]: ...


#: The counters among a cache's stats() (they only grow; the rest are gauges).
CACHE_COUNTERS = ("hits", "misses", "evictions", "syncs", "writes")


#: No key (yet): a failure before the first call, or of a call of no key.
_NO_KEY = object()


def _late_rows(watermark_ms: int, late_watermark_ms: Optional[int]) -> int:
    """The watermark a windowed aggregate drops closed windows' rows by: the late-rows one, else the batch's."""
    return watermark_ms if late_watermark_ms is None else late_watermark_ms


def folds_raw_rows(spec: OperatorSpec) -> bool:
    """Whether an instance of ``spec`` folds a batch's raw rows as columns at the batch's end
    (:class:`~buffering.buffer.RowPartials`): an ``aggregate()`` whose aggregations all have a column
    form, without a trigger, over no window or tumbling or hopping ones."""
    if spec.aggregations is None or ColumnarLayout.of(spec.aggregations) is None:
        return False
    if spec.window is not None and spec.window.spec.merges:
        return False
    return spec.mini_batch is None or not spec.mini_batch.triggered


class OperatorInstance:
    """The operator for the key groups of instance ``index`` of ``parallelism``."""

    @classmethod
    def for_runner(
        cls,
        runner: RunnerSettings,
        index: int,
        *,
        storage: Optional[CheckpointStorage],
        manager: Optional[CacheManager],
        workdir: Optional[str] = None,
        fresh: bool = True,
    ) -> "OperatorInstance":
        """Instance ``index`` of ``runner``'s operator: how every runner builds its instances.

        Args:
            runner: the operator's settings (a LocalRunner, or a Spark TaskPlan).
            index: which instance (it owns ``key_group_range(index, parallelism, max_parallelism)``).
            storage: the checkpoint it restores from and writes to (None: no checkpoints).
            manager: the CacheManager whose budget bounds its state cache (None: no budget).
            workdir: its working RocksDB directory (None: ``instance-{index}-of-{parallelism}`` under
                the operator's ``cached_state(path=)`` or a new temporary directory).
            fresh: rebuild the working store (True), or keep what ``workdir`` holds to adopt it.
        """
        instance = cls(
            runner.spec,
            key_columns=runner.key_columns,
            key_types=runner.key_types,
            index=index,
            parallelism=runner.parallelism,
            max_parallelism=runner.max_parallelism,
            timeout_conf=runner.timeout_conf,
            watermark_present=runner.event_time is not None,
            storage=storage,
            workdir=workdir,
            fresh=fresh,
            manager=manager,
            state_schema=runner.state_schema,
            event_time=runner.event_time,
        )
        try:
            instance._runner = weakref.ref(runner)  # asked for the running batch's version (see _running_batch)
        except TypeError:  # settings that take no weak reference: errors name no batch
            pass
        return instance

    def __init__(
        self,
        spec: OperatorSpec,
        *,
        key_columns: list[str],
        key_types: Optional[tuple[str, ...]],
        index: int,
        parallelism: int,
        max_parallelism: int,
        timeout_conf: str = GroupStateTimeout.NoTimeout,
        watermark_present: bool = False,
        storage: Optional[CheckpointStorage] = None,
        workdir: Optional[str] = None,
        fresh: bool = True,
        manager: Optional[CacheManager] = None,
        state_schema: Optional[StateSchema] = None,
        event_time: Optional[str] = None,
    ) -> None:
        self.spec = spec
        # aggregate(..., window=...): the windows' runtime (assignment, late rows, closing); the buffer and,
        # for tumbling/hopping windows, the state key by (key..., window start), key groups by the key alone.
        self.windows: Optional[WindowRuntime] = None
        if spec.window is not None:
            if event_time is None:
                raise ValueError("aggregate(window=...) needs the runner's event_time= (the column windows are over)")
            assert spec.aggregations is not None
            check_window_columns(key_columns, list(spec.aggregations))
            self.windows = WindowRuntime(spec.window, spec.aggregations, key_columns, event_time)
        # Spark's stateStructType: what a stored state reads back as (None: the value as given).
        self._state_schema = state_schema
        self._key_types = key_types
        self.key_columns = list(key_columns)
        self.index = index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_groups = key_group_range(index, parallelism, max_parallelism)
        self.timeout_conf = timeout_conf
        self.watermark_present = watermark_present
        self.storage = storage
        self.metrics = InstanceMetrics()
        #: The version of the batch running, named by the errors of the user's code (see :meth:`_failed`);
        #: set by the runner (a Spark task). None: the LocalRunner that built the instance is asked.
        self.batch: Optional[int] = None
        self._runner: Optional[weakref.ref] = None
        config = spec.state
        self.ttl_ms: Optional[int] = config.ttl_ms
        # aggregate() accumulators kept as columns (None: as objects, for aggregations without a column form)
        # Tumbling and hopping windows keep columns too, through the windows' runtime (their flush and
        # closing are its own); a session's state is its list of sessions, kept as objects.
        layout = (
            ColumnarLayout.of(spec.aggregations)
            if spec.aggregations is not None and (self.windows is None or not self.windows.spec.merges)
            else None
        )
        self.columnar: Optional[ColumnarLayout] = layout if self.windows is None else None
        if self.windows is not None:
            self.windows.layout = layout
        self._packed_state = layout is not None
        # Without a trigger every batch's partials are merged at its end: a SQL-combined batch can skip the
        # buffer, and raw rows are folded as columns (row_partials).
        self._merge_directly = folds_raw_rows(spec)
        # The side tables besides the state; the TTL tables only when this operator expires state, so
        # that checkpoints of operators without TTL keep their tables (a restore adds them when the
        # checkpoint has them: see restore()).
        self._side_tables: list[str] = [PENDING_TABLE, TIMERS_TABLE] + (list(TTL_TABLES) if self.ttl_ms is not None else [])
        self._files = _WorkingFiles()
        self._finalizer = weakref.finalize(self, self._files.release)
        # A transformWithStateInPandas processor: one table per state variable, each behind its cache.
        self.processor: Optional[ProcessorRuntime] = None
        if spec.processor is not None:
            self.processor = ProcessorRuntime(
                spec.processor,
                key_columns=key_columns,
                key_types=key_types,
                timeout_conf=timeout_conf,
                make_cache=lambda table, name: self._make_cache(table, f"{name}[{index}/{parallelism}]"),
                key_groups=self.key_groups,
            )
        self._manager = manager
        # The working store: RocksDB when asked for, or whenever checkpoints are written
        # (the checkpoint reads key-group ranges from it); "memory" then means an
        # unbounded cache in front of it, so all state stays in memory. A processor's
        # tables are always in RocksDB (its map and list entries are read by key range).
        if config.store == "rocksdb" or storage is not None or self.processor is not None or self.windows is not None:
            if workdir is None:
                base = config.path
                if base is None:
                    base = self._files.owned_dir = tempfile.mkdtemp(prefix="opbuffer-")
                else:
                    os.makedirs(base, exist_ok=True)
                workdir = os.path.join(base, f"instance-{index}-of-{parallelism}")
            # Claimed before anything is deleted: another runner's live store may be there.
            self._files.lock = directory_lock(workdir)
            self._files.lock.acquire()
            if storage is not None:
                # SST staging directories of crashed checkpoints and restores (in /dev/shm: memory).
                sweep_stale_staging([os.path.dirname(os.path.abspath(workdir))])
            if fresh:
                # The working copy is rebuilt from the checkpoint: never trust leftovers.
                shutil.rmtree(workdir, ignore_errors=True)
            self.workdir: Optional[str] = workdir
            self.tables: dict[str, Store] = {}
            # The same tables as the checkpoint layer sees them (raw records, change tracking).
            self._raw: dict[str, RawTable] = {}
            self._open_working_store()
        else:
            self.workdir = None
            self._raw = {}
            root_memory = MemoryStore(name=STATE_TABLE, max_parallelism=max_parallelism, key_types=key_types)
            self.tables = {STATE_TABLE: root_memory}
            for name in self._side_tables:
                self.tables[name] = root_memory.table(name)
            self._files.root = root_memory
        state_table = self.tables[STATE_TABLE]
        self.cache: Optional[WriteBackCache | KeyGroupCache] = None
        if manager is not None and not isinstance(state_table, RocksDBStore):
            raise ValueError(
                f"memory_budget={manager.max_bytes} bounds caches in front of RocksDB working stores, but this "
                "instance keeps its state in memory: use cached_state(store='rocksdb') or a checkpoint location"
            )
        #: How the state is kept now: "key" or "key_group" (layout="auto" starts with blocks where they
        #: apply and switches to per-key records when the state outgrows the cache: see _settle_layout).
        # A cache in front of the state (else state goes straight to the table): asked for with bounds or a
        # manager, or "memory" over a RocksDB working store. A processor's variables have their own caches.
        cached = self.processor is None and (
            config.cached or manager is not None or (config.store == "memory" and isinstance(state_table, RocksDBStore))
        )
        self.layout = self._initial_layout(state_table, cached)
        # Counters of the caches a layout switch retired, so that the instance's cache counters only grow.
        self._retired_counters: dict[str, int] = {}
        if self.layout == "key_group":
            self.cache = self._make_cache(state_table, f"state[{index}/{parallelism}]", layout="key_group")
        elif cached:
            self.cache = self._make_cache(state_table, f"state[{index}/{parallelism}]")
        self.state: Store = self.cache if self.cache is not None else state_table
        self.timers = TimerService(self.tables[TIMERS_TABLE])
        self.ttl: Optional[AnyExpiryIndex] = self._expiry_index() if self.ttl_ms is not None else None
        # Expiries set (int) or cleared (None) by the calls of one flush, written to the index in one
        # batch after them (one multi-get and write batch instead of one per call; for the in-memory
        # index over a RocksDB table measured 2.9-3.4 us per key batched vs 5.9-6.6 us one by one).
        self._expiry_changes: dict[NormalizedKey, Optional[int]] = {}
        if self.windows is not None:
            self.buffer = MiniBatchBuffer(
                self.windows.buffer_key_columns, spec.mini_batch, None if key_types is None else (*key_types, "long")
            )
        else:
            self.buffer = MiniBatchBuffer(self.key_columns, spec.mini_batch, key_types)
        # An aggregate without a trigger folds a batch's raw rows into one block of partials at its end
        # (a tumbling or hopping window's rows per (key..., window start)).
        self.row_partials: Optional[RowPartials] = None
        if self._merge_directly:
            assert spec.aggregations is not None
            if self.windows is None:
                assert self.columnar is not None
                self.row_partials = RowPartials(self.key_columns, key_types, self.columnar, spec.aggregations)
            else:
                assert self.windows.layout is not None
                self.row_partials = RowPartials(
                    self.windows.buffer_key_columns, None if key_types is None else (*key_types, "long"),
                    self.windows.layout, spec.aggregations,
                )
        # Columns of the frames handed to the function (the empty frame of a timeout has them).
        self._value_columns: Sequence[str] = list(self.key_columns)
        # The key as Spark hands it to the function, the conversion chosen once for the key types.
        self._to_spark_key = spark_key_function(key_types)
        self._pending_keys: set[NormalizedKey] = set()
        self.suspended = False

    def _initial_layout(self, state_table: Store, cached: bool) -> str:
        """The layout an instance starts with: the configured one, or for ``layout="auto"`` key-group
        blocks where they apply (an aggregate whose accumulators are columns, its state ``cached`` in
        front of a RocksDB working store, evicted least recently used), else per key."""
        config = self.spec.state
        if config.layout != "auto":
            return config.layout
        blocks_apply = (
            self._packed_state and cached and config.policy == "lru" and isinstance(state_table, RocksDBStore)
        )
        return "key_group" if blocks_apply else "key"

    def _settle_layout(self) -> None:
        """``layout="auto"``: once the key-group cache has evicted a key group (the state no longer fits its
        bounds, where blocks lose: every batch would load and write back whole key groups for a few keys
        each), go on with per-key records and the per-key cache for the rest of the instance's life.

        Costs one write-back of the dirty blocks and one pass over the state (the block records turned
        into per-key records, recorded as changes: the next checkpoint writes those key groups again).
        """
        cache = self.cache
        if self.spec.state.layout != "auto" or not isinstance(cache, KeyGroupCache) or not cache.evictions:
            return
        self._use_per_key_records()

    def _use_per_key_records(self) -> None:
        cache = self.cache
        assert isinstance(cache, KeyGroupCache)
        stats = cache.stats()
        for name in CACHE_COUNTERS:
            self._retired_counters[name] = self._retired_counters.get(name, 0) + stats[name]
        cache.release()
        table = self.tables[STATE_TABLE]
        assert isinstance(table, RocksDBStore)
        split_blocks(table, self.key_groups)
        self.cache = self._make_cache(table, cache.cache_name)
        self.state = self.cache
        self.layout = "key"
        if self.windows is not None:
            self.windows.reload()  # its index of open windows was of key groups

    def _make_cache(self, table: Store, name: str, layout: str = "key") -> WriteBackCache | KeyGroupCache:
        """A cache in front of ``table`` with the operator's bounds and watermarks (a manager, if any, grants
        the bytes): per key, or of key-group blocks for ``cached_state(layout="key_group")``."""
        config = self.spec.state
        settings: dict[str, Any] = dict(
            max_entries=config.max_entries,
            max_bytes=config.max_bytes,
            low_watermark=config.low_watermark,
            high_watermark=config.high_watermark,
            manager=self._manager,
            name=name,
        )
        if layout == "key":
            return WriteBackCache(table, policy=config.policy, **settings)
        if not isinstance(table, RocksDBStore):
            raise ValueError(
                "cached_state(layout='key_group') keeps its blocks in a RocksDB working store: use store='rocksdb' "
                "or a checkpoint location"
            )
        return KeyGroupCache(table, **settings)  # the settings blocks cannot keep were refused by StateConfig

    @property
    def state_table(self) -> Store:
        """The table the state lives in (behind :attr:`state` when that is a cache)."""
        return self.tables[STATE_TABLE]

    def cache_stats(self) -> list[dict[str, Any]]:
        """``stats()`` of every cache in :attr:`caches`, the state's counters including those of the cache
        a layout switch retired (so counters only grow over the instance's life)."""
        out = [cache.stats() for cache in self.caches]
        if self._retired_counters and self.cache is not None:
            state = out[0]
            for name, value in self._retired_counters.items():
                state[name] += value
            reads = state["hits"] + state["misses"]
            state["hit_ratio"] = state["hits"] / reads if reads else 0.0
        return out

    @property
    def caches(self) -> list[WriteBackCache | KeyGroupCache]:
        """Every state cache of this instance (the state's, or one per processor variable)."""
        caches = [self.cache] if self.cache is not None else []
        if self.processor is not None:
            caches.extend(self.processor.caches)
        return caches

    def _flush_caches(self) -> None:
        for cache in self.caches:
            cache.flush()

    def _expiry_index(self) -> AnyExpiryIndex:
        """The order by expiry in RocksDB next to a RocksDB working store (memory: one int per key group),
        in memory over a memory store."""
        table = self.tables[TTL_TABLE]
        if isinstance(table, RocksDBStore):
            order = self.tables[TTL_ORDER_TABLE]
            assert isinstance(order, RocksDBStore)
            return OrderedExpiryIndex(table, order, key_groups=self.key_groups)
        return ExpiryIndex(table)

    def _open_working_store(self) -> RocksDBStore:
        assert self.workdir is not None
        windows = self.windows
        root = RocksDBStore(
            self.workdir,
            max_parallelism=self.max_parallelism,
            key_types=self._key_types,
            table=STATE_TABLE,
            serializer=PackedSerializer() if self._packed_state else None,
            group_columns=windows.state_group_columns if windows is not None else None,
            default_column_family=True,  # one column family less to open, flush and close at every hand-over
        )
        if TTL_TABLE not in self._side_tables and TTL_TABLE in root.tables():
            # An adopted store restored from a checkpoint with expiries (see restore()): its tables
            # belong to every version this instance writes.
            self._side_tables.extend(TTL_TABLES)
        # Windows: pending partials are keyed by (key..., window start); their key group is the key's.
        pending_groups = len(self.key_columns) if windows is not None else None
        tables = {
            STATE_TABLE: root,
            **{
                name: root.table(name, group_columns=pending_groups if name == PENDING_TABLE else None)
                for name in self._side_tables
            },
        }
        if self.processor is not None:
            tables.update(self.processor.bind(root))
        self.tables.update(tables)
        self._raw = dict(tables)
        for raw in self._raw.values():
            raw.track_changes()
        self._files.root = root
        return root

    @property
    def _root(self) -> Store:
        """The store that holds the tables (what the finalizer closes)."""
        assert self._files.root is not None
        return self._files.root

    # ------------------------------------------------------------ handing the working store over
    def suspend(self) -> None:
        """Write everything to the working RocksDB and close it, keeping the Python objects.

        Right after a checkpoint the store on disk equals the checkpointed
        version, so another process can :meth:`adopt` it, or this one can
        :meth:`resume` with its cache still warm. The claim on the directory
        is kept until :meth:`release_workdir`, so that nobody sweeps it before
        the hand-over is recorded.
        """
        if self.workdir is None:
            raise TypeError("only an instance with a RocksDB working store can be suspended")
        self._save_pending()
        self._flush_caches()
        self._root.close()
        self.suspended = True

    def release_workdir(self) -> None:
        """Give up the claim on a suspended instance's directory, so another process can adopt it."""
        if not self.suspended:
            raise RuntimeError("release_workdir() is for a suspended instance: its store must be closed first")
        if self._files.lock is not None:
            self._files.lock.release()

    def resume(self) -> None:
        """Reopen the working store after :meth:`suspend` (nobody else has changed it since)."""
        if not self.suspended:
            return
        assert self.workdir is not None
        if self._files.lock is None:
            self._files.lock = directory_lock(self.workdir)
        self._files.lock.acquire()
        self._open_working_store()
        if self.cache is not None:
            self.cache.rebind(self.tables[STATE_TABLE])
            self.state = self.cache
        else:
            self.state = self.tables[STATE_TABLE]
        self.timers = TimerService(self.tables[TIMERS_TABLE])
        self.timers.reload()
        if self.ttl is not None:
            self.ttl = self._expiry_index()  # reloads from the reopened tables
        self.suspended = False

    def adopt(self) -> None:
        """Take over a working store another process suspended: reload timers and pending rows from it."""
        for raw in self._raw.values():
            raw.drain_changes()
        self._reload_from_tables()

    def _reload_from_tables(self) -> None:
        state = self._raw.get(STATE_TABLE)
        if isinstance(state, RocksDBStore):
            if self.layout == "key":
                split_blocks(state, self.key_groups)  # a checkpoint written with layout="key_group"
            elif self.spec.state.layout == "auto" and holds_per_key_records(state, self.key_groups):
                # Written per key (by a state that outgrew its blocks, or by layout="key"): it stays so.
                self._use_per_key_records()
        self.timers.reload()
        if self.windows is not None:
            self.windows.reload()
        if self.processor is not None:
            self.processor.reload()
        if self.ttl is not None:
            self.ttl.reload()
        elif TTL_TABLE in self.tables:
            # Restored from a checkpoint of this operator with ttl_ms, now run without: its state no
            # longer expires, and stale expiries must not come back should ttl_ms be set again.
            for name in TTL_TABLES:
                table = self.tables[name]
                if isinstance(table, RocksDBStore):
                    table.write_raw([(raw_key, None) for raw_key, _ in table.iter_raw()], track=True)
                else:
                    table.delete_many([key for key, _ in table.items()])
        pending = [(normalize_key(k), v) for k, v in self.tables[PENDING_TABLE].items()]
        self.buffer.restore(iter(pending))
        self._pending_keys = {nkey for nkey, _ in pending}

    # ------------------------------------------------------------ restore / checkpoint
    def restore(self, manifest: Manifest) -> None:
        """Load this instance's key groups of ``manifest`` (state, pending rows, timers, expiries)."""
        assert self.storage is not None
        if TTL_TABLE in manifest.tables and TTL_TABLE not in self._raw:
            # The checkpoint's operator had ttl_ms: restore its tables too (every table of a version
            # must be restored), then _reload_from_tables clears them.
            for name in TTL_TABLES:
                self._side_tables.append(name)
                table = self._root.table(name)
                assert isinstance(table, RocksDBStore)
                table.track_changes()
                self.tables[name] = self._raw[name] = table
        restore(self.storage, manifest, self.key_groups, self._raw)
        for raw in self._raw.values():
            raw.drain_changes()  # what was restored is not a change
        self._reload_from_tables()

    def checkpoint(self, version: int, previous: Optional[Manifest]) -> TaskReport:
        """Persist pending rows, flush the cache, and write this instance's task file of ``version``."""
        assert self.storage is not None
        self._save_pending()
        self._flush_caches()
        changes = {name: raw.drain_changes() for name, raw in self._raw.items()}
        writer = CheckpointWriter(self.storage, key_groups=self.key_groups, task=f"{self.index}of{self.parallelism}")
        report = writer.write(version, self._raw, changes, previous)
        self.metrics.checkpoint_bytes += report.bytes
        return report

    def _save_pending(self) -> None:
        rows = self.row_partials
        if rows is not None and len(rows):
            # Persisted before the batch's end: they wait in the buffer as accumulators, as a trigger's would.
            arrival_ms = rows.first_ms
            keys, accumulators, counts = rows.drain_accumulators()
            self.buffer.add_accumulators(keys, accumulators, counts, arrival_ms)
        snapshot = self.buffer.snapshot()
        pending = self.tables[PENDING_TABLE]
        stale = [k for k in self._pending_keys if k not in snapshot]
        if stale:
            pending.delete_many(stale)
        if snapshot:
            pending.put_many(snapshot.items())
        self._pending_keys = set(snapshot)

    # ------------------------------------------------------------ processing
    def process(
        self, frame: pd.DataFrame, processing_time_ms: int, watermark_ms: int, late_watermark_ms: Optional[int] = None
    ) -> list[pd.DataFrame]:
        """Buffer ``frame``; flush whenever a trigger fires; return the outputs.

        ``late_watermark_ms``: a windowed aggregate drops the rows of windows that this
        watermark closes (Spark's watermark for late events: the one the previous batch
        ran with); None: ``watermark_ms``.
        """
        outputs: list[pd.DataFrame] = []
        self.metrics.rows_in += len(frame)
        if self.windows is not None and len(frame):
            frame, late = self.windows.assign(frame, _late_rows(watermark_ms, late_watermark_ms))  # open windows' pairs
            self.metrics.late_rows += late
        if self.row_partials is not None and not len(self.buffer):
            self.row_partials.add(frame, processing_time_ms)
            return outputs
        n = len(frame)
        start = 0
        row_bytes = 0.0
        config = self.spec.mini_batch
        if n and config is not None and config.max_bytes is not None:
            row_bytes = float(frame.memory_usage(index=False, deep=False).sum()) / n
        while start < n:
            room = self.buffer.room(row_bytes)
            stop = n if room is None else min(n, start + room)
            self.buffer.add(frame.iloc[start:stop] if (start or stop < n) else frame, processing_time_ms)
            start = stop
            if room is not None and self.buffer.should_flush(processing_time_ms):
                outputs.extend(self.flush(processing_time_ms, watermark_ms))
        return outputs

    def process_accumulators(
        self,
        nkeys: list[NormalizedKey],
        accumulators: list[Any],
        rows: list[int],
        processing_time_ms: int,
        watermark_ms: int,
        late_watermark_ms: Optional[int] = None,
    ) -> list[pd.DataFrame]:
        """Buffer accumulators combined before a shuffle (one per key); flush when a trigger fires.

        The count trigger is checked after the whole chunk: an accumulator
        stands for many rows and cannot be split. ``late_watermark_ms`` as for :meth:`process`.
        """
        self.metrics.rows_in += sum(rows)
        if self.windows is not None:  # combined per (key..., window start): closed windows' are late
            nkeys, accumulators, rows, late = self.windows.drop_late_accumulators(
                nkeys, accumulators, rows, _late_rows(watermark_ms, late_watermark_ms)
            )
            self.metrics.late_rows += late
        self.buffer.add_accumulators(nkeys, accumulators, rows, processing_time_ms)
        config = self.spec.mini_batch
        triggered = config is not None and (config.max_rows is not None or config.max_bytes is not None)
        if triggered and self.buffer.should_flush(processing_time_ms):
            return self.flush(processing_time_ms, watermark_ms)
        return []

    def end_of_batch(self, processing_time_ms: int, watermark_ms: int) -> list[pd.DataFrame]:
        """Time-triggered flush (or the flush of an unbuffered operator), then due timeouts, then the TTL sweep."""
        outputs: list[pd.DataFrame] = []
        if self.buffer.should_flush(processing_time_ms) or (self.row_partials is not None and len(self.row_partials)):
            outputs.extend(self.flush(processing_time_ms, watermark_ms))
        if self.windows is not None:
            if len(self.buffer):  # a closing window's pending partials join it first
                outputs.extend(self.flush(processing_time_ms, watermark_ms))
            outputs.extend(self.windows.close(self, watermark_ms))
        else:
            outputs.extend(self.fire_timers(processing_time_ms, watermark_ms))
        if self.ttl is not None:
            self.sweep_expired(processing_time_ms)
        if self.processor is not None:
            self.metrics.expired += self.processor.sweep()
        self._settle_layout()
        return outputs

    def sweep_expired(self, processing_time_ms: int) -> int:
        """Delete the state of every key expired at ``processing_time_ms``; return how many.

        The expiry index hands over exactly the expired keys (the others are
        not visited), and their state and expiries go in one batched delete
        each: the work is proportional to what expires, not to the state.
        """
        assert self.ttl is not None
        expired = self.ttl.pop_due(processing_time_ms)
        if expired:
            self.state.delete_many(expired)
            self.metrics.expired += len(expired)
        return len(expired)

    def _visible(self, keys: list[NormalizedKey], values: list[Any], processing_time_ms: int) -> list[Any]:
        """``values`` read for ``keys``, with the state of expired keys hidden (None: no state)."""
        if self.ttl is None:
            return values
        held = [i for i, value in enumerate(values) if value is not None]  # a key without state has nothing to hide
        if not held:
            return values
        expired = self.ttl.expired_many([keys[i] for i in held], processing_time_ms)
        if not any(expired):
            return values
        values = list(values)
        for i, gone in zip(held, expired):
            if gone:
                values[i] = None
        return values

    def flush(self, processing_time_ms: int, watermark_ms: int) -> list[pd.DataFrame]:
        """Hand every buffered key to the function (or fold its partials into the accumulators)."""
        self.metrics.flushes += 1
        if self.windows is not None:
            return self.windows.flush(self)
        if self.spec.aggregations is not None:
            return self._flush_aggregate(processing_time_ms)
        keys, frames = self.buffer.drain_keyed()  # each key's frame is made as its call comes
        if not keys:
            return []
        if self.processor is not None:
            return self._flush_processor(zip(keys, frames), processing_time_ms, watermark_ms)
        values = self.state.get_many(keys)  # one batched read: cache hits, one multi-get for misses
        values = self._visible(keys, values, processing_time_ms)
        outputs = FrameCollector()
        call = self._call
        nkey: Any = _NO_KEY
        try:
            for nkey, rows, value in zip(keys, frames, values):
                outputs.add(call(nkey, rows, value, False, processing_time_ms, watermark_ms))
        except Exception as exc:
            self._failed(exc, "data", nkey)
            raise
        self._apply_expiry_changes()
        joined = outputs.frames()
        self.metrics.rows_out += sum(len(frame) for frame in joined)  # a few joined frames, not one per call
        return joined

    def _apply_expiry_changes(self) -> None:
        """Write the expiries the calls since the last flush set or cleared, in one batch each."""
        changes = self._expiry_changes
        if not changes:
            return
        assert self.ttl is not None
        self.ttl.remove_many([nkey for nkey, expires_at in changes.items() if expires_at is None])
        self.ttl.set_many([(nkey, expires_at) for nkey, expires_at in changes.items() if expires_at is not None])
        changes.clear()

    def _flush_aggregate(self, processing_time_ms: int) -> list[pd.DataFrame]:
        aggs = self.spec.aggregations
        assert aggs is not None
        outputs: list[pd.DataFrame] = []
        if self.row_partials is not None and len(self.row_partials):
            row_keys, block, _ = self.row_partials.drain()
            outputs.append(self._merge_columns(row_keys, block, processing_time_ms))
        keys, partials = self.buffer.drain_accumulators()
        if not keys:
            return outputs
        if self.columnar is not None:
            return [*outputs, self._merge_columns(keys, self.columnar.from_accumulators(partials), processing_time_ms)]
        stored = self._visible(keys, self.state.get_many(keys), processing_time_ms)
        merge = aggs.merge
        merged = [p if s is None else merge(s, p) for s, p in zip(stored, partials)]
        self.state.put_many(zip(keys, merged))
        if self.ttl is not None:  # every key's accumulator was updated: its expiry moves
            expires_at = expiry_for(processing_time_ms, self.ttl_ms)  # type: ignore[arg-type]
            self.ttl.set_many((nkey, expires_at) for nkey in keys)
        self.metrics.calls += len(keys)
        self.metrics.rows_out += len(keys)
        return [aggs.results_frame(dict(zip(keys, merged)), self.key_columns, keys)]

    def _merge_columns(
        self,
        keys: list[NormalizedKey],
        incoming: list[Any],
        processing_time_ms: int,
        key_frame: Optional[pd.DataFrame] = None,
    ) -> pd.DataFrame:
        """Merge a block of partials (one row per key) into the keys' accumulators; their results.

        One multi-get, one numpy merge, one encoding pass and one multi-put for
        all ``keys``. ``key_frame`` (optional): the key columns of the rows, in
        ``keys``' order (else built from the keys).
        """
        layout = self.columnar
        assert layout is not None
        cache = self.cache
        if isinstance(cache, KeyGroupCache):  # the values as byte ranges, never one object per key
            if self.ttl is not None:
                # An expired accumulator merges as if absent (the per-key branch hides it with _visible): gone first.
                expired = [nkey for nkey, gone in zip(keys, self.ttl.expired_many(keys, processing_time_ms)) if gone]
                if expired:
                    cache.delete_many(expired)
            block, _ = layout.merge_into(cache, keys, incoming)
        else:
            stored = self._visible(keys, self.state.get_many(keys), processing_time_ms)
            block = layout.merge(layout.decode(stored), incoming)
            self.state.put_many(zip(keys, layout.encode(block)))
        if self.ttl is not None:  # every key's accumulator was updated: its expiry moves
            expires_at = expiry_for(processing_time_ms, self.ttl_ms)  # type: ignore[arg-type]
            self.ttl.set_many((nkey, expires_at) for nkey in keys)
        self.metrics.calls += len(keys)
        self.metrics.rows_out += len(keys)
        if key_frame is None:
            key_frame = pd.DataFrame(key_column_values(keys, self.key_columns), columns=self.key_columns)
        else:
            key_frame = key_frame.reset_index(drop=True)
        return key_frame.assign(**layout.results(block))

    @property
    def merges_columns(self) -> bool:
        """Whether :meth:`process_columns` merges now (an aggregate with columns, no trigger, nothing buffered)."""
        return self._merge_directly and not len(self.buffer)

    def process_columns(
        self,
        nkeys: list[NormalizedKey],
        key_frame: pd.DataFrame,
        partials: dict[str, Any],
        rows: list[int],
        processing_time_ms: int,
        watermark_ms: int = NO_TIMESTAMP,
        late_watermark_ms: Optional[int] = None,
    ) -> Optional[list[pd.DataFrame]]:
        """Merge partials combined before the shuffle, one row per key, given as columns; None when this
        operator buffers them instead (it has a trigger: use :meth:`process_accumulators`).

        ``partials``: per output, the partials of the rows (ints for counts,
        DataSketches sketch bytes for ``ApproxDistinct``, ``(values, non-null
        counts)`` for sums, means and picks). A windowed aggregate's keys end
        with the window start; rows of windows that ``late_watermark_ms`` closes
        (None: ``watermark_ms``) are dropped and counted, as for :meth:`process`.
        """
        if not self.merges_columns:
            return None
        if not self._count_merge(nkeys, rows):
            return []
        if self.windows is not None:
            return self.windows.merge_columns(self, nkeys, partials, rows, _late_rows(watermark_ms, late_watermark_ms))
        assert self.columnar is not None
        return [self._merge_columns(nkeys, self.columnar.from_columns(partials), processing_time_ms, key_frame)]

    def process_block(
        self, nkeys: list[NormalizedKey], block: list[Any], rows: Sequence[int], processing_time_ms: int
    ) -> Optional[list[pd.DataFrame]]:
        """Merge partials combined before the shuffle as one block (:class:`ColumnarLayout`, row i: the
        distinct key ``nkeys[i]`` over ``rows[i]`` input rows); None when this operator buffers them instead
        (a trigger, or a windowed aggregate: use :meth:`process_accumulators`)."""
        if not self.merges_columns or self.columnar is None:
            return None
        if not self._count_merge(nkeys, rows):
            return []
        return [self._merge_columns(nkeys, block, processing_time_ms)]

    def _count_merge(self, nkeys: list[NormalizedKey], rows: Sequence[int]) -> bool:
        """Count the input rows of partials merged directly, and the merge itself when there are keys to merge."""
        self.metrics.rows_in += int(sum(rows))
        if not nkeys:
            return False
        self.metrics.flushes += 1
        return True

    def _processor_at(self, processing_time_ms: int, watermark_ms: int) -> ProcessorRuntime:
        """The processor, set to the batch's times (the watermark only with an event-time column)."""
        runtime = self.processor
        assert runtime is not None
        runtime.set_times(processing_time_ms, watermark_ms if self.watermark_present else NO_TIMESTAMP)
        return runtime

    def _flush_processor(
        self, items: Iterable[tuple[NormalizedKey, pd.DataFrame]], processing_time_ms: int, watermark_ms: int
    ) -> list[pd.DataFrame]:
        runtime = self._processor_at(processing_time_ms, watermark_ms)
        outputs = FrameCollector()
        try:
            for nkey, rows in items:
                frames = runtime.handle_rows(nkey, rows)
                self.metrics.calls += 1
                for frame in frames:
                    self.metrics.rows_out += len(frame)
                outputs.add(frames)
        except Exception as exc:
            self._failed(exc, "data", runtime.nkey)
            raise
        return outputs.frames()

    def apply_initial_state(self, frame: pd.DataFrame, processing_time_ms: int, watermark_ms: int) -> None:
        """``handleInitialState`` for each key of ``frame`` (this instance's keys, before its first batch)."""
        if self.processor is None:
            raise TypeError("initial_state is for a transformWithStateInPandas processor")
        runtime = self._processor_at(processing_time_ms, watermark_ms)
        if not len(frame):
            return
        by = self.key_columns if len(self.key_columns) > 1 else self.key_columns[0]
        try:
            for key, rows in frame.groupby(by, sort=False, dropna=False):
                runtime.handle_initial_state(normalize_key(key), rows.reset_index(drop=True))
        except Exception as exc:
            self._failed(exc, "initial state", runtime.nkey)
            raise

    def _fire_processor_timers(self, processing_time_ms: int, watermark_ms: int) -> list[pd.DataFrame]:
        """``handleExpiredTimer`` for every due timer of the processor."""
        runtime = self._processor_at(processing_time_ms, watermark_ms)
        fired = runtime.fired
        try:
            outputs = runtime.fire_timers()
        except Exception as exc:
            self._failed(exc, "timer", runtime.nkey)
            raise
        self.metrics.timeouts += runtime.fired - fired
        for frame in outputs:
            self.metrics.rows_out += len(frame)
        return outputs

    def fire_timers(self, processing_time_ms: int, watermark_ms: int) -> list[pd.DataFrame]:
        """Call the function with ``hasTimedOut`` for every key whose timeout passed."""
        if self.processor is not None:
            return self._fire_processor_timers(processing_time_ms, watermark_ms)
        if self.timeout_conf == GroupStateTimeout.ProcessingTimeTimeout:
            threshold = processing_time_ms
        elif self.timeout_conf == GroupStateTimeout.EventTimeTimeout and watermark_ms != NO_TIMESTAMP:
            threshold = watermark_ms
        else:
            return []
        due = self.timers.due(threshold)
        if not due:
            return []
        outputs: list[pd.DataFrame] = []
        if any(nkey in self.buffer for _, nkey in due):
            # A key's buffered rows reach the function before its timeout does (and that call resets it).
            outputs.extend(self.flush(processing_time_ms, watermark_ms))
            due = self.timers.due(threshold)
        keys = [nkey for _, nkey in due]
        values = self._visible(keys, self.state.get_many(keys), processing_time_ms)
        nkey: Any = _NO_KEY
        try:
            for nkey, value in zip(keys, values):
                self.metrics.timeouts += 1
                frames = self._call(nkey, None, value, True, processing_time_ms, watermark_ms)
                self.metrics.rows_out += sum(len(frame) for frame in frames)
                outputs.extend(frames)
        except Exception as exc:
            self._failed(exc, "timeout", nkey)
            raise
        self._apply_expiry_changes()
        return outputs

    def _failed(self, exc: BaseException, call: str, nkey: Any = _NO_KEY) -> None:
        """In the except branch around the user's calls: ``exc`` names ``call``, the key ``nkey`` (as the
        user's code sees it, in plain Python; none: a call of no key) and the batch (see :mod:`buffering.errors`)."""
        batch = self._running_batch()
        if nkey is _NO_KEY:
            annotate(exc, call, batch=batch)
        else:
            annotate(exc, call, denormalize_key(nkey), batch)

    def _running_batch(self) -> Optional[int]:
        """The version of the batch running: :attr:`batch`, else the one the LocalRunner that built this
        instance is running (None when unknown)."""
        if self.batch is not None:
            return self.batch
        runner = self._runner() if self._runner is not None else None
        next_version = getattr(runner, "_next_version", None)
        try:
            return int(next_version()) if callable(next_version) else None
        except Exception:  # noqa: BLE001 - only to name it in an error
            return None

    def _call(
        self,
        nkey: NormalizedKey,
        rows: Optional[pd.DataFrame],
        value: Any,
        timed_out: bool,
        processing_time_ms: int,
        watermark_ms: int,
    ) -> list[pd.DataFrame]:
        function = self.spec.function
        assert function is not None
        old_timeout = self.timers.get(nkey)
        state = GroupState(
            value,
            batch_processing_time_ms=processing_time_ms,
            event_time_watermark_ms=watermark_ms if self.watermark_present else NO_TIMESTAMP,
            timeout_conf=self.timeout_conf,
            has_timed_out=timed_out,
            watermark_present=self.watermark_present,
            old_timeout_timestamp=NO_TIMESTAMP if old_timeout is None else old_timeout,
        )
        if rows is not None:
            self._value_columns = rows.columns  # the Index, not a list: a timeout's empty frame lists it
        frames = call_function(function, nkey, self._key_types, rows, state, self._value_columns, self._to_spark_key)
        self.metrics.calls += 1
        if state.removed:
            self.state.delete(nkey)
            if self.ttl is not None:
                self._expiry_changes[nkey] = None
        elif state.updated:
            value = state.value if self._state_schema is None else self._state_schema.convert(state.value)
            self.state.put(nkey, value)
            if self.ttl is not None:  # Spark: any update resets the expiry to processing time + TTL
                self._expiry_changes[nkey] = expiry_for(processing_time_ms, self.ttl_ms)  # type: ignore[arg-type]
        timeout = state.timeout_timestamp
        if timeout != NO_TIMESTAMP:
            self.timers.set(nkey, timeout)
        elif old_timeout is not None:
            self.timers.clear(nkey)  # Spark resets the timeout on every call
        return frames  # the caller counts their rows (metrics.rows_out)

    # ------------------------------------------------------------ inspection
    def state_items(self) -> dict[tuple, Any]:
        """Every key's state (for tests and debugging); an aggregate's accumulators as mappings."""
        if self._packed_state:
            return {key: packed(value) for key, value in self.state.items()}
        return dict(self.state.items())

    def stats(self) -> dict[str, Any]:
        """Counters of this instance (rows, flushes, calls, timeouts, pending, checkpoint bytes, TTL, cache stats)."""
        out: dict[str, Any] = {
            "instance": self.index,
            "key_groups": (self.key_groups.start, self.key_groups.stop),
            "rows_in": self.metrics.rows_in,
            "flushes": self.metrics.flushes,
            "calls": self.metrics.calls,
            "timeouts": self.metrics.timeouts,
            "rows_out": self.metrics.rows_out,
            "pending_rows": self.buffer.rows,
            "pending_keys": len(self.buffer),
            "timers": len(self.timers) if self.processor is None else len(self.processor.timers),
            "checkpoint_bytes": self.metrics.checkpoint_bytes,
        }
        if self.ttl is not None or self.processor is not None:
            out["expired"] = self.metrics.expired  # entries the TTL sweeps removed since the instance started
        if self.windows is not None:
            out["late_rows"] = self.metrics.late_rows  # (row, window) pairs of closed windows, dropped
            out["closed_windows"] = self.metrics.expired
        if self.cache is not None:
            out["cache"] = self.cache_stats()[0]
        if self.processor is not None:
            out["caches"] = {cache.cache_name: cache.stats() for cache in self.processor.caches}
        return out

    def discard(self) -> None:
        """Drop everything since the last checkpoint: close the stores WITHOUT flushing the cache.

        For a failed batch: the cache may hold values the batch changed (live
        objects, possibly changed in place), so nothing of it may reach the
        store. The directory is released (a temporary one deleted); build a new
        instance from the checkpoint to go on.
        """
        self._finalizer()

    def close(self) -> None:
        """Flush the cache, close the working store and give up its directory (a temporary one is deleted).

        An instance dropped without ``close()`` is not flushed, but its
        finalizer still closes the store, releases the directory and deletes a
        temporary one.
        """
        try:
            if not self.suspended:
                if self.processor is not None:
                    self._flush_caches()
                    try:
                        self.processor.close()
                    except Exception as exc:
                        annotate(exc, "close")  # between batches: it names none
                        raise
                if self.cache is not None:
                    self.cache.close()  # flushes and closes the root store's table
        finally:
            self._finalizer()
