"""The mini-batch buffer: rows (or one partial per key) waiting for a count, size or time trigger.

Per-row work is vectorized: an incoming frame is factorized on its key
columns once, only its unique keys are normalized in Python, and rows are
kept as whole frames plus an integer key code per row. A flush groups the
rows by key with one stable sort, so the rows of a key keep arrival order.
With a mapping combiner the buffer keeps one accumulator per key instead of
rows (memory O(keys)); with a callable combiner, one combined frame per key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from state.keys import NormalizedKey, normalize_key

from .aggregations import Aggregations, Grouping
from .aggregations.columnar import ColumnarLayout, PackedAccumulator
from .aggregations.engine import _check_columns
from .decorators import MiniBatchConfig
from .frames import row_slices


def factorize_keys(
    df: pd.DataFrame, key_columns: list[str], key_types: Optional[Sequence[str]] = None
) -> tuple[np.ndarray, list[NormalizedKey]]:
    """Per-row codes into a list of normalized unique keys (first-appearance order).

    Nulls are a key as in Spark's grouping: ``None``/``NaN``/``pd.NA``/``NaT`` in
    a column whose Spark type (``key_types``; else the dtype) is not a double or
    float is the null element (a long column with nulls arrives as float64 NaN,
    its other values as whole floats, which are taken back as ints).
    In a double/float column NaN stays NaN (Spark's NaN is a value), since
    pandas cannot tell a null double from NaN.
    """
    if key_types is not None:
        kinds = [_kind(t) for t in key_types]
    else:
        kinds = ["f" if df[c].dtype.kind == "f" else "" for c in key_columns]

    def element(value: Any, kind: str) -> Any:
        if kind == "f" or type(value) is not float:
            return value
        if value != value:
            return None  # NaN outside a double/float column is pandas' null
        return int(value) if kind == "i" and value.is_integer() else value

    if len(key_columns) == 1:
        column = df[key_columns[0]]
        codes, uniques = pd.factorize(column, sort=False, use_na_sentinel=False)
        values = uniques.tolist()
        codes = codes.astype(np.int64, copy=False)
        if _fits_int64(column.dtype) or (column.dtype == object and _all_str(values)):
            return codes, values  # a bare int (of a numpy integer column: no nulls) or str is its normalized key
        kind = kinds[0]
        return codes, [normalize_key((element(v, kind),)) for v in values]
    integral = _integral_keys(df, key_columns)
    if integral is not None:
        return integral
    grouped = df.groupby(key_columns, sort=False, dropna=False)
    codes = grouped.ngroup().to_numpy(dtype=np.int64)
    first_rows = grouped.head(1)[key_columns]
    uniques = [
        normalize_key(tuple(element(v, k) for v, k in zip(row, kinds)))
        for row in first_rows.itertuples(index=False, name=None)
    ]
    return codes, uniques


def _fits_int64(dtype: Any) -> bool:
    """Whether a column of ``dtype`` holds only int64 values: a numpy signed integer, or an unsigned one
    narrower than 64 bits (a nullable ``Int64`` column is a pandas extension dtype and may hold pd.NA)."""
    return isinstance(dtype, np.dtype) and (dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8))


def _all_str(values: list[Any]) -> bool:
    """Whether every value is exactly a ``str`` (one C-level pass over the types)."""
    return all(t is str for t in set(map(type, values)))


#: The largest number of distinct value combinations _integral_keys numbers in one int64.
_MAX_COMBINATIONS = 1 << 62


def _integral_keys(df: pd.DataFrame, key_columns: list[str]) -> Optional[tuple[np.ndarray, list[NormalizedKey]]]:
    """:func:`factorize_keys` of key columns that are all numpy integers (no nulls), by hashing alone; None otherwise.

    Each column is factorized on its own, the codes combined into one int64
    per row (mixed radix) and that factorized again: O(rows), in C, with the
    unique keys built from the columns' unique values (a (key, window start)
    pair of 44k unique keys in 50k rows: 8 ms against 59 with a groupby and a
    normalized tuple per key in Python). Integers are already normalized.
    """
    if not all(_fits_int64(df[c].dtype) for c in key_columns):
        return None
    columns = [df[c].to_numpy() for c in key_columns]
    combined: Optional[np.ndarray] = None
    uniques_per_column = []
    combinations = 1
    for column in columns:
        codes, uniques = pd.factorize(column, sort=False)
        combinations *= max(len(uniques), 1)
        if combinations > _MAX_COMBINATIONS:
            return None
        uniques_per_column.append(uniques)
        codes = codes.astype(np.int64, copy=False)
        combined = codes if combined is None else combined * len(uniques) + codes
    assert combined is not None
    codes, first = pd.factorize(combined, sort=False)  # first-appearance order, as groupby(sort=False)
    positions = []
    for uniques in reversed(uniques_per_column):
        positions.append(first % len(uniques))
        first = first // len(uniques)
    positions.reverse()
    keys = list(zip(*(uniques[at].tolist() for uniques, at in zip(uniques_per_column, positions))))
    return codes.astype(np.int64, copy=False), keys


_INTEGRAL = frozenset(("long", "bigint", "int", "integer", "short", "smallint", "byte", "tinyint"))


def _kind(type_name: str) -> str:
    """"f": NaN is a value; "i": an integral column (a float64 of one with nulls holds whole floats); "": other."""
    if type_name in ("double", "float", "real"):
        return "f"
    return "i" if type_name in _INTEGRAL else ""


@dataclass
class _Chunk:
    frame: pd.DataFrame
    codes: np.ndarray  # global key ids (into MiniBatchBuffer._keys)


class MiniBatchBuffer:
    """Buffered input of one operator instance, flushed as a whole when a trigger fires."""

    def __init__(
        self, key_columns: list[str], config: Optional[MiniBatchConfig], key_types: Optional[Sequence[str]] = None
    ) -> None:
        self.key_columns = list(key_columns)
        self.key_types = key_types
        self.config = config
        self.aggregations: Optional[Aggregations] = config.aggregations if config is not None else None
        self.combine_fn: Optional[Callable[[pd.DataFrame], pd.DataFrame]] = (
            config.combine if config is not None and callable(config.combine) else None  # type: ignore[assignment]
        )
        self.rows = 0
        self.bytes = 0
        self.oldest_ms: Optional[int] = None
        self.flushes = 0
        self._keys: dict[NormalizedKey, int] = {}  # key -> id, in first-arrival order
        self._arrival: dict[NormalizedKey, int] = {}
        self._key_rows: dict[NormalizedKey, int] = {}  # rows per key (the count trigger survives restores)
        self._key_bytes: dict[NormalizedKey, float] = {}  # input bytes per key (so does the size trigger)
        self._chunks: list[_Chunk] = []
        self._partials: dict[NormalizedKey, Any] = {}  # combine mode: key -> accumulator / frame

    # ------------------------------------------------------------ triggers
    @property
    def combined(self) -> bool:
        return self.aggregations is not None or self.combine_fn is not None

    def room(self, row_bytes: float = 0.0) -> Optional[int]:
        """Rows (of ``row_bytes`` each) that fit before the count or size trigger fires (None: no such trigger)."""
        config = self.config
        if config is None:
            return None
        rows: Optional[int] = None
        if config.max_rows is not None:
            rows = max(1, config.max_rows - self.rows)
        if config.max_bytes is not None and row_bytes > 0:
            by_size = max(1, -(-(config.max_bytes - self.bytes) // int(max(1, row_bytes))))
            rows = by_size if rows is None else min(rows, by_size)
        return rows

    def should_flush(self, now_ms: int) -> bool:
        config = self.config
        if not self.rows and not self._partials:
            return False
        if config is None or not config.triggered:
            return True  # no trigger: every micro-batch is flushed at its end
        if config.max_rows is not None and self.rows >= config.max_rows:
            return True
        if config.max_bytes is not None and self.bytes >= config.max_bytes:
            return True
        if config.max_delay_ms is not None and self.oldest_ms is not None:
            return now_ms - self.oldest_ms >= config.max_delay_ms
        return False

    def __len__(self) -> int:
        """Keys pending."""
        return len(self._keys)

    def __contains__(self, nkey: object) -> bool:
        return nkey in self._keys

    # ------------------------------------------------------------ adding
    def add(self, frame: pd.DataFrame, arrival_ms: int) -> None:
        """Buffer ``frame`` (arrived at ``arrival_ms``); rows keep their order per key."""
        if not len(frame):
            return
        codes, uniques = factorize_keys(frame, self.key_columns, self.key_types)
        ids = np.empty(len(uniques), dtype=np.int64)
        counts = np.bincount(codes, minlength=len(uniques)).tolist()
        sized = self.config is not None and self.config.max_bytes is not None
        frame_bytes = int(frame.memory_usage(index=False, deep=False).sum()) if sized else 0
        row_bytes = frame_bytes / len(frame)
        keys = self._keys
        key_rows = self._key_rows
        key_bytes = self._key_bytes
        for i, nkey in enumerate(uniques):
            kid = keys.get(nkey)
            if kid is None:
                kid = keys[nkey] = len(keys)
                self._arrival[nkey] = arrival_ms
                key_rows[nkey] = 0
                key_bytes[nkey] = 0.0
            key_rows[nkey] += counts[i]
            key_bytes[nkey] += counts[i] * row_bytes
            ids[i] = kid
        if self.oldest_ms is None:
            self.oldest_ms = arrival_ms
        self.rows += len(frame)
        self.bytes += frame_bytes
        if self.aggregations is not None:
            partials = self.aggregations.partials(frame, self.key_columns)
            for nkey, (_, accumulator) in zip(uniques, self.aggregations.rows(partials)):
                previous = self._partials.get(nkey)
                self._partials[nkey] = accumulator if previous is None else self.aggregations.merge(previous, accumulator)
        elif self.combine_fn is not None:
            for nkey, rows in _grouped([_Chunk(frame.reset_index(drop=True), codes)], uniques):
                previous = self._partials.get(nkey)
                rows = rows if previous is None else pd.concat([previous, rows], ignore_index=True)
                self._partials[nkey] = self.combine_fn(rows.reset_index(drop=True))
        else:
            self._chunks.append(_Chunk(frame.reset_index(drop=True), ids[codes]))

    def add_accumulators(self, nkeys: list[NormalizedKey], accumulators: list[Any], rows: list[int], arrival_ms: int) -> None:
        """Buffer accumulators combined upstream (a map-side combine before the shuffle).

        ``rows[i]`` is how many input rows ``accumulators[i]`` stands for, so the
        count trigger and the metrics see the input, not the partials.
        """
        aggs = self.aggregations
        if aggs is None:
            raise TypeError("add_accumulators() needs a buffer whose combiner is a mapping of Aggregations")
        if not nkeys:
            return
        keys = self._keys
        partials = self._partials
        if not keys and len(nkeys) == len(accumulators) == len(rows):
            order = dict(zip(nkeys, range(len(nkeys))))
            if len(order) == len(nkeys):  # an empty buffer and distinct keys (as a SQL combine gives): in bulk
                self._keys = order
                self._arrival = dict.fromkeys(nkeys, arrival_ms)
                self._key_rows = dict(zip(nkeys, rows))
                self._key_bytes = dict.fromkeys(nkeys, 0.0)
                self._partials = dict(zip(nkeys, accumulators))
                self.rows += sum(rows)
                self.oldest_ms = arrival_ms
                return
        merge = aggs.merge
        for nkey, accumulator, n in zip(nkeys, accumulators, rows):
            if nkey not in keys:
                keys[nkey] = len(keys)
                self._arrival[nkey] = arrival_ms
                self._key_rows[nkey] = 0
                self._key_bytes[nkey] = 0.0
                partials[nkey] = accumulator
            else:
                partials[nkey] = merge(partials[nkey], accumulator)
            self._key_rows[nkey] += n
            self.rows += n
        if self.oldest_ms is None:
            self.oldest_ms = arrival_ms

    # ------------------------------------------------------------ draining
    def drain(self) -> Iterator[tuple[NormalizedKey, pd.DataFrame]]:
        """Every pending key with its rows (or one combined row), keys in first-arrival order; empties the buffer."""
        keys, frames = self.drain_keyed()
        return zip(keys, frames)

    def drain_keyed(self) -> tuple[list[NormalizedKey], Iterator[pd.DataFrame]]:
        """:meth:`drain` as the list of keys and an iterator of their frames, made one at a time.

        The buffer is emptied at once. A frame per key made only when it is
        handed on keeps a flush of many keys from holding all of them alive
        (every full garbage collection of the flush would walk them).
        """
        keys = list(self._keys)
        partials = self._partials
        chunks = self._chunks
        self._reset()
        self.flushes += 1
        if self.aggregations is not None:
            # One frame for the whole flush (one column of partials per output, as a direct
            # call combines them); each key gets a one-row slice, far cheaper than a frame per key.
            columns: dict[str, Any] = {}
            for name in self.aggregations:
                columns[name] = _object_column([partials[k].get(name) for k in keys])
            combined = pd.DataFrame(columns)
            return keys, (combined.iloc[i : i + 1] for i in range(len(keys)))
        if self.combine_fn is not None:
            return keys, (partials[nkey] for nkey in keys)
        if not chunks:
            return [], iter(())
        return _grouped_parts(chunks, keys)

    def drain_accumulators(self) -> tuple[list[NormalizedKey], list[Any]]:
        """Combine mode with aggregations: pending keys and their accumulators; empties the buffer."""
        assert self.aggregations is not None
        keys = list(self._keys)
        partials = self._partials
        self._reset()
        self.flushes += 1
        return keys, [partials[k] for k in keys]

    def _reset(self) -> None:
        self._keys = {}
        self._arrival = {}
        self._key_rows = {}
        self._key_bytes = {}
        self._chunks = []
        self._partials = {}
        self.rows = 0
        self.bytes = 0
        self.oldest_ms = None

    # ------------------------------------------------------------ checkpointing
    def snapshot(self) -> dict[NormalizedKey, tuple[int, int, int, int, Any]]:
        """What is pending, per key: ``(arrival order, arrival_ms, rows, bytes, payload)``; the buffer is unchanged.

        The payload is the key's rows as ``{column: ndarray}``, its accumulator,
        or its combined rows. Input rows and bytes per key keep the count and
        size triggers exact after a restore.
        """
        out: dict[NormalizedKey, tuple[int, int, int, int, Any]] = {}
        if self.combined:
            for nkey, kid in self._keys.items():
                value = self._partials[nkey]
                if isinstance(value, pd.DataFrame):
                    value = _columns(value)
                out[nkey] = (kid, self._arrival[nkey], self._key_rows[nkey], round(self._key_bytes[nkey]), value)
            return out
        if self._chunks:
            for nkey, rows in _grouped(self._chunks, list(self._keys)):
                out[nkey] = (
                    self._keys[nkey],
                    self._arrival[nkey],
                    self._key_rows[nkey],
                    round(self._key_bytes[nkey]),
                    _columns(rows),
                )
        return out

    def restore(self, pending: Iterator[tuple[NormalizedKey, tuple[int, int, int, int, Any]]]) -> None:
        """Refill the buffer from snapshots (after a restore), in the original arrival order."""
        self._reset()
        for nkey, (_, arrival_ms, rows, size, value) in sorted(pending, key=lambda item: (item[1][1], item[1][0])):
            self._keys[nkey] = len(self._keys)
            self._arrival[nkey] = arrival_ms
            self._key_rows[nkey] = rows
            self._key_bytes[nkey] = float(size)
            self.rows += rows
            self.bytes += size
            self.oldest_ms = arrival_ms if self.oldest_ms is None else min(self.oldest_ms, arrival_ms)
            if self.aggregations is not None:
                self._partials[nkey] = value
            elif self.combine_fn is not None:
                self._partials[nkey] = pd.DataFrame(value)
            else:
                frame = pd.DataFrame(value)
                self._chunks.append(_Chunk(frame, np.full(len(frame), self._keys[nkey], dtype=np.int64)))


class KeyedBlock:
    """Blocks of ``aggregate()`` partials arriving in parts, merged into one block with a row per key.

    A part is a block (:class:`ColumnarLayout`) whose rows belong to distinct
    normalized keys; a key in several parts gets their rows merged. Keys keep
    their first-arrival order. O(keys + partials) numpy work per part, no
    Python object per key besides its dict entry.
    """

    def __init__(self, layout: ColumnarLayout) -> None:
        self.layout = layout
        self._ids: dict[NormalizedKey, int] = {}  # key -> its row of the block
        self._rows: list[int] = []  # input rows per key
        self.rows = 0  # input rows in all
        self._block: Optional[list[Any]] = None

    def __len__(self) -> int:
        """Keys held."""
        return len(self._ids)

    def add(self, nkeys: Sequence[NormalizedKey], block: list[Any], rows: Sequence[int]) -> None:
        """Merge ``block``: its row i holds the partials of ``nkeys[i]`` (distinct keys) over ``rows[i]`` input rows."""
        ids = self._ids
        before = len(ids)
        self.rows += int(sum(rows))
        if not before:  # the first part (often the only one): its keys are the ids 0..n-1, made in C
            ids.update(zip(nkeys, range(len(nkeys))))
            if len(ids) == len(nkeys):
                self._rows, self._block = list(rows), block
                return
            ids.clear()  # keys not distinct, against the contract: the general way below, as before
        where = np.fromiter((ids.setdefault(nkey, len(ids)) for nkey in nkeys), dtype=np.int64, count=len(nkeys))
        counts = self._rows
        counts.extend([0] * (len(ids) - before))
        for row, count in zip(where.tolist(), rows):
            counts[row] += count
        n = len(ids)
        layout = self.layout
        block = layout.spread(block, where, n)
        if self._block is not None:
            block = layout.merge(layout.spread(self._block, np.arange(before, dtype=np.int64), n), block)
        self._block = block

    def drain(self) -> tuple[list[NormalizedKey], list[Any], list[int]]:
        """The keys, their block (row i: key i) and input rows per key; empties this."""
        keys, block, rows = list(self._ids), self._block, self._rows
        self._ids, self._block, self._rows, self.rows = {}, None, [], 0
        return keys, (block if block is not None else self.layout.empty(0)), rows


class RowPartials:
    """A batch's raw rows for an ``aggregate()`` kept as columns: one block of partials for all its keys.

    Without a trigger an aggregate folds a whole batch into its state at the
    batch's end. The buffer's way, a partial object per key and chunk merged
    per key (a DataSketches sketch per key, one call per value), costs Python
    work per key and value; here the rows of the batch's chunks wait as they
    came (their key and input columns) and are folded into one block at the
    end (:meth:`ColumnarLayout.from_rows`: one factorization, numpy partials,
    HyperLogLog coupons hashed with numpy). Past ``fold_rows`` waiting rows
    they are folded early into a :class:`KeyedBlock`, so memory stays
    O(keys + fold_rows). Keys keep their first-arrival order.
    """

    def __init__(
        self,
        key_columns: list[str],
        key_types: Optional[Sequence[str]],
        layout: ColumnarLayout,
        aggregations: Aggregations,
        fold_rows: int = 1 << 20,
    ) -> None:
        self.key_columns = list(key_columns)
        self.key_types = key_types
        self.layout = layout
        self.aggregations = aggregations
        self.fold_rows = fold_rows
        self._columns = list(dict.fromkeys([*self.key_columns, *aggregations.input_columns]))
        self._frames: list[pd.DataFrame] = []
        self._waiting = 0  # rows in _frames
        self._folded = KeyedBlock(layout)
        self.first_ms: Optional[int] = None

    def __len__(self) -> int:
        """Rows waiting (folded or not)."""
        return self._waiting + self._folded.rows

    def add(self, frame: pd.DataFrame, arrival_ms: int) -> None:
        """Take a chunk of the batch (checked for the key and input columns now, folded later)."""
        if not len(frame):
            return
        _check_columns(frame, self._columns, "aggregate")
        self._frames.append(frame[self._columns])
        self._waiting += len(frame)
        if self.first_ms is None:
            self.first_ms = arrival_ms
        if self._waiting >= self.fold_rows:
            self._fold()

    def _fold(self) -> None:
        frames, self._frames, self._waiting = self._frames, [], 0
        if not frames:
            return
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        codes, uniques = factorize_keys(frame, self.key_columns, self.key_types)
        keys = list(dict.fromkeys(uniques))
        if len(keys) < len(uniques):  # values that normalize to one key (1 and 1.0 of objects)
            position = {nkey: i for i, nkey in enumerate(keys)}
            codes = np.array([position[nkey] for nkey in uniques], dtype=np.int64)[codes]
        grouping = Grouping(codes, len(keys), None)
        rows = np.bincount(codes, minlength=len(keys)).tolist()
        self._folded.add(keys, self.layout.from_rows(self.aggregations, frame, grouping), rows)

    def drain(self) -> tuple[list[NormalizedKey], list[Any], list[int]]:
        """The keys (first-arrival order), their block of partials and input rows per key; empties this."""
        self._fold()
        self.first_ms = None
        return self._folded.drain()

    def drain_accumulators(self) -> tuple[list[NormalizedKey], list[Any], list[int]]:
        """:meth:`drain` with each key's partials as an accumulator (a mapping ``{output: partial}``)."""
        keys, block, rows = self.drain()
        return keys, [PackedAccumulator(value) for value in self.layout.encode(block)], rows


