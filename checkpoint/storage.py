"""Where checkpoints live: a local directory or an fsspec URL, with atomic manifest commits.

Layout of a checkpoint location::

    manifests/v0000000007.json     the manifest of version 7 (exists = version 7 is committed)
    manifests/.tmp-v...-<uuid>     a manifest being committed (never read)
    data/v0000000007-<task>-<attempt>.ckpt   task files (one per operator instance, version, attempt)
    data/v0000000007-<task>-<attempt>.kg<lo>-<hi>.t<i>.sst   SST files a task file's snapshots reference

A version exists only once its manifest exists. A manifest is written to a
temporary name and renamed (local: ``os.replace`` after ``fsync``; fsspec:
``fs.mv``; on object stores an object appears whole, so the rename's copy is
atomic too). Task files are written under unique attempt names and are never
renamed: a file only matters once a committed manifest references it.

Local paths (and ``file://`` URLs) use ``os`` directly; any other URL
(``memory://``, ``s3://``, ...) goes through ``fsspec``, imported on first use.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from contextlib import contextmanager
from typing import IO, Any, Iterator

from .errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError, VersionExistsError
from .manifest import Manifest

MANIFEST_DIR = "manifests"
DATA_DIR = "data"
_MANIFEST_RE = re.compile(r"^v(\d{10})\.json$")
_TMP_MANIFEST_RE = re.compile(r"^\.tmp-v(\d{10})-[0-9a-f]+\.json$")
_DATA_RE = re.compile(r"^v(\d{10})-.*\.(?:ckpt|sst)$")
_TASK_RE = re.compile(r"[^A-Za-z0-9_.=]+")


def manifest_path(version: int) -> str:
    return f"{MANIFEST_DIR}/v{version:010d}.json"


def data_file_version(name: str) -> int | None:
    """The version in a task (or SST) file's name (``data/v0000000007-...``), or None for a foreign file."""
    match = _DATA_RE.match(name.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def _check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 10**10:
        raise ValueError(f"version must be an int in [0, 10**10), got {version!r}")
    return version


class _LocalFS:
    """The few file operations a checkpoint needs, on a local directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def full(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def makedirs(self, rel: str) -> None:
        os.makedirs(self.full(rel), exist_ok=True)

    def listdir(self, rel: str) -> list[str]:
        try:
            return os.listdir(self.full(rel))
        except FileNotFoundError:
            return []

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.full(rel))

    def size(self, rel: str) -> int:
        return os.path.getsize(self.full(rel))

    @contextmanager
    def open_write(self, rel: str) -> Iterator[IO[bytes]]:
        path = self.full(rel)
        with open(path, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())

    def open_read(self, rel: str) -> IO[bytes]:
        return open(self.full(rel), "rb")

    def read_bytes(self, rel: str) -> bytes:
        with open(self.full(rel), "rb") as f:
            return f.read()

    def delete(self, rel: str) -> None:
        try:
            os.remove(self.full(rel))
        except FileNotFoundError:
            pass

    def commit_file(self, tmp_rel: str, final_rel: str) -> None:
        tmp, final = self.full(tmp_rel), self.full(final_rel)
        try:
            os.link(tmp, final)  # atomic and never replaces a file another committer published
        except FileExistsError:
            raise VersionExistsError(f"{final_rel} was committed concurrently") from None
        except OSError:  # no hard links on this filesystem
            os.replace(tmp, final)
        else:
            os.remove(tmp)
        try:  # make the rename durable
            fd = os.open(os.path.dirname(self.full(final_rel)), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


class _FsspecFS:
    """The same operations through an fsspec filesystem."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        try:
            import fsspec
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise CheckpointError(f"checkpoint location {url!r} needs fsspec (pip install fsspec)") from exc
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def makedirs(self, rel: str) -> None:
        self.fs.makedirs(self.full(rel), exist_ok=True)

    def listdir(self, rel: str) -> list[str]:
        try:
            names = self.fs.ls(self.full(rel), detail=False)
        except FileNotFoundError:
            return []
        return [n.rstrip("/").rsplit("/", 1)[-1] for n in names]

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.full(rel)))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.full(rel)))

    @contextmanager
    def open_write(self, rel: str) -> Iterator[IO[bytes]]:
        with self.fs.open(self.full(rel), "wb") as f:
            yield f

    def open_read(self, rel: str) -> IO[bytes]:
        return self.fs.open(self.full(rel), "rb")

    def read_bytes(self, rel: str) -> bytes:
        return bytes(self.fs.cat_file(self.full(rel)))

    def delete(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass

    def commit_file(self, tmp_rel: str, final_rel: str) -> None:
        self.fs.mv(self.full(tmp_rel), self.full(final_rel))


class CheckpointStorage:
    """A checkpoint location: task files and one manifest per committed version.

    Args:
        location: a local directory (created if missing), a ``file://`` URL or
            any fsspec URL (``memory://...``, ``s3://bucket/prefix``, ...).
        storage_options: passed to fsspec for non-local URLs.
        create: create the location's directories (off for read-only uses such as ``inspect``).

    One committer (the driver) at a time is assumed; on a local filesystem a
    concurrent commit of the same version is still detected (the manifest is
    published with a hard link, which never replaces an existing file).

    Paths handed around (task files in reports and manifests) are relative to
    the location, so a checkpoint can be moved or copied as a whole.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        create: bool = True,
    ) -> None:
        text = os.fspath(location)
        if not isinstance(text, str) or not text:
            raise ValueError(f"location must be a non-empty path or URL, got {location!r}")
        self.location = text
        if text.startswith("file://"):
            self._fs: _LocalFS | _FsspecFS = _LocalFS(text[len("file://") :])
        elif "://" in text:
            self._fs = _FsspecFS(text, dict(storage_options or {}))
        else:
            self._fs = _LocalFS(text)
        if create:
            self._fs.makedirs(MANIFEST_DIR)
            self._fs.makedirs(DATA_DIR)

    @classmethod
    def of(cls, location: "CheckpointStorage | str | os.PathLike[str]", **kwargs: Any) -> "CheckpointStorage":
        """``location`` itself if it is a CheckpointStorage, else a new one for it."""
        return location if isinstance(location, CheckpointStorage) else cls(location, **kwargs)

    @property
    def is_local(self) -> bool:
        return isinstance(self._fs, _LocalFS)

    def local_path(self, rel: str) -> str | None:
        """The operating-system path of ``rel`` for a local location, None for any other (fsspec) one."""
        return self._fs.full(rel) if isinstance(self._fs, _LocalFS) else None

    # ------------------------------------------------------------ versions and manifests
    def versions(self) -> list[int]:
        """Committed versions, ascending."""
        out = []
        for name in self._fs.listdir(MANIFEST_DIR):
            match = _MANIFEST_RE.match(name)
            if match:
                out.append(int(match.group(1)))
        return sorted(out)

    def latest_version(self, before: int | None = None) -> int | None:
        """The newest committed version (``< before`` when given), or None."""
        versions = self.versions()
        if before is not None:
            versions = [v for v in versions if v < before]
        return versions[-1] if versions else None

    def latest_manifest(self, before: int | None = None) -> Manifest | None:
        """The manifest of :meth:`latest_version` (``< before`` when given), or None when there is none.

        What a task of version N restores from and writes on top of: ``latest_manifest(before=N)``.
        """
        version = self.latest_version(before)
        return None if version is None else self.read_manifest(version)

    def has_version(self, version: int) -> bool:
        return self._fs.exists(manifest_path(_check_version(version)))

    def read_manifest(self, version: int | None = None) -> Manifest:
        """The manifest of ``version`` (latest if None).

        Raises CheckpointNotFoundError when the version is not committed and
        CheckpointCorruptError when its manifest cannot be parsed.
        """
        if version is None:
            version = self.latest_version()
            if version is None:
                raise CheckpointNotFoundError(f"no committed version in {self.location!r}")
        rel = manifest_path(_check_version(version))
        try:
            data = self._fs.read_bytes(rel)
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"version {version} is not committed in {self.location!r} (no {rel}); "
                f"committed versions: {self.versions()}"
            ) from None
        try:
            manifest = Manifest.from_dict(json.loads(data))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(f"corrupt manifest {rel!r} in {self.location!r}: {exc}", file=rel) from exc
        if manifest.version != version:
            raise CheckpointCorruptError(
                f"manifest {rel!r} in {self.location!r} says version {manifest.version}", file=rel
            )
        return manifest

    def write_manifest(self, manifest: Manifest) -> None:
        """Commit ``manifest``: write it under a temporary name, then rename it into place.

        Raises VersionExistsError if the version is already committed.
        """
        final = manifest_path(_check_version(manifest.version))
        if self._fs.exists(final):
            raise VersionExistsError(f"version {manifest.version} is already committed in {self.location!r}")
        tmp = f"{MANIFEST_DIR}/.tmp-v{manifest.version:010d}-{uuid.uuid4().hex}.json"
        data = json.dumps(manifest.to_dict(), indent=1, sort_keys=False).encode("utf-8")
        try:
            with self._fs.open_write(tmp) as f:
                f.write(data)
            self._fs.commit_file(tmp, final)
        except BaseException:
            self._fs.delete(tmp)
            raise

    def delete_manifest(self, version: int) -> None:
        self._fs.delete(manifest_path(_check_version(version)))

    # ------------------------------------------------------------ task files
    def new_data_file(self, version: int, task: str | int) -> str:
        """A fresh, unique task file name for one attempt: ``data/v{version:010d}-{task}-{attempt}.ckpt``."""
        task_text = _TASK_RE.sub("_", str(task))[:64] or "task"
        return f"{DATA_DIR}/v{_check_version(version):010d}-{task_text}-{uuid.uuid4().hex[:16]}.ckpt"

    def data_files(self) -> list[str]:
        """Every file under ``data/`` (relative paths), including orphans of failed attempts."""
        return sorted(f"{DATA_DIR}/{name}" for name in self._fs.listdir(DATA_DIR))

    def open_write(self, rel: str) -> Any:
        """A context manager writing a new file (local: exclusive create, fsync on close)."""
        return self._fs.open_write(rel)

    def open_read(self, rel: str) -> IO[bytes]:
        return self._fs.open_read(rel)

    def write_small_file(self, rel: str, data: bytes) -> None:
        """Write (or replace) a small file atomically: a temporary name, then a rename."""
        directory = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if directory:
            self._fs.makedirs(directory)
        tmp = f"{rel}.tmp-{uuid.uuid4().hex}"
        try:
            with self._fs.open_write(tmp) as f:
                f.write(data)
            if self._fs.exists(rel):
                self._fs.delete(rel)
            self._fs.commit_file(tmp, rel)
        except BaseException:
            self._fs.delete(tmp)
            raise

    def read_small_file(self, rel: str) -> bytes | None:
        """The bytes of a small file, or None if it does not exist."""
        if not self._fs.exists(rel):
            return None
        return self._fs.read_bytes(rel)

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        with self._fs.open_read(rel) as f:
            f.seek(offset)
            return f.read(length)

    def size(self, rel: str) -> int:
        return self._fs.size(rel)

    def exists(self, rel: str) -> bool:
        return self._fs.exists(rel)

    def delete(self, rel: str) -> None:
        """Delete a file (no error when it is already gone)."""
        self._fs.delete(rel)

    def temp_manifests(self) -> list[tuple[str, int]]:
        """``(path, version)`` of leftover temporary manifests (of commits that died)."""
        out = []
        for name in self._fs.listdir(MANIFEST_DIR):
            match = _TMP_MANIFEST_RE.match(name)
            if match:
                out.append((f"{MANIFEST_DIR}/{name}", int(match.group(1))))
        return out

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.location!r})"
