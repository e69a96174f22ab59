"""State schemas: store a state tuple as Spark's ``stateStructType`` would.

Spark's applyInPandasWithState pickles the state through the JVM, which keeps a
field only when the value's type fits the field and stores null otherwise, and
reads it back through pyspark's ``StructType.fromInternal``. The rules below
were measured on PySpark 4.3 (a state of one value in a field of every type,
updated in one micro-batch and read back in the next):

=============  ============================================================
field          value read back
=============  ============================================================
long, int,     an ``int`` (or numpy integer) cut to the field's bits as Java
short, byte    casts it (300 in a byte field: 44); an int beyond 64 bits,
               float, bool, str: null
double         a ``float`` (or numpy float) as it is; int, bool, str: null
float          a float, rounded to 32 bits; int, bool, str: null
string         str as it is; int ``"1"``; float ``"1.5"``; bool ``"true"``
boolean        a bool; anything else: null
date           a date; a datetime becomes its date (other types fail the query)
timestamp      a datetime: a naive one as it is, a zone-aware one as the naive
               local time of the same instant (other types fail the query)
timestamp_ntz  a datetime's wall time, without its zone (others fail the query)
decimal(p,s)   a ``Decimal`` rounded half up to ``s`` places (more than ``p``
               digits then fail the query); int, float, str: null
binary         bytes, a bytearray as bytes, a str as its UTF-8 bytes; others null
struct<...>    a ``pyspark.sql.Row`` with the field names, each field by these
               rules, from a Row, tuple or list (by position; another length
               fails the query), a dict (by name: a missing name is null,
               others are ignored) or an object's attributes
array<T>       a list of the elements by T's rules, from a list or tuple
map<K,V>       a dict, keys by K's rules and values by V's; a null key fails
=============  ============================================================

``None`` is null in every field, and at every depth. A datetime or date in a
string field, which Spark stores as the text of a ``java.util.GregorianCalendar``,
is refused here. Values Spark fails the query on, and values of another kind
than a list for an array or a dict for a map (Spark stores some of those as
null), are refused with a :class:`StateValueError` naming the field and the
value. Other field types (intervals, time, variant, ...) keep their value.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import functools
import math
import re
from decimal import Decimal
from typing import Any, Callable, Mapping, Optional, Sequence

_ALIASES = {"bigint": "long", "integer": "int", "smallint": "short", "tinyint": "byte", "real": "float", "bool": "boolean"}
#: Bits of the JVM integer each integral field is cast to.
_BITS = {"long": 64, "int": 32, "short": 16, "byte": 8}

# A parsed field type: ("scalar", name) | ("decimal", precision, scale) | ("array", element)
# | ("map", key, value) | ("struct", ((name, type), ...)).
_Type = tuple


class StateValueError(ValueError, TypeError):
    """A state value that cannot be stored in its field's type; names the field and the value.

    A ValueError, and a TypeError as the refusals of earlier versions were.
    """


def canonical_type_name(type_name: str) -> str:
    """One name per Spark type: ``"bigint"`` is ``"long"``, ``"integer"`` ``"int"``, and so on (others as given).

    Nested and decimal types are spelled out in full, each inner type by the same rule:
    ``"array<struct<t: bigint>>"`` is ``"array<struct<t:long>>"``, ``"decimal"`` ``"decimal(10,0)"``.
    """
    if "<" not in type_name and "(" not in type_name and not type_name.lower().startswith(("dec", "numeric")):
        return _ALIASES.get(type_name, type_name)
    return _render(_parse_type(type_name), canonical=True)


class StateSchema:
    """The fields of a state tuple (names and Spark type names) and the conversion Spark applies on store.

    Nested fields (``struct``, ``array``, ``map``, any depth) read back as pyspark
    hands them, structs as ``pyspark.sql.Row`` (imported when the first struct is
    built). PySpark 4.3's own applyInPandasWithState fails on any array or map
    field in its state schema (its Python worker cannot read the schema back:
    ``KeyError: 'elementType'`` / ``'keyType'``); opbuffer stores them by the rules above.
    """

    def __init__(self, fields: Sequence[tuple[str, str]], _types: Optional[Sequence[_Type]] = None) -> None:
        if not fields:
            raise ValueError("a state schema needs at least one field")
        self.fields = [(str(name), str(type_name)) for name, type_name in fields]
        types = list(_types) if _types is not None else [_parse_type(t) for _, t in self.fields]
        self._converters = tuple(_converter(t, name) for (name, _), t in zip(self.fields, types))

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
        return cls([(f.name, f.dataType.simpleString()) for f in fields], [_type_of(f.dataType) for f in fields])

    def __repr__(self) -> str:
        return "StateSchema(" + ", ".join(f"{n} {t}" for n, t in self.fields) + ")"

    def convert(self, value: Any) -> tuple:
        """The tuple Spark reads back after storing ``value`` (see the module docstring)."""
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"state value {value!r} must be a tuple with one item per field of {self!r}")
        if len(value) != len(self.fields):
            raise ValueError(f"state value {value!r} has {len(value)} items but {self!r} has {len(self.fields)} fields")
        return tuple([convert(v) for convert, v in zip(self._converters, value)])


# ---------------------------------------------------------------- parsing type names


def _parse_ddl(ddl: str) -> list[tuple[str, str]]:
    text = ddl.strip()
    if text.lower().startswith("struct<") and text.endswith(">"):
        text = text[7:-1]
    fields = []
    for part in _split_top_level(text):
        match = re.fullmatch(r"\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+(.+?)\s*", part, re.S)
        if match is None:
            raise ValueError(f"state_schema {ddl!r}: cannot read the field {part.strip()!r} (expected 'name type')")
        type_text = match.group(2)
        try:
            parsed = _parse_type(type_text)
        except ValueError as exc:
            raise ValueError(f"state_schema {ddl!r}: field {match.group(1)!r}: {exc}") from None
        # A nested type keeps its field names' case (``row.visitTime``); a plain one is lowercased.
        fields.append((match.group(1), _render(parsed) if parsed[0] in ("array", "map", "struct") else type_text.lower()))
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


_NESTED_START = re.compile(r"\s*(array|map|struct)\s*<", re.I)
_FIELD_NAME = re.compile(r"\s*(?:`((?:[^`]|``)*)`|([^\s:,<>`]+))\s*:?\s*")
_MODIFIERS = re.compile(r"(?:\s+not\s+null)?(?:\s+comment\s+'(?:[^'\\]|\\.)*')?\s*$", re.I | re.S)
_MEMBER_MODIFIER = re.compile(r"\s+(?:not\s+null|comment\s+'(?:[^'\\]|\\.)*')", re.I | re.S)
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?", re.I)


def _parse_type(text: str) -> _Type:
    """A Spark type name (``"long"``, ``"decimal(5,2)"``, ``"array<struct<a:long,b:map<string,date>>>"``) as a tree."""
    parsed, end = _parse_at(text, 0)
    if text[end:].strip():
        raise ValueError(f"cannot read the type {text.strip()!r} (unexpected {text[end:].strip()!r})")
    return parsed


def _parse_at(text: str, pos: int) -> tuple[_Type, int]:
    nested = _NESTED_START.match(text, pos)
    if nested is None:
        return _parse_scalar(text, pos)
    kind, pos = nested.group(1).lower(), nested.end()
    if kind == "array":
        element, pos = _parse_at(text, pos)
        parsed: _Type = ("array", element)
    elif kind == "map":
        key, pos = _parse_at(text, pos)
        pos = _expect(text, pos, ",")
        value, pos = _parse_at(text, pos)
        parsed = ("map", key, value)
    else:
        members: list[tuple[str, _Type]] = []
        while not text[pos:].lstrip().startswith(">"):
            if members:
                pos = _expect(text, pos, ",")
            name = _FIELD_NAME.match(text, pos)
            if name is None or not (name.group(1) or name.group(2)):
                raise ValueError(f"cannot read a struct field of {text.strip()!r} at {text[pos:].strip()!r}")
            member, pos = _parse_at(text, name.end())
            members.append((name.group(2) or name.group(1).replace("``", "`"), member))
        parsed = ("struct", tuple(members))
    return parsed, _expect(text, pos, ">")


def _parse_scalar(text: str, pos: int) -> tuple[_Type, int]:
    depth, quoted, i = 0, False, pos
    while i < len(text):
        ch = text[i]
        if quoted:
            quoted = ch != "'" or text[i - 1] == "\\"
        elif ch == "'":
            quoted = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and ch in ",<>":
            break
        i += 1
    token = text[pos:i]
    name = token[: _MODIFIERS.search(token).start()].strip()  # type: ignore[union-attr]  # always matches
    if not name or "<" in text[i : i + 1]:
        raise ValueError(f"cannot read the type {text.strip()!r} at {text[pos:].strip()!r}")
    decimal = _DECIMAL.fullmatch(name)
    if decimal is not None:
        return ("decimal", int(decimal.group(1) or 10), int(decimal.group(2) or 0)), i
    return ("scalar", re.sub(r"\s+", " ", name.lower())), i


def _expect(text: str, pos: int, what: str) -> int:
    stripped = text[pos:].lstrip()
    if not stripped.startswith(what):
        raise ValueError(f"cannot read the type {text.strip()!r}: expected {what!r} at {stripped or 'the end'!r}")
    pos = len(text) - len(stripped) + 1
    if what == ">":  # a nested struct member may go on with NOT NULL and COMMENT '...'
        found = _MEMBER_MODIFIER.match(text, pos)
        while found is not None:
            pos = found.end()
            found = _MEMBER_MODIFIER.match(text, pos)
    return pos


def _type_of(data_type: Any) -> _Type:
    """The tree of a pyspark DataType (read from the object: field names may hold any character)."""
    if hasattr(data_type, "elementType"):
        return ("array", _type_of(data_type.elementType))
    if hasattr(data_type, "keyType"):
        return ("map", _type_of(data_type.keyType), _type_of(data_type.valueType))
    if hasattr(data_type, "fields"):
        return ("struct", tuple((f.name, _type_of(f.dataType)) for f in data_type.fields))
    return _parse_type(data_type.simpleString())


def _render(parsed: _Type, canonical: bool = False) -> str:
    kind = parsed[0]
    if kind == "scalar":
        return _ALIASES.get(parsed[1], parsed[1]) if canonical else parsed[1]
    if kind == "decimal":
        return f"decimal({parsed[1]},{parsed[2]})"
    if kind == "array":
        return f"array<{_render(parsed[1], canonical)}>"
    if kind == "map":
        return f"map<{_render(parsed[1], canonical)},{_render(parsed[2], canonical)}>"
    members = (f"{_quoted(name)}:{_render(member, canonical)}" for name, member in parsed[1])
    return "struct<" + ",".join(members) + ">"


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "`" + name.replace("`", "``") + "`"


# ---------------------------------------------------------------- value tests


def _is_int(v: Any) -> bool:
    if _is_bool(v):
        return False
    return isinstance(v, int) or (type(v).__module__ == "numpy" and type(v).__name__.startswith(("int", "uint")))


def _is_float(v: Any) -> bool:
    return isinstance(v, float) or (type(v).__module__ == "numpy" and type(v).__name__.startswith("float"))


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"))


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


def _refuse(name: str, type_name: str, v: Any, why: str) -> StateValueError:
    return StateValueError(f"state field {name!r} ({type_name}): {type(v).__name__} value {v!r:.200} {why}")


@functools.lru_cache(maxsize=None)
def _row_maker() -> Callable[[list, list], Any]:
    """pyspark's own Row builder (what ``StructType.fromInternal`` calls), imported on the first struct."""
    try:
        from pyspark.sql.types import _create_row
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise ImportError("a struct field of a state schema reads back as a pyspark.sql.Row: install pyspark") from exc
    return _create_row  # type: ignore[no-any-return]


