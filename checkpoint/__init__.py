"""Versioned, key-group-sharded checkpoints of opbuffer state (built on :mod:`state`).

A checkpoint location (local path or fsspec URL) holds one task file per
operator instance and version, and one manifest per committed version::

    from checkpoint import CheckpointStorage, CheckpointWriter, commit, restore

    storage = CheckpointStorage("/ckpt")           # or "memory://...", "s3://bucket/prefix"
    # task i of p, batch N: restore the latest version before N (any parallelism) ...
    restored = restore(storage, None, key_group_range(i, p), tables, before=N)
    for t in tables.values():
        t.track_changes()
    # ... process the batch, then write the changed key groups as version N
    writer = CheckpointWriter(storage, key_groups=key_group_range(i, p), task=i)
    report = writer.write(N, tables, {n: t.drain_changes() for n, t in tables.items()}, restored.manifest)
    # the driver, with every task's report (report.to_dict() is JSON-able), once the output is safe:
    commit(storage, N, reports, metadata={"watermark": ...})    # atomic; then retention

Only ``state`` is imported (never ``buffering`` or Spark). See
:mod:`checkpoint.format` for the file format and :mod:`checkpoint.storage`
for the layout of a location; ``python -m checkpoint inspect LOCATION``
prints what a location holds.
"""

from .debug import describe, format_description, read_state
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTrustError,
    RetentionWarning,
    VersionExistsError,
)
from .format import DELTA, FORMAT_VERSION, RECORDS, SNAPSHOT, SST
from .manifest import Manifest, SectionRef, TaskReport
from .reader import RestoreReport, restore
from .storage import KEY_ENV, CheckpointStorage
from .writer import (
    DEFAULT_MAX_CHAIN,
    DEFAULT_MAX_DELTA_RATIO,
    DEFAULT_RETAIN,
    DEFAULT_SST_KEY_GROUPS,
    DEFAULT_SST_MIN_ENTRIES,
    CheckpointWriter,
    apply_retention,
    commit,
)

__all__ = [
    "DEFAULT_MAX_CHAIN",
    "DEFAULT_MAX_DELTA_RATIO",
    "DEFAULT_RETAIN",
    "DEFAULT_SST_KEY_GROUPS",
    "DEFAULT_SST_MIN_ENTRIES",
    "DELTA",
    "FORMAT_VERSION",
    "RECORDS",
    "SNAPSHOT",
    "SST",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "CheckpointTrustError",
    "KEY_ENV",
    "RetentionWarning",
    "CheckpointWriter",
    "Manifest",
    "RestoreReport",
    "SectionRef",
    "TaskReport",
    "VersionExistsError",
    "apply_retention",
    "commit",
    "describe",
    "format_description",
    "read_state",
    "restore",
]
