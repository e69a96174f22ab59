"""Short-lived staging directories for SST files, and the sweep of those a dead process left.

A checkpoint writes SST files to a staging directory (``/dev/shm`` when it
can) and a restore stages them next to the store; both remove their directory
when done. A process killed in between (a crashed Spark attempt, an OOM kill)
leaves it behind, and in ``/dev/shm`` that is memory. Each staging directory
carries its creator's pid in its name, so the next instance that starts can
remove those whose creator is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from typing import Iterable, Optional

from state.locks import process_alive

#: ``[.]opbuffer-<kind>-<pid>-<random>``: what :func:`staging_dir` creates.
_NAME = re.compile(r"^\.?opbuffer-(?:ckpt|restore)-(\d+)-")
_SWEEP_EVERY_S = 60.0
_last_sweep = float("-inf")


def fast_temp_dir() -> str:
    """A directory for short-lived SST files: ``/dev/shm`` when usable (no fsync cost), else the system temp.

    RocksDB's ``SstFileWriter.finish()`` fsyncs the file, which costs
    milliseconds per file on a disk; the files written here are read back
    and deleted at once, so a RAM-backed directory is the right place.
    """
    shm = "/dev/shm"
    try:
        if os.path.isdir(shm) and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            if stat.f_bavail * stat.f_frsize >= 256 << 20:
                return shm
    except OSError:
        pass
    return tempfile.gettempdir()


def staging_dir(kind: str, parent: Optional[str] = None, hidden: bool = False) -> str:
    """A new staging directory under ``parent`` (default: :func:`fast_temp_dir`) named after this process."""
    prefix = f"{'.' if hidden else ''}opbuffer-{kind}-{os.getpid()}-"
    return tempfile.mkdtemp(prefix=prefix, dir=parent if parent is not None else fast_temp_dir())


def sweep_stale_staging(parents: Iterable[str] = (), *, force: bool = False) -> list[str]:
    """Remove the staging directories of dead processes in the temp dirs and ``parents``; return their paths.

    Cheap enough for every instance start (one listing per directory), and
    rate-limited to once a minute per process unless ``force``.
    """
    global _last_sweep
    now = time.monotonic()
    if not force and now - _last_sweep < _SWEEP_EVERY_S:
        return []
    _last_sweep = now
    removed = []
    seen: set[str] = set()
    for parent in (fast_temp_dir(), tempfile.gettempdir(), *parents):
        parent = os.path.abspath(parent)
        if parent in seen:
            continue
        seen.add(parent)
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            match = _NAME.match(name)
            if match is None or process_alive(int(match.group(1))):
                continue
            path = os.path.join(parent, name)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed
