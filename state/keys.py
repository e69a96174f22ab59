"""Keys: normalization, canonical bytes and Spark-compatible key groups.

A key is a tuple of scalars (``int``, ``float``, ``str``, ``bytes``, ``bool``,
``datetime.date``, ``datetime.datetime``) or nulls; a bare scalar means a 1-tuple.
numpy/pandas scalars are converted to Python scalars first, so ``np.int64(5)``,
``5`` and ``(5,)`` are one key everywhere.

*Normalized* keys (what caches and in-memory stores use as dict keys) are
tuples in which ``int``, ``str`` and ``bytes`` stand for themselves and every
other type is tagged as ``(tag, value)``. The tag keeps apart keys Python
would merge (``1 == 1.0 == True``) but Spark and the canonical bytes keep
distinct; since a key never holds a tuple, a tagged element cannot collide
with a user's value.

A null column value (``None``, ``pd.NA``, ``pd.NaT``) is the element
``None``: Spark groups nulls as one key, so ``(None,)`` and ``(None, "x")`` are
keys. NaN is a value (Spark groups every NaN as one key, apart from null): all
NaNs normalize to one float object, so they are one dict key.

*Canonical bytes* are equal exactly when normalized keys are equal, in every
process and Python version (no use of the salted ``hash()``).
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any, Callable, Hashable, Iterable, Union

import numpy as np
import xxhash

from .keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism, key_group_from_hash

Scalar = Union[int, float, str, bytes, bool, _dt.date, _dt.datetime]
Key = Union[Scalar, tuple]
NormalizedKey = Hashable  # a bare int/str/bytes, or a tuple

SPARK_HASH_SEED = 42
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

# Tags of normalized elements whose Python equality is too loose.
_T_FLOAT = "f"
_T_BOOL = "b"
_T_DATE = "d"
_T_DATETIME = "t"

_PLAIN = frozenset((int, str, bytes))
# The one NaN of normalized keys: tuples compare elements by identity first, so
# keys holding this object are equal (and hash alike) although NaN != NaN.
_NAN = float("nan")
_TAG_TYPES: dict[str, type] = {_T_FLOAT: float, _T_BOOL: bool, _T_DATE: _dt.date, _T_DATETIME: _dt.datetime}


def _normalize_scalar(value: Any, key: Any) -> Hashable:
    t = type(value)
    if t is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"key {key!r}: integer {value!r} does not fit a 64-bit long")
        return value
    if t is str or t is bytes:
        return value
    if t is bool:
        return (_T_BOOL, value)
    if value is None:
        return None
    if t is float:
        if math.isnan(value):
            return (_T_FLOAT, _NAN)
        return (_T_FLOAT, value + 0.0)  # -0.0 + 0.0 == 0.0: Spark groups -0.0 with 0.0
    if t is _dt.datetime:
        if value.tzinfo is not None and value.utcoffset() is not None:
            try:
                value.astimezone(_dt.timezone.utc)
            except OverflowError:
                raise ValueError(f"key {key!r}: {value!r} is outside the range of UTC timestamps") from None
        return (_T_DATETIME, value)
    if t is _dt.date:
        return (_T_DATE, value)
    if t is tuple:
        # An element that is already normalized (tagged), so that normalize_key is idempotent.
        if len(value) == 2 and type(value[0]) is str and _TAG_TYPES.get(value[0]) is type(value[1]):
            return _normalize_scalar(value[1], key)  # re-validated: a tag cannot smuggle in NaN or -0.0
        raise TypeError(f"key {key!r}: a key column cannot hold the tuple {value!r}; flatten the key")
    # Slow path: numpy / pandas scalars and subclasses of the plain types.
    item = getattr(value, "item", None)
    module = type(value).__module__
    if module.startswith("pandas"):
        if type(value).__name__ == "Timestamp":
            return _normalize_scalar(value.to_pydatetime(), key)
        if type(value).__name__ in ("NaTType", "NAType"):
            return None
    if module == "numpy" and item is not None:
        if type(value).__name__ == "datetime64":
            import pandas as pd

            if pd.isna(value):
                return None
            return _normalize_scalar(pd.Timestamp(value).to_pydatetime(), key)
        return _normalize_scalar(item(), key)
    if isinstance(value, bool):
        return (_T_BOOL, bool(value))
    if isinstance(value, int):
        return _normalize_scalar(int(value), key)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytearray, memoryview)) or isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, float):
        return _normalize_scalar(float(value), key)
    raise TypeError(
        f"key {key!r}: {type(value).__name__} value {value!r} is not a supported key type "
        "(int, float, str, bytes, bool, date, datetime)"
    )


def normalize_key(key: Any) -> NormalizedKey:
    """Return the normalized form of ``key``; raise TypeError/ValueError naming a bad key.

    A one-column key of an ``int``, ``str`` or ``bytes`` normalizes to the bare
    value (the fastest dict key); every other key to a tuple. The function is
    idempotent.
    """
    t = type(key)
    if t is int:
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise ValueError(f"key {key!r}: integer does not fit a 64-bit long")
        return key
    if t is str or t is bytes:
        return key
    if t is tuple:
        if not key:
            raise ValueError("key () is empty: a key needs at least one column")
        for element in key:
            if type(element) not in _PLAIN or (type(element) is int and not _INT64_MIN <= element <= _INT64_MAX):
                break
        else:
            return key[0] if len(key) == 1 else key
        elements = tuple(_normalize_scalar(e, key) for e in key)
    elif isinstance(key, (list, dict, set, frozenset)):
        raise TypeError(f"key {key!r}: a {t.__name__} is not a valid key; use a tuple of scalars")
    elif isinstance(key, tuple):  # namedtuple and other tuple subclasses
        return normalize_key(tuple(key))
    else:
        elements = (_normalize_scalar(key, key),)
    if len(elements) == 1 and type(elements[0]) in _PLAIN:
        return elements[0]
    return elements


def normalize_keys(keys: Iterable[Any]) -> list[NormalizedKey]:
    """``[normalize_key(k) for k in keys]``, checked a column at a time where it can be.

    Keys that are already normalized and alike (all ``int``, all ``str``, or
    tuples of one length whose every column is all ``int`` or all ``str``)
    are recognized with a few C-level passes (types, lengths, a range check)
    instead of one Python call per key: 21k int keys 0.64 ms against 1.89,
    21k (int, int) pairs 3.9 ms against 5.8 (measured here). O(n).
    """
    keys = keys if type(keys) is list else list(keys)
    if len(keys) >= 32 and _normalized_alike(keys):
        return keys
    return [normalize_key(k) for k in keys]


def _int64_array(ints: Iterable[int], n: int) -> np.ndarray | None:
    """``n`` Python ints as an int64 array (one C-level pass); None when one does not fit a 64-bit long."""
    try:
        return np.fromiter(ints, dtype=np.int64, count=n)
    except OverflowError:
        return None


def _fit_int64(ints: Iterable[int], n: int) -> bool:
    """Whether ``n`` Python ints all fit a 64-bit long (one C-level pass)."""
    return _int64_array(ints, n) is not None


def split_pairs(pairs: Iterable[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    """The keys and the values of ``(key, value)`` pairs, as two lists."""
    pairs = pairs if type(pairs) is list else list(pairs)
    if not pairs:
        return [], []
    try:
        pairs_only = set(map(len, pairs)) == {2}
    except TypeError:
        pairs_only = False
    if not pairs_only:
        bad = next(p for p in pairs if not (hasattr(p, "__len__") and len(p) == 2))
        raise ValueError(f"expected (key, value) pairs, got {bad!r}")
    keys, values = zip(*pairs)
    return list(keys), list(values)


def _normalized_alike(keys: list[Any]) -> bool:
    types = set(map(type, keys))
    if len(types) != 1:
        return False
    (t,) = types
    if t is int:
        return _fit_int64(keys, len(keys))
    if t is str or t is bytes:
        return True
    if t is not tuple:
        return False
    lengths = set(map(len, keys))
    if len(lengths) != 1 or lengths.pop() < 2:  # a one-element tuple normalizes to its element
        return False
    elements = set(map(type, chain.from_iterable(keys)))
    if elements == {int}:
        return _fit_int64(chain.from_iterable(keys), sum(map(len, keys)))
    if elements == {str} or elements == {bytes}:
        return True
    for column in zip(*keys):
        kinds = set(map(type, column))
        if kinds == {int}:
            if not (_INT64_MIN <= min(column) and max(column) <= _INT64_MAX):
                return False
        elif kinds != {str} and kinds != {bytes}:
            return False
    return True


def key_columns(nkey: NormalizedKey) -> tuple:
    """The normalized elements of a normalized key, as a tuple (bare one-column keys wrapped)."""
    return nkey if type(nkey) is tuple else (nkey,)


def denormalize_key(nkey: NormalizedKey) -> tuple:
    """The user-facing key (a tuple of Python scalars) of a normalized key."""
    if type(nkey) is not tuple:
        return (nkey,)
    for element in nkey:
        if type(element) is tuple:
            return tuple(e[1] if type(e) is tuple else e for e in nkey)
    return nkey


# ---------------------------------------------------------------- canonical bytes
# One tag byte per element, then a fixed-width or length-prefixed payload.
_B_INT = 0x01
_B_STR = 0x02
_B_BYTES = 0x03
_B_FLOAT = 0x04
_B_BOOL = 0x05
_B_DATE = 0x06
_B_DATETIME_NAIVE = 0x07
_B_DATETIME_UTC = 0x08
_B_NULL = 0x00  # no payload

_pack_q = struct.Struct(">q").pack
_pack_d = struct.Struct(">d").pack
_pack_i = struct.Struct(">i").pack
_pack_I = struct.Struct(">I").pack
_unpack_q = struct.Struct(">q").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_unpack_i = struct.Struct(">i").unpack_from
_unpack_I = struct.Struct(">I").unpack_from


def key_column_values(
    nkeys: Sequence[Any], names: Sequence[str], to_columns: Callable[[Any], tuple] = denormalize_key
) -> dict[str, Union[list, np.ndarray]]:
    """``{name: values}``: the columns ``names`` of the keys ``nkeys`` (``to_columns`` turns one key into
    its column values). One column of plain scalars (the common case) is the keys themselves, with no
    per-key tuple. A column of ints that fit a long is an int64 array (what pandas infers from the
    list, without its pass over the objects: a frame of 25k keys 2.7 ms against 9.6); any other column a list.
    O(keys x columns). Raises ValueError naming a key of another number of columns."""
    names = list(names)
    if len(names) == 1 and to_columns is denormalize_key:
        types = set(map(type, nkeys))
        if tuple not in types:
            return {names[0]: _int_column(list(nkeys), types)}
    rows = [to_columns(k) for k in nkeys]
    for k, row in zip(nkeys, rows):
        if len(row) != len(names):
            raise ValueError(f"key {k!r} has {len(row)} columns but key_names is {names!r}")
    columns = ([row[i] for row in rows] for i in range(len(names)))
    return {name: _int_column(values, set(map(type, values))) for name, values in zip(names, columns)}


def _int_column(values: list, types: set[type]) -> Union[list, np.ndarray]:
    """``values`` (of the ``types``) as an int64 array when all are ``int`` (not bool) and fit a long; else as
    they are."""
    array = _int64_array(values, len(values)) if types == {int} else None
    return values if array is None else array


def long_columns(raw_keys: Sequence[bytes], offset: int = 0) -> list[np.ndarray] | None:
    """The elements of canonical key bytes (from ``offset``) as int64 columns, when every key is the same
    number of ints only; None otherwise (decode those with :func:`decode_key`).

    An int element is ``0x01`` and 8 big-endian bytes, so keys of ints only have one width and each
    column is a strided view of the joined keys: numpy work, no Python per key."""
    n = len(raw_keys)
    if not n:
        return None
    width = len(raw_keys[0])
    m, rest = divmod(width - offset, 9)
    if rest or not m:
        return None
    joined = b"".join(raw_keys)
    if len(joined) != n * width or len(set(map(len, raw_keys))) != 1:
        return None
    tags = np.ndarray((n, m), dtype=np.uint8, buffer=joined, offset=offset, strides=(width, 9))
    if not (tags == _B_INT).all():
        return None
    return [
        np.ndarray((n,), dtype=">i8", buffer=joined, offset=offset + 9 * i + 1, strides=(width,)).astype(np.int64)
        for i in range(m)
    ]


def _micros(value: _dt.datetime) -> tuple[int, bool]:
    if value.tzinfo is None or value.utcoffset() is None:
        delta = value - _EPOCH_NAIVE
        aware = False
    else:
        delta = value - _EPOCH_UTC
        aware = True
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, aware


def encode_key(nkey: NormalizedKey) -> bytes:
    """Canonical bytes of a normalized key (see :func:`normalize_key`)."""
    if type(nkey) is int:
        return b"\x01" + _pack_q(nkey)
    parts: list[bytes] = []
    for element in key_columns(nkey):
        t = type(element)
        if t is int:
            parts.append(b"\x01" + _pack_q(element))
        elif t is str:
            raw = element.encode("utf-8", "surrogatepass")
            parts.append(b"\x02" + _pack_I(len(raw)) + raw)
        elif t is bytes:
            parts.append(b"\x03" + _pack_I(len(element)) + element)
        elif element is None:
            parts.append(b"\x00")
        else:
            tag, value = element
            if tag == _T_FLOAT:
                parts.append(b"\x04" + _pack_d(value))
            elif tag == _T_BOOL:
                parts.append(b"\x05\x01" if value else b"\x05\x00")
            elif tag == _T_DATE:
                parts.append(b"\x06" + _pack_i((value - _EPOCH_DATE).days))
            else:
                micros, aware = _micros(value)
                parts.append((b"\x08" if aware else b"\x07") + _pack_q(micros))
    return b"".join(parts)


def decode_key(data: bytes, offset: int = 0) -> NormalizedKey:
    """Inverse of :func:`encode_key` (from ``offset`` to the end of ``data``)."""
    out: list[Hashable] = []
    n = len(data)
    i = offset
    while i < n:
        tag = data[i]
        i += 1
        if tag == _B_INT:
            out.append(_unpack_q(data, i)[0])
            i += 8
        elif tag == _B_STR or tag == _B_BYTES:
            length = _unpack_I(data, i)[0]
            raw = data[i + 4 : i + 4 + length]
            out.append(raw.decode("utf-8", "surrogatepass") if tag == _B_STR else bytes(raw))
            i += 4 + length
        elif tag == _B_NULL:
            out.append(None)
        elif tag == _B_FLOAT:
            value = _unpack_d(data, i)[0]
            out.append((_T_FLOAT, _NAN if value != value else value))
            i += 8
        elif tag == _B_BOOL:
            out.append((_T_BOOL, data[i] == 1))
            i += 1
        elif tag == _B_DATE:
            out.append((_T_DATE, _EPOCH_DATE + _dt.timedelta(days=_unpack_i(data, i)[0])))
            i += 4
        elif tag == _B_DATETIME_NAIVE or tag == _B_DATETIME_UTC:
            micros = _unpack_q(data, i)[0]
            base = _EPOCH_NAIVE if tag == _B_DATETIME_NAIVE else _EPOCH_UTC
            out.append((_T_DATETIME, base + _dt.timedelta(microseconds=micros)))
            i += 8
        else:
            raise ValueError(f"corrupt key bytes {bytes(data)!r}: unknown element tag {tag:#04x} at {i - 1}")
    if len(out) == 1 and type(out[0]) in _PLAIN:
        return out[0]
    return tuple(out)


# ---------------------------------------------------------------- Spark's xxhash64
# Spark type name -> how one column's value is hashed.
_LONG_TYPES = {"long", "bigint", "timestamp", "timestamp_ntz"}
_INT_TYPES = {"int", "integer", "short", "smallint", "byte", "tinyint", "date", "boolean"}
_DOUBLE_TYPES = {"double"}
_FLOAT_TYPES = {"float", "real"}
_BYTES_TYPES = {"string", "binary"}
_TIMESTAMP_TYPES = {"timestamp", "timestamp_ntz"}
# Half the range of each integral type: a value v fits when -limit <= v < limit.
_INT_LIMITS = {"int": 1 << 31, "integer": 1 << 31, "short": 1 << 15, "smallint": 1 << 15, "byte": 1 << 7, "tinyint": 1 << 7}
SUPPORTED_SPARK_TYPES = frozenset(_LONG_TYPES | _INT_TYPES | _DOUBLE_TYPES | _FLOAT_TYPES | _BYTES_TYPES)

_pack_le_q = struct.Struct("<q").pack
_pack_le_i = struct.Struct("<i").pack
_pack_le_d = struct.Struct("<d").pack
_pack_le_f = struct.Struct("<f").pack
_xxh = xxhash.xxh64_intdigest


def spark_type_name(data_type: Any) -> str:
    """``"long"``, ``"string"``, ... from a name or a pyspark ``DataType``."""
    if isinstance(data_type, str):
        name = data_type.strip().lower()
    elif hasattr(data_type, "typeName"):
        name = data_type.typeName()
    else:
        raise TypeError(f"key type {data_type!r} must be a Spark type name or a pyspark DataType")
    if name not in SUPPORTED_SPARK_TYPES:
        raise ValueError(f"key type {data_type!r} is not supported; use one of {sorted(SUPPORTED_SPARK_TYPES)}")
    return name


def _element_bytes(element: Hashable, type_name: str | None) -> bytes:
    """The bytes Spark's xxhash64 reads for one column value."""
    tag = None
    value: Any = element
    if type(element) is tuple:
        tag, value = element
    if type_name is None:  # infer from the Python type, as Spark infers a schema
        if type(value) is int:
            type_name = "long"
        elif type(value) is str:
            type_name = "string"
        elif type(value) is bytes:
            type_name = "binary"
        elif tag == _T_FLOAT:
            type_name = "double"
        elif tag == _T_BOOL:
            type_name = "boolean"
        elif tag == _T_DATE:
            type_name = "date"
        else:
            type_name = "timestamp"
    # Each branch takes only what fits its Spark type; anything else is a KeyTypeError.
    if type_name in _LONG_TYPES:
        if tag is None and type(value) is int:
            return _pack_le_q(value)
        if tag == _T_DATETIME and type_name in _TIMESTAMP_TYPES:
            return _pack_le_q(_micros(value)[0])
    elif type_name in _BYTES_TYPES:
        if type(value) is str:
            if type_name == "string":
                return value.encode("utf-8", "surrogatepass")
        elif type(value) is bytes and type_name == "binary":
            return value
    elif type_name in _INT_TYPES:
        if type_name == "date":
            if tag == _T_DATE:
                return _pack_le_i((value - _EPOCH_DATE).days)
        elif type_name == "boolean":
            if tag == _T_BOOL:
                return _pack_le_i(int(value))
        elif tag is None and type(value) is int and -_INT_LIMITS[type_name] <= value < _INT_LIMITS[type_name]:
            return _pack_le_i(value)
    elif tag == _T_FLOAT or (tag is None and type(value) is int):  # double, float
        return _pack_le_d(float(value) + 0.0) if type_name in _DOUBLE_TYPES else _pack_le_f(float(value) + 0.0)
    raise KeyTypeError(value, type_name)


