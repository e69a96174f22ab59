"""Where checkpoints live: a local directory or an fsspec URL, with atomic manifest commits.

Layout of a checkpoint location::

    manifests/v0000000007.json     the manifest of version 7 (exists = version 7 is committed)
    manifests/.tmp-v...-<uuid>     a manifest being committed (never read)
    manifests/set-aside/v0000000009-<uuid>.json   a version set aside by a runner started from an older one
    batches/v0000000008.json       the processing time batch 8 chose before it ran (reused by its retries)
    metrics/v0000000007.json       what batch 7 did (a runner's batch metrics), written after it committed
    data/v0000000007-<task>-<attempt>.ckpt   task files (one per operator instance, version, attempt)
    data/v0000000007-<task>-<attempt>.kg<lo>-<hi>.t<i>.sst   SST files a task file's snapshots reference
    initial_state/part-00003-<attempt>.arrow   a processor's initial state for operator instance 3 (Spark runner)

A version exists only once its manifest exists. A manifest is written to a
temporary name and renamed (local: ``os.replace`` after ``fsync``; fsspec:
``fs.mv``; on object stores an object appears whole, so the rename's copy is
atomic too). Task files are written under unique attempt names and are never
renamed: a file only matters once a committed manifest references it.

Manifests and batch records are sealed: the file is JSON holding a
``checksum`` (SHA-256 of the canonical JSON of the other fields: sorted keys,
compact separators, ASCII) and, with a checkpoint key, a ``signature``
(HMAC-SHA256 of the same bytes). A file must also be byte for byte what the
writer wrote, so every changed byte is caught. A file without a checksum (a
manifest of an opbuffer that had none) is refused: it cannot be told apart
from one whose checksum field was damaged, and there are no such
checkpoints to keep.

The key (``checkpoint_key=`` or the environment variable
``OPBUFFER_CHECKPOINT_KEY``) protects against anyone who can write the
location: checkpoint values are pickles, so such a writer could otherwise
run code wherever a version is restored. With a key, unsigned manifests and
records are refused, and a manifest is verified before any file it names is
read; it holds the checksums of every section and SST file.

Local paths (and ``file://`` URLs) use ``os`` directly; any other URL
(``memory://``, ``s3://``, ...) goes through ``fsspec``, imported on first use.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator, Mapping

from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTrustError,
    VersionExistsError,
)
from .manifest import Manifest

MANIFEST_DIR = "manifests"
SET_ASIDE_DIR = f"{MANIFEST_DIR}/set-aside"
DATA_DIR = "data"
BATCHES_DIR = "batches"
METRICS_DIR = "metrics"
#: The environment variable holding the checkpoint key when no ``checkpoint_key=`` is given.
KEY_ENV = "OPBUFFER_CHECKPOINT_KEY"
_CHECKSUM = "checksum"
_SIGNATURE = "signature"
_SET_ASIDE_RE = re.compile(r"^v(\d{10})-[0-9a-f]+\.json$")
_BATCH_RE = re.compile(r"^v(\d{10})\.json(?:\.tmp-[0-9a-f]+)?$")
_METRICS_RE = re.compile(r"^v(\d{10})\.json(?:\.tmp-[0-9a-f]+)?$")
_MANIFEST_RE = re.compile(r"^v(\d{10})\.json$")
_TMP_MANIFEST_RE = re.compile(r"^\.tmp-v(\d{10})-[0-9a-f]+\.json$")
_DATA_RE = re.compile(r"^v(\d{10})-.*\.(?:ckpt|sst)$")
_TASK_RE = re.compile(r"[^A-Za-z0-9_.=]+")
#: Requests to an object store in flight at once while reading ranges (each one is a round trip of
#: 1-50 ms on S3, nearly all of it waiting: threads overlap the waits).
FETCH_THREADS = 16
#: Bytes of ranges fetched ahead of the reader at most (bounds the memory of a concurrent read).
FETCH_AHEAD_BYTES = 128 << 20


def manifest_path(version: int) -> str:
    return f"{MANIFEST_DIR}/v{version:010d}.json"


#: The batch running now (see CheckpointStorage.record_running_batch); not a numbered record.
RUNNING_BATCH_PATH = f"{BATCHES_DIR}/running.json"


def batch_record_path(version: int) -> str:
    return f"{BATCHES_DIR}/v{version:010d}.json"


def batch_metrics_path(version: int) -> str:
    return f"{METRICS_DIR}/v{version:010d}.json"


def resolve_key(checkpoint_key: str | bytes | None) -> bytes | None:
    """The checkpoint key: ``checkpoint_key`` (str: its UTF-8 bytes), else ``$OPBUFFER_CHECKPOINT_KEY``, else None.

    An empty key is refused (it would sign with no secret at all).
    """
    if checkpoint_key is None:
        env = os.environ.get(KEY_ENV)
        if env is None:
            return None
        if not env:
            raise ValueError(f"the environment variable {KEY_ENV} is set but empty; unset it or give it a key")
        return env.encode("utf-8")
    if isinstance(checkpoint_key, str):
        checkpoint_key = checkpoint_key.encode("utf-8")
    if not isinstance(checkpoint_key, (bytes, bytearray)):
        raise TypeError(f"checkpoint_key must be str or bytes, got {type(checkpoint_key).__name__}")
    if not checkpoint_key:
        raise ValueError("checkpoint_key must not be empty")
    return bytes(checkpoint_key)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _sealed(body: dict[str, Any], checksum: str, signature: str | None) -> dict[str, Any]:
    sealed = dict(body)
    sealed[_CHECKSUM] = checksum
    if signature is not None:
        sealed[_SIGNATURE] = signature
    return sealed


def _render(body: dict[str, Any], checksum: str, signature: str | None) -> bytes:
    """The file of a sealed body: one top-level field a line, each value compact. Every part goes
    through json's C encoder (``indent=`` takes its pure-Python one: 4 ms to render a manifest of 128
    key groups, paid again by every read, which renders the file to compare it)."""
    compact = (",", ":")
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=compact)}" for k, v in _sealed(body, checksum, signature).items()]
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode("ascii")


def _render_indented(body: dict[str, Any], checksum: str, signature: str | None) -> bytes:
    """How files were rendered before :func:`_render` (``indent=1``): still read."""
    return json.dumps(_sealed(body, checksum, signature), indent=1).encode("ascii")


def seal(body: dict[str, Any], key: bytes | None) -> bytes:
    """The file of ``body``: its JSON with a checksum and, with ``key``, a signature of the canonical JSON."""
    if _CHECKSUM in body or _SIGNATURE in body:
        raise ValueError(f"a sealed body may not have the fields {_CHECKSUM!r} or {_SIGNATURE!r}")
    canonical = _canonical(body)
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    signature = None if key is None else "hmac-sha256:" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return _render(body, checksum, signature)


def unseal(data: bytes, key: bytes | None, *, what: str) -> dict[str, Any]:
    """The body of a sealed file, verified; raises CheckpointCorruptError / CheckpointTrustError naming ``what``.

    ``what`` says which file it is (e.g. ``"manifest 'manifests/v0000000007.json' in '/ckpt'"``).
    """
    try:
        sealed = json.loads(data)
    except ValueError as exc:
        raise CheckpointCorruptError(f"corrupt {what}: not JSON ({exc})") from exc
    if not isinstance(sealed, dict):
        raise CheckpointCorruptError(f"corrupt {what}: not a JSON object")
    checksum = sealed.pop(_CHECKSUM, None)
    signature = sealed.pop(_SIGNATURE, None)
    if checksum is None:
        raise CheckpointCorruptError(
            f"{what} has no checksum: refused (damaged, or written by an opbuffer without manifest checksums)"
        )
    canonical = _canonical(sealed)
    if not isinstance(checksum, str) or not hmac.compare_digest(
        checksum, "sha256:" + hashlib.sha256(canonical).hexdigest()
    ):
        raise CheckpointCorruptError(f"corrupt {what}: checksum mismatch")
    if signature is not None and not isinstance(signature, str):
        raise CheckpointCorruptError(f"corrupt {what}: the signature is not a string")
    data = bytes(data)
    if _render(sealed, checksum, signature) != data and _render_indented(sealed, checksum, signature) != data:
        raise CheckpointCorruptError(f"corrupt {what}: it is not byte for byte what the writer wrote")
    if key is not None:
        if signature is None:
            raise CheckpointTrustError(
                f"{what} is not signed, and a checkpoint key is set: refused (an unsigned file may have been "
                "written by anyone who can write the location; nothing of it was read)"
            )
        expected = "hmac-sha256:" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(signature, expected):
            raise CheckpointTrustError(
                f"{what} has a signature that does not match the checkpoint key: refused (written with another "
                "key, or crafted; nothing of it was read)"
            )
    return sealed


def data_file_version(name: str) -> int | None:
    """The version in a task (or SST) file's name (``data/v0000000007-...``), or None for a foreign file."""
    match = _DATA_RE.match(name.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def _check_options(storage_options: Any, location: str) -> Mapping[str, Any]:
    """``storage_options`` as a mapping (None: empty); anything else is a TypeError naming it."""
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping):
        raise TypeError(
            f"storage_options for {location!r} must be a mapping of fsspec options "
            f"(e.g. {{'client_kwargs': {{'endpoint_url': ...}}}}), got {type(storage_options).__name__}: "
            f"{storage_options!r:.200}"
        )
    return storage_options


