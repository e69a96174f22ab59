"""An S3 API server for tests: moto's server mode on 127.0.0.1, reached through s3fs.

:func:`start_s3_server` starts ``moto_server`` on a free loopback port in its
own process group, waits until it answers and creates a bucket; the
:class:`S3Server` it returns says how to reach it and stops it by its pid.
The fixtures in ``tests/conftest.py`` use it (one server per test session, a
fresh prefix per test); ``benchmarks/checkpoint.py`` uses it too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

from buffering.spark.standalone import free_port, stop_process_group

BUCKET = "opbuffer-tests"


def _moto_server() -> str:
    """The ``moto_server`` script of this interpreter's environment (not whichever one is on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "moto_server")
    found = beside if os.access(beside, os.X_OK) else shutil.which("moto_server")
    if found is None:
        raise FileNotFoundError("moto_server not found: pip install 'moto[server]' (the test extra has it)")
    return found


@dataclass
class S3Server:
    """A running moto server and the bucket it was started with."""

    process: subprocess.Popen
    endpoint_url: str
    bucket: str
    log_path: str
    _stopped: bool = field(default=False, repr=False)

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options reaching this server (moto accepts any credentials)."""
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}, "key": "testing", "secret": "testing"}

    def location(self, name: str | None = None) -> str:
        """An ``s3://`` URL under the bucket no other caller gets (``name`` prefixed to a random suffix)."""
        return f"s3://{self.bucket}/{name or 'ckpt'}-{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        stop_process_group(self.process)  # its own group (start_new_session): moto's reloader children too
        try:
            os.remove(self.log_path)
        except OSError:
            pass


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-2000:].decode(errors="replace")
    except OSError:
        return "(no log)"


def start_s3_server(bucket: str = BUCKET, timeout: float = 30.0) -> S3Server:
    """Start ``moto_server -H 127.0.0.1 -p <free port>`` and create ``bucket``; stop it with ``.stop()``.

    Raises RuntimeError (with the server's log) when it does not answer within ``timeout`` seconds.
    """
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="moto-server-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            [_moto_server(), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a whole, by its pid
        )
    server = S3Server(process, f"http://127.0.0.1:{port}", bucket, log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {process.returncode}: {_log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto_server on port {port} did not answer within {timeout} s: {_log_tail(log_path)}"
                    ) from None
                time.sleep(0.1)
        import s3fs

        s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True).mkdir(bucket)
    except BaseException:
        server.stop()
        raise
    return server
