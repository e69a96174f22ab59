"""A processor's initial state at scale: Spark's own transformWithStateInPandas vs opbuffer's run_stream.

The processor (:class:`SeededTotal`): ``handleInitialState`` puts the key's
initial value into a ValueState, ``handleInputRows`` adds the key's ``v`` to it
and emits ``(id, total)``. The initial state: ``--keys`` keys (default
1,000,000), ``id long, initVal long`` with ``initVal = 3 * id``, a parquet file
read as a static DataFrame. The input: one parquet file (one micro-batch) of
``--rows`` rows (default 10,000, ``v = 1``) over ``--touched`` keys of the
initial state (default 1,000), read with ``readStream.parquet(...)`` and
``trigger(availableNow=True)``.

The variants, each in a fresh Python process of its own with its own Spark
(driver JVM), so that each one's peak memory is its own:

(o) ``run_stream(stream, SeededTotal(), key="id", initial_state=init_df, ...)``:
    one Spark job writes each operator instance's initial rows into the
    checkpoint storage, the tasks read them (the driver collects report rows only);
(s) ``stream.groupBy("id").transformWithStateInPandas(SeededTotal(), ...,
    initialState=init_df.groupBy("id"))`` with the RocksDB state store (Spark
    4.3 takes no other for transformWithState).

Both write their output with ``foreachBatch`` into a callable that collects it
(the touched keys' rows: small). Before the timed run each process runs the
same query once, untimed, on a 1,000-key initial state (the JVM's and the
Python workers' warm-up); then the peak-RSS counters are reset
(``/proc/PID/clear_refs``).

Timed: from just before the query is built and started (for (o) that includes
run_stream's initial-state job) to the return of ``awaitTermination()`` (the
first and only batch committed); the end of the sink's call for batch 0 is
recorded too. Memory: the peak RSS (VmHWM) of the driver's Python process and
of the driver's JVM (its pid from ``ProcessHandle.current()``), and the
largest sum of the RSS of the JVM's descendant processes (Spark's Python
workers) sampled every 0.2 s. Checked: every touched key's total is
``3 * id + rows of the key``.

    python -m benchmarks.initial_state [--keys N] [--rows N] [--touched N] [--variants opbuffer,spark]
        [--parallelism 4] [--timeout 900] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd

from ._common import local_spark_builder, log, now, print_table, ratio, write_record

NAME = "initial_state"
KEYS = 1_000_000
ROWS = 10_000
TOUCHED = 1_000
WARMUP_KEYS = 1_000
VARIANTS = ("opbuffer", "spark")
LABELS = {"opbuffer": "(o) opbuffer run_stream", "spark": "(s) Spark transformWithStateInPandas"}
TWS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
INPUT_SCHEMA = "id long, v long"
OUTPUT_SCHEMA = "id long, total long"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _processor_class() -> Any:
    from pyspark.sql.streaming import StatefulProcessor

    class SeededTotal(StatefulProcessor):
        """A total per key: the initial value, plus the ``v`` of the key's rows."""

        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
            self.total.update((int(initialState["initVal"].iloc[0]),))

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
            stored = self.total.get()
            total = (int(stored[0]) if stored is not None else 0) + sum(int(pdf["v"].sum()) for pdf in rows)
            self.total.update((total,))
            yield pd.DataFrame({"id": [key[0]], "total": [total]})

        def close(self) -> None:
            pass

    return SeededTotal


