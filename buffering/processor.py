"""transformWithStateInPandas processors on an operator instance: their state variables, timers and calls.

A user's :class:`pyspark.sql.streaming.StatefulProcessor` runs unchanged. Its
handle (:class:`ProcessorHandle`) gives each state variable a table of the
instance's working RocksDB, behind its own write-back cache, so a state access
on a cache hit is a dict lookup in this process, not a socket round trip to the
JVM as in Spark (564 us measured here):

==========  ==========================================  =======================================
variable    table ``tws.<kind>.<name>`` keyed by          one access touches
==========  ==========================================  =======================================
ValueState  the grouping key                              that key's value
ListState   the grouping key: ``[count, first 64]``;      the head and the last chunk of 64
            ``tws.list-chunks.<name>``: key + chunk 1..
MapState    grouping key + the entry's user key           that entry (iteration: the key's entries)
timers      ``tws.timers``: grouping key + timestamp      that timer
==========  ==========================================  =======================================

Composite keys take their key group from the grouping-key columns only
(``RocksDBStore(group_columns=)``), so a key's entries, chunks and timers stay
with the instance that owns the key, through checkpoints and rescales.

TTL (``ttlDurationMs``): a value, map entry or list element is stored with
its expiry (processing time of its last update + TTL); reads skip expired
ones, and the sweep after each batch deletes what expired, at a cost
proportional to what expired: ``tws.ttl.<name>`` records each entry's expiry
(a list: its earliest element's) and ``tws.ttl-order.<name>`` orders them by
key group and time (:class:`state.ttl.OrderedExpiryIndex`), both checkpointed.
As Spark: a value is expired when its expiry <= the batch's processing time.

Values are stored as tuples with numpy scalars made Python scalars (as Spark
pickles them); Spark also applies the schema's ``toInternal`` (a date comes
back as days since the epoch), which is not repeated here.
"""

from __future__ import annotations

import copy
from itertools import chain
from typing import Any, Callable, Iterator, Optional, Sequence

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from sortedcontainers import SortedList

from state import RocksDBStore, WriteBackCache
from state.ttl import OrderedExpiryIndex
from state.group_state import NO_TIMESTAMP, GroupStateTimeout
from state.keys import NormalizedKey, decode_key, denormalize_key, encode_key, key_columns, normalize_key

from .errors import annotate
from .protocol import output_frames, spark_key

#: Elements per ListState chunk: an append rewrites one chunk, a get reads len/64 + 1 entries.
LIST_CHUNK = 64
TIMERS_TABLE = "tws.timers"
_NO_VALUE: Any = object()

#: transformWithState time mode (lower case) -> the runners' ``timeout`` that gives its timers.
TIME_MODES = {"none": "none", "processingtime": "processing", "eventtime": "event"}


def is_processor(obj: Any) -> bool:
    """Whether ``obj`` is a transformWithStateInPandas ``StatefulProcessor`` (an operator of its own)."""
    return isinstance(obj, StatefulProcessor)


def processor_timeout(spec: Any, timeout: str, time_mode: Optional[str], initial_state: Any) -> str:
    """The runner's ``timeout`` for an operator: a processor's comes from ``time_mode``.

    ``time_mode`` and ``initial_state`` are for processors only; a processor
    takes ``time_mode``, not ``timeout``. Errors name the argument.
    """
    if spec.processor is None:
        if time_mode is not None or initial_state is not None:
            raise TypeError("time_mode= and initial_state= are for a transformWithStateInPandas StatefulProcessor")
        return timeout
    if timeout not in ("none", "NoTimeout", None):
        raise TypeError(f"a StatefulProcessor takes time_mode=, not timeout={timeout!r}")
    if time_mode is None:
        return "none"
    if not isinstance(time_mode, str) or time_mode.lower() not in TIME_MODES:
        raise ValueError(f"time_mode must be 'None', 'ProcessingTime' or 'EventTime', got {time_mode!r}")
    return TIME_MODES[time_mode.lower()]