def _misfits(element: Hashable, type_name: str | None) -> bool:
    try:
        _element_bytes(element, type_name)
    except KeyTypeError:
        return True
    return False


class KeyTypeError(TypeError, ValueError):
    """A key value that does not fit the Spark type declared for its column."""

    def __init__(self, value: Any, type_name: str, column: str | None = None) -> None:
        self.value, self.type_name, self.column = value, type_name, column
        where = f" in key column {column!r}" if column is not None else ""
        super().__init__(
            f"key value {value!r}{where} ({type(value).__name__}) does not fit its declared Spark type {type_name!r}"
        )


def spark_hash(
    nkey: NormalizedKey, types: Sequence[str | None] | None = None, columns: Sequence[str] | None = None
) -> int:
    """Spark's ``xxhash64(col1, col2, ...)`` (seed 42) of a normalized key, as a signed long.

    As in Spark, a null column is skipped: the hash so far passes through unchanged.
    With ``types``, each other value must fit its column's Spark type, else
    :class:`KeyTypeError` names the value, the type and (given ``columns``) the column.
    """
    h = SPARK_HASH_SEED
    nkey = key_columns(nkey)
    if types is None:
        for element in nkey:
            t = type(element)
            if t is int:
                h = _xxh(_pack_le_q(element), h)
            elif t is str:
                h = _xxh(element.encode("utf-8", "surrogatepass"), h)
            elif element is None:
                continue
            else:
                h = _xxh(_element_bytes(element, None), h)
    else:
        if len(types) != len(nkey):
            raise ValueError(f"key {denormalize_key(nkey)!r} has {len(nkey)} columns but {len(types)} types were given")
        try:
            for element, type_name in zip(nkey, types):
                if element is not None:
                    h = _xxh(_element_bytes(element, type_name), h)
        except KeyTypeError as exc:
            if columns is None:
                raise
            i = next(i for i, element in enumerate(nkey) if element is not None and _misfits(element, types[i]))
            raise KeyTypeError(exc.value, exc.type_name, columns[i]) from None
    return h - (1 << 64) if h >= 1 << 63 else h


