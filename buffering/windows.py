"""Windowed aggregations: ``aggregate({...}, window=Tumbling(...) | Hopping(...) | Session(...))``.

Each input row is assigned to its window(s) by its event time (the runner's
``event_time=`` column), vectorized: a tumbling window's start is the event
time floored to the size, a hopping row is repeated once per window that
holds it, and a session row starts a window ``[t, t + gap)`` of its own.

The window start joins the key: the buffer combines, and (tumbling, hopping)
the state holds, one accumulator per ``(key..., window start)``. Key groups
come from the user's key columns alone (the state table's ``group_columns``),
so every window of a key lives in the key's instance and checkpoints,
restores and rescaling work as for any key. Sessions keep one state entry per
key, its open sessions ``[[start, end, accumulator], ...]`` sorted by start,
since a row may merge two of them; a per-key timer at the earliest session's
close finds the keys to close.

A window closes when the watermark reaches its end + ``grace``
(``end + grace <= watermark``, Spark's eviction rule with grace 0); its state
is then deleted. A (row, window) pair whose window has already closed is late:
it is dropped and counted (``late_rows`` in the instance stats,
``dropped_late_rows`` in the runners' batch metrics). As in Spark, "already"
means by the watermark the previous batch ran with (the runners pass it as the
late-rows watermark), so a row behind the batch's own watermark but not the
previous one is counted in its window, which the batch then closes. Results carry the key
columns, ``window_start`` and ``window_end`` (UTC timestamps, end exclusive),
then the outputs; ``emit="watermark"`` emits each window once, when it
closes (Spark's append mode), ``emit="update"`` emits every window a batch
changed, with its running result (Spark's update mode).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pandas as pd

from state.blocks import KeyGroupCache
from state.group_state import NO_TIMESTAMP
from state.keys import NormalizedKey, key_column_values, key_columns, long_columns, normalize_key
from state.raw import KEY_GROUP_BYTES

from .protocol import event_time_ms

if TYPE_CHECKING:  # pragma: no cover
    from .aggregations.columnar import ColumnarLayout
    from .aggregations import Aggregations
    from .operator import OperatorInstance

#: Output columns (and, internally, the last key column of a window's state).
WINDOW_START = "window_start"
WINDOW_END = "window_end"
EMIT_MODES = ("watermark", "update")

#: A duration: milliseconds (int/float), a ``pd.Timedelta``/``datetime.timedelta``/``np.timedelta64``, or a string
#: pandas reads as one ("10 minutes", "30s").
Duration = Any


def duration_ms(name: str, value: Any, *, allow_zero: bool = False) -> int:
    """``value`` as whole milliseconds: an int/float (ms), a ``pd.Timedelta``/``datetime.timedelta``, or a
    string pandas reads as one ("10 minutes", "30s", "1h"). The error names the argument and the value."""
    import datetime as _dt

    if isinstance(value, bool):
        raise TypeError(f"{name} must be a duration (ms, a Timedelta or a string like '10 minutes'), got {value!r}")
    if isinstance(value, (int, np.integer)):
        ms = float(value)
    elif isinstance(value, (float, np.floating)):
        if math.isnan(value):
            raise ValueError(f"{name} must be a duration, got {value!r}")
        ms = float(value)
    elif isinstance(value, (str, pd.Timedelta, _dt.timedelta, np.timedelta64)):
        try:
            delta = pd.Timedelta(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}={value!r} is not a duration pandas can read ({exc})") from None
        if delta is pd.NaT:
            raise ValueError(f"{name} must be a duration, got {value!r}")
        ms = delta.value / 1_000_000
    else:
        raise TypeError(
            f"{name} must be a duration (ms, a Timedelta or a string like '10 minutes'), got {type(value).__name__} {value!r}"
        )
    if ms != int(ms):
        raise ValueError(f"{name}={value!r} is not a whole number of milliseconds")
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} duration, got {value!r}")
    return int(ms)


class WindowSpec:
    """What windows a row belongs to (a base class: use :class:`Tumbling`, :class:`Hopping` or :class:`Session`)."""

    #: The length of a window [start, start + length) as first assigned (a session's: the gap).
    length_ms: int

    def starts(self, event_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For event times (epoch ms): ``(row index, window start)`` of every (row, window) pair."""
        raise NotImplementedError

    def start_sql(self, ts_ms: str) -> str:
        """Spark SQL for the window start(s) of the epoch-ms expression ``ts_ms`` (an array for hopping)."""
        raise NotImplementedError

    @property
    def merges(self) -> bool:
        """Whether windows of a key merge (sessions)."""
        return False

    @property
    def windows_per_row_sql(self) -> bool:
        """Whether :meth:`start_sql` is an array (a row in several windows) to explode."""
        return False