def check_initial_state(frame: pd.DataFrame, key_columns: Sequence[str]) -> None:
    """Refuse a processor's initial state without the key columns, naming the missing ones."""
    missing = [c for c in key_columns if c not in frame.columns]
    if missing:
        raise KeyError(f"initial_state lacks the key column(s) {missing} (it has {list(frame.columns)})")


def _python_value(value: Any) -> Any:
    item = getattr(value, "item", None)
    if item is not None and type(value).__module__ == "numpy":
        return item()
    return value


_PLAIN_VALUES = frozenset((int, float, str, bytes, bool, type(None)))
_TUPLE = frozenset((tuple,))


def _row(value: Any, kind: str, name: str) -> tuple:
    """A state value as Spark stores it: a tuple of Python scalars (numpy scalars converted).

    ``kind`` and ``name`` name the variable in an error (formatted only then).
    """
    if type(value) is tuple:
        for v in value:
            if type(v) not in _PLAIN_VALUES:
                break
        else:
            return value
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{kind} {name!r}: a state value must be a tuple (one element per schema field), got {value!r:.200}")
    return tuple(_python_value(v) for v in value)


def _rows(values: Any, kind: str, name: str) -> list:
    """:func:`_row` of many values, checked in C when they are all tuples of plain scalars (the usual case)."""
    values = list(values)
    if _TUPLE.issuperset(map(type, values)) and _PLAIN_VALUES.issuperset(map(type, chain.from_iterable(values))):
        return values
    return [_row(v, kind, name) for v in values]


class _Variable:
    """One state variable: its table, the cache in front of it, and its TTL."""

    kind = ""

    def __init__(self, runtime: "ProcessorRuntime", name: str, ttl_ms: Optional[int]) -> None:
        if ttl_ms is not None and (isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0):
            raise ValueError(f"state {name!r}: ttlDurationMs must be a positive int or None, got {ttl_ms!r}")
        self.runtime = runtime
        self.name = name
        self.ttl_ms = ttl_ms
        self.table_name = f"tws.{self.kind}.{name}"
        self.ttl_table_name = f"tws.ttl.{name}" if ttl_ms is not None else None
        self.cache: WriteBackCache
        self.table: RocksDBStore
        self.expiry: Optional[OrderedExpiryIndex] = None

    @property
    def caches(self) -> list[WriteBackCache]:
        return [self.cache]

    def bind(self, root: RocksDBStore) -> list[tuple[str, RocksDBStore]]:
        """Open (or reopen) this variable's tables on ``root``; returns them by name."""
        group_columns = self.runtime.group_columns if self.kind == "map" else None
        self.table = root.table(self.table_name, group_columns=group_columns)
        cache = getattr(self, "cache", None)
        if cache is None:
            self.cache = self.runtime.make_cache(self.table, self.table_name)
        else:
            self.cache.rebind(self.table)
        tables = [(self.table_name, self.table)]
        if self.ttl_table_name is not None:
            ttl_table = root.table(self.ttl_table_name, group_columns=group_columns)
            order_name = f"tws.ttl-order.{self.name}"
            order_table = root.table(order_name)
            self.expiry = OrderedExpiryIndex(ttl_table, order_table, key_groups=self.runtime.key_groups)
            tables.extend([(self.ttl_table_name, ttl_table), (order_name, order_table)])
        return tables

    def expires_at(self) -> int:
        return self.runtime.processing_time_ms + self.ttl_ms  # type: ignore[operator]

    def live(self, stored: Any) -> bool:
        """Is a stored (value, expiry) entry of a TTL'd variable unexpired now?"""
        return stored[1] > self.runtime.processing_time_ms

    def sweep(self, now: int) -> int:
        """Delete what expired at ``now``; returns how many entries went."""
        if self.expiry is None:
            return 0
        due = self.expiry.pop_due(now)
        for nkey in due:
            self._expire(nkey, now)
        return len(due)

    def _expire(self, nkey: NormalizedKey, now: int) -> None:
        self.cache.delete(nkey)

    def drop_all(self) -> None:
        """Remove this variable's entries of the current grouping key."""
        raise NotImplementedError

    def purge(self) -> None:
        """Remove every entry of this variable, of every key this instance owns (deleteIfExists).

        O(entries): the cache is flushed, then each stored entry deleted
        through it (so the deletions reach the next checkpoint).
        """
        self.cache.flush()
        for key, _ in list(self.table.items()):
            self.cache.delete(key)
        if self.expiry is not None:
            self.expiry.remove_many([nkey for nkey, _ in list(self.expiry.items())])