def normalize_types(types: Iterable[Any] | None) -> tuple[str, ...] | None:
    """Validate a sequence of Spark key types (names or DataTypes)."""
    if types is None:
        return None
    if isinstance(types, str):
        types = [types]
    return tuple(spark_type_name(t) for t in types)


def key_group(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM, types: Iterable[Any] | None = None) -> int:
    """The key group of ``key``: bit-for-bit Spark's ``pmod(xxhash64(cols), max_parallelism)``.

    ``types`` gives the Spark type of each key column (``"long"``, ``"int"``,
    ``"string"``, ... or pyspark DataTypes). Without it, ``int`` hashes as a
    long, ``str`` as a string, ``float`` as a double, ``bool`` as a boolean,
    ``date`` as a date and ``datetime`` as a timestamp (naive datetimes are
    taken as UTC wall-clock micros).
    """
    check_max_parallelism(max_parallelism)
    return key_group_from_hash(spark_hash(normalize_key(key), normalize_types(types)), max_parallelism)


# ---------------------------------------------------------------- vectorized (numpy) hashing
# XXH64 of one 8- or 4-byte little-endian lane, on uint64 arrays (wrapping arithmetic),
# so a million key groups cost milliseconds instead of a Python call per key.
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: Any, r: int) -> Any:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _avalanche(h: Any) -> Any:
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(_P2)
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(_P3)
    return h ^ (h >> np.uint64(32))


