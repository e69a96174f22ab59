"""The errors of the checkpoint package."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """Base class of checkpoint errors (a bad commit, an unusable location, ...)."""


class CheckpointNotFoundError(CheckpointError):
    """The requested version has no manifest (it was never committed, or retention removed it)."""


class VersionExistsError(CheckpointError):
    """The version is already committed (e.g. Spark re-ran a batch whose manifest was committed)."""


class CheckpointCorruptError(CheckpointError):
    """A data file or manifest is damaged or missing.

    ``file`` is the file (relative to the checkpoint location) and ``key_group``
    the key group whose section could not be read, when known. The message
    names both. Other versions are not affected: a version whose manifest
    references only intact files stays restorable.
    """

    def __init__(self, message: str, *, file: str | None = None, key_group: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.key_group = key_group


class CheckpointTrustError(CheckpointCorruptError):
    """A checkpoint key is set and a manifest (or batch record) is unsigned or its signature does not match.

    Raised before anything of the version is read or unpickled. ``file`` names the file.
    """


class RetentionWarning(UserWarning):
    """Retention failed after a version was committed; the version stands, retention is retried after the next commit."""
