"""transformWithStateInPandas processors: Spark's own operator vs opbuffer's run_stream, and opbuffer's overhead.

The processor (:class:`CountAndLast10`, a user's ``StatefulProcessor``, the same
object for every runner): per key a ValueState count and a ListState of the
last 10 events ``(user, ts)``. One ``handleInputRows`` call reads both (``get``),
adds the key's rows and writes both back (``update``, ``put``): 4 state
accesses per call. It emits ``(tweet, views, kept)`` (``kept`` = events in
the list, ``min(10, views)``).

Workload: ``--rows`` views (default 2,000,000) of tweets by users, generated as
:mod:`benchmarks.spark_e2e` does (tweet ids zipf(1.0)-skewed over the key
cardinality, users uniform over 25,000, ``ts`` increasing), written as
``--batches`` parquet files (default 4) read back with
``readStream.parquet(...).option("maxFilesPerTrigger", 1)`` and
``trigger(availableNow=True)``: one micro-batch per file. Keys: 10k and 100k.

End to end, per key cardinality (fresh checkpoint and output directories per run):

(spark)    ``groupBy("tweet").transformWithStateInPandas(CountAndLast10(), ...)``
           with the RocksDB state store provider (Spark 4.3 refuses any other
           for transformWithState), ``foreachBatch`` into a parquet sink;
(opbuffer) ``run_stream(stream, cached_state(max_entries=...)(CountAndLast10()), key="tweet", ...)``
           with the same parquet sink;
(floor)    the same source, ``foreachBatch``: ``repartition(P, "tweet")``, an identity
           ``mapInPandas`` and the ``noop`` sink: moving the rows through a shuffle into
           Python and back, what any runner of Python state must do at least. With the
           processor's own cost (the (dict) loop below, per call, times the calls,
           spread over the cores) it bounds how much faster than Spark any such runner
           can be: ``ceiling = spark / (floor + own cost)``, printed with the ratio.

Timed: query build + start .. ``awaitTermination()`` returns, after an untimed
warm-up run of each. Checked: both emit, as their last row per tweet, the
pandas count of the input and ``kept = min(10, views)``.

Per call, in this process, on the frames of one micro-batch grouped by key in
advance (``--micro-keys`` keys, default 10,000; ``--micro-rounds`` passes, the
first one untimed so every key has state; median of the timed passes):

(dict)     the processor's own cost: ``handleInputRows`` in a loop against a
           plain dict-backed handle (:class:`DictHandle`: the grouping key is an
           attribute, each state a dict);
(opbuffer) the same loop against opbuffer's handle: the processor copy a
           LocalRunner's instance runs (``instance.processor.processor``) after
           one ``process`` of the batch, the grouping key set with its
           ``ProcessorRuntime.set_key`` (normalized keys, as the runner's buffer
           hands them), all state cached (cache hits);
(runtime)  opbuffer's own per-key call, ``ProcessorRuntime.handle_rows`` (key
           conversion, the call, its output frames collected), for information;
(runner)   ``LocalRunner.process`` of the whole batch (late-row filter,
           grouping, calls, timers/TTL sweep, commit of a version to its private
           checkpoint), per call, for information.

overhead per call = (opbuffer - dict) / calls; overhead per state access =
(opbuffer - dict) / accesses in a loop of ``get`` / ``update`` on the current
key's ValueState and ``get`` / ``put`` on its ListState (``--access-ops``).

Targets: (opbuffer) >= 8x faster than (spark) at 100k keys; opbuffer's overhead
<= 10 us per handleInputRows call and <= 2 us per state access on a cache hit.
The machine is shared (2 cores): the load average is recorded with every run.

    python -m benchmarks.tws [--quick] [--rows N] [--keys 10000,100000] [--batches 4]
        [--variants spark,opbuffer] [--micro-keys N] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import traceback
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ListState, TimerValues, ValueState

from ._common import check_target, local_spark_builder, log, median, now, print_table, write_record
from .spark_e2e import _batch_seconds, _code_version, _progress, _uptime, generate_views, write_files

NAME = "tws"

ROWS = 2_000_000
USERS = 25_000
BATCHES = 4
KEYS = (10_000, 100_000)
#: --quick: sized from a measured Spark run (see the report): about 3 minutes in all on 2 shared cores.
QUICK = {"rows": 100_000, "keys": (1_000, 5_000), "micro_keys": 5_000, "micro_rounds": 3, "access_ops": 100_000}
VARIANTS = ("spark", "opbuffer", "floor")
KEEP = 10
ACCESSES_PER_CALL = 4

INPUT_SCHEMA = "tweet long, user long, ts long"
OUTPUT_SCHEMA = "tweet long, views long, kept long"

TARGET_VS_SPARK = 8.0
TARGET_CALL_US = 10.0
TARGET_ACCESS_US = 2.0

TWS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


# ---------------------------------------------------------------- the user's processor
class CountAndLast10(StatefulProcessor):
    """Views per tweet in a ValueState and the last 10 events (user, ts) in a ListState."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "views long")
        self.last = handle.getListState("last", "user long, ts long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        stored = self.count.get()
        views = stored[0] if stored is not None else 0
        recent = list(self.last.get())
        for pdf in rows:
            views += len(pdf)
            recent.extend(zip(pdf["user"].tolist(), pdf["ts"].tolist()))
        recent = recent[-KEEP:]
        self.count.update((views,))
        self.last.put(recent)
        yield pd.DataFrame({"tweet": [key[0]], "views": [views], "kept": [len(recent)]})

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- a plain dict-backed handle (the floor)
class DictHandle(StatefulProcessorHandle):
    """The least a handle can do: the current grouping key in an attribute, each state variable a dict."""

    def __init__(self) -> None:
        self.key: Any = None

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ValueState:
        return DictValueState(self)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ListState:
        return DictListState(self)


class DictValueState(ValueState):
    def __init__(self, handle: DictHandle) -> None:
        self.handle = handle
        self.data: dict = {}

    def exists(self) -> bool:
        return self.handle.key in self.data

    def get(self) -> Optional[tuple]:
        return self.data.get(self.handle.key)

    def update(self, newValue: tuple) -> None:
        self.data[self.handle.key] = newValue

    def clear(self) -> None:
        self.data.pop(self.handle.key, None)


class DictListState(ListState):
    def __init__(self, handle: DictHandle) -> None:
        self.handle = handle
        self.data: dict = {}

    def exists(self) -> bool:
        return self.handle.key in self.data

    def get(self) -> Iterator[tuple]:
        return iter(self.data.get(self.handle.key, ()))

    def put(self, newState: list) -> None:
        self.data[self.handle.key] = list(newState)

    def appendValue(self, newState: tuple) -> None:
        self.data.setdefault(self.handle.key, []).append(newState)

    def appendList(self, newState: list) -> None:
        self.data.setdefault(self.handle.key, []).extend(newState)

    def clear(self) -> None:
        self.data.pop(self.handle.key, None)


# ---------------------------------------------------------------- end to end in Spark
def start_spark(args: argparse.Namespace) -> Any:
    builder = (
        local_spark_builder("opbuffer-tws", master=args.master, driver_memory=args.driver_memory,
                            parallelism=args.parallelism)
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .config("spark.sql.streaming.stateStore.providerClass", TWS_PROVIDER)
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_variant(spark: Any, source: str, root: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One end-to-end run; returns seconds, per-batch seconds, load before/after and the output directory."""
    from buffering import cached_state
    from buffering.spark import ParquetSink, run_stream

    base = tempfile.mkdtemp(prefix=f"{variant}-", dir=root)
    checkpoint, out = os.path.join(base, "checkpoint"), os.path.join(base, "out")
    stream = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    result: dict[str, Any] = {"variant": variant, "out": out, "load_before": list(os.getloadavg())}
    started = now()
    if variant == "spark":
        query = (
            stream.groupBy("tweet")
            .transformWithStateInPandas(CountAndLast10(), OUTPUT_SCHEMA, "Update", "None")
            .writeStream.outputMode("update")
            .foreachBatch(ParquetSink(out))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    elif variant == "floor":
        parallelism = args.parallelism
        schema = stream.schema

        def floor(batch_df: Any, batch_id: int) -> None:
            (batch_df.repartition(parallelism, "tweet").mapInPandas(_identity, schema)
             .write.format("noop").mode("overwrite").save())

        query = (
            stream.writeStream.foreachBatch(floor)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        result["out"] = None
    elif variant == "opbuffer":
        query = run_stream(
            stream,
            cached_state(max_entries=args.max_entries)(CountAndLast10()),
            key="tweet",
            output_schema=OUTPUT_SCHEMA,
            checkpoint_location=checkpoint,
            sink=ParquetSink(out),
            parallelism=args.parallelism,
            trigger={"availableNow": True},
            workdir=os.path.join(base, "work"),
        )
        query.awaitTermination()
        result["runner_batch_seconds"] = [m.seconds for m in query.batch_metrics]
        # How each instance's task got it ("resumed" = warm cache) tells a cold cache from a slow call.
        result["batch_metrics"] = [{**m.to_dict(), "starts": [i.get("start") for i in m.per_instance]}
                                   for m in query.batch_metrics]
    else:
        raise ValueError(variant)
    result["seconds"] = now() - started
    result["batch_seconds"] = _batch_seconds(_progress(query))
    result["load_after"] = list(os.getloadavg())
    return result


def _identity(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    yield from batches


def verify(views: pd.DataFrame, outs: dict[str, str]) -> dict[str, Any]:
    """The last row per tweet of every variant: views = the pandas count of the input, kept = min(10, views)."""
    import pyarrow.dataset as ds

    exact = views.groupby("tweet").size().astype(np.int64)
    check: dict[str, Any] = {"tweets": int(len(exact)), "problems": []}
    for v, out in outs.items():
        try:
            pdf = ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas()
        except Exception as err:  # noqa: BLE001 - reported
            check["problems"].append(f"({v}) output unreadable: {err}")
            continue
        last = pdf.sort_values(["tweet", "batch_id"], kind="stable").groupby("tweet").tail(1).set_index("tweet")
        if not last.index.sort_values().equals(exact.index):
            check["problems"].append(f"({v}) emitted {len(last)} tweets, the input has {len(exact)}")
            continue
        wrong = int((last.loc[exact.index, "views"].astype(np.int64) != exact).sum())
        wrong_kept = int((last.loc[exact.index, "kept"].astype(np.int64) != np.minimum(exact, KEEP)).sum())
        if wrong or wrong_kept:
            check["problems"].append(f"({v}) {wrong} view counts and {wrong_kept} list sizes differ from the input's")
    check["ok"] = not check["problems"]
    return check


# ---------------------------------------------------------------- per call, in this process
def grouped_batch(rows: int, keys: int, users: int, seed: int) -> tuple[pd.DataFrame, list[tuple[tuple, pd.DataFrame]]]:
    """One micro-batch (``rows`` views over ``keys`` tweets) and its frames per key, grouped in advance."""
    batch = generate_views(rows, keys, users, seed)
    groups = [((int(k),), frame.reset_index(drop=True)) for k, frame in batch.groupby("tweet", sort=True)]
    return batch, groups


def call_loop(proc: CountAndLast10, groups: list[tuple[tuple, pd.DataFrame]], set_key: Any, set_args: list) -> float:
    """Seconds of one pass of handleInputRows over every key's frame (``set_key(arg)`` first, ``arg`` precomputed)."""
    timer_values = TimerValues(0, -1)
    handle_rows = proc.handleInputRows
    start = now()
    for (key, frame), arg in zip(groups, set_args):
        set_key(arg)
        for _ in handle_rows(key, iter((frame,)), timer_values):
            pass
    return now() - start


def runtime_loop(runtime: Any, groups: list[tuple[tuple, pd.DataFrame]], nkeys: list) -> float:
    """Seconds of one pass of opbuffer's own per-key call (ProcessorRuntime.handle_rows: key conversion, the
    call, its output frames collected) over every key's frame."""
    handle_rows = runtime.handle_rows
    start = now()
    for (_, frame), nkey in zip(groups, nkeys):
        handle_rows(nkey, frame)
    return now() - start


def access_loop(proc: CountAndLast10, keys: list, set_key: Any, ops: int) -> dict[str, float]:
    """Seconds per state access (get/update of the ValueState, get/put of the ListState) over existing keys."""
    count, last = proc.count, proc.last
    n = len(keys)
    order = [keys[i % n] for i in range(ops)]
    values = [(i,) for i in range(ops)]
    lists = [[(i, i)] for i in range(ops)]
    out: dict[str, float] = {}

    start = now()
    for k in order:
        set_key(k)
    base = now() - start  # setting the key alone, charged to neither

    start = now()
    for k in order:
        set_key(k)
        count.get()
    out["value.get"] = (now() - start - base) / ops
    start = now()
    for k, v in zip(order, values):
        set_key(k)
        count.update(v)
    out["value.update"] = (now() - start - base) / ops
    start = now()
    for k in order:
        set_key(k)
        for _ in last.get():
            pass
    out["list.get"] = (now() - start - base) / ops
    start = now()
    for k, v in zip(order, lists):
        set_key(k)
        last.put(v)
    out["list.put"] = (now() - start - base) / ops
    return out


def dict_processor() -> tuple[CountAndLast10, Any]:
    handle = DictHandle()
    proc = CountAndLast10()
    proc.init(handle)

    def set_key(key: Any) -> None:
        handle.key = key

    return proc, set_key


def opbuffer_processor(batch: pd.DataFrame, max_entries: int) -> tuple[CountAndLast10, Any, Any, Any]:
    """The processor a LocalRunner runs (its instance's copy) after one batch (every key has state, all of it
    cached), the instance's key setter (takes a normalized key), its ProcessorRuntime and the runner."""
    from buffering import LocalRunner, cached_state

    runner = LocalRunner(cached_state(max_entries=max_entries)(CountAndLast10()), key=["tweet"])
    runner.process(batch)
    (instance,) = runner.instances
    runtime = instance.processor
    return runtime.processor, runtime.set_key, runtime, runner


def measure_calls(args: argparse.Namespace, rows: int, keys: int) -> dict[str, Any]:
    """The per-call measurements: dict-backed loop, opbuffer loop, LocalRunner.process, per-access loops."""
    from buffering import LocalRunner, cached_state
    from state.keys import normalize_key

    batch, groups = grouped_batch(rows, keys, USERS, args.seed)
    calls = len(groups)
    keys_list = [k for k, _ in groups]
    nkeys = [normalize_key(k) for k in keys_list]  # what the runner's buffer hands an instance
    result: dict[str, Any] = {"rows": rows, "keys": keys, "calls": calls, "load_before": list(os.getloadavg())}

    d_proc, d_set = dict_processor()
    call_loop(d_proc, groups, d_set, keys_list)  # untimed: every key gets its state
    o_proc, o_set, o_runtime, o_runner = opbuffer_processor(batch, args.max_entries)
    dict_s, op_s, rt_s = [], [], []
    for _ in range(args.micro_rounds):
        # Interleaved, so that load changes hit all alike.
        dict_s.append(call_loop(d_proc, groups, d_set, keys_list))
        op_s.append(call_loop(o_proc, groups, o_set, nkeys))
        rt_s.append(runtime_loop(o_runtime, groups, nkeys))
    result["dict_call_us"] = median(dict_s) / calls * 1e6
    result["opbuffer_call_us"] = median(op_s) / calls * 1e6
    result["overhead_call_us"] = result["opbuffer_call_us"] - result["dict_call_us"]
    result["runtime_call_us"] = median(rt_s) / calls * 1e6
    result["dict_call_us_all"] = [s / calls * 1e6 for s in dict_s]
    result["opbuffer_call_us_all"] = [s / calls * 1e6 for s in op_s]
    result["runtime_call_us_all"] = [s / calls * 1e6 for s in rt_s]

    d_acc = [access_loop(d_proc, keys_list, d_set, args.access_ops) for _ in range(args.micro_rounds)]
    o_acc = [access_loop(o_proc, nkeys, o_set, args.access_ops) for _ in range(args.micro_rounds)]
    result["access_us"] = {}
    for op in d_acc[0]:
        d = median([a[op] for a in d_acc]) * 1e6
        o = median([a[op] for a in o_acc]) * 1e6
        result["access_us"][op] = {"dict": d, "opbuffer": o, "overhead": o - d}
    result["overhead_access_us_max"] = max(v["overhead"] for v in result["access_us"].values())
    result["cache_stats"] = _cache_stats(o_runner)
    o_runner.close()

    # The whole runner on the same batch (grouping, calls, outputs), per call: for information.
    runner = LocalRunner(cached_state(max_entries=args.max_entries)(CountAndLast10()), key=["tweet"])
    runner.process(batch)
    process_s = []
    for _ in range(args.micro_rounds):
        start = now()
        runner.process(batch)
        process_s.append(now() - start)
    runner.close()
    result["runner_process_call_us"] = median(process_s) / calls * 1e6
    result["load_after"] = list(os.getloadavg())
    return result


def _cache_stats(runner: Any) -> Any:
    try:
        return runner.stats()
    except Exception as err:  # noqa: BLE001 - informative only
        return f"unavailable: {type(err).__name__}: {err}"


# ---------------------------------------------------------------- main
def _parse_ints(text: str) -> list[int]:
    values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"expected positive integers separated by commas, got {text!r}")
    return values


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"a run of about 3 minutes: {QUICK['rows']:,} rows, keys {QUICK['keys']}, "
                        f"{QUICK['micro_keys']:,} keys per call measurement")
    p.add_argument("--rows", type=int, default=None, help=f"views in total (default {ROWS:,})")
    p.add_argument("--keys", default=None, help=f"key cardinalities, comma-separated (default {','.join(map(str, KEYS))})")
    p.add_argument("--batches", type=int, default=BATCHES, help=f"parquet files = micro-batches (default {BATCHES})")
    p.add_argument("--variants", default=",".join(VARIANTS), help="end-to-end variants to run (default spark,opbuffer)")
    p.add_argument("--micro-keys", type=int, default=None, help="keys of the per-call measurement (default 10,000)")
    p.add_argument("--micro-rows", type=int, default=None,
                   help="rows of the per-call measurement's batch (default: 5 rows per key)")
    p.add_argument("--micro-rounds", type=int, default=None, help="timed passes of the per-call loops (median; default 5)")
    p.add_argument("--access-ops", type=int, default=None, help="accesses per per-access loop (default 200,000)")
    p.add_argument("--no-e2e", action="store_true", help="only the per-call measurements")
    p.add_argument("--no-micro", action="store_true", help="only the end-to-end runs")
    p.add_argument("--parallelism", type=int, default=4, help="shuffle partitions = operator instances (default 4)")
    p.add_argument("--max-entries", type=int, default=200_000, help="cached_state(max_entries=...) of opbuffer")
    p.add_argument("--seed", type=int, default=1234, help="random seed of the workload")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each variant")
    p.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/tws.json)")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    started = now()
    n_rows = args.rows or (QUICK["rows"] if args.quick else ROWS)
    cards = _parse_ints(args.keys) if args.keys else list(QUICK["keys"] if args.quick else KEYS)
    variants = [v for v in VARIANTS if v in {x.strip() for x in args.variants.split(",")}]
    micro_keys = args.micro_keys or (QUICK["micro_keys"] if args.quick else 10_000)
    micro_rows = args.micro_rows or micro_keys * 5
    args.micro_rounds = args.micro_rounds or (QUICK["micro_rounds"] if args.quick else 5)
    args.access_ops = args.access_ops or (QUICK["access_ops"] if args.quick else 200_000)
    params = {
        "rows": n_rows, "batches": args.batches, "keys": cards, "variants": variants,
        "processor": "CountAndLast10: ValueState count + ListState of the last 10 (user, ts); 4 state accesses per call",
        "generator": "benchmarks.spark_e2e.generate_views: tweets zipf(1.0) over the key cardinality, users uniform",
        "users": USERS, "seed": args.seed, "parallelism": args.parallelism, "master": args.master,
        "max_entries": args.max_entries, "spark_state_store": TWS_PROVIDER,
        "timed": "query build + start .. awaitTermination() returns", "warmup": not args.no_warmup,
        "micro": {"keys": micro_keys, "rows": micro_rows, "rounds": args.micro_rounds, "access_ops": args.access_ops},
        "quick": args.quick, "uptime_start": _uptime(), "code": _code_version(),
    }
    print(f"tws: {n_rows:,} rows in {args.batches} micro-batches, keys {cards}, variants {','.join(variants)}, "
          f"{args.master}, parallelism {args.parallelism}; pid {os.getpid()}", flush=True)
    print(f"load at start: {params['uptime_start']}", flush=True)
    results: dict[str, Any] = {"per_keys": {}}
    targets: list[dict] = []

    if not args.no_micro:
        log(f"per call: {micro_rows:,} rows over {micro_keys:,} keys, {args.micro_rounds} rounds")
        m = measure_calls(args, micro_rows, micro_keys)
        results["micro"] = m
        rows = [["handleInputRows, dict-backed handle (the processor's own cost)", m["dict_call_us"], "-"],
                ["handleInputRows, opbuffer handle (cache hits)", m["opbuffer_call_us"], m["overhead_call_us"]],
                ["ProcessorRuntime.handle_rows (opbuffer's per-key call)", m["runtime_call_us"],
                 m["runtime_call_us"] - m["dict_call_us"]],
                ["LocalRunner.process of the batch, per call", m["runner_process_call_us"],
                 m["runner_process_call_us"] - m["dict_call_us"]]]
        for op, v in m["access_us"].items():
            rows.append([f"{op}, dict-backed / opbuffer (cache hit)", v["opbuffer"], v["overhead"]])
            rows.append([f"{op}, dict-backed", v["dict"], "-"])
        print_table(["measurement", "us", "opbuffer overhead us"], rows,
                    title=f"per call: {m['calls']:,} calls on {micro_rows:,} rows pre-grouped by key, median of "
                          f"{args.micro_rounds} passes; load {m['load_before'][0]:.1f}-{m['load_after'][0]:.1f}")
        targets.append(check_target("opbuffer overhead per handleInputRows call", m["overhead_call_us"],
                                    TARGET_CALL_US, at_most=True, unit=" us"))
        targets.append(check_target("opbuffer overhead per state access on a cache hit (worst of get/update/list)",
                                    m["overhead_access_us_max"], TARGET_ACCESS_US, at_most=True, unit=" us"))

    root = tempfile.mkdtemp(prefix="opbuffer-tws-")
    spark = None
    try:
        if not args.no_e2e and variants:
            spark = start_spark(args)
            import pyspark

            params["pyspark"] = pyspark.__version__
            if not args.no_warmup:
                source = os.path.join(root, "warmup-input")
                write_files(generate_views(8_000, 100, 500, args.seed), source, args.batches)
                for v in variants:
                    t = now()
                    run_variant(spark, source, root, v, args)
                    log(f"warm-up ({v}): {now() - t:.1f} s")
            table = []
            for card in cards:
                views = generate_views(n_rows, card, USERS, args.seed)
                source = os.path.join(root, f"input-{card}")
                sizes = write_files(views, source, args.batches)
                bounds = np.cumsum([0, *sizes])
                calls = [int(views["tweet"].iloc[s:e].nunique()) for s, e in zip(bounds[:-1], bounds[1:])]
                runs: dict[str, dict[str, Any]] = {}
                errors: dict[str, str] = {}
                for v in variants:
                    log(f"[{card}] ({v}) ... (load {os.getloadavg()[0]:.2f}); {sum(calls):,} handleInputRows calls")
                    try:
                        runs[v] = run_variant(spark, source, root, v, args)
                    except Exception as err:  # noqa: BLE001 - record and go on
                        errors[v] = f"{type(err).__name__}: {err}"
                        print(f"ERROR [{card}] ({v}): {errors[v]}", flush=True)
                        traceback.print_exc()
                        continue
                    r = runs[v]
                    log(f"[{card}] ({v}) {r['seconds']:.2f} s; batches "
                        f"{'/'.join(f'{s:.1f}' for s in r['batch_seconds'])} s; "
                        f"load {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}")
                check = verify(views, {v: r["out"] for v, r in runs.items() if r["out"] is not None})
                check["problems"] += [f"({v}) failed: {e}" for v, e in errors.items()]
                check["ok"] = not check["problems"]
                for problem in check["problems"]:
                    print(f"!!! CORRECTNESS MISMATCH [{card} keys]: {problem}", flush=True)
                t = {v: r["seconds"] for v, r in runs.items()}
                speedup = t["spark"] / t["opbuffer"] if "spark" in t and "opbuffer" in t else None
                for v in variants:
                    if v not in runs:
                        table.append([card, v, "failed", "-", "-", "-", "-"])
                        continue
                    r = runs[v]
                    table.append([card, v, r["seconds"], sum(calls) / r["seconds"],
                                  "/".join(f"{s:.1f}" for s in r.get("runner_batch_seconds") or r["batch_seconds"]),
                                  f"{r['load_before'][0]:.1f}-{r['load_after'][0]:.1f}",
                                  (speedup if v == "opbuffer" and speedup is not None else "-")])
                results["per_keys"][str(card)] = {
                    "rows_per_batch": sizes, "calls_per_batch": calls, "seconds": t, "speedup_vs_spark": speedup,
                    "runs": {v: {k: x for k, x in r.items() if k != "out"} for v, r in runs.items()},
                    "errors": errors, "verification": check,
                }
                shutil.rmtree(source, ignore_errors=True)
            print()
            print_table(["keys", "variant", "seconds", "calls/s", "per batch s", "load 1m", "x faster than spark"], table,
                        title=f"{n_rows:,} rows, {args.batches} micro-batches, {args.master}, parallelism "
                              f"{args.parallelism}; seconds = query start .. awaitTermination, same run")
            for card in cards:
                c = results["per_keys"].get(str(card), {})
                print(f"verify [{card}]: {'OK' if c.get('verification', {}).get('ok') else 'MISMATCH'}")
                for m in c.get("runs", {}).get("opbuffer", {}).get("batch_metrics", []):
                    starts = m.get("starts")
                    print(f"run_stream [{card}] batch {m['batch_id']}: {m['seconds']:.2f} s, slowest task "
                          f"{m.get('task_seconds_max', 0):.2f} s (tasks sum {m.get('task_seconds_sum', 0):.2f} s, "
                          f"checkpoint {m.get('checkpoint_seconds', 0):.2f} s), sink {m.get('sink_seconds', 0):.2f} s, "
                          f"commit {m.get('commit_seconds', 0):.2f} s, calls {m.get('calls', 0):,}, instances {starts}")
                seconds = c.get("seconds", {})
                own_us = results.get("micro", {}).get("dict_call_us")
                if "spark" in seconds and "floor" in seconds:
                    # The processor's own work, spread over the cores, on top of moving the rows.
                    own_s = (own_us or 0.0) * 1e-6 * sum(c.get("calls_per_batch", [])) / max(1, args.parallelism)
                    ceiling = seconds["spark"] / (seconds["floor"] + own_s)
                    c["ceiling_vs_spark"] = ceiling
                    c["own_cost_seconds"] = own_s
                    print(f"ceiling [{card}]: spark {seconds['spark']:.1f} s / (floor {seconds['floor']:.1f} s + the "
                          f"processor's own cost {own_s:.1f} s) = {ceiling:.2f}x: no runner that moves the rows into "
                          f"Python and calls the processor can be faster than Spark by more"
                          + ("" if own_us is not None else " (own cost not measured: --no-micro)"))
                if c.get("speedup_vs_spark") is not None and card == max(cards):
                    targets.append(check_target(f"opbuffer vs Spark at {card} keys", c["speedup_vs_spark"],
                                                TARGET_VS_SPARK, unit="x"))
    finally:
        params["uptime_end"] = _uptime()
        print(f"load at end: {params['uptime_end']}", flush=True)
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