# ---------------------------------------------------------------- converters, one per field type


def _converter(parsed: _Type, name: str) -> Callable[[Any], Any]:
    """The function that turns a stored value into what Spark reads back, for one (nested) field type."""
    kind = parsed[0]
    if kind == "array":
        return _array_converter(parsed, name)
    if kind == "map":
        return _map_converter(parsed, name)
    if kind == "struct":
        return _struct_converter(parsed, name)
    if kind == "decimal":
        return _decimal_converter(parsed[1], parsed[2], name)
    return _scalar_converter(canonical_type_name(parsed[1]), name)


def _array_converter(parsed: _Type, name: str) -> Callable[[Any], Any]:
    element = _converter(parsed[1], f"{name}[]")
    type_name = _render(parsed)

    def convert(v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, (list, tuple)):
            raise _refuse(name, type_name, v, "is not a list or tuple")
        return [element(e) for e in v]

    return convert


def _map_converter(parsed: _Type, name: str) -> Callable[[Any], Any]:
    key_of, value_of = _converter(parsed[1], f"{name}.key"), _converter(parsed[2], f"{name}.value")
    type_name = _render(parsed)

    def convert(v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, Mapping):
            raise _refuse(name, type_name, v, "is not a dict")
        out = {}
        for k, item in v.items():
            key = key_of(k)
            if key is None:
                raise _refuse(name, type_name, v, f"has the key {k!r}, null in the key type (a map key cannot be null)")
            out[key] = value_of(item)
        return out

    return convert


