"""Exclusive claims on working directories, held by an open file (``flock``).

A runner clears its working RocksDB directory before it rebuilds it from a
checkpoint. Without a claim, a second runner given the same directory (in
another process or in this one) would delete the first one's live store.
RocksDB's own ``LOCK`` file does not help: it is taken only when the store
opens, after the directory was cleared, and POSIX record locks do not conflict
within one process.

``flock`` locks belong to the open file description, so a second claim fails
in this process as in any other, and the kernel drops a claim when its process
dies (even by SIGKILL): a claim never outlives a crash.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from .base import StoreLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: claims are not enforced
    fcntl = None  # type: ignore[assignment]


class FileLock:
    """An exclusive ``flock`` on the file at ``path`` (created if missing).

    ``acquire()`` raises :class:`~state.StoreLockedError` naming ``what`` when
    another open file holds the lock; ``blocking=True`` waits instead. The lock
    is held until :meth:`release` or until the process exits.
    """

    __slots__ = ("path", "what", "_fd")

    def __init__(self, path: str, what: Optional[str] = None) -> None:
        self.path = os.fspath(path)
        self.what = what or self.path
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, blocking: bool = False) -> bool:
        """Take the lock; False (and nothing held) when another holder has it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return False
                raise
        self._fd = fd
        return True

    def acquire(self, blocking: bool = False) -> None:
        """Take the lock or raise StoreLockedError naming what it guards."""
        if not self.try_acquire(blocking):
            raise StoreLockedError(
                f"{self.what} is in use by another runner or process (it holds the lock {self.path!r}); "
                "give each runner its own directory"
            )

    def release(self) -> None:
        """Give the lock up (closing the file releases the flock). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire(blocking=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FileLock({self.path!r}, held={self.held})"


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (another user's counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def directory_lock(directory: str) -> FileLock:
    """The claim on a working directory: a hidden lock file beside it (``.<name>.lock``), so clearing the directory keeps the claim."""
    directory = os.path.abspath(os.fspath(directory)).rstrip(os.sep)
    parent, name = os.path.split(directory)
    return FileLock(os.path.join(parent, f".{name}.lock"), what=f"the working directory {directory!r}")