def _check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 10**10:
        raise ValueError(f"version must be an int in [0, 10**10), got {version!r}")
    return version


class _LocalFS:
    """The few file operations a checkpoint needs, on a local directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))  # "~/ckpt" means the home directory, as in a shell

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

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        with open(self.full(rel), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def delete(self, rel: str) -> None:
        try:
            os.remove(self.full(rel))
        except FileNotFoundError:
            pass

    def move(self, src_rel: str, dst_rel: str) -> None:
        os.replace(self.full(src_rel), self.full(dst_rel))

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
        if storage_options.get("use_listings_cache", False):
            raise ValueError(
                f"storage_options use_listings_cache={storage_options['use_listings_cache']!r} for {url!r}: "
                "a checkpoint location is never read through a listings cache (it would hide the files other "
                "processes write); leave the option out"
            )
        # No listings cache. fsspec filesystems (s3fs, gcsfs, ...) keep the directory listings they
        # made and answer exists/info/ls from them; such a listing only follows this process's own
        # writes. A checkpoint location is written by other processes: Spark tasks write the task
        # files the driver's commit then looks for, another driver may have committed versions.
        # With the cache, commit found a task file "missing" because retention had listed data/
        # before the tasks wrote it. fs.invalidate_cache(path) before each check would have to
        # precede every exists/ls/info here and in every future caller (one forgotten call is this
        # bug again), and skip_instance_cache only stops sharing the instance: its own cache still
        # goes stale. Off where the filesystem is made, every answer is current. The price is
        # requests: an exists is a HEAD of its own, so commit checks the tasks' files against one
        # fresh listing of data/ instead, and a restore asks for no size at all (manifest sizes).
        self.fs, root = fsspec.core.url_to_fs(url, **{**storage_options, "use_listings_cache": False})
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
        # From offset 0 to the end: s3fs then sends one GET ("bytes=0-"); without a start it
        # asks for the size first (a HEAD), to split a large object into concurrent parts.
        return self._cat(rel, 0, None)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        # With both ends given, an object store answers with one ranged GET: no HEAD for the size.
        return self._cat(rel, start, end)

    def _cat(self, rel: str, start: int, end: int | None) -> bytes:
        try:
            return bytes(self.fs.cat_file(self.full(rel), start=start, end=end))
        except FileNotFoundError:
            raise
        except OSError as exc:
            # S3 refuses a range starting at or past the end of the object (416); a local file
            # or memory:// reads nothing there. The caller sees a short read either way.
            if exc.errno == errno.EINVAL and "range" in str(exc).lower():
                return b""
            raise

    def delete(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass

    def move(self, src_rel: str, dst_rel: str) -> None:
        self.fs.mv(self.full(src_rel), self.full(dst_rel))

    def commit_file(self, tmp_rel: str, final_rel: str) -> None:
        self.fs.mv(self.full(tmp_rel), self.full(final_rel))


class CheckpointStorage:
    """A checkpoint location: task files and one manifest per committed version.

    Args:
        location: a local directory (created if missing), a ``file://`` URL or
            any fsspec URL (``memory://...``, ``s3://bucket/prefix``, ...).
        storage_options: one mapping of fsspec options for a non-local URL (for s3fs e.g.
            ``{"client_kwargs": {"endpoint_url": ...}, "key": ..., "secret": ...}``). The
            location is never read through a listings cache (``use_listings_cache`` is off).
        create: create the location's directories (off for read-only uses such as ``inspect``).
        checkpoint_key: the key manifests and batch records are signed with and
            verified against (str: its UTF-8 bytes); None: ``$OPBUFFER_CHECKPOINT_KEY``
            when set, else no key (checksums only). With a key, unsigned files are refused.

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
        checkpoint_key: str | bytes | None = None,
    ) -> None:
        self._key = resolve_key(checkpoint_key)
        text = os.fspath(location)
        if not isinstance(text, str) or not text:
            raise ValueError(f"location must be a non-empty path or URL, got {location!r}")
        self.location = text
        if text.startswith("file://"):
            self._fs: _LocalFS | _FsspecFS = _LocalFS(text[len("file://") :])
        elif "://" in text:
            self._fs = _FsspecFS(text, dict(_check_options(storage_options, text)))
        else:
            self._fs = _LocalFS(text)
        if create:
            self._fs.makedirs(MANIFEST_DIR)
            self._fs.makedirs(DATA_DIR)

    @classmethod
    def of(cls, location: "CheckpointStorage | str | os.PathLike[str]", **kwargs: Any) -> "CheckpointStorage":
        """``location`` itself if it is a CheckpointStorage, else a new one for it.

        A CheckpointStorage given with another ``checkpoint_key`` than its own is refused.
        """
        if isinstance(location, CheckpointStorage):
            key = kwargs.get("checkpoint_key")
            if key is not None and resolve_key(key) != location._key:
                raise ValueError(f"checkpoint_key differs from the key of the given {location!r}")
            if kwargs.get("storage_options"):  # they would be silently ignored: the storage has its filesystem
                raise ValueError(
                    f"storage_options are for a location given as a path or URL, not for the given {location!r}"
                )
            return location
        return cls(location, **kwargs)

    @property
    def checkpoint_key(self) -> bytes | None:
        """The key manifests are signed with and verified against (None: checksums only)."""
        return self._key

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
            body = unseal(data, self._key, what=f"manifest {rel!r} in {self.location!r}")
        except CheckpointCorruptError as exc:
            exc.file = rel
            raise
        try:
            manifest = Manifest.from_dict(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
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
        data = seal(manifest.to_dict(), self._key)
        try:
            with self._fs.open_write(tmp) as f:
                f.write(data)
            self._fs.commit_file(tmp, final)
        except BaseException:
            self._fs.delete(tmp)
            raise

    def delete_manifest(self, version: int) -> None:
        self._fs.delete(manifest_path(_check_version(version)))

    # ------------------------------------------------------------ starting from a version
    def set_aside_manifests(self) -> list[tuple[str, int]]:
        """``(path, version)`` of the manifests set aside by :meth:`set_aside_after`, by version."""
        return self._numbered(SET_ASIDE_DIR, _SET_ASIDE_RE)

    def set_aside_versions(self) -> list[int]:
        """Versions set aside by :meth:`set_aside_after`, ascending."""
        return [v for _, v in self.set_aside_manifests()]

    def highest_version(self) -> int | None:
        """The highest version ever committed here that is still on record (committed or set aside), or None.

        A version number is never committed twice: the next version must be above it.
        """
        versions = self.versions() + self.set_aside_versions()
        return max(versions) if versions else None

    def start(self, start_version: int | None = None) -> Manifest | None:
        """The manifest a runner starts from, read and verified: the latest one, or ``start_version`` (a way back).

        Nothing is changed here: a runner that starts from an older version
        checks that it fits, then calls :meth:`set_aside_after`.

        Raises CheckpointNotFoundError when ``start_version`` is not committed
        (naming the retained versions) and, for a damaged version, the error
        of :meth:`way_back_error`.
        """
        if start_version is None:
            latest = self.latest_version()
            if latest is None:
                return None
            try:
                return self.read_manifest(latest)
            except CheckpointCorruptError as exc:
                raise self.way_back_error(exc, latest) from exc
        if isinstance(start_version, bool) or not isinstance(start_version, int) or start_version < 0:
            raise ValueError(f"start_version must be an int >= 0, got {start_version!r}")
        versions = self.versions()
        if start_version not in versions:
            raise CheckpointNotFoundError(
                f"start_version={start_version} is not a committed version of {self.location!r}; "
                f"retained versions: {versions}"
            )
        try:
            return self.read_manifest(start_version)
        except CheckpointCorruptError as exc:
            raise self.way_back_error(exc, start_version) from exc

    def set_aside_after(self, version: int) -> list[int]:
        """Set aside every committed version after ``version``; returns them.

        Their manifests move to ``manifests/set-aside/`` (newest first, so a
        crash part way leaves a location whose latest version is one of them,
        or ``version``), where ``inspect`` cannot see them and retention
        deletes them and their files once a newer version is committed.
        Version numbers are never reused (:meth:`highest_version`; ``commit``
        refuses a number at or below a set-aside one), so nothing keyed by a
        version (an executor's working store "at version V", a cached
        manifest, the recorded processing time of batch V, a sink's output of
        batch V) can mistake a new version for an abandoned one. Versions
        before ``version`` are untouched, so an even older start stays possible.
        """
        later = [v for v in self.versions() if v > _check_version(version)]
        if later:
            self._fs.makedirs(SET_ASIDE_DIR)
            for v in reversed(later):
                self._fs.move(manifest_path(v), f"{SET_ASIDE_DIR}/v{v:010d}-{uuid.uuid4().hex[:16]}.json")
        return later

    def way_back_error(self, exc: CheckpointCorruptError, version: int) -> CheckpointCorruptError:
        """``exc`` (version ``version`` cannot be restored) with how to start from an older retained version."""
        if isinstance(exc, CheckpointTrustError):
            return exc  # another key, or a crafted location: an older version is no way out
        older = [v for v in self.versions() if v < version]
        if older:
            how = (f"to start from an older retained version instead, pass start_version=N to LocalRunner or "
                   f"run_stream, N one of {older} (the versions after N are set aside)")
        else:
            how = f"no version older than {version} is retained in {self.location!r}, so there is no way back"
        out = type(exc)(f"{exc}; version {version} cannot be restored: {how}", file=exc.file, key_group=exc.key_group)
        return out

    # ------------------------------------------------------------ batch records
    def _read_sealed(self, rel: str, what: str) -> dict[str, Any] | None:
        """The body of the sealed small file ``rel``, None when it is absent; errors name the file."""
        data = self.read_small_file(rel)
        if data is None:
            return None
        try:
            return unseal(data, self._key, what=what)
        except CheckpointCorruptError as exc:
            exc.file = rel
            raise

    def batch_record(self, version: int) -> dict[str, Any] | None:
        """What the driver recorded for batch ``version`` before it ran, or None when it has not run.

        Always ``version`` and ``processing_time_ms``; a Spark runner that hosts its
        instances in Spark's stateful operator adds ``previous_version`` and
        ``watermark_ms``, which its tasks read instead of receiving them in a closure.
        Raises CheckpointCorruptError naming the file when the record is torn or damaged.
        """
        rel = batch_record_path(_check_version(version))
        what = f"processing-time record {rel!r} of batch {version} in {self.location!r}"
        body = self._read_sealed(rel, what)
        if body is None:
            return None
        ms = body.get("processing_time_ms")
        if body.get("version") != version or isinstance(ms, bool) or not isinstance(ms, int):
            raise CheckpointCorruptError(
                f"corrupt {what}: expected version {version} and an int processing_time_ms, got {body}", file=rel
            )
        return dict(body)

    def processing_time(self, version: int) -> int | None:
        """The processing time batch ``version`` recorded before it ran, or None when it has not run.

        Raises CheckpointCorruptError naming the file when the record is torn or damaged.
        """
        body = self.batch_record(version)
        return None if body is None else int(body["processing_time_ms"])

    def record_processing_time(self, version: int, processing_time_ms: int, **decisions: Any) -> None:
        """Record the processing time batch ``version`` runs at (before it runs; its retries reuse it).

        ``decisions``: more of what the driver decided for the batch (JSON values),
        read back with :meth:`batch_record`.
        """
        if isinstance(processing_time_ms, bool) or not isinstance(processing_time_ms, int):
            raise TypeError(f"processing_time_ms must be an int, got {processing_time_ms!r}")
        reserved = {"version", "processing_time_ms"} & set(decisions)
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by record_processing_time itself")
        body = {"version": _check_version(version), "processing_time_ms": processing_time_ms, **decisions}
        self.write_small_file(batch_record_path(version), seal(body, self._key))

    def record_running_batch(self, version: int) -> None:
        """Record that batch ``version`` is the one running now (before its tasks start).

        For tasks that cannot learn their micro-batch from Spark (jobs that Spark
        Connect's foreachBatch starts carry no ``streaming.sql.batchId``): one
        batch runs at a time, and the driver records it before any task starts.
        """
        body = {"version": _check_version(version), "running": True}
        self.write_small_file(RUNNING_BATCH_PATH, seal(body, self._key))

    def running_batch(self) -> int | None:
        """The version :meth:`record_running_batch` recorded last, None if none.

        Raises CheckpointCorruptError naming the file when the record is torn or damaged.
        """
        what = f"running-batch record {RUNNING_BATCH_PATH!r} in {self.location!r}"
        body = self._read_sealed(RUNNING_BATCH_PATH, what)
        if body is None:
            return None
        version = body.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise CheckpointCorruptError(f"corrupt {what}: expected an int version >= 0, got {body}", file=RUNNING_BATCH_PATH)
        return version

    def batch_records(self) -> list[tuple[str, int]]:
        """``(path, version)`` of every processing-time record (and leftover temporary one)."""
        return self._numbered(BATCHES_DIR, _BATCH_RE)

    # ------------------------------------------------------------ batch metrics
    def write_batch_metrics(self, version: int, metrics: dict[str, Any]) -> None:
        """Record what batch ``version`` did (JSON-able ``metrics``), replacing an earlier record of it.

        Written by the process that ran the batch, read back by any other that sees
        this location (under Spark Connect the runner runs in the server's Python and
        the client reads the metrics here). Sealed like the processing-time records;
        pruned by retention with them.
        """
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
        body = {"version": _check_version(version), "metrics": metrics}
        try:
            data = seal(body, self._key)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metrics of batch {version} are not JSON: {exc}") from exc
        self.write_small_file(batch_metrics_path(version), data)

    def read_batch_metrics(self, version: int) -> dict[str, Any] | None:
        """The metrics :meth:`write_batch_metrics` recorded for batch ``version``, or None when there are none.

        Raises CheckpointCorruptError naming the file when the record is torn or damaged.
        """
        rel = batch_metrics_path(_check_version(version))
        what = f"metrics record {rel!r} of batch {version} in {self.location!r}"
        body = self._read_sealed(rel, what)
        if body is None:
            return None
        metrics = body.get("metrics")
        if body.get("version") != version or not isinstance(metrics, dict):
            raise CheckpointCorruptError(
                f"corrupt {what}: expected version {version} and a metrics object, got {body}", file=rel
            )
        return metrics

    def batch_metrics_records(self) -> list[tuple[str, int]]:
        """``(path, version)`` of every batch metrics record (and leftover temporary one), by version."""
        return self._numbered(METRICS_DIR, _METRICS_RE)

    def _numbered(self, directory: str, pattern: "re.Pattern[str]") -> list[tuple[str, int]]:
        """``(path, version)`` of the files of ``directory`` whose name ``pattern`` matches (group 1: the version)."""
        out = []
        for name in self._fs.listdir(directory):
            match = pattern.match(name)
            if match:
                out.append((f"{directory}/{name}", int(match.group(1))))
        return sorted(out, key=lambda item: item[1])

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

    def open_new_file(self, rel: str) -> Any:
        """:meth:`open_write` for a file of any size under a directory created first if missing.

        Name it uniquely (one name per attempt, as task files): it is written in
        place, not renamed, so a reader must only look at it once its writer has
        said it is complete (e.g. in a report the driver collected).
        """
        directory = rel.rsplit("/", 1)[0] if "/" in rel else ""
        if directory:
            self._fs.makedirs(directory)
        return self._fs.open_write(rel)

    def files_in(self, directory: str) -> list[str]:
        """The names under ``directory`` as relative paths (sorted); none when it does not exist."""
        return sorted(f"{directory}/{name}" for name in self._fs.listdir(directory))

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
        try:
            return self._fs.read_bytes(rel)  # one request: no existence check before it
        except FileNotFoundError:
            return None

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``rel`` from ``offset`` (fewer at the end of the file); one request, no size lookup."""
        return self._fs.read_range(rel, offset, offset + length)

    def read_ranges(
        self, ranges: Iterable[tuple[str, int, int]], *, ahead_bytes: int = FETCH_AHEAD_BYTES
    ) -> Iterator[tuple[tuple[str, int, int], "Future[bytes]"]]:
        """Each ``(rel, offset, length)`` range with a future of its bytes, in the order given.

        On an object store the ranges are fetched concurrently (FETCH_THREADS
        requests at once, up to ``ahead_bytes`` ahead of the caller), each with
        one ranged GET of the length the caller knows (from a manifest): no
        request for a file's size. A local location reads each range when the
        caller asks for its result. ``result()`` raises FileNotFoundError for a
        missing file and returns fewer bytes than asked past its end.
        """
        if self.is_local:
            for item in ranges:
                future: Future[bytes] = Future()
                try:
                    future.set_result(self.read_range(*item))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(exc)
                yield item, future
            return
        pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="opbuffer-fetch")
        in_flight: deque[tuple[tuple[str, int, int], Future[bytes]]] = deque()
        try:
            pending_bytes = 0
            for item in ranges:
                while in_flight and (len(in_flight) >= 4 * FETCH_THREADS or pending_bytes + item[2] > ahead_bytes):
                    done = in_flight.popleft()
                    pending_bytes -= done[0][2]
                    yield done
                in_flight.append((item, pool.submit(self.read_range, *item)))
                pending_bytes += item[2]
            while in_flight:
                yield in_flight.popleft()
        finally:
            for _, future in in_flight:
                future.cancel()
            pool.shutdown(wait=True)

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