class _ValueVariable(_Variable, ValueState):
    kind = "value"

    def __init__(self, runtime: "ProcessorRuntime", name: str, ttl_ms: Optional[int]) -> None:
        _Variable.__init__(self, runtime, name, ttl_ms)

    def exists(self) -> bool:
        return self.get() is not None

    def get(self) -> Optional[tuple]:
        stored = self.cache.get(self.runtime.nkey)
        if stored is None or self.ttl_ms is None:
            return stored
        return stored[0] if self.live(stored) else None

    def update(self, newValue: tuple) -> None:
        value = _row(newValue, "ValueState", self.name)
        nkey = self.runtime.nkey
        if self.ttl_ms is None:
            self.cache.put(nkey, value)
        else:
            at = self.expires_at()
            self.cache.put(nkey, (value, at))
            self.expiry.set(nkey, at)  # type: ignore[union-attr]

    def clear(self) -> None:
        nkey = self.runtime.nkey
        self.cache.delete(nkey)
        if self.expiry is not None:
            self.expiry.remove(nkey)

    drop_all = clear


class _ListVariable(_Variable, ListState):
    """A list in chunks of LIST_CHUNK elements; with TTL each element carries its own expiry (as Spark).

    The head ``[count, first elements]`` is keyed by the grouping key alone
    (``tws.list.<name>``, like a ValueState: a list of up to LIST_CHUNK
    elements is one lookup of the cache's fastest kind); chunks 1, 2, ... are
    in ``tws.list-chunks.<name>`` under grouping key + chunk number. An append
    changes the head (its count) and the last chunk only.
    """

    kind = "list"

    def __init__(self, runtime: "ProcessorRuntime", name: str, ttl_ms: Optional[int]) -> None:
        _Variable.__init__(self, runtime, name, ttl_ms)
        self.chunks_name = f"tws.list-chunks.{name}"
        self.chunks: WriteBackCache

    def bind(self, root: RocksDBStore) -> list[tuple[str, RocksDBStore]]:
        tables = _Variable.bind(self, root)
        chunks_table = root.table(self.chunks_name, group_columns=self.runtime.group_columns)
        if getattr(self, "chunks", None) is None:
            self.chunks = self.runtime.make_cache(chunks_table, self.chunks_name)
        else:
            self.chunks.rebind(chunks_table)
        self.chunks_table = chunks_table
        return tables + [(self.chunks_name, chunks_table)]

    @property
    def caches(self) -> list[WriteBackCache]:
        return [self.cache, self.chunks]

    def _chunk_keys(self, first: int, stop: int) -> list[NormalizedKey]:
        group = self.runtime.group
        return [group + (i,) for i in range(first, stop)]  # an int is its own normalized element

    def _elements(self) -> list:
        head = self.cache.get(self.runtime.nkey)
        if head is None:
            return []
        count, first = head
        if count <= LIST_CHUNK:
            return list(first)
        out = list(first)
        for chunk in self.chunks.get_many(self._chunk_keys(1, (count + LIST_CHUNK - 1) // LIST_CHUNK)):
            out.extend(chunk)
        return out

    def exists(self) -> bool:
        return next(self.get(), None) is not None

    def get(self) -> Iterator[tuple]:
        elements = self._elements()
        if self.ttl_ms is None:
            return iter(elements)
        now = self.runtime.processing_time_ms
        return iter([value for value, at in elements if at > now])

    def _entries(self, values: list[tuple]) -> list:
        rows = _rows(values, "ListState", self.name)
        if self.ttl_ms is None:
            return rows
        at = self.expires_at()
        return [(row, at) for row in rows]

    def put(self, newState: list[tuple]) -> None:
        self._write(self._entries(newState))

    def _write(self, entries: list) -> None:
        nkey = self.runtime.nkey
        head = self.cache.get(nkey)
        n = len(entries)
        if n <= LIST_CHUNK and (head is None or head[0] <= LIST_CHUNK) and self.expiry is None:
            # The usual case: the list is, and was, its head alone.
            if n:
                self.cache.put(nkey, [n, entries])
            elif head is not None:
                self.cache.delete(nkey)
            return
        old_chunks = 0 if head is None else (head[0] + LIST_CHUNK - 1) // LIST_CHUNK
        new_chunks = (n + LIST_CHUNK - 1) // LIST_CHUNK
        if n:
            self.cache.put(nkey, [n, entries if n <= LIST_CHUNK else entries[:LIST_CHUNK]])
            for i, key in enumerate(self._chunk_keys(1, new_chunks), start=1):
                self.chunks.put(key, entries[i * LIST_CHUNK : (i + 1) * LIST_CHUNK])
        elif head is not None:
            self.cache.delete(nkey)
        if old_chunks > max(new_chunks, 1):
            self.chunks.delete_many(self._chunk_keys(max(new_chunks, 1), old_chunks))
        if self.expiry is not None:
            if entries:
                self.expiry.set(nkey, min(at for _, at in entries))
            else:
                self.expiry.remove(nkey)

    def appendValue(self, newState: tuple) -> None:
        self.appendList([newState])

    def appendList(self, newState: list[tuple]) -> None:
        new = self._entries(newState)
        if not new:
            return
        nkey = self.runtime.nkey
        head = self.cache.get(nkey)
        if head is None:
            self._write(new)
            return
        count = head[0]
        last = (count - 1) // LIST_CHUNK
        chunk = head[1] if last == 0 else self.chunks.get(self.runtime.group + (last,))
        for entry in new:
            if len(chunk) == LIST_CHUNK:
                if last:
                    self.chunks.put(self.runtime.group + (last,), chunk)
                last += 1
                chunk = []
            chunk.append(entry)  # in place: the cached chunk is this process's live object
        if last:
            self.chunks.put(self.runtime.group + (last,), chunk)
        head[0] = count + len(new)
        self.cache.put(nkey, head)
        if self.expiry is not None and self.expiry.expires_at(nkey) is None:
            self.expiry.set(nkey, min(at for _, at in new))

    def clear(self) -> None:
        self._write([])

    drop_all = clear

    def purge(self) -> None:
        _Variable.purge(self)
        self.chunks.flush()
        for key, _ in list(self.chunks_table.items()):
            self.chunks.delete(key)

    def _expire(self, nkey: NormalizedKey, now: int) -> None:
        # The index holds the earliest expiry of the key's elements: drop the expired ones, keep the rest.
        with self.runtime.at_group(nkey):
            self._write([(v, at) for v, at in self._elements() if at > now])


class _MapVariable(_Variable, MapState):
    kind = "map"

    def __init__(self, runtime: "ProcessorRuntime", name: str, ttl_ms: Optional[int]) -> None:
        _Variable.__init__(self, runtime, name, ttl_ms)

    def _key(self, user_key: Any) -> NormalizedKey:
        if type(user_key) is not tuple:
            raise TypeError(f"MapState {self.name!r}: a key must be a tuple (one element per key schema field), got {user_key!r:.200}")
        return self.runtime.group + key_columns(normalize_key(user_key))

    def _entries(self) -> Iterator[tuple[tuple, Any]]:
        """Every live (user key, stored value) of the current grouping key (expired ones skipped)."""
        if self.ttl_ms is None:
            return self._entries_all()
        return ((k, stored) for k, stored in self._entries_all() if self.live(stored))

    def exists(self) -> bool:
        return next(self._entries(), None) is not None

    def getValue(self, key: tuple) -> Optional[tuple]:
        stored = self.cache.get(self._key(key))
        if stored is None or self.ttl_ms is None:
            return stored
        return stored[0] if self.live(stored) else None

    def containsKey(self, key: tuple) -> bool:
        return self.getValue(key) is not None

    def updateValue(self, key: tuple, value: tuple) -> None:
        nkey = self._key(key)
        row = _row(value, "MapState", self.name)
        if self.ttl_ms is None:
            self.cache.put(nkey, row)
        else:
            at = self.expires_at()
            self.cache.put(nkey, (row, at))
            self.expiry.set(nkey, at)  # type: ignore[union-attr]

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        if self.ttl_ms is None:
            return iter(list(self._entries()))
        return iter([(k, stored[0]) for k, stored in self._entries()])

    def keys(self) -> Iterator[tuple]:
        return iter([k for k, _ in self.iterator()])

    def values(self) -> Iterator[tuple]:
        return iter([v for _, v in self.iterator()])

    def removeKey(self, key: tuple) -> None:
        nkey = self._key(key)
        self.cache.delete(nkey)
        if self.expiry is not None:
            self.expiry.remove(nkey)

    def clear(self) -> None:
        for user_key, _ in list(self._entries_all()):
            self.removeKey(user_key)

    def _entries_all(self) -> Iterator[tuple[tuple, Any]]:
        """Every stored (user key, stored value) of the current grouping key, expired or not, in key order."""
        self.cache.flush()  # the table then holds every write
        n = self.runtime.group_columns
        for nkey, stored in self.table.iter_prefix(self.runtime.nkey):
            yield denormalize_key(nkey)[n:], stored

    drop_all = clear


class ProcessorHandle(StatefulProcessorHandle):
    """The handle a processor's ``init`` receives: state variables and timers of the current grouping key."""

    def __init__(self, runtime: "ProcessorRuntime") -> None:
        self._runtime = runtime

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ValueState:
        return self._runtime.variable(_ValueVariable, stateName, ttlDurationMs)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ListState:
        return self._runtime.variable(_ListVariable, stateName, ttlDurationMs)

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: Optional[int] = None
    ) -> MapState:
        return self._runtime.variable(_MapVariable, stateName, ttlDurationMs)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._runtime.timers.register(self._runtime.nkey, int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._runtime.timers.delete(self._runtime.nkey, int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        return iter(self._runtime.timers.list(self._runtime.nkey))

    def deleteIfExists(self, stateName: str) -> None:
        """Delete the state variable ``stateName`` with every key's values, as Spark drops its column family.

        As under Spark, a variable deleted in ``init`` fails every later use with
        Spark's ``PySparkRuntimeError`` (e.g. "Error checking value state exists");
        ``getValueState``/``getListState``/``getMapState`` in ``init`` make it anew.
        """
        variable = self._runtime.variables.get(stateName)
        if variable is not None:
            variable.purge()  # it stays among the variables: its deletions reach the next checkpoint
            if self._runtime._in_init:  # Spark calls init again in every batch: a later call recreates it
                _mark_deleted(variable)


#: Spark's error text per method of a deleted variable (its state clients' messages, kind by kind).
_DELETED_ERRORS = {
    "value": {"exists": "Error checking value state exists", "get": "Error getting value state",
              "update": "Error updating value state", "clear": "Error clearing value state"},
    "list": {"exists": "Error checking value state exists", "get": "Error getting list state",
             "put": "Error updating value state", "appendValue": "Error updating value state",
             "appendList": "Error updating value state", "clear": "Error clearing value state"},
    "map": {"exists": "Error checking map state exists", "getValue": "Error getting value",
            "containsKey": "Error checking map state contains key", "updateValue": "Error updating map state value",
            "iterator": "Error getting map state iterator", "keys": "Error getting map state keys",
            "values": "Error getting map state values", "removeKey": "Error removing key from map state",
            "clear": "Error clearing map state"},
}


def _mark_deleted(variable: "_Variable") -> None:
    """Make each public method of ``variable`` raise Spark's error (instance attributes: live variables pay nothing)."""
    from pyspark.errors import PySparkRuntimeError

    variable.deleted = True  # type: ignore[attr-defined]
    for method, text in _DELETED_ERRORS[variable.kind].items():
        def deleted(*args: Any, _text: str = text, **kwargs: Any) -> Any:
            raise PySparkRuntimeError(
                f"{_text}: state variable {variable.name!r} was deleted by deleteIfExists "
                "(its column family does not exist)"
            )

        setattr(variable, method, deleted)


class ProcessorTimers:
    """Timers of a processor: many per grouping key, fired in time order.

    The table ``tws.timers`` holds ``grouping key + timestamp``; an in-memory
    sorted index finds due timers in O(log n + due) and is rebuilt from the
    table after a restore.
    """

    def __init__(self, runtime: "ProcessorRuntime") -> None:
        self._runtime = runtime
        self._index: SortedList = SortedList()
        self._by_key: dict[NormalizedKey, set[int]] = {}
        self.table: RocksDBStore

    def bind(self, root: RocksDBStore) -> list[tuple[str, RocksDBStore]]:
        self.table = root.table(TIMERS_TABLE, group_columns=self._runtime.group_columns)
        return [(TIMERS_TABLE, self.table)]

    def reload(self) -> None:
        """Rebuild the in-memory index from the table (after a restore or adoption). O(timers)."""
        self._index.clear()
        self._by_key.clear()
        n = self._runtime.group_columns
        for key, _ in self.table.items():
            group = normalize_key(key[:n])
            timestamp = key[n]
            self._by_key.setdefault(group, set()).add(timestamp)
            self._index.add((timestamp, encode_key(group)))

    def register(self, nkey: NormalizedKey, timestamp: int) -> None:
        """Set a timer of ``nkey`` at ``timestamp`` (a second one at the same time is the same timer). O(log n)."""
        timestamps = self._by_key.setdefault(nkey, set())
        if timestamp in timestamps:
            return
        timestamps.add(timestamp)
        self._index.add((timestamp, encode_key(nkey)))
        self.table.put(self._runtime.composite((timestamp,), nkey), True)

    def delete(self, nkey: NormalizedKey, timestamp: int) -> None:
        """Remove the timer of ``nkey`` at ``timestamp``, if set. O(log n)."""
        timestamps = self._by_key.get(nkey)
        if not timestamps or timestamp not in timestamps:
            return
        timestamps.discard(timestamp)
        if not timestamps:
            del self._by_key[nkey]
        self._index.discard((timestamp, encode_key(nkey)))
        self.table.delete(self._runtime.composite((timestamp,), nkey))

    def list(self, nkey: NormalizedKey) -> list[int]:
        """The timestamps of ``nkey``'s timers, ascending."""
        return sorted(self._by_key.get(nkey, ()))

    def due(self, threshold: int) -> list[tuple[int, NormalizedKey]]:
        """Timers with timestamp <= threshold, earliest first."""
        stop = self._index.bisect_right((threshold, b"\xff" * 16))
        return [(ts, decode_key(encoded)) for ts, encoded in self._index[:stop]]

    def __len__(self) -> int:
        return len(self._index)


class ProcessorRuntime:
    """One instance's copy of the user's processor, with its state variables and timers.

    Built by the operator instance; every call sets the grouping key the
    handle's variables read and write (``nkey``).
    """

    def __init__(
        self,
        processor: StatefulProcessor,
        *,
        key_columns: Sequence[str],
        key_types: Optional[Sequence[str]],
        timeout_conf: str,
        make_cache: Callable[[RocksDBStore, str], WriteBackCache],
        key_groups: Optional[range] = None,
    ) -> None:
        if not isinstance(processor, StatefulProcessor):
            raise TypeError(f"expected a pyspark StatefulProcessor, got {type(processor).__name__}")
        # Each instance has its own copy: init() keeps the handle's variables on the processor.
        self.processor = copy.deepcopy(processor)
        self.group_columns = len(key_columns)
        self.key_types = tuple(key_types) if key_types is not None else None
        self.timeout_conf = timeout_conf
        self.make_cache = make_cache
        #: The key groups this runtime's instance owns (TTL sweeps seek only those); None: all.
        self.key_groups = key_groups
        self.variables: dict[str, _Variable] = {}
        self.timers = ProcessorTimers(self)
        self.nkey: NormalizedKey = None
        self.group: tuple = ()
        self.processing_time_ms = 0
        self.watermark_ms = NO_TIMESTAMP
        self._root: Optional[RocksDBStore] = None
        self._tables: dict[str, RocksDBStore] = {}
        self._initialized = False
        self._in_init = False
        self.fired = 0

    # ------------------------------------------------------------ tables
    def bind(self, root: RocksDBStore) -> dict[str, RocksDBStore]:
        """Open every table on ``root`` (first call: run the processor's ``init``); returns them by name."""
        self._root = root
        self._tables = dict(self.timers.bind(root))
        for variable in self.variables.values():
            self._tables.update(variable.bind(root))
        if not self._initialized:
            self._initialized = self._in_init = True
            try:
                self.processor.init(ProcessorHandle(self))
            except Exception as exc:
                annotate(exc, "init")  # the batch is named by the runner that started the instance
                raise
            finally:
                self._in_init = False
        return dict(self._tables)

    def variable(self, cls: type, name: str, ttl_ms: Optional[int]) -> Any:
        """The state variable ``name`` of kind ``cls``, created (with its tables) during ``init`` only."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a state variable needs a non-empty name, got {name!r}")
        existing = self.variables.get(name)
        if existing is not None and getattr(existing, "deleted", False) and self._in_init:
            existing = None  # made anew after deleteIfExists, as Spark creates the column family again
        if existing is not None:
            if type(existing) is not cls:
                raise ValueError(f"state variable {name!r} is a {existing.kind} state, not a {cls.kind} state")
            return existing
        if not self._in_init:
            raise RuntimeError(f"state variable {name!r}: state variables are created in the processor's init()")
        variable = cls(self, name, ttl_ms)
        self._tables.update(variable.bind(self._root))
        self.variables[name] = variable
        return variable

    @property
    def tables(self) -> dict[str, RocksDBStore]:
        """Every table of the processor by name (variables, their expiries, timers): all checkpointed."""
        return dict(self._tables)

    @property
    def caches(self) -> list[WriteBackCache]:
        """The cache of every variable table."""
        return [cache for v in self.variables.values() for cache in v.caches]

    def reload(self) -> None:
        """After a restore or adoption: rebuild the timer and expiry indexes from their tables."""
        self.timers.reload()
        for variable in self.variables.values():
            if variable.expiry is not None:
                variable.expiry.reload()

    # ------------------------------------------------------------ keys
    def set_key(self, nkey: NormalizedKey) -> None:
        """Make ``nkey`` (normalized) the grouping key the variables read and write."""
        self.nkey = nkey
        # Its normalized columns: a composite key is these plus normalized elements (already a normalized key).
        self.group = nkey if type(nkey) is tuple else (nkey,)

    def composite(self, extra: tuple, group: Any = _NO_VALUE) -> NormalizedKey:
        """The normalized key ``group`` (default: the current grouping key) + ``extra``, for composite-key tables."""
        columns = self.group if group is _NO_VALUE else key_columns(group)
        return columns + key_columns(normalize_key(extra))

    def at_group(self, composite_group: NormalizedKey) -> "_AtKey":
        """A context under the grouping key of ``composite_group`` (its leading columns)."""
        return _AtKey(self, normalize_key(composite_group))

    def set_times(self, processing_time_ms: int, watermark_ms: int) -> None:
        """The batch's processing time and event-time watermark (NO_TIMESTAMP: none), as TimerValues give them."""
        self.processing_time_ms = processing_time_ms
        self.watermark_ms = watermark_ms

    def timer_values(self) -> TimerValues:
        """The batch's times as the processor's calls receive them."""
        return TimerValues(self.processing_time_ms, self.watermark_ms)

    # ------------------------------------------------------------ calls
    def handle_rows(self, nkey: NormalizedKey, rows: pd.DataFrame) -> list[pd.DataFrame]:
        """``handleInputRows`` for ``nkey`` with its rows (one frame); its output frames, checked."""
        self.set_key(nkey)
        key = spark_key(nkey, self.key_types)
        return output_frames(denormalize_key(nkey), self.processor.handleInputRows(key, iter([rows]), self.timer_values()))

    def handle_initial_state(self, nkey: NormalizedKey, frame: pd.DataFrame) -> None:
        """``handleInitialState`` for ``nkey`` with its initial-state rows."""
        self.set_key(nkey)
        self.processor.handleInitialState(spark_key(nkey, self.key_types), frame, self.timer_values())

    def fire_timers(self) -> list[pd.DataFrame]:
        """handleExpiredTimer for every due timer, in time order; each timer is deleted after its call."""
        if self.timeout_conf == GroupStateTimeout.ProcessingTimeTimeout:
            threshold = self.processing_time_ms
        elif self.timeout_conf == GroupStateTimeout.EventTimeTimeout and self.watermark_ms != NO_TIMESTAMP:
            threshold = self.watermark_ms
        else:
            return []
        outputs: list[pd.DataFrame] = []
        for timestamp, nkey in self.timers.due(threshold):
            outputs.extend(self.fire(nkey, timestamp))
        return outputs

    def fire(self, nkey: NormalizedKey, timestamp: int) -> list[pd.DataFrame]:
        """``handleExpiredTimer`` for the timer of ``nkey`` at ``timestamp``; the timer is deleted after the call.

        After, as Spark: the firing timer is still listed by ``listTimers()`` during it.
        """
        self.fired += 1
        self.set_key(nkey)
        result = self.processor.handleExpiredTimer(
            spark_key(nkey, self.key_types), self.timer_values(), ExpiredTimerInfo(timestamp)
        )
        frames = output_frames(denormalize_key(nkey), result)
        self.timers.delete(nkey, timestamp)
        return frames

    def sweep(self) -> int:
        """Delete the state that expired by the batch's processing time; returns how many entries went."""
        return sum(v.sweep(self.processing_time_ms) for v in self.variables.values())

    def close(self) -> None:
        """The processor's ``close()``, once, when its instance closes."""
        self.processor.close()


class _AtKey:
    """``with runtime.at_group(k):`` runs under grouping key ``k`` and restores the current one after."""

    def __init__(self, runtime: ProcessorRuntime, composite_group: NormalizedKey) -> None:
        self._runtime = runtime
        columns = key_columns(composite_group)[: runtime.group_columns]
        self._key = normalize_key(columns)
        self._saved: Any = None

    def __enter__(self) -> None:
        self._saved = self._runtime.nkey
        self._runtime.set_key(self._key)

    def __exit__(self, *exc: object) -> None:
        self._runtime.set_key(self._saved)
