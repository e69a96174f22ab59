"""Manifests (what a committed version is) and task reports (what a task wrote).

A :class:`Manifest` of version N lists, for every key group, the chain of
sections to read in order: a snapshot followed by zero or more deltas.
Manifest N is manifest N-1 updated with the sections the tasks of version N
wrote (:meth:`Manifest.build`): a new snapshot replaces the key group's
chain, a delta is appended to it. Key groups no task touched keep their chain.

A :class:`TaskReport` is what one operator instance sends to the driver after
writing its task file: plain JSON-able data (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .errors import CheckpointError
from .format import DELTA, FORMAT_VERSION, SNAPSHOT


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class SectionRef:
    """Where one section of one key group is: ``length`` bytes at ``offset`` of ``file``.

    A snapshot section may reference SST files of their own (``sst_files``,
    shared by the consecutive key groups each holds); ``sst_bytes`` is this
    key group's share of their bytes.

    Written with a checkpoint key, a section also has ``digest``, the SHA-256
    of its bytes, and ``sst_digests``, those of its SST files (in the order of
    ``sst_files``): xxh64 and xxh3 catch damage, not a forger, so only these
    make a signed manifest vouch for the bytes it names. Empty without a key.
    """

    key_group: int
    kind: str  # SNAPSHOT or DELTA
    file: str  # relative to the checkpoint location
    offset: int
    length: int
    checksum: int  # xxh64 of the section bytes
    sst_files: tuple[str, ...] = ()  # relative to the checkpoint location
    sst_bytes: int = 0
    digest: str = ""  # SHA-256 (hex) of the section bytes; "" when written without a checkpoint key
    sst_digests: tuple[str, ...] = ()  # SHA-256 (hex) of each of sst_files; () without a checkpoint key

    @property
    def bytes(self) -> int:
        """The bytes this section stands for: its own and its share of the SST files it references."""
        return self.length + self.sst_bytes

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "file": self.file,
            "offset": self.offset,
            "length": self.length,
            "checksum": f"{self.checksum:016x}",
        }
        if self.sst_files:
            out["sst_files"] = list(self.sst_files)
            out["sst_bytes"] = self.sst_bytes
        if self.digest:
            out["digest"] = self.digest
        if self.sst_digests:
            out["sst_digests"] = list(self.sst_digests)
        return out

    @classmethod
    def from_dict(cls, key_group: int, data: Mapping[str, Any]) -> "SectionRef":
        kind = data["kind"]
        if kind not in (SNAPSHOT, DELTA):
            raise ValueError(f"unknown section kind {kind!r}")
        sst_files = data.get("sst_files")
        sst_digests = data.get("sst_digests")
        ref = cls(int(key_group), kind, str(data["file"]), int(data["offset"]), int(data["length"]),
                  int(data["checksum"], 16), tuple(map(str, sst_files)) if sst_files else (),
                  int(data.get("sst_bytes", 0)), str(data.get("digest", "")),
                  tuple(map(str, sst_digests)) if sst_digests else ())
        if ref.sst_digests and len(ref.sst_digests) != len(ref.sst_files):
            raise ValueError(f"{len(ref.sst_digests)} sst_digests for {len(ref.sst_files)} sst_files")
        return ref


@dataclass(frozen=True)
class TaskReport:
    """What one operator instance wrote for one version; sent to the driver, which commits it.

    ``file`` is None when no key group of the instance changed (nothing was
    written). ``base_version`` is the version whose chains the deltas were
    written on top of (None when the report holds only snapshots of a first
    checkpoint).
    """

    version: int
    task: str
    key_groups: range
    max_parallelism: int
    tables: tuple[str, ...]
    base_version: int | None
    file: str | None
    sections: tuple[SectionRef, ...] = ()
    bytes: int = 0
    records: int = 0
    seconds: float = 0.0

    @property
    def snapshots(self) -> int:
        return sum(1 for s in self.sections if s.kind == SNAPSHOT)

    @property
    def deltas(self) -> int:
        return sum(1 for s in self.sections if s.kind == DELTA)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "task": self.task,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "max_parallelism": self.max_parallelism,
            "tables": list(self.tables),
            "base_version": self.base_version,
            "file": self.file,
            "sections": [dict(s.to_dict(), key_group=s.key_group) for s in self.sections],
            "bytes": self.bytes,
            "records": self.records,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TaskReport":
        start, stop = data["key_groups"]
        return cls(
            version=int(data["version"]),
            task=str(data["task"]),
            key_groups=range(int(start), int(stop)),
            max_parallelism=int(data["max_parallelism"]),
            tables=tuple(data["tables"]),
            base_version=None if data.get("base_version") is None else int(data["base_version"]),
            file=data.get("file"),
            sections=tuple(SectionRef.from_dict(s["key_group"], s) for s in data.get("sections", ())),
            bytes=int(data.get("bytes", 0)),
            records=int(data.get("records", 0)),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class Manifest:
    """A committed version: the chain of sections of every key group, the tables and free-form metadata."""

    version: int
    max_parallelism: int
    tables: tuple[str, ...]
    chains: Mapping[int, tuple[SectionRef, ...]]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    base_version: int | None = None
    created_at: str = ""
    tasks: tuple[Mapping[str, Any], ...] = ()  # summary of the reports committed in this version

    def chain(self, key_group: int) -> tuple[SectionRef, ...]:
        """The sections of ``key_group`` in apply order (empty: the key group holds no state)."""
        return self.chains.get(key_group, ())

    def files(self) -> set[str]:
        """Every file this version needs: task files and the SST files their snapshots reference."""
        out = set()
        for chain in self.chains.values():
            for ref in chain:
                out.add(ref.file)
                out.update(ref.sst_files)
        return out

    def total_bytes(self, key_groups: Iterable[int] | None = None) -> int:
        """Bytes of the sections of ``key_groups`` (all by default), with their shares of SST files."""
        groups = self.chains if key_groups is None else key_groups
        return sum(ref.bytes for g in groups for ref in self.chain(g))

    # ------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        previous: "Manifest | None",
        version: int,
        reports: Iterable[TaskReport],
        metadata: Mapping[str, Any] | None = None,
        *,
        max_parallelism: int | None = None,
    ) -> "Manifest":
        """Manifest ``version`` = ``previous`` updated with the sections of ``reports``.

        Raises CheckpointError when the reports do not fit: another version,
        another max_parallelism, two reports writing one key group, a section
        outside its task's key groups, or a delta whose chain is not the one of
        ``previous`` (it was written on top of another version).
        """
        reports = list(reports)
        if previous is not None and version <= previous.version:
            raise CheckpointError(f"version {version} is not after the previous version {previous.version}")
        mp = max_parallelism
        if previous is not None:
            if mp is not None and mp != previous.max_parallelism:
                raise CheckpointError(f"max_parallelism {mp} != {previous.max_parallelism} of version {previous.version}")
            mp = previous.max_parallelism
        for report in reports:
            if mp is None:
                mp = report.max_parallelism
            if report.max_parallelism != mp:
                raise CheckpointError(
                    f"task {report.task!r} wrote with max_parallelism {report.max_parallelism}, the checkpoint has {mp}"
                )
        if mp is None:
            raise CheckpointError("the first version needs max_parallelism (no previous manifest and no reports)")

        chains: dict[int, tuple[SectionRef, ...]] = dict(previous.chains) if previous is not None else {}
        tables = list(previous.tables) if previous is not None else []
        written: dict[int, str] = {}
        base = previous.version if previous is not None else None
        for report in reports:
            if report.version != version:
                raise CheckpointError(f"task {report.task!r} reported version {report.version}, committing {version}")
            for name in report.tables:
                if name not in tables:
                    tables.append(name)
            has_delta = any(s.kind == DELTA for s in report.sections)
            if has_delta and report.base_version != base:
                raise CheckpointError(
                    f"task {report.task!r} wrote deltas on top of version {report.base_version}, "
                    f"but version {version} is committed on top of {base}"
                )
            for ref in report.sections:
                g = ref.key_group
                if g not in report.key_groups or not 0 <= g < mp:
                    raise CheckpointError(f"task {report.task!r} wrote key group {g} outside its {report.key_groups}")
                if g in written:
                    raise CheckpointError(f"key group {g} written by two tasks: {written[g]!r} and {report.task!r}")
                written[g] = report.task
                if ref.kind == SNAPSHOT:
                    chains[g] = (ref,)
                else:
                    if not chains.get(g):
                        raise CheckpointError(f"task {report.task!r} wrote a delta for key group {g}, which has no chain")
                    chains[g] = chains[g] + (ref,)
        summary = tuple(
            {"task": r.task, "file": r.file, "key_groups": [r.key_groups.start, r.key_groups.stop],
             "snapshots": r.snapshots, "deltas": r.deltas, "bytes": r.bytes, "records": r.records,
             "seconds": round(r.seconds, 6)}
            for r in reports
        )
        return cls(
            version=version,
            max_parallelism=mp,
            tables=tuple(tables),
            chains=dict(sorted(chains.items())),
            metadata=dict(metadata or {}),
            base_version=base,
            created_at=_now(),
            tasks=summary,
        )

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "version": self.version,
            "base_version": self.base_version,
            "created_at": self.created_at,
            "max_parallelism": self.max_parallelism,
            "tables": list(self.tables),
            "metadata": dict(self.metadata),
            "tasks": [dict(t) for t in self.tasks],
            "key_groups": {str(g): [ref.to_dict() for ref in chain] for g, chain in sorted(self.chains.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Manifest":
        if int(data.get("format", 1)) > FORMAT_VERSION:
            raise ValueError(f"manifest format {data['format']} is newer than this reader ({FORMAT_VERSION})")
        chains = {
            int(g): tuple(SectionRef.from_dict(int(g), ref) for ref in refs) for g, refs in data["key_groups"].items()
        }
        return cls(
            version=int(data["version"]),
            max_parallelism=int(data["max_parallelism"]),
            tables=tuple(data["tables"]),
            chains=chains,
            metadata=dict(data.get("metadata") or {}),
            base_version=None if data.get("base_version") is None else int(data["base_version"]),
            created_at=str(data.get("created_at", "")),
            tasks=tuple(data.get("tasks") or ()),
        )
