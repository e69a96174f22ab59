"""A Spark Connect server for the tests: started on 127.0.0.1 with a free port, always stopped.

pip's pyspark ships the server (its jar is in ``pyspark/jars``; ``sbin/start-connect-server.sh``
daemonizes it through ``spark-daemon.sh``). Here ``spark-submit`` runs the server class in the
foreground instead, in its own process group: ``spark-submit`` execs the JVM, so the pid
``Popen`` returns is the server's, and stopping that process group stops it and its Python
workers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from buffering.spark.standalone import free_port, stop_process_group

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The repository root: the server's Python workers import opbuffer from here (this checkout's code).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def connect_server(log_path: str, start_timeout_s: float = 180.0) -> Iterator[str]:
    """Run a local[2] Spark Connect server until the block ends; yields its URL ``sc://127.0.0.1:PORT``.

    The server's output goes to ``log_path`` (its tail is in the error when it does not start).
    """
    import pyspark

    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    port = free_port()
    command = [
        os.path.join(spark_home, "bin", "spark-submit"),
        "--class", SERVER_CLASS,
        "--name", "opbuffer-tests-connect",
        "--master", "local[2]",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        # Loopback only, as the classic test session.
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.driver.memory=1g",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=4",
        # Progress reports every 100 ms instead of every 2 s: a test's run_batch lasts about a
        # second, and a run shorter than the interval gets no report (its bar shows no tasks).
        "--conf", "spark.connect.progress.reportInterval=100ms",
    ]
    env = dict(os.environ)
    env.update(
        SPARK_HOME=spark_home,
        # The foreachBatch function and every task run in the server's Python: this interpreter,
        # importing this checkout's opbuffer.
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p),
    )
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _listening(port):
            if process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with code {process.returncode} before listening on "
                    f"127.0.0.1:{port}; the end of {log_path}:\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark Connect server did not listen on 127.0.0.1:{port} within {start_timeout_s:.0f} s; "
                    f"the end of {log_path}:\n{_tail(log_path)}"
                )
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_process_group(process, grace_s=30.0)
