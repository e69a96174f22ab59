"""An opbuffer checkpoint's state as rows: one per key, the key columns then the state's fields.

The shape Spark's ``transformWithStateInPandas(initialState=...)`` takes (a
DataFrame the job groups by its key), so a job can move from run_stream or
LocalRunner back to Spark's own operators; :func:`buffering.spark.export_state`
makes a Spark DataFrame of it, ``python -m checkpoint export`` a parquet or
CSV file. Only :mod:`state` and pandas are imported here (no Spark).

The state of an ``applyInPandasWithState``-shaped function is the tuple it
gave ``state.update``; each of its items becomes the column of the matching
field of ``state_schema``.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from state.state_schema import StateSchema

from .debug import read_state
from .storage import CheckpointStorage

if TYPE_CHECKING:
    import pandas as pd

#: The metadata field of an imported version that records the state schema it was imported with.
STATE_SCHEMA_FIELD = "state_schema"


@dataclass(frozen=True)
class StateRows:
    """What :func:`state_rows` read: column names and types, and one tuple per key."""

    version: int
    key_columns: list[str]
    #: Spark type names of the key columns (empty when the checkpoint does not record them).
    key_types: list[str]
    state_fields: list[tuple[str, str]]
    #: The column of each key's timeout timestamp (epoch ms), or None when not asked for.
    timeout_column: Optional[str]
    rows: list[tuple]


def state_schema_of(manifest_metadata: Mapping[str, Any], state_schema: Any) -> StateSchema:
    """The state schema given, else the one an imported version recorded; an error names both ways."""
    if state_schema is not None:
        return StateSchema.of(state_schema)
    recorded = manifest_metadata.get(STATE_SCHEMA_FIELD)
    if recorded:
        return StateSchema([(str(name), str(type_name)) for name, type_name in recorded])
    raise ValueError(
        "state_schema= is needed (the state's fields, e.g. 'views long, last timestamp', as "
        "applyInPandasWithState's stateStructType): this version does not record one"
    )


def state_rows(
    location: CheckpointStorage | str | os.PathLike[str],
    version: Optional[int] = None,
    *,
    state_schema: Any = None,
    timeout_column: Optional[str] = None,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
) -> StateRows:
    """Every key of ``version`` (latest if None): its key values, then its state tuple's items.

    Args:
        location: the opbuffer checkpoint (local path or fsspec URL).
        version: the committed version to read (default: the latest).
        state_schema: the state's fields (StructType, DDL string or StateSchema); default:
            what an imported version recorded.
        timeout_column: also a column of this name with each key's GroupState timeout
            (epoch ms; None where the key has none). Keys with a timeout and no state
            are kept then, with null state columns.
        storage_options: fsspec options of a URL location.
        checkpoint_key: verify the manifest's signature (default: ``$OPBUFFER_CHECKPOINT_KEY``).

    Raises ValueError naming the key when a stored state is not a tuple of one item
    per field (the state of ``buffering.aggregate(...)`` is its accumulators, not a tuple).
    """
    storage = CheckpointStorage.of(location, storage_options=storage_options, create=False, checkpoint_key=checkpoint_key)
    manifest = storage.read_manifest(version)
    meta = manifest.metadata
    schema = state_schema_of(meta, state_schema)
    names = [name for name, _ in schema.fields]
    key_columns = [str(c) for c in meta.get("key_columns") or []]
    if not key_columns:
        raise ValueError(f"version {manifest.version} of {storage!r} does not record its key columns")
    clash = sorted(set(key_columns) & set(names + ([timeout_column] if timeout_column else [])))
    if clash:
        raise ValueError(f"state field or timeout column name(s) {clash} are also key columns {key_columns}")
    # Read with the storage already verified, so the key is checked once.
    states = read_state(storage, manifest.version, key_names=key_columns, value_name="__value", loads=pickle.loads)
    by_key: dict[tuple, Any] = {}
    for row in states.itertuples(index=False, name=None):
        key, value = tuple(row[:-1]), row[-1]
        if not isinstance(value, tuple) or len(value) != len(names):
            raise ValueError(
                f"the state of key {key!r} is {type(value).__name__} {value!r:.200}, not a tuple of {len(names)} "
                f"item(s) for the fields {names}: export reads applyInPandasWithState-shaped state"
            )
        by_key[key] = value
    timeouts: dict[tuple, int] = {}
    if timeout_column is not None and "timers" in manifest.tables:
        timers = read_state(storage, manifest.version, table="timers", key_names=key_columns, value_name="__ts")
        timeouts = {tuple(row[:-1]): int(row[-1]) for row in timers.itertuples(index=False, name=None)}
    rows: list[tuple] = []
    empty = (None,) * len(names)
    for key in sorted(set(by_key) | set(timeouts), key=repr) if timeouts else by_key:
        row = key + by_key.get(key, empty)
        if timeout_column is not None:
            row += (timeouts.get(key),)
        rows.append(row)
    return StateRows(
        version=manifest.version,
        key_columns=key_columns,
        key_types=[str(t) for t in meta.get("key_types") or []],
        state_fields=list(schema.fields),
        timeout_column=timeout_column,
        rows=rows,
    )


def export_state(
    location: CheckpointStorage | str | os.PathLike[str],
    version: Optional[int] = None,
    *,
    state_schema: Any = None,
    timeout_column: Optional[str] = None,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
) -> "pd.DataFrame":
    """The state of ``version`` (latest if None) as a pandas DataFrame: one row per key.

    Columns: the key columns, one column per field of ``state_schema`` and, with
    ``timeout_column``, each key's timeout (epoch ms). A column holding a null
    keeps Python objects (``None``, not NaN; ints stay ints). See :func:`state_rows`.
    """
    import pandas as pd

    read = state_rows(
        location,
        version,
        state_schema=state_schema,
        timeout_column=timeout_column,
        storage_options=storage_options,
        checkpoint_key=checkpoint_key,
    )
    columns = read.key_columns + [name for name, _ in read.state_fields]
    if timeout_column is not None:
        columns.append(timeout_column)
    values = list(zip(*read.rows)) if read.rows else [() for _ in columns]
    out = pd.DataFrame({name: list(column) for name, column in zip(columns, values)}, columns=columns)
    for name, column in zip(columns, values):
        if any(v is None for v in column):
            # pandas would turn [2, None] into [2.0, NaN]: a null stays None.
            out[name] = pd.Series(list(column), dtype=object)
    return out


def write_table(frame: "pd.DataFrame", path: str, file_format: Optional[str] = None) -> str:
    """Write ``frame`` as parquet or CSV (``file_format``, else from the path's suffix); returns the format."""
    fmt = file_format or ("csv" if path.lower().endswith(".csv") else "parquet" if path.lower().endswith((".parquet", ".pq")) else None)
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"cannot tell the format of {path!r}: give --format parquet|csv (or a .parquet/.csv path)")
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return fmt


__all__: Sequence[str] = ["STATE_SCHEMA_FIELD", "StateRows", "export_state", "state_rows", "state_schema_of", "write_table"]
