"""The :class:`Aggregations` collection: ``{output_column: aggregation}`` run together.

What an ``aggregate`` operator and the mini-batch buffer hold: partials
frames of all outputs at once, accumulators (``dict[output_column, partial]``)
merged key by key, and results as dicts or frames.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, Callable

import numpy as np
import pandas as pd

from state.keys import denormalize_key, key_column_values, normalize_key

from .base import Aggregation
from .engine import Grouping, _as_by, _check_columns, _object_array


Accumulator = dict  # dict[out_col, partial]


class Aggregations(Mapping[str, Aggregation]):
    """``{output_column: aggregation}``: partials, merges and results of all outputs at once.

    An accumulator (what an ``aggregate`` operator keeps per key) is a
    ``dict[output_column, partial]``; a *partials frame* has one row per key
    (the group keys as index, as in :meth:`Aggregation.partials`) and one
    column of partials per output.
    """

    def __init__(self, aggs: Mapping[str, Aggregation] | Iterable[tuple[str, Aggregation]]) -> None:
        items = list(aggs.items() if isinstance(aggs, Mapping) else aggs)
        if not items:
            raise ValueError("Aggregations: at least one output is needed")
        self._aggs: dict[str, Aggregation] = {}
        for name, agg in items:
            if not isinstance(name, str):
                raise TypeError(f"Aggregations: output names must be str, got {name!r}")
            if not isinstance(agg, Aggregation):
                raise TypeError(f"Aggregations: {name!r} must be an Aggregation, got {agg!r}")
            if name in self._aggs:
                raise ValueError(f"Aggregations: duplicate output {name!r}")
            self._aggs[name] = agg

    # Mapping
    def __getitem__(self, name: str) -> Aggregation:
        return self._aggs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._aggs)

    def __len__(self) -> int:
        return len(self._aggs)

    def __repr__(self) -> str:
        return f"Aggregations({self._aggs!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Aggregations):
            return list(self._aggs.items()) == list(other._aggs.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def input_columns(self) -> list[str]:
        """The input columns needed, without repeats, in order."""
        return list(dict.fromkeys(c for agg in self._aggs.values() for c in agg.input_columns))

    # partials
    def partials(self, df: pd.DataFrame, by: str | Sequence[str]) -> pd.DataFrame:
        """The partials frame of ``df``: one row per group of ``by`` (first-appearance order)."""
        by = _as_by(by)
        _check_columns(df, [*by, *self.input_columns], "aggregate")
        grouping = Grouping.of(df, by)
        data = {name: agg._series(df, grouping) for name, agg in self._aggs.items()}
        return pd.DataFrame(data, index=grouping.index)

    def partial(self, df: pd.DataFrame) -> Accumulator:
        _check_columns(df, self.input_columns, "aggregate")
        return {name: agg.partial(df) for name, agg in self._aggs.items()}

    def empty(self) -> Accumulator:
        return {name: agg.empty() for name, agg in self._aggs.items()}

    # merging
    def merge(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> Accumulator:
        """Merge two accumulators (``a`` earlier); an output missing from one counts as empty."""
        if len(a) == len(b) == len(self._aggs):
            try:  # the common case: both complete
                return {name: agg.merge(a[name], b[name]) for name, agg in self._aggs.items()}
            except KeyError:
                pass  # an output of neither, or a stray name: the general path
        out = {}
        for name, agg in self._aggs.items():
            if name not in a:
                out[name] = b[name] if name in b else agg.empty()
            elif name not in b:
                out[name] = a[name]
            else:
                out[name] = agg.merge(a[name], b[name])
        return out

    def merge_many(self, accumulators: Iterable[Mapping[str, Any]]) -> Accumulator:
        accs = list(accumulators)
        return {name: agg.merge_many(acc[name] for acc in accs if name in acc) for name, agg in self._aggs.items()}

    def rows(self, frame: pd.DataFrame) -> Iterator[tuple[Hashable, Accumulator]]:
        """``(label, accumulator)`` for each row of a partials frame (label: scalar or tuple)."""
        names = list(self._aggs)
        columns = [frame[name].tolist() for name in names]
        for label, *partials in zip(frame.index.tolist(), *columns):
            yield label, dict(zip(names, partials))

    def merge_frames(self, earlier: pd.DataFrame, later: pd.DataFrame) -> pd.DataFrame:
        """Merge two partials frames key by key (keys in order of first appearance)."""
        merged: dict[Hashable, Accumulator] = {}
        for frame in (earlier, later):
            for label, acc in self.rows(frame):
                prev = merged.get(label)
                merged[label] = acc if prev is None else self.merge(prev, acc)
        index = earlier.index.append(later.index).unique()
        labels = index.tolist()
        data = {
            name: pd.Series(
                _object_array((merged[label][name] for label in labels), len(labels)),
                index=index,
                dtype=agg.partial_dtype,
            )
            for name, agg in self._aggs.items()
        }
        return pd.DataFrame(data, index=index)

    def merge_into(
        self,
        accumulators: MutableMapping[Hashable, Accumulator],
        frame: pd.DataFrame,
        key: Callable[[Any], Hashable] = normalize_key,
    ) -> list[Hashable]:
        """Merge each row of a partials frame into ``accumulators[key(label)]`` (created if absent).

        The frame's partials are the later ones. Accumulators are replaced,
        never mutated. Returns the keys updated, in frame order. With the
        default ``key`` the dict is keyed by :func:`state.keys.normalize_key`.
        """
        updated = []
        for label, acc in self.rows(frame):
            k = key(label)
            prev = accumulators.get(k)
            accumulators[k] = acc if prev is None else self.merge(prev, acc)
            updated.append(k)
        return updated

    # results
    def result(self, acc: Mapping[str, Any]) -> dict[str, Any]:
        """The final values of an accumulator (a missing output counts as empty)."""
        return {name: agg.result(acc[name] if name in acc else agg.empty()) for name, agg in self._aggs.items()}

    def results(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The results of a partials frame, same index, one column per output."""
        data = {}
        for name, agg in self._aggs.items():
            values = frame[name].tolist()
            data[name] = pd.Series(
                _object_array((agg.result(p) for p in values), len(values)), index=frame.index, dtype=object
            )
        return pd.DataFrame(data, index=frame.index)

    def results_frame(
        self,
        accumulators: Mapping[Hashable, Mapping[str, Any]],
        key_names: Sequence[str],
        keys: Iterable[Hashable] | None = None,
        key_columns: Callable[[Hashable], tuple] = denormalize_key,
    ) -> pd.DataFrame:
        """One row per key: the key columns (``key_names``), then one column per output.

        ``keys`` (default: all, in the mapping's order) selects the rows;
        ``key_columns`` turns a stored key into its column values (default
        :func:`state.keys.denormalize_key`).
        """
        key_names = list(key_names)
        keys = list(accumulators if keys is None else keys)
        data: dict[str, Any] = key_column_values(keys, key_names, key_columns)
        accs = [accumulators[k] for k in keys]
        for name, agg in self._aggs.items():
            if name in data:
                raise ValueError(f"output {name!r} is also a key column")
            result = agg.result
            try:
                values = [result(acc[name]) for acc in accs]
            except KeyError:  # an accumulator lacks this output: it counts as empty
                empty = agg.empty()
                values = [result(acc[name] if name in acc else empty) for acc in accs]
            column = np.empty(len(values), dtype=object)
            column[:] = values
            data[name] = column
        return pd.DataFrame(data, columns=[*key_names, *self._aggs])

    def output_types(self, input_types: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Arrow type name of each output, given the input columns' types (e.g. ``df.dtypes``)."""
        input_types = {} if input_types is None else input_types
        return {
            name: agg.output_type(input_types.get(agg.column) if agg.column is not None else None)
            for name, agg in self._aggs.items()
        }


def combine_frame(
    df: pd.DataFrame, by: str | Sequence[str], aggs: Mapping[str, Aggregation] | Aggregations
) -> pd.DataFrame:
    """All partials of all groups at once: ``Aggregations(aggs).partials(df, by)``."""
    if not isinstance(aggs, Aggregations):
        aggs = Aggregations(aggs)
    return aggs.partials(df, by)