def _seed_array(seed: Any, n: int) -> Any:
    if isinstance(seed, int):
        return np.full(n, seed & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    return np.asarray(seed).astype(np.int64, copy=False).view(np.uint64)


def spark_hash_longs(values: Any, seed: Any = SPARK_HASH_SEED) -> Any:
    """Spark's xxhash64 of a long column (numpy int64 array) with a scalar or per-row seed; int64 result."""
    lanes = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = _seed_array(seed, len(lanes)) + np.uint64((_P5 + 8) & 0xFFFFFFFFFFFFFFFF)
        k1 = _rotl(lanes * np.uint64(_P2), 31) * np.uint64(_P1)
        h = h ^ k1
        h = _rotl(h, 27) * np.uint64(_P1) + np.uint64(_P4)
        return _avalanche(h).view(np.int64)


def spark_hash_ints(values: Any, seed: Any = SPARK_HASH_SEED) -> Any:
    """Spark's xxhash64 of an int/date/boolean column (as 4-byte ints) with a scalar or per-row seed."""
    lanes = np.ascontiguousarray(values, dtype=np.int32).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _seed_array(seed, len(lanes)) + np.uint64(_P5 + 4)
        h = h ^ (lanes * np.uint64(_P1))
        h = _rotl(h, 23) * np.uint64(_P2) + np.uint64(_P3)
        return _avalanche(h).view(np.int64)


def key_groups_of_longs(values: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> Any:
    """Key groups of one-column long keys, vectorized: ``pmod(xxhash64(col), max_parallelism)``."""
    check_max_parallelism(max_parallelism)
    return spark_hash_longs(values) % max_parallelism