@dataclass(frozen=True, init=False)
class Tumbling(WindowSpec):
    """Fixed, non-overlapping windows ``[start, start + size)``, starts at multiples of size (+ offset)
    from the epoch, as Spark's ``window(ts, size[, startTime=offset])``."""

    size_ms: int
    offset_ms: int

    def __init__(self, size: Duration, offset: Duration = 0) -> None:
        size_ms = duration_ms("Tumbling(size)", size)
        offset_ms = duration_ms("Tumbling(offset)", offset, allow_zero=True)
        if offset_ms >= size_ms:
            raise ValueError(f"Tumbling(offset={offset!r}) must be shorter than size={size!r}")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "offset_ms", offset_ms)

    @property
    def length_ms(self) -> int:  # type: ignore[override]
        return self.size_ms

    def starts(self, event_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # numpy's % on int64 is a floor modulo: right for times before the epoch too
        return np.arange(len(event_ms)), event_ms - np.mod(event_ms - self.offset_ms, self.size_ms)

    def start_sql(self, ts_ms: str) -> str:
        return f"({ts_ms} - pmod({ts_ms} - {self.offset_ms}L, {self.size_ms}L))"


@dataclass(frozen=True, init=False)
class Hopping(WindowSpec):
    """Overlapping windows of ``size`` starting every ``slide`` (+ offset): a row is in ``ceil(size / slide)``
    of them, as Spark's ``window(ts, size, slide[, startTime=offset])``."""

    size_ms: int
    slide_ms: int
    offset_ms: int

    def __init__(self, size: Duration, slide: Duration, offset: Duration = 0) -> None:
        size_ms = duration_ms("Hopping(size)", size)
        slide_ms = duration_ms("Hopping(slide)", slide)
        offset_ms = duration_ms("Hopping(offset)", offset, allow_zero=True)
        if slide_ms > size_ms:
            raise ValueError(
                f"Hopping(slide={slide!r}) is longer than size={size!r}: rows between windows would belong to none"
            )
        if offset_ms >= slide_ms:
            raise ValueError(f"Hopping(offset={offset!r}) must be shorter than slide={slide!r}")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "slide_ms", slide_ms)
        object.__setattr__(self, "offset_ms", offset_ms)

    @property
    def length_ms(self) -> int:  # type: ignore[override]
        return self.size_ms

    @property
    def windows_per_row(self) -> int:
        return -(-self.size_ms // self.slide_ms)

    @property
    def windows_per_row_sql(self) -> bool:
        return True

    def starts(self, event_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self.windows_per_row
        last = event_ms - np.mod(event_ms - self.offset_ms, self.slide_ms)  # the latest window holding the row
        starts = last[:, None] - self.slide_ms * np.arange(k, dtype=np.int64)[None, :]
        holds = starts + self.size_ms > event_ms[:, None]  # size not a multiple of slide: the oldest may miss
        rows = np.broadcast_to(np.arange(len(event_ms))[:, None], starts.shape)
        # oldest window first per row, as Spark's expansion
        return rows[:, ::-1][holds[:, ::-1]], starts[:, ::-1][holds[:, ::-1]]

    def start_sql(self, ts_ms: str) -> str:
        last = f"({ts_ms} - pmod({ts_ms} - {self.offset_ms}L, {self.slide_ms}L))"
        k = self.windows_per_row
        return (
            f"filter(transform(sequence({k - 1}, 0, -1), i -> {last} - i * {self.slide_ms}L), "
            f"s -> s + {self.size_ms}L > {ts_ms})"
        )


@dataclass(frozen=True, init=False)
class Session(WindowSpec):
    """Session windows: a row at ``t`` opens ``[t, t + gap)``; windows of a key that overlap merge, as
    Spark's ``session_window(ts, gap)``."""

    gap_ms: int

    def __init__(self, gap: Duration) -> None:
        object.__setattr__(self, "gap_ms", duration_ms("Session(gap)", gap))

    @property
    def length_ms(self) -> int:  # type: ignore[override]
        return self.gap_ms

    @property
    def merges(self) -> bool:
        return True

    def starts(self, event_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(len(event_ms)), event_ms

    def start_sql(self, ts_ms: str) -> str:
        return ts_ms


@dataclass(frozen=True)
class WindowConfig:
    """``aggregate(..., window=, grace=, emit=)``: the windows, their allowed lateness and when they are emitted."""

    spec: WindowSpec
    grace_ms: int = 0
    emit: str = "watermark"

    def __post_init__(self) -> None:
        if not isinstance(self.spec, WindowSpec) or type(self.spec) is WindowSpec:
            raise TypeError(
                f"window must be buffering.windows.Tumbling(...), Hopping(...) or Session(...), got {self.spec!r}"
            )
        if self.emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {list(EMIT_MODES)}, got {self.emit!r}")

    @classmethod
    def of(cls, window: Any, grace: Any = 0, emit: str = "watermark") -> "WindowConfig":
        return cls(window, duration_ms("grace", grace, allow_zero=True), emit)

    def closes_at(self, end_ms: Any) -> Any:
        """The watermark at which a window ending at ``end_ms`` closes."""
        return end_ms + self.grace_ms


def timestamps(ms: Any) -> pd.Series:
    """Epoch ms as UTC timestamps (what ``window_start``/``window_end`` hold)."""
    return pd.Series(pd.to_datetime(np.asarray(ms, dtype=np.int64), unit="ms", utc=True))


def window_starts(raw_keys: Sequence[bytes]) -> np.ndarray:
    """The window start each raw ``(key..., window start)`` key of a state table ends with (int64).

    The start is the key's last element, a long: encoded as ``0x01`` and 8 big-endian bytes, so it is
    the last 8 bytes of the raw key, whatever the user's key columns are. numpy work on the joined
    keys, no Python per key."""
    n = len(raw_keys)
    if not n:
        return np.empty(0, dtype=np.int64)
    joined = b"".join(raw_keys)
    widths = set(map(len, raw_keys))
    if len(widths) == 1:  # keys of fixed-width columns: the starts are a strided view of the joined keys
        width = widths.pop()
        return np.ndarray((n,), dtype=">i8", buffer=joined, offset=width - 8, strides=(width,)).astype(np.int64)
    ends = np.cumsum(np.fromiter(map(len, raw_keys), dtype=np.int64, count=n))
    gathered = np.frombuffer(joined, dtype=np.uint8)[(ends - 8)[:, None] + np.arange(8)]
    return gathered.view(">i8").ravel().astype(np.int64)


class _KeyGroupWindows:
    """The open windows of state kept as key-group blocks: per window start, the key groups holding
    windows of that start, and a heap of the starts.

    Not the keys: a close pops, from each key group listed under a closing start, every entry whose
    raw key ends with a start that closes (:meth:`KeyGroupCache.pop_selected`), so neither a merge
    nor a close does Python work per window. A merge records its (start, key group) pairs, a few
    per batch and key group."""

    def __init__(self) -> None:
        self.groups: dict[int, set[int]] = {}
        self.heap: list[int] = []

    @classmethod
    def of(cls, cache: KeyGroupCache, key_groups: Sequence[int]) -> "_KeyGroupWindows":
        """The open windows ``cache`` holds in ``key_groups``, read from their blocks (which a merge or a
        close would load next anyway)."""
        index = cls()
        for group, raws in cache.iter_group_keys(key_groups):
            index.record(window_starts(raws), np.full(len(raws), group, dtype=np.int64))
        return index

    def record(self, starts: np.ndarray, key_groups: np.ndarray) -> None:
        """Record windows of ``starts`` (one per window) in ``key_groups`` (the same length) as open."""
        if not len(starts):
            return
        order = np.lexsort((key_groups, starts))
        starts, key_groups = starts[order], key_groups[order]
        new = np.ones(len(starts), dtype=bool)
        new[1:] = (starts[1:] != starts[:-1]) | (key_groups[1:] != key_groups[:-1])
        for start, group in zip(starts[new].tolist(), key_groups[new].tolist()):
            bucket = self.groups.get(start)
            if bucket is None:
                bucket = self.groups[start] = set()
                heapq.heappush(self.heap, start)
            bucket.add(group)

    def due(self, last_start: int) -> set[int]:
        """The key groups holding windows with a start <= ``last_start``, no longer listed."""
        groups: set[int] = set()
        while self.heap and self.heap[0] <= last_start:
            groups |= self.groups.pop(heapq.heappop(self.heap))
        return groups


def user_key(nkey: NormalizedKey) -> NormalizedKey:
    """The user's key of a ``(key..., window start)`` key."""
    rest = key_columns(nkey)[:-1]
    return rest[0] if len(rest) == 1 and type(rest[0]) is not tuple else rest


def _window_starts(keys: Sequence[NormalizedKey]) -> np.ndarray:
    """The window start of each ``(key..., window start)`` key, as int64 (one C pass over the tuples)."""
    return np.fromiter(map(itemgetter(-1), keys), dtype=np.int64, count=len(keys))


class WindowRuntime:
    """The windows of one operator instance: assignment, late rows, merges, closing and emission.

    The operator calls it at its hooks (``OperatorInstance`` with
    ``spec.window``); it works on the instance's state, timers and buffer.
    """

    def __init__(self, config: WindowConfig, aggregations: "Aggregations", key_columns: Sequence[str], event_time: str) -> None:
        self.config = config
        self.spec = config.spec
        self.aggs = aggregations
        self.key_columns = list(key_columns)
        self.event_time = event_time
        #: Tumbling/hopping: window start -> keys of the open windows with that start (rebuilt from the
        #: state after a restore), and a heap of the starts, so closing visits only what closes. It also
        #: says which windows have state: a new window's accumulator is not looked up in the store.
        self._open: Optional[dict[int, set[NormalizedKey]]] = None
        self._heap: list[int] = []
        #: The same for windows' state kept as key-group blocks (``cached_state(layout="key_group")``
        #: with a column form): the key groups per start, not the keys.
        self._grouped: Optional[_KeyGroupWindows] = None
        #: Tumbling/hopping windows of aggregations with a column form: accumulators merged as columns
        #: (set by the operator, which stores them packed).
        self.layout: Optional["ColumnarLayout"] = None

    @property
    def buffer_key_columns(self) -> list[str]:
        """What the buffer (and pending table) keys by: the key columns plus the window start."""
        return [*self.key_columns, WINDOW_START]

    @property
    def state_group_columns(self) -> Optional[int]:
        """``group_columns`` of the state table: the key columns (None: sessions keep one entry per key)."""
        return None if self.spec.merges else len(self.key_columns)

    # ------------------------------------------------------------ rows in
    def _late(self, starts: np.ndarray, watermark_ms: int) -> np.ndarray:
        if watermark_ms == NO_TIMESTAMP:
            return np.zeros(len(starts), dtype=bool)
        return self.config.closes_at(starts + self.spec.length_ms) <= watermark_ms

    def assign(self, frame: pd.DataFrame, watermark_ms: int) -> tuple[pd.DataFrame, int]:
        """``frame``'s (row, window) pairs with a WINDOW_START column, without the late ones; and how many were late.

        Rows without an event time belong to no window and are dropped (as Spark's ``window()`` does).
        """
        if self.event_time not in frame.columns:
            raise KeyError(f"the event_time column {self.event_time!r} is missing from the rows (they have {list(frame.columns)})")
        column = frame[self.event_time]
        if column.isna().any():
            frame = frame.loc[column.notna().to_numpy()].reset_index(drop=True)
            column = frame[self.event_time]
        event = event_time_ms(column)
        rows, starts = self.spec.starts(event)
        late = self._late(starts, watermark_ms)
        n_late = int(late.sum())
        if n_late:
            rows, starts = rows[~late], starts[~late]
        if len(rows) == len(frame) and (not len(rows) or (rows == np.arange(len(frame))).all()):
            out = frame.assign(**{WINDOW_START: starts})
        else:
            out = frame.take(rows).reset_index(drop=True).assign(**{WINDOW_START: starts})
        return out, n_late

    def _open_positions(
        self, nkeys: list[NormalizedKey], rows: Sequence[int], watermark_ms: int
    ) -> tuple[Optional[np.ndarray], int]:
        """Positions of the ``(key..., window start)`` keys whose window is still open (None: all of them),
        and how many input rows the others stand for."""
        if watermark_ms == NO_TIMESTAMP or not nkeys:
            return None, 0
        starts = np.fromiter((key_columns(k)[-1] for k in nkeys), dtype=np.int64, count=len(nkeys))
        late = self._late(starts, watermark_ms)
        if not late.any():
            return None, 0
        return np.flatnonzero(~late), int(np.asarray(rows, dtype=np.int64)[late].sum())

    def drop_late_accumulators(
        self, nkeys: list[NormalizedKey], accumulators: list[Any], rows: list[int], watermark_ms: int
    ) -> tuple[list[NormalizedKey], list[Any], list[int], int]:
        """Accumulators combined before the shuffle per ``(key..., window start)``, without closed windows'."""
        keep, n_late = self._open_positions(nkeys, rows, watermark_ms)
        if keep is None:
            return nkeys, accumulators, rows, 0
        positions = keep.tolist()
        return [nkeys[i] for i in positions], [accumulators[i] for i in positions], [rows[i] for i in positions], n_late

    # ------------------------------------------------------------ merging
    def flush(self, instance: "OperatorInstance") -> list[pd.DataFrame]:
        """Merge the buffered partials into the windows' state; with ``emit="update"`` return the changed windows."""
        outputs: list[pd.DataFrame] = []
        rows = instance.row_partials  # a batch's raw rows as one block, when nothing waits in the buffer
        if rows is not None and len(rows):
            row_keys, block, _ = rows.drain()
            instance.metrics.calls += len(row_keys)
            outputs = self._merge_fixed(instance, row_keys, block)
        keys, partials = instance.buffer.drain_accumulators()
        if not keys:
            return outputs
        return [*outputs, *self._flush_partials(instance, keys, partials)]

    def _flush_partials(self, instance: "OperatorInstance", keys: list[NormalizedKey], partials: list[Any]) -> list[pd.DataFrame]:
        instance.metrics.calls += len(keys)
        if self.spec.merges:
            return self._flush_sessions(instance, keys, partials)
        if self.layout is not None:
            return self._merge_fixed(instance, keys, self.layout.from_accumulators(partials))
        state = instance.state
        held = self._held(instance, keys)
        merged = list(partials)
        if held:
            merge = self.aggs.merge
            for i, stored in zip(held, state.get_many([keys[i] for i in held])):
                if stored is not None:
                    merged[i] = merge(stored, merged[i])
        self._open_new(keys, held)
        state.put_many(zip(keys, merged))
        if self.config.emit != "update":
            return []
        return [self._fixed_frame(keys, merged, instance)]

    def _held(self, instance: "OperatorInstance", keys: list[NormalizedKey]) -> list[int]:
        """Positions of the ``(key..., window start)`` keys whose window is open (has state)."""
        index = self._index(instance)
        empty: frozenset = frozenset()
        return [i for i, nkey in enumerate(keys) if nkey in index.get(nkey[-1], empty)]

    def _open_new(self, keys: list[NormalizedKey], held: list[int]) -> None:
        """Record the windows of ``keys`` not in ``held`` (their positions) as open."""
        if len(held) == len(keys):
            return
        index = self._open
        assert index is not None
        is_held = np.zeros(len(keys), dtype=bool)
        is_held[held] = True
        for i in np.flatnonzero(~is_held).tolist():
            nkey = keys[i]
            start = nkey[-1]
            bucket = index.get(start)
            if bucket is None:
                bucket = index[start] = set()
                heapq.heappush(self._heap, start)
            bucket.add(nkey)

    def _merge_fixed(self, instance: "OperatorInstance", keys: list[NormalizedKey], incoming: list[Any]) -> list[pd.DataFrame]:
        """Merge a block of partials (one row per ``(key..., window start)``) into the windows' state as columns."""
        layout = self.layout
        assert layout is not None
        state = instance.state
        if isinstance(state, KeyGroupCache):  # cached_state(layout="key_group"): merged as byte ranges
            index = self._group_index(instance, state)
            block, key_groups = layout.merge_into(state, keys, incoming)
            index.record(_window_starts(keys), key_groups)
            if self.config.emit != "update":
                return []
            return [self._fixed_frame(keys, None, instance, layout.results(block))]
        held = self._held(instance, keys)
        stored: list[Any] = [None] * len(keys)
        if held:
            for i, value in zip(held, state.get_many([keys[i] for i in held])):
                stored[i] = value
        block = layout.merge(layout.decode(stored), incoming)
        state.put_many(zip(keys, layout.encode(block)))
        self._open_new(keys, held)
        if self.config.emit != "update":
            return []
        return [self._fixed_frame(keys, None, instance, layout.results(block))]

    def merge_columns(
        self,
        instance: "OperatorInstance",
        nkeys: list[NormalizedKey],
        partials: dict[str, Any],
        rows: list[int],
        watermark_ms: int,
    ) -> list[pd.DataFrame]:
        """Partials combined before the shuffle per ``(key..., window start)``, as columns: closed windows'
        rows dropped and counted, the others merged into the windows' state."""
        assert self.layout is not None
        keep, n_late = self._open_positions(nkeys, rows, watermark_ms)
        if keep is not None:
            instance.metrics.late_rows += n_late
            nkeys = [nkeys[i] for i in keep.tolist()]
            partials = {name: _take(column, keep) for name, column in partials.items()}
            if not nkeys:
                return []
        instance.metrics.calls += len(nkeys)  # the windows merged, as a flush counts them
        return self._merge_fixed(instance, nkeys, self.layout.from_columns(partials))

    def _flush_sessions(
        self, instance: "OperatorInstance", keys: list[NormalizedKey], partials: list[Any]
    ) -> list[pd.DataFrame]:
        gap = self.spec.length_ms
        by_user: dict[NormalizedKey, list[list[Any]]] = {}
        for nkey, partial in zip(keys, partials):
            start = key_columns(nkey)[-1]
            by_user.setdefault(user_key(nkey), []).append([start, start + gap, partial, True])
        users = list(by_user)
        stored = instance.state.get_many(users)
        merge = self.aggs.merge
        updates = []
        changed: list[tuple[NormalizedKey, list[Any]]] = []
        for ukey, old in zip(users, stored):
            windows = by_user[ukey]
            if old is not None:
                windows.extend([s, e, acc, False] for s, e, acc in old)
            windows.sort(key=lambda w: w[0])
            sessions: list[list[Any]] = []
            for w in windows:
                last = sessions[-1] if sessions else None
                if last is not None and w[0] <= last[1]:  # overlapping or touching: one session
                    last[1] = max(last[1], w[1])
                    last[2] = merge(last[2], w[2])
                    last[3] = last[3] or w[3]
                else:
                    sessions.append(list(w))
            updates.append((ukey, [[s, e, acc] for s, e, acc, _ in sessions]))
            changed.extend((ukey, w) for w in sessions if w[3])
            instance.timers.set(ukey, self.config.closes_at(min(w[1] for w in sessions)))  # the first to close
        instance.state.put_many(updates)
        if self.config.emit != "update":
            return []
        return [self._session_frame(changed, instance)]

    # ------------------------------------------------------------ closing
    def close(self, instance: "OperatorInstance", watermark_ms: int) -> list[pd.DataFrame]:
        """Close every window with ``end + grace <= watermark``: emit it (``emit="watermark"``), delete its state."""
        if watermark_ms == NO_TIMESTAMP:
            return []
        if self.spec.merges:
            return self._close_sessions(instance, watermark_ms)
        last_start = watermark_ms - self.config.grace_ms - self.spec.length_ms  # start + length + grace <= wm
        state = instance.state
        if isinstance(state, KeyGroupCache) and self.layout is not None:
            return self._close_key_groups(instance, state, last_start)
        index = self._index(instance)
        keys: list[NormalizedKey] = []
        while self._heap and self._heap[0] <= last_start:
            keys.extend(index.pop(heapq.heappop(self._heap), ()))
        if not keys:
            return []
        out: list[pd.DataFrame] = []
        if self.config.emit == "watermark":
            values = state.pop_many(keys)  # a cache keeps no entry for them: never read again
            present = [i for i, v in enumerate(values) if v is not None]
            if len(present) != len(keys):
                keys, values = [keys[i] for i in present], [values[i] for i in present]
            if self.layout is not None:
                out.append(self._fixed_frame(keys, None, instance, self.layout.results(self.layout.decode(values))))
            else:
                out.append(self._fixed_frame(keys, values, instance))
        else:
            instance.state.delete_uncached(keys)
        instance.metrics.expired += len(keys)
        return out

    def _close_key_groups(self, instance: "OperatorInstance", state: KeyGroupCache, last_start: int) -> list[pd.DataFrame]:
        """Close the windows with a start <= ``last_start`` of state kept as key-group blocks: popped from
        the key groups that hold them, selected by the start their raw keys end with."""
        assert self.layout is not None
        groups = self._group_index(instance, state).due(last_start)
        if not groups:
            return []
        raws, buffer, starts, lengths = state.pop_selected(sorted(groups), lambda keys: window_starts(keys) <= last_start)
        instance.metrics.expired += len(raws)
        if not raws or self.config.emit != "watermark":
            return []
        results = self.layout.results(self.layout.decode_buffer(buffer, starts, lengths))
        columns = long_columns(raws, KEY_GROUP_BYTES)
        if columns is None or len(columns) != len(self.key_columns) + 1:  # not all longs: decoded per key
            return [self._fixed_frame(state.table_store.decode_raw_keys(raws), None, instance, results)]
        instance.metrics.rows_out += len(raws)
        window_start = columns[-1]
        key_data = dict(zip(self.key_columns, columns))
        return [self._frame(key_data, window_start, window_start + self.spec.length_ms, None, results)]

    def _close_sessions(self, instance: "OperatorInstance", watermark_ms: int) -> list[pd.DataFrame]:
        due = instance.timers.due(watermark_ms + 1)  # timers strictly before the threshold
        if not due:
            return []
        users = [nkey for _, nkey in due]
        stored = instance.state.get_many(users)
        closed: list[tuple[NormalizedKey, list[Any]]] = []
        keep, gone = [], []
        for ukey, sessions in zip(users, stored):
            sessions = sessions or []
            still = [w for w in sessions if self.config.closes_at(w[1]) > watermark_ms]
            closed.extend((ukey, w) for w in sessions if self.config.closes_at(w[1]) <= watermark_ms)
            if still:
                keep.append((ukey, still))
                instance.timers.set(ukey, self.config.closes_at(min(w[1] for w in still)))
            else:
                gone.append(ukey)
                instance.timers.clear(ukey)
        if keep:
            instance.state.put_many(keep)
        if gone:
            instance.state.delete_uncached(gone)
        instance.metrics.expired += len(closed)
        if self.config.emit != "watermark" or not closed:
            return []
        return [self._session_frame(closed, instance)]

    # ------------------------------------------------------------ the open windows (tumbling, hopping)
    def _index(self, instance: "OperatorInstance") -> dict[int, set[NormalizedKey]]:
        if self._open is None:
            self._open = {}
            state = instance.state
            state.flush()  # the working table then holds every window with state
            # Key-group blocks are read back through their cache (the table holds block records).
            table = state if isinstance(state, KeyGroupCache) else instance.state_table
            key_list = getattr(table, "key_list", None)
            keys = key_list() if key_list is not None else [normalize_key(k) for k in table.keys()]
            if keys:  # grouped by window start with one sort, not a dict lookup per key
                starts = _window_starts(keys)
                order = np.argsort(starts, kind="stable")
                cuts = np.flatnonzero(np.diff(starts[order])) + 1
                for positions in np.split(order, cuts):
                    self._open[int(starts[positions[0]])] = set(map(keys.__getitem__, positions.tolist()))
            self._heap = list(self._open)
            heapq.heapify(self._heap)
        return self._open

    def _group_index(self, instance: "OperatorInstance", state: KeyGroupCache) -> _KeyGroupWindows:
        if self._grouped is None:
            self._grouped = _KeyGroupWindows.of(state, instance.key_groups)
        return self._grouped

    def reload(self) -> None:
        """The state changed under the instance (a restore, an adopted store): rebuild the index when next needed."""
        self._open = None
        self._heap = []
        self._grouped = None

    # ------------------------------------------------------------ output frames
    def _frame(
        self,
        key_data: dict[str, Any],
        starts: Any,
        ends: Any,
        accs: Optional[list[Any]],
        results: Optional[dict[str, Any]] = None,
    ) -> pd.DataFrame:
        """Output rows: the key columns (``key_data``), window start and end, then each output (from
        ``accs``, the accumulators, or ``results``, the outputs' columns)."""
        data: dict[str, Any] = dict(key_data)
        data[WINDOW_START] = timestamps(starts)
        data[WINDOW_END] = timestamps(ends)
        if results is not None:
            data.update(results)
        else:
            assert accs is not None
            for name, agg in self.aggs.items():
                result = agg.result
                column = np.empty(len(accs), dtype=object)
                column[:] = [result(acc[name] if name in acc else agg.empty()) for acc in accs]
                data[name] = column
        return pd.DataFrame(data, columns=[*self.key_columns, WINDOW_START, WINDOW_END, *self.aggs])

    def _fixed_frame(
        self,
        keys: list[NormalizedKey],
        accs: Optional[list[Any]],
        instance: "OperatorInstance",
        results: Optional[dict[str, Any]] = None,
    ) -> pd.DataFrame:
        starts = _window_starts(keys)
        instance.metrics.rows_out += len(keys)
        if len(self.key_columns) == 1:
            users = [k[0] for k in keys]  # the key's one normalized element
            if any(type(u) is tuple for u in users):  # a tagged element (float, timestamp...): a tuple key
                users = [(u,) for u in users]
        else:
            users = [k[:-1] for k in keys]
        return self._frame(key_column_values(users, self.key_columns), starts, starts + self.spec.length_ms, accs, results)

    def _session_frame(self, sessions: list[tuple[NormalizedKey, list[Any]]], instance: "OperatorInstance") -> pd.DataFrame:
        instance.metrics.rows_out += len(sessions)
        return self._frame(
            key_column_values([u for u, _ in sessions], self.key_columns),
            [w[0] for _, w in sessions],
            [w[1] for _, w in sessions],
            [w[2] for _, w in sessions],
        )


def _take(column: Any, keep: np.ndarray) -> Any:
    """Rows ``keep`` of a partials column (an array, a list, or a tuple of them)."""
    if isinstance(column, tuple):
        return tuple(_take(c, keep) for c in column)
    if isinstance(column, np.ndarray):
        return column[keep]
    return [column[i] for i in keep.tolist()]


def check_window_columns(key_columns: Sequence[str], outputs: Sequence[str]) -> None:
    """Key and output columns may not take the names of the window columns."""
    clash = [c for c in (*key_columns, *outputs) if c in (WINDOW_START, WINDOW_END)]
    if clash:
        raise ValueError(
            f"aggregate(window=...) adds the columns {WINDOW_START!r} and {WINDOW_END!r}; the key or outputs "
            f"already use {clash}"
        )


def check_runner_settings(spec: Any, event_time: Optional[str], timeout_conf: str) -> None:
    """A runner of a windowed aggregate needs an event-time column and no GroupState timeout."""
    if getattr(spec, "window", None) is None:
        return
    from state.group_state import GroupStateTimeout

    if event_time is None:
        raise ValueError(
            f"aggregate(window={spec.window.spec!r}) needs the runner's event_time= (the column the windows are over)"
        )
    if timeout_conf != GroupStateTimeout.NoTimeout:
        raise ValueError(
            f"aggregate(window=...) closes its windows by the watermark; drop timeout={timeout_conf!r}"
        )