def _struct_converter(parsed: _Type, name: str) -> Callable[[Any], Any]:
    names = [member for member, _ in parsed[1]]
    members = [_converter(t, f"{name}.{member}") for member, t in parsed[1]]
    type_name = _render(parsed)
    width = len(names)

    def convert(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, (tuple, list)):  # a Row too: by position, as Spark takes it
            if len(v) != width:
                raise _refuse(name, type_name, v, f"has {len(v)} items for {width} fields")
            values = v
        elif isinstance(v, Mapping):
            values = [v.get(n) for n in names]
        elif hasattr(v, "__dict__"):
            attributes = vars(v)
            values = [attributes.get(n) for n in names]
        else:
            raise _refuse(name, type_name, v, "is not a struct (a Row, tuple, list or dict)")
        return _row_maker()(names, [convert_member(x) for convert_member, x in zip(members, values)])

    return convert


def _decimal_converter(precision: int, scale: int, name: str) -> Callable[[Any], Any]:
    type_name = f"decimal({precision},{scale})"
    exponent = Decimal(1).scaleb(-scale)
    context = _decimal.Context(prec=max(precision, 38) + 40, rounding=_decimal.ROUND_HALF_UP)

    def convert(v: Any) -> Any:
        if not isinstance(v, Decimal):
            return None  # as Spark: an int, a float or a str in a decimal field is null
        if not v.is_finite():
            raise _refuse(name, type_name, v, "is not a finite number (Spark fails the query)")
        try:
            rounded = v.quantize(exponent, context=context)
        except _decimal.InvalidOperation:  # more digits than even the context holds
            rounded = None
        if rounded is None or len(rounded.as_tuple().digits) > precision:
            raise _refuse(name, type_name, v, f"has more than {precision} digits at scale {scale} (Spark fails the query)")
        return rounded

    return convert


