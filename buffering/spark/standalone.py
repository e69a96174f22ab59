"""A real Spark standalone cluster on this machine, started from the pip package alone.

For tests and benchmarks that must see what one machine per executor looks
like: a master and ``workers`` worker daemons, each with its own temp and
local directories (as separate machines have), each in its own process group
so that one can be killed like a lost machine. ``local-cluster[...]`` shares
one temp directory across its executors and hides exactly what matters for
executor-local state.

Example::

    with StandaloneCluster(workers=2, cores=1, memory="2g") as cluster:
        spark = SparkSession.builder.master(cluster.master_url).getOrCreate()
        ...
        cluster.kill_worker(0)  # a machine lost mid-stream
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> str:
    """The pyspark package directory: it carries ``bin/spark-class`` and the jars."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before listening on port {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not listen on port {port} within {timeout:.0f}s")


@dataclass
class Worker:
    """One worker daemon: its process, its own directory (temp, local dirs, work dir) and log."""

    index: int
    process: subprocess.Popen
    directory: str
    log: str

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers on 127.0.0.1, each worker standing for a machine.

    Args:
        workers: number of worker daemons (one executor each for an application).
        cores: cores each worker offers (executors with one core run one task at a time).
        memory: memory each worker offers, as Spark spells it (``"2g"``).
        directory: where the workers' directories and logs go (default: a new temp directory).
    """

    workers: int = 2
    cores: int = 1
    memory: str = "2g"
    directory: Optional[str] = None
    started_timeout: float = 60.0
    master: Optional[subprocess.Popen] = None
    worker_list: list[Worker] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"cores must be an int >= 1, got {self.cores!r}")

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [os.path.join(spark_home(), "bin", "spark-class"), *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopping it takes its children too
            )

    def start(self) -> "StandaloneCluster":
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="opbuffer-cluster-")
        os.makedirs(self.directory, exist_ok=True)
        env = dict(os.environ, SPARK_HOME=spark_home(), PYSPARK_PYTHON=sys.executable)
        self.port = free_port()
        web = free_port()
        self.master = self._spawn(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(web)],
            env,
            os.path.join(self.directory, "master.log"),
        )
        try:
            _wait_for_port(self.port, self.master, "the Spark master", self.started_timeout)
            for index in range(self.workers):
                self.add_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self) -> Worker:
        """Start one more worker (a machine joining), with its own directories."""
        assert self.directory is not None and self.master is not None, "start() the cluster first"
        index = len(self.worker_list)
        own = os.path.join(self.directory, f"worker-{index}")
        for sub in ("tmp", "local", "work"):
            os.makedirs(os.path.join(own, sub), exist_ok=True)
        env = dict(
            os.environ,
            SPARK_HOME=spark_home(),
            PYSPARK_PYTHON=sys.executable,
            TMPDIR=os.path.join(own, "tmp"),
            SPARK_LOCAL_DIRS=os.path.join(own, "local"),
            SPARK_WORKER_DIR=os.path.join(own, "work"),
            # Executors inherit the worker's environment: their Python workers' tempfile dir is the machine's own.
            SPARK_EXECUTOR_OPTS=f"-Djava.io.tmpdir={os.path.join(own, 'tmp')}",
        )
        port = free_port()
        log = os.path.join(self.directory, f"worker-{index}.log")
        process = self._spawn(
            [
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host", "127.0.0.1",
                "--port", str(port),
                "--webui-port", str(free_port()),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", os.path.join(own, "work"),
            ],
            env,
            log,
        )
        _wait_for_port(port, process, f"Spark worker {index}", self.started_timeout)
        worker = Worker(index, process, own, log)
        self.worker_list.append(worker)
        return worker

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executor (its whole process group), as a lost machine."""
        worker = self.worker_list[index]
        kill_process_group(worker.process)

    def stop(self) -> None:
        """Stop every worker, then the master (SIGTERM, then SIGKILL after 10 s)."""
        for worker in self.worker_list:
            stop_process_group(worker.process)
        if self.master is not None:
            stop_process_group(self.master)

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_process_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process``'s whole process group (it was started in a session of its own) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def stop_process_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``process``'s whole process group: SIGTERM, then SIGKILL after ``grace_s`` seconds.

    The process must lead its own group (started with ``start_new_session=True``).
    Whatever it forked that is still in the group afterwards (a JVM's Python
    workers) is killed too. Safe to call on a process that already exited.
    """
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        pass
    kill_process_group(process)
