"""The :class:`Aggregation` base class: what every mergeable aggregation implements.

An aggregation turns rows into partials (vectorized, one per group of a
:class:`~buffering.aggregations.engine.Grouping`), merges partials, and turns
a partial into its result; the conventions every aggregation follows are in
the :mod:`buffering.aggregations` docstring.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .engine import Grouping, _as_by, _check_columns
from .types import type_name


class Aggregation(ABC):
    """A mergeable aggregation of one input column (or of rows, for ``Count()``).

    Subclasses implement :meth:`_grouped` (vectorized partials for a
    :class:`Grouping`), :meth:`merge`, :meth:`result`, :meth:`empty` and
    :meth:`output_type`.
    """

    #: whether the aggregation needs an input column
    needs_column: bool = True
    #: dtype of the Series returned by :meth:`partials`
    partial_dtype: Any = object

    def __init__(self, column: str | None = None) -> None:
        if column is None and self.needs_column:
            raise TypeError(f"{type(self).__name__} needs an input column, e.g. {type(self).__name__}('amount')")
        if column is not None and not isinstance(column, str):
            raise TypeError(f"{type(self).__name__}: the column must be a str, got {column!r}")
        self.column: str | None = column

    # -- partials
    def partials(self, df: pd.DataFrame, by: str | Sequence[str]) -> pd.Series:
        """One partial per group of ``by`` (keys in order of first appearance), vectorized."""
        by = _as_by(by)
        _check_columns(df, [*by, *self.input_columns], repr(self))
        grouping = Grouping.of(df, by)
        return self._series(df, grouping)

    def partial(self, df: pd.DataFrame) -> Any:
        """The partial of a whole frame (one key); ``empty()`` for a frame without rows."""
        _check_columns(df, self.input_columns, repr(self))
        if len(df) == 0:
            return self.empty()
        return self._grouped(df, Grouping.single(df))[0]

    @property
    def input_columns(self) -> list[str]:
        return [] if self.column is None else [self.column]

    def _series(self, df: pd.DataFrame, grouping: Grouping) -> pd.Series:
        values = self._grouped(df, grouping)
        return pd.Series(values, index=grouping.index, dtype=self.partial_dtype, copy=False)

    @abstractmethod
    def _grouped(self, df: pd.DataFrame, grouping: Grouping) -> np.ndarray:
        """The partials of every group of ``grouping`` as an array (object unless ``partial_dtype``)."""

    # -- merging
    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """Combine two partials (``a`` from earlier rows than ``b``) without mutating them."""

    def merge_many(self, partials: Iterable[Any]) -> Any:
        """Merge partials in order (earliest first); ``empty()`` for none."""
        acc = self.empty()
        for p in partials:
            acc = self.merge(acc, p)
        return acc

    @abstractmethod
    def result(self, p: Any) -> Any:
        """The final value of a partial."""

    @abstractmethod
    def empty(self) -> Any:
        """The identity partial: what a key without rows has."""

    @abstractmethod
    def output_type(self, input_type: Any = None) -> str:
        """Arrow type name of :meth:`result` (see :func:`type_name`, :func:`arrow_type`).

        ``input_type`` is the input column's type (a pandas/numpy dtype, a
        pyarrow type or a type name); aggregations whose result type follows
        the input raise ValueError without it.
        """

    # -- helpers
    def _input(self, df: pd.DataFrame) -> pd.Series:
        assert self.column is not None
        return df[self.column]

    def _needs_input_type(self, input_type: Any) -> str:
        if input_type is None:
            raise ValueError(
                f"{self!r}.output_type() follows the input column's type: pass it, "
                f"e.g. output_type('int64') or output_type(df[{self.column!r}].dtype)"
            )
        return type_name(input_type)

    def _params(self) -> tuple:
        return (self.column,)

    def __repr__(self) -> str:
        args = [] if self.column is None else [repr(self.column)]
        args += [f"{k}={v!r}" for k, v in self._options().items()]
        return f"{type(self).__name__}({', '.join(args)})"

    def _options(self) -> dict[str, Any]:
        return {}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._params() == self._params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._params()))