# ---------------------------------------------------------------- the workload (written by the parent, no Spark)
def write_workload(root: str, keys: int, rows: int, touched: int, seed: int) -> dict[str, Any]:
    """The initial state's and the input's parquet files; returns their paths and the expected totals."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    paths: dict[str, Any] = {}
    for name, n in (("init", keys), ("warm_init", WARMUP_KEYS)):
        ids = np.arange(n, dtype=np.int64)
        os.makedirs(os.path.join(root, name))
        pq.write_table(pa.table({"id": ids, "initVal": 3 * ids}), os.path.join(root, name, "part-00000.parquet"))
        paths[name] = os.path.join(root, name)
    chosen = rng.choice(keys, size=min(touched, keys), replace=False).astype(np.int64)
    ids = chosen[rng.integers(0, len(chosen), size=rows)]
    ids[: len(chosen)] = chosen  # every chosen key gets a row
    for name, frame in (("input", ids), ("warm_input", ids % WARMUP_KEYS)):
        os.makedirs(os.path.join(root, name))
        pq.write_table(pa.table({"id": frame, "v": np.ones(len(frame), dtype=np.int64)}),
                       os.path.join(root, name, "part-00000.parquet"))
        paths[name] = os.path.join(root, name)
    counts = pd.Series(ids).value_counts()
    paths["expected"] = {int(k): 3 * int(k) + int(c) for k, c in counts.items()}
    return paths


# ---------------------------------------------------------------- memory
def _status_kb(pid: int, field: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak(pid: int) -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux: ``5 > /proc/PID/clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class WorkerSampler:
    """The largest sum of RSS over the JVM's descendant processes (Spark's Python workers), sampled."""

    def __init__(self, jvm_pid: int, interval: float = 0.2) -> None:
        self.jvm_pid, self.interval = jvm_pid, interval
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = sum(_status_kb(pid, "VmRSS") or 0 for pid in _descendants(self.jvm_pid))
            self.peak_kb = max(self.peak_kb, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "WorkerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- one variant (in a child process)
def run_query(spark: Any, variant: str, init_path: str, input_path: str, base: str, parallelism: int) -> dict[str, Any]:
    """One query over the input with the initial state; returns its times and output."""
    from buffering.spark import run_stream

    processor = _processor_class()()
    out: list[pd.DataFrame] = []
    marks: dict[str, float] = {}

    def sink(df: Any, batch_id: int) -> None:
        out.append(df.toPandas())
        marks.setdefault(f"sink_end_{batch_id}", now())

    init_df = spark.read.parquet(init_path)
    stream = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_path)
    started = now()
    if variant == "opbuffer":
        query = run_stream(
            stream, processor, key="id", output_schema=OUTPUT_SCHEMA, checkpoint_location=os.path.join(base, "ck"),
            sink=sink, parallelism=parallelism, trigger={"availableNow": True}, initial_state=init_df,
            workdir=os.path.join(base, "work"),
        )
    elif variant == "spark":
        query = (
            stream.groupBy("id")
            .transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Update", "None", initialState=init_df.groupBy("id"))
            .writeStream.outputMode("update")
            .foreachBatch(sink)
            .option("checkpointLocation", os.path.join(base, "ck"))
            .trigger(availableNow=True)
            .start()
        )
    else:
        raise ValueError(variant)
    marks["started"] = now()
    query.awaitTermination()
    ended = now()
    result: dict[str, Any] = {
        "seconds": ended - started,
        "start_call_seconds": marks["started"] - started,
        "first_batch_sink_seconds": marks.get("sink_end_0", float("nan")) - started,
        "batches": len(out),
        "output": pd.concat(out, ignore_index=True) if out else pd.DataFrame({"id": [], "total": []}),
    }
    if variant == "opbuffer":
        files = query.runner.plan.initial_state
        result["opbuffer_initial_rows"] = files.rows if files is not None else 0
        result["opbuffer_batch_seconds"] = [m.seconds for m in query.batch_metrics]
    return result


def child(args: argparse.Namespace) -> None:
    """Run ``args.child`` (warm-up, then the timed run) and print its result as one ``RESULT {json}`` line."""
    paths = json.loads(Path(args.workload).read_text())
    builder = local_spark_builder(f"opbuffer-{NAME}-{args.child}", master=args.master, driver_memory=args.driver_memory,
                                  parallelism=args.parallelism)
    spark = builder.config("spark.sql.streaming.stateStore.providerClass", TWS_PROVIDER).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    base = tempfile.mkdtemp(prefix=f"{args.child}-", dir=args.root)
    log(f"[{args.child}] warm-up on {WARMUP_KEYS:,} keys")
    run_query(spark, args.child, paths["warm_init"], paths["warm_input"], os.path.join(base, "warm"), args.parallelism)
    rss_before = {"driver_python_kb": _status_kb(os.getpid(), "VmRSS"), "driver_jvm_kb": _status_kb(jvm_pid, "VmRSS")}
    reset = _reset_peak(os.getpid()) and _reset_peak(jvm_pid)
    log(f"[{args.child}] timed run on {args.keys:,} keys")
    Path(args.root, f"{args.child}.timed").write_text(repr(time.time()))
    with WorkerSampler(jvm_pid) as workers:
        result = run_query(spark, args.child, paths["init"], paths["input"], os.path.join(base, "run"), args.parallelism)
    output = result.pop("output")
    expected = {int(k): v for k, v in paths["expected"].items()}
    got = {int(i): int(t) for i, t in zip(output["id"], output["total"])}
    result.update(
        variant=args.child,
        peak_reset=reset,
        rss_before_kb=rss_before,
        driver_python_peak_kb=_status_kb(os.getpid(), "VmHWM"),
        driver_jvm_peak_kb=_status_kb(jvm_pid, "VmHWM"),
        workers_peak_kb=workers.peak_kb,
        output_rows=len(output),
        ok=got == expected,
        wrong=sum(1 for k, v in expected.items() if got.get(k) != v) + len(set(got) - set(expected)),
    )
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent
def run_child(variant: str, args: argparse.Namespace, workload: str, root: str) -> dict[str, Any]:
    """``variant`` in a child process (its own session: its JVM and Python workers go with it on a timeout)."""
    cmd = [sys.executable, "-m", "benchmarks.initial_state", "--child", variant, "--workload", workload, "--root", root,
           "--keys", str(args.keys), "--parallelism", str(args.parallelism), "--master", args.master,
           "--driver-memory", args.driver_memory]
    log_path, mark = os.path.join(root, f"{variant}.log"), os.path.join(root, f"{variant}.timed")
    started = now()
    with open(log_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            out: dict[str, Any] = {"variant": variant, "process_seconds": now() - started}
            if os.path.exists(mark):  # the timed run had started: it took longer than this
                out["seconds_at_least"] = time.time() - float(Path(mark).read_text())
                out["error"] = f"stopped after {out['seconds_at_least']:.0f} s of the timed run"
            else:
                out["error"] = f"stopped after {args.timeout:.0f} s, before the timed run"
            return out
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            out["process_seconds"] = now() - started
            return out
    tail = Path(log_path).read_text().splitlines()[-20:]
    log(f"({variant}) failed; the end of its log:\n" + "\n".join(tail))
    return {"variant": variant, "error": f"exit status {proc.returncode}, no result", "process_seconds": now() - started}


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the child's process group (the child, its JVM and the JVM's Python workers)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _mb(kb: Optional[int]) -> float:
    return float("nan") if kb is None else kb / 1024.0


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=KEYS, help=f"keys of the initial state (default {KEYS:,})")
    p.add_argument("--rows", type=int, default=ROWS, help=f"rows of the one input batch (default {ROWS:,})")
    p.add_argument("--touched", type=int, default=TOUCHED, help=f"keys the input touches (default {TOUCHED:,})")
    p.add_argument("--variants", default=",".join(VARIANTS), help="variants to run (default opbuffer,spark)")
    p.add_argument("--parallelism", type=int, default=4, help="shuffle partitions = operator instances (default 4)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--driver-memory", default="2g", help="spark.driver.memory (default 2g)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a variant may take before it is stopped")
    p.add_argument("--seed", type=int, default=1234, help="random seed of the workload")
    p.add_argument("--out", default=None, help=f"path of the JSON record (default benchmarks/results/{NAME}.json)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        child(args)
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    started = now()
    results: dict[str, Any] = {"load_before": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix=f"opbuffer-{NAME}-") as root:
        log(f"writing the workload: {args.keys:,} initial keys, {args.rows:,} input rows over {args.touched:,} keys")
        paths = write_workload(root, args.keys, args.rows, args.touched, args.seed)
        workload = os.path.join(root, "workload.json")
        Path(workload).write_text(json.dumps(paths))
        for variant in variants:
            log(f"running {LABELS[variant]}")
            results[variant] = run_child(variant, args, workload, root)
    results["load_after"] = list(os.getloadavg())
    rows = []
    for v in variants:
        r = results[v]
        if "error" in r:
            rows.append([LABELS[v], r["error"], "", "", "", "", "no result"])
            continue
        rows.append([LABELS[v], r["seconds"], r["first_batch_sink_seconds"], _mb(r["driver_python_peak_kb"]),
                     _mb(r["driver_jvm_peak_kb"]), _mb(r["workers_peak_kb"]), r["ok"]])
    print_table(["variant", "s (start..end)", "s (..batch 0 sink)", "driver py peak MB", "driver JVM peak MB",
                 "workers peak MB", "correct"], rows,
                title=f"initial state of {args.keys:,} keys, one batch of {args.rows:,} rows over {args.touched:,} keys, "
                      f"parallelism {args.parallelism}, {args.master}")
    o, s = results.get("opbuffer", {}), results.get("spark", {})
    if "seconds" in o and "seconds_at_least" in s:
        results["ratios"] = {"time_s_over_o_at_least": ratio(s["seconds_at_least"], o["seconds"])}
        print(f"RATIO time_s_over_o: > {results['ratios']['time_s_over_o_at_least']:.2f}x "
              f"((s) stopped after {s['seconds_at_least']:.0f} s of its timed run)", flush=True)
    if "seconds" in o and "seconds" in s:
        results["ratios"] = {
            "time_s_over_o": ratio(s["seconds"], o["seconds"]),
            "driver_python_peak_s_over_o": ratio(s["driver_python_peak_kb"] or 0, o["driver_python_peak_kb"] or 0),
            "driver_jvm_peak_s_over_o": ratio(s["driver_jvm_peak_kb"] or 0, o["driver_jvm_peak_kb"] or 0),
            "workers_peak_s_over_o": ratio(s["workers_peak_kb"] or 0, o["workers_peak_kb"] or 0),
        }
        for label, value in results["ratios"].items():
            print(f"RATIO {label}: {value:.2f}x", flush=True)
    if "opbuffer_batch_seconds" in o:
        print(f"(o) run_stream() call (its initial-state job and the query's start): {o['start_call_seconds']:.2f} s; "
              f"runner's batch seconds: {', '.join(f'{x:.2f}' for x in o['opbuffer_batch_seconds'])}", flush=True)
    write_record(
        NAME,
        params={k: getattr(args, k) for k in ("keys", "rows", "touched", "parallelism", "master", "driver_memory", "seed",
                                              "timeout")} | {"variants": variants},
        results=results,
        out=args.out,
        started=started,
    )


if __name__ == "__main__":
    main()
