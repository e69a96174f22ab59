"""State schemas: store a state tuple as Spark's ``stateStructType`` would.

Spark's applyInPandasWithState pickles the state through the JVM, which keeps a
field only when the value's type fits the field and stores null otherwise. The
rules below were measured on PySpark 4.3 (a state of one value in a field of
every type, updated in one micro-batch and read back in the next):

=========  ===============================================================
field      value read back
=========  ===============================================================
long, int  an ``int`` (or numpy integer) as it is; float, bool, str: null
double     a ``float`` (or numpy float) as it is; int, bool, str: null
float      a float, rounded to 32 bits; int, bool, str: null
string     str as it is; int ``"1"``; float ``"1.5"``; bool ``"true"``
boolean    a bool; anything else: null
date       a date; a datetime becomes its date (other types fail the query)
timestamp  a datetime (other types fail the query)
=========  ===============================================================

``None`` is null in every field. A datetime or date in a string field, which
Spark stores as the text of a ``java.util.GregorianCalendar``, is refused here.
Other field types (binary, decimal, intervals, nested) keep their value.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from decimal import Decimal
from typing import Any, Sequence

_INTEGRAL = frozenset(("long", "bigint", "int", "integer", "short", "smallint", "byte", "tinyint"))
_FLOATING = frozenset(("double", "float", "real"))
_ALIASES = {"bigint": "long", "integer": "int", "smallint": "short", "tinyint": "byte", "real": "float", "bool": "boolean"}


def canonical_type_name(type_name: str) -> str:
    """One name per Spark type: ``"bigint"`` is ``"long"``, ``"integer"`` ``"int"``, and so on (others as given)."""
    return _ALIASES.get(type_name, type_name)


class StateSchema:
    """The fields of a state tuple (names and Spark type names) and the conversion Spark applies on store."""

    def __init__(self, fields: Sequence[tuple[str, str]]) -> None:
        if not fields:
            raise ValueError("a state schema needs at least one field")
        self.fields = [(str(name), str(type_name)) for name, type_name in fields]

    @classmethod
    def of(cls, schema: Any) -> "StateSchema":
        """From a pyspark ``StructType``, a DDL string (``"count long, seen date"``) or a StateSchema."""
        if isinstance(schema, StateSchema):
            return schema
        if isinstance(schema, str):
            return cls(_parse_ddl(schema))
        fields = getattr(schema, "fields", None)
        if fields is None:
            raise TypeError(f"state_schema {schema!r} must be a StructType or a DDL string such as 'count long'")
        return cls([(f.name, f.dataType.simpleString()) for f in fields])

    def __repr__(self) -> str:
        return "StateSchema(" + ", ".join(f"{n} {t}" for n, t in self.fields) + ")"

    def convert(self, value: Any) -> tuple:
        """The tuple Spark reads back after storing ``value`` (see the module docstring)."""
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"state value {value!r} must be a tuple with one item per field of {self!r}")
        if len(value) != len(self.fields):
            raise ValueError(f"state value {value!r} has {len(value)} items but {self!r} has {len(self.fields)} fields")
        return tuple(_convert(v, name, type_name) for v, (name, type_name) in zip(value, self.fields))


def _parse_ddl(ddl: str) -> list[tuple[str, str]]:
    text = ddl.strip()
    if text.lower().startswith("struct<") and text.endswith(">"):
        text = text[7:-1]
    fields = []
    for part in _split_top_level(text):
        match = re.fullmatch(r"\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+(.+?)\s*", part)
        if match is None:
            raise ValueError(f"state_schema {ddl!r}: cannot read the field {part.strip()!r} (expected 'name type')")
        fields.append((match.group(1), match.group(2).lower()))
    return fields


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _is_int(v: Any) -> bool:
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    return isinstance(v, int) or (type(v).__module__ == "numpy" and type(v).__name__.startswith(("int", "uint")))


def _is_float(v: Any) -> bool:
    return isinstance(v, float) or (type(v).__module__ == "numpy" and type(v).__name__.startswith("float"))


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"


def _java_double(x: float) -> str:
    """Java's Double.toString: shortest digits, scientific outside [1e-3, 1e7)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return f"{x:f}".rstrip("0").rstrip(".") + (".0" if float(x).is_integer() else "") if "e" in repr(x) else repr(x)
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    text = "".join(map(str, digits))
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{len(digits) - 1 + int(exponent)}"


def _convert(v: Any, name: str, type_name: str) -> Any:
    if v is None:
        return None
    t = canonical_type_name(type_name)
    if t in _INTEGRAL or t in ("long", "int", "short", "byte"):
        return int(v) if _is_int(v) else None
    if t == "double":
        return float(v) if _is_float(v) else None
    if t == "float":
        if not _is_float(v):
            return None
        import numpy as np

        return float(np.float32(v))
    if t == "boolean":
        return bool(v) if _is_bool(v) else None
    if t == "string":
        if isinstance(v, str):
            return v
        if _is_bool(v):
            return "true" if v else "false"
        if _is_int(v):
            return str(int(v))
        if _is_float(v):
            return _java_double(float(v))
        raise TypeError(
            f"state field {name!r} (string): {type(v).__name__} value {v!r} has no text Spark would read back; "
            "store str(value)"
        )
    if t == "date":
        if isinstance(v, _dt.datetime):
            return v.date()
        if isinstance(v, _dt.date):
            return v
        raise TypeError(f"state field {name!r} (date): {type(v).__name__} value {v!r} is not a date (Spark fails the query)")
    if t in ("timestamp", "timestamp_ntz"):
        if isinstance(v, _dt.datetime):
            return v
        raise TypeError(f"state field {name!r} ({t}): {type(v).__name__} value {v!r} is not a datetime (Spark fails the query)")
    return v
