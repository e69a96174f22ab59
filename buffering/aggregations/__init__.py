"""Mergeable aggregations: vectorized partials, merge, result.

An :class:`Aggregation` turns rows into a *partial* (a small, picklable
accumulator), merges partials, and turns a partial into the final value. The
mini-batch buffer uses them to pre-aggregate: it computes one partial per key
for each incoming pandas chunk (:meth:`Aggregation.partials`, vectorized: no
Python work per row), keeps one partial per key instead of the rows (memory
O(keys)), and merges the buffered partial into the key's state accumulator on a
flush. :class:`Aggregations` does the same for ``{output_column: aggregation}``
and is what an ``aggregate`` operator keeps per key: ``dict[out_col, partial]``.

>>> import pandas as pd
>>> df = pd.DataFrame({"k": ["a", "b", "a"], "x": [1, None, 3]})
>>> aggs = Aggregations({"n": Count(), "total": Sum("x"), "hi": Max("x")})
>>> aggs.partials(df, ["k"])  # doctest: +NORMALIZE_WHITESPACE
   n total    hi
k
a  2   4.0   3.0
b  1  None  None
>>> aggs.result(aggs.merge(aggs.partial(df.iloc[:2]), aggs.partial(df.iloc[2:])))
{'n': 3, 'total': 4.0, 'hi': 3.0}

Conventions (all aggregations):

* **Groups.** ``partials(df, by)`` returns one partial per group of the
  ``by`` columns, indexed by the group keys **in order of first appearance**
  (``groupby(by, sort=False, dropna=False)``): a plain :class:`pandas.Index`
  for one key column, a :class:`pandas.MultiIndex` for several. Rows whose key
  is null form their own group (keys are never null by contract; nothing is
  dropped silently).
* **Nulls** are ignored as in SQL (``None``, ``NaN``, ``NaT``, ``pd.NA``; pandas
  cannot tell a float NaN from a null, so NaN counts as null). ``Count()``
  counts rows, ``Count(col)`` non-null values; Sum/Min/Max/Mean/First/Last of a
  group with no non-null value is ``None``.
* **Partials are values.** They are Python objects (ints, floats, strings,
  tuples, :class:`HllPartial`), picklable with protocol 5, and treated as
  immutable: ``merge`` never mutates its inputs, but may return one of them
  unchanged (e.g. when the other is the identity).
* **Merge laws.** ``merge`` is associative for every aggregation, has
  ``empty()`` as identity, and is commutative except for :class:`First` and
  :class:`Last`, whose ``merge(earlier, later)`` keeps the earlier (First) or
  the later (Last) value. Float sums depend on the order of additions only up
  to rounding.
* **Output types** are Arrow type names (``"int64"``, ``"double"``,
  ``"string"``, ``"list<string>"``, ...); see :meth:`Aggregation.output_type`
  and :func:`arrow_type`.

Modules (everything above is importable from this package, as it was from the
single module it replaces):

* :mod:`~buffering.aggregations.types`: Arrow type names (:func:`type_name`,
  :func:`arrow_type`).
* :mod:`~buffering.aggregations.engine`: the group-reduction engine
  (:class:`Grouping`) and the column checks (:class:`ColumnNotFoundError`).
* :mod:`~buffering.aggregations.base`: the :class:`Aggregation` base class.
* :mod:`~buffering.aggregations.basic`: :class:`Count`, :class:`Sum`,
  :class:`Mean`, :class:`Min`, :class:`Max`, :class:`First`, :class:`Last`,
  :class:`CollectSet`.
* :mod:`~buffering.aggregations.sketches`: :class:`ApproxDistinct` and its
  :class:`HllPartial`.
* :mod:`~buffering.aggregations.collection`: :class:`Aggregations` and
  :func:`combine_frame`.
"""

from .base import Aggregation
from .basic import CollectSet, Count, First, Last, Max, Mean, Min, Sum
from .collection import Aggregations, combine_frame
from .engine import ColumnNotFoundError, Grouping
from .sketches import ApproxDistinct, HllPartial
from .types import arrow_type, type_name

# Names outside __all__ that are imported from here: Accumulator (the module's alias
# of an accumulator's type), _datasketches (buffering.spark._sql_combine) and
# _hll_partial, which stored state names: pickled sketches unpickle through
# buffering.aggregations._hll_partial.
from .collection import Accumulator  # noqa: F401
from .sketches import _datasketches, _hll_partial  # noqa: F401

__all__ = [
    "Aggregation",
    "Aggregations",
    "ApproxDistinct",
    "CollectSet",
    "ColumnNotFoundError",
    "Count",
    "First",
    "Grouping",
    "HllPartial",
    "Last",
    "Max",
    "Mean",
    "Min",
    "Sum",
    "arrow_type",
    "combine_frame",
    "type_name",
]
