"""Arrow type names: the output types of aggregations.

:meth:`Aggregation.output_type <buffering.aggregations.Aggregation.output_type>`
answers with an Arrow type name (``"int64"``, ``"double"``, ``"string"``,
``"list<string>"``, ``"timestamp[us]"``, ...). :func:`type_name` names the
type of an input column (a pandas/numpy dtype, a pyarrow type or a name) that
way; :func:`arrow_type` parses a name back into a pyarrow type.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pandas.api import types as pdt


def type_name(t: Any) -> str:
    """The Arrow type name of a pandas/numpy dtype, a pyarrow type, or a type name.

    ``object`` means strings (the pandas convention); ``float64`` is
    ``"double"``; a name pandas does not know (``"list<string>"``,
    ``"timestamp[us]"``) is returned unchanged.
    """
    if isinstance(t, pa.DataType):
        return str(t)
    if isinstance(t, str):
        try:
            t = pdt.pandas_dtype(t)
        except TypeError:
            return t
    if isinstance(t, pd.CategoricalDtype):
        return type_name(t.categories.dtype)
    if isinstance(t, pd.DatetimeTZDtype):
        return f"timestamp[{t.unit}, tz={t.tz}]"
    if isinstance(t, pd.StringDtype) or t == np.dtype(object):
        return "string"
    if isinstance(t, pd.ArrowDtype):
        return str(t.pyarrow_dtype)
    if isinstance(t, pd.api.extensions.ExtensionDtype):
        numpy_dtype = getattr(t, "numpy_dtype", None)  # Int64, Float64, boolean
        if numpy_dtype is None:
            raise TypeError(f"no Arrow type for the pandas dtype {t!r}")
        t = numpy_dtype
    return str(pa.from_numpy_dtype(np.dtype(t)))


_TIMESTAMP = re.compile(r"timestamp\[(\w+)(?:,\s*tz=(.+))?\]$")


def arrow_type(name: str) -> pa.DataType:
    """Parse a type name as returned by :meth:`Aggregation.output_type` into a pyarrow type."""
    name = name.strip()
    if name.startswith("list<") and name.endswith(">"):
        inner = name[5:-1]
        if inner.startswith("item:"):
            inner = inner[5:]
        return pa.list_(arrow_type(inner))
    m = _TIMESTAMP.match(name)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    return pa.type_for_alias(name)
