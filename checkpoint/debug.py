"""Looking into a checkpoint: ``read_state`` (a DataFrame of a table) and ``describe`` (what ``inspect`` prints)."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from state import RocksDBStore, decode_key, denormalize_key
from state.blocks import iter_entries

from .format import DELTA, SNAPSHOT
from .reader import restore, verify_sections
from .storage import CheckpointStorage

if TYPE_CHECKING:
    import pandas as pd

_KG_BYTES = 2


def _storage(
    location: Any, storage_options: Mapping[str, Any] | None, checkpoint_key: str | bytes | None = None
) -> CheckpointStorage:
    return CheckpointStorage.of(location, storage_options=storage_options, create=False, checkpoint_key=checkpoint_key)


def read_state(
    location: CheckpointStorage | str | os.PathLike[str],
    version: int | None = None,
    *,
    table: str = "state",
    key_names: Sequence[str] | None = None,
    value_name: str = "state",
    key_groups: range | None = None,
    with_key_group: bool = False,
    loads: Callable[[bytes], Any] = pickle.loads,
    storage_options: Mapping[str, Any] | None = None,
    checkpoint_key: str | bytes | None = None,
) -> pd.DataFrame:
    """Every key of ``table`` in ``version`` (latest if None) as a DataFrame, for debugging and tests.

    Columns: the key columns (``key_names``, else the ``key_columns`` the runner
    recorded in the manifest's metadata, else ``k0, k1, ...``), then
    ``value_name`` holding the value deserialized with ``loads`` (pickle), and
    with ``with_key_group`` a ``key_group`` column first. Rows are in RocksDB
    order (key group, then canonical key bytes). The version is restored into
    a temporary RocksDB, so every section's checksum is verified on the way.
    ``storage_options`` are the fsspec options of a URL ``location`` (one mapping,
    e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for s3fs).

    Values are unpickled (with the default ``loads``): read only locations
    whose writers you trust, or set a checkpoint key (``checkpoint_key=`` or
    ``$OPBUFFER_CHECKPOINT_KEY``), which makes an unsigned or wrongly signed
    manifest fail before any value is read.
    """
    import pandas as pd
    storage = _storage(location, storage_options, checkpoint_key)
    manifest = storage.read_manifest(version)
    if table not in manifest.tables:
        raise ValueError(f"version {manifest.version} has no table {table!r}; its tables: {list(manifest.tables)}")
    groups = range(manifest.max_parallelism) if key_groups is None else key_groups
    rows: list[tuple[int, tuple, Any]] = []
    with tempfile.TemporaryDirectory(prefix="opbuffer-read-state-") as tmp:
        store = RocksDBStore(os.path.join(tmp, "db"), max_parallelism=manifest.max_parallelism, table=table)
        try:
            tables = {name: store.table(name) for name in manifest.tables}
            restore(storage, manifest.version, groups, tables, tmp_dir=tmp)
            for raw_key, raw_value in iter_entries(tables[table].iter_raw()):  # key-group blocks expanded
                key = denormalize_key(decode_key(raw_key, _KG_BYTES))
                rows.append((int.from_bytes(raw_key[:_KG_BYTES], "big"), key, loads(raw_value)))
        finally:
            store.close()
    arity = max((len(k) for _, k, _ in rows), default=len(key_names) if key_names else 1)
    if key_names is None:
        for field in ("key_columns", "state_key_columns"):  # a windowed aggregate's keys add window_start
            recorded = manifest.metadata.get(field)
            if isinstance(recorded, list) and (key_names is None or len(recorded) == arity):
                key_names = [str(name) for name in recorded]
    names = list(key_names) if key_names is not None else [f"k{i}" for i in range(arity)]
    if len(names) != arity:
        raise ValueError(f"key_names has {len(names)} names, the keys of {table!r} have {arity} columns")
    columns: dict[str, list] = {}
    if with_key_group:
        columns["key_group"] = [g for g, _, _ in rows]
    for i, name in enumerate(names):
        columns[name] = [k[i] if i < len(k) else None for _, k, _ in rows]
    columns[value_name] = [v for _, _, v in rows]
    out = pd.DataFrame(columns)
    for name in names:
        if any(value is None for value in columns[name]):
            # A null key element stays None: pandas would turn [2, None] into [2.0, NaN].
            out[name] = pd.Series(columns[name], dtype=object)
    return out


def describe(
    location: CheckpointStorage | str | os.PathLike[str],
    version: int | None = None,
    *,
    verify: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    checkpoint_key: str | bytes | None = None,
) -> dict[str, Any]:
    """A JSON-able description of a checkpoint location and one version (latest by default).

    With ``verify`` every section of the version is read and its checksum checked
    (a damaged one raises CheckpointCorruptError). With a checkpoint key the
    manifest's signature is verified too. Nothing is unpickled.
    """
    storage = _storage(location, storage_options, checkpoint_key)
    versions = storage.versions()
    out: dict[str, Any] = {"location": storage.location, "versions": versions}
    data_files = storage.data_files()
    out["data_files"] = len(data_files)
    if not versions and version is None:
        return out
    manifest = storage.read_manifest(version)
    files: dict[str, dict[str, int]] = {}
    groups = []
    for g, chain in manifest.chains.items():
        for ref in chain:
            entry = files.setdefault(ref.file, {"sections": 0, "bytes": 0})
            entry["sections"] += 1
            entry["bytes"] += ref.length
            for name in ref.sst_files:  # SST files next to the task file: sections referencing them
                entry = files.setdefault(name, {"sections": 0, "bytes": 0})
                entry["sections"] += 1
                entry["bytes"] += ref.sst_bytes // len(ref.sst_files)
        groups.append({
            "key_group": g,
            "chain": len(chain),
            "kinds": "".join("S" if r.kind == SNAPSHOT else "D" for r in chain),
            "snapshot_bytes": chain[0].bytes if chain else 0,
            "delta_bytes": sum(r.bytes for r in chain[1:]),
            "files": sorted({r.file for r in chain} | {f for r in chain for f in r.sst_files}),
        })
    for name, entry in files.items():
        try:
            entry["file_size"] = storage.size(name)
        except FileNotFoundError:
            entry["file_size"] = -1  # missing
    chains = [g["chain"] for g in groups]
    kinds = Counter(r.kind for chain in manifest.chains.values() for r in chain)
    out["version"] = {
        "version": manifest.version,
        "base_version": manifest.base_version,
        "created_at": manifest.created_at,
        "max_parallelism": manifest.max_parallelism,
        "tables": list(manifest.tables),
        "metadata": dict(manifest.metadata),
        "tasks": [dict(t) for t in manifest.tasks],
        "key_groups_with_state": len(groups),
        "snapshots": kinds.get(SNAPSHOT, 0),
        "deltas": kinds.get(DELTA, 0),
        "total_bytes": manifest.total_bytes(),
        "chain_length": {"min": min(chains, default=0), "max": max(chains, default=0),
                         "mean": round(sum(chains) / len(chains), 3) if chains else 0.0},
        "files": files,
        "key_groups": groups,
    }
    if verify:
        refs = [ref for chain in manifest.chains.values() for ref in chain]
        verify_sections(storage, refs)
        out["version"]["verified_sections"] = len(refs)
    return out


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)  # pragma: no cover


def format_description(info: dict[str, Any], *, key_groups: bool = True) -> str:
    """The text ``python -m checkpoint inspect`` prints."""
    lines = [f"checkpoint {info['location']}"]
    versions = info["versions"]
    if not versions:
        lines.append(f"versions: none committed ({info['data_files']} data files)")
        return "\n".join(lines)
    lines.append(f"versions: {', '.join(map(str, versions))} (latest {versions[-1]}); {info['data_files']} data files")
    v = info["version"]
    lines.append("")
    lines.append(f"version {v['version']}  base {v['base_version']}  created {v['created_at']}")
    lines.append(f"max_parallelism {v['max_parallelism']}  tables: {', '.join(v['tables'])}")
    lines.append(f"metadata: {v['metadata']}")
    cl = v["chain_length"]
    lines.append(
        f"key groups with state: {v['key_groups_with_state']}  sections: {v['snapshots']} snapshots + "
        f"{v['deltas']} deltas  total {_human(v['total_bytes'])} ({v['total_bytes']:,} bytes)  "
        f"chain length min {cl['min']} / max {cl['max']} / mean {cl['mean']}"
    )
    if "verified_sections" in v:
        lines.append(f"verified: {v['verified_sections']} sections, every checksum matches")
    lines.append(f"files ({len(v['files'])}):")
    for name, entry in sorted(v["files"].items()):
        size = "MISSING" if entry["file_size"] < 0 else _human(entry["file_size"])
        lines.append(f"  {name}  {entry['sections']} sections  {_human(entry['bytes'])} referenced  file {size}")
    if v["tasks"]:
        lines.append(f"written in this version ({len(v['tasks'])} tasks):")
        for t in v["tasks"]:
            lines.append(
                f"  task {t['task']}  key groups {t['key_groups'][0]}..{t['key_groups'][1] - 1}  "
                f"{t['snapshots']} snapshots + {t['deltas']} deltas  {_human(t['bytes'])}  {t['seconds']:.3f} s"
            )
    if key_groups:
        lines.append("key group  chain  kinds       snapshot       deltas")
        for g in v["key_groups"]:
            lines.append(
                f"{g['key_group']:>9}  {g['chain']:>5}  {g['kinds']:<10}  {g['snapshot_bytes']:>8,} B  "
                f"{g['delta_bytes']:>9,} B"
            )
    return "\n".join(lines)