def _scalar_converter(t: str, name: str) -> Callable[[Any], Any]:
    if t in _BITS:
        bits = _BITS[t]
        half, full = 1 << (bits - 1), 1 << bits

        def integral(v: Any) -> Any:
            if not _is_int(v):
                return None
            v = int(v)
            if not -(1 << 63) <= v < 1 << 63:
                return None  # beyond a Java long: Spark stores null
            return v if -half <= v < half else (v + half) % full - half

        return integral
    if t == "double":
        return lambda v: float(v) if _is_float(v) else None
    if t == "float":

        def single(v: Any) -> Any:
            if not _is_float(v):
                return None
            import numpy as np

            with np.errstate(over="ignore"):
                return float(np.float32(v))

        return single
    if t == "boolean":
        return lambda v: bool(v) if _is_bool(v) else None
    if t == "string" or re.fullmatch(r"(var)?char\(\d+\)", t):

        def string(v: Any) -> Any:
            if v is None or isinstance(v, str):
                return v
            if _is_bool(v):
                return "true" if v else "false"
            if _is_int(v):
                return str(int(v))
            if _is_float(v):
                return _java_double(float(v))
            raise _refuse(name, t, v, "has no text Spark would read back; store str(value)")

        return string
    if t == "binary":

        def binary(v: Any) -> Any:
            if isinstance(v, (bytes, bytearray)):
                return bytes(v)
            return v.encode("utf-8") if isinstance(v, str) else None

        return binary
    if t == "date":

        def date(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, _dt.date):  # a datetime too: its date
                return _dt.date(v.year, v.month, v.day)
            raise _refuse(name, t, v, "is not a date (Spark fails the query)")

        return date
    if t in ("timestamp", "timestamp_ltz", "timestamp_ntz"):
        local = t != "timestamp_ntz"

        def timestamp(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, _dt.datetime):
                raise _refuse(name, t, v, "is not a datetime (Spark fails the query)")
            if v.tzinfo is not None:
                # timestamp: the same instant in local time; timestamp_ntz: the wall time
                v = v.astimezone().replace(tzinfo=None) if local else v.replace(tzinfo=None)
            if type(v) is not _dt.datetime:  # a pandas Timestamp: a datetime, to the microsecond
                v = _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)
            return v

        return timestamp
    return _keep


def _keep(v: Any) -> Any:
    return v


__all__ = ["StateSchema", "StateValueError", "canonical_type_name"]