def _grouped(chunks: list[_Chunk], keys: list[NormalizedKey]) -> Iterator[tuple[NormalizedKey, pd.DataFrame]]:
    """Rows of the chunks grouped by key id (``keys[id]``), ids ascending, arrival order within a key."""
    grouped_keys, frames = _grouped_parts(chunks, keys)
    return zip(grouped_keys, frames)


def _grouped_parts(chunks: list[_Chunk], keys: list[NormalizedKey]) -> tuple[list[NormalizedKey], Iterator[pd.DataFrame]]:
    """:func:`_grouped` as the keys in order and an iterator of their rows (each frame made on demand).

    One stable sort and one take per flush (O(rows log rows)); then each key's
    frame is cut from the sorted rows in O(blocks) (:func:`~.frames.row_slices`),
    with the index ``0..n-1``.
    """
    frame = chunks[0].frame if len(chunks) == 1 else pd.concat([c.frame for c in chunks], ignore_index=True)
    codes = chunks[0].codes if len(chunks) == 1 else np.concatenate([c.codes for c in chunks])
    order = np.argsort(codes, kind="stable")  # stable: arrival order within a key
    sorted_codes = codes[order]
    bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(codes)])).tolist()
    grouped_keys = [keys[code] for code in sorted_codes[starts].tolist()]
    return grouped_keys, row_slices(frame.take(order), starts.tolist(), ends)


def _object_column(values: list[Any]) -> Any:
    """A column that keeps partials as they are (ints stay ints, sketches stay objects)."""
    if all(type(v) is int for v in values):
        return values
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return {column: frame[column].to_numpy() for column in frame.columns}
