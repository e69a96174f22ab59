"""run_stream on a real standalone cluster: do operator instances stay warm on their executor?

Starts its own Spark standalone cluster from the pip package
(:class:`buffering.spark.standalone.StandaloneCluster`: a master and W workers
with one core each and their own temp and local directories, as W machines),
and runs ``cached_state(store="rocksdb")(aggregate({"n": Count()}))`` through
``run_stream`` over ``--rows`` rows (default 200,000) of ``--keys`` keys
(default 20,000) in ``--batches`` micro-batches (default 6, one parquet file
each), checkpoint on a path every worker sees.

Layouts: 2 workers at parallelism 4 and 3 workers at parallelism 6 (``--layouts``).
Placements: ``executor`` (instances hosted in Spark's stateful operator, which
the state store coordinator keeps on the executor that ran it last) and
``batch`` (inside ``foreachBatch``, where any free executor takes a task).

Per batch it prints seconds, cache hit ratio and how each instance started
(``BatchMetrics.per_instance[i]["start"]``: resumed, adopted, restored, new);
per run, the warm ratio (instance-batches after the first that started
without a restore), the resumed ratio, restores and total seconds; and checks
the output against a pandas count of the input (every batch, every key).

``--kill-worker-after N``: SIGKILL the last worker (its process group, as a
lost machine) once batch N committed; its instances must restore elsewhere
and the output stay exact.

Target (issue 13): after the first batch, >= 95 % of instance-batches start
without a restore, and >= 95 % are "resumed" (one core per executor).

    python -m benchmarks.cluster [--quick] [--layouts 2x4,3x6] [--placements executor,batch]
        [--rows N] [--keys N] [--batches N] [--kill-worker-after N] [--out PATH]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._common import check_target, log, print_table, write_record

ROOT = str(Path(__file__).resolve().parent.parent)


def write_input(directory: str, rows: int, keys: int, batches: int, seed: int) -> list[pd.DataFrame]:
    """``batches`` parquet files of ``rows // batches`` rows (zipf-skewed keys), in name = modification order."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1)
    weights /= weights.sum()
    frames = []
    for b in range(batches):
        frame = pd.DataFrame({"k": rng.choice(keys, size=rows // batches, p=weights).astype(np.int64)})
        path = os.path.join(directory, f"part-{b:05d}.parquet")
        frame.to_parquet(path, index=False)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))
        frames.append(frame)
    return frames


def expected_output(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per batch, each key of the batch with its running count (what aggregate(Count) emits)."""
    out, total = [], pd.Series(dtype=np.int64)
    for b, frame in enumerate(frames):
        counts = frame["k"].value_counts()
        total = total.add(counts, fill_value=0).astype(np.int64)
        out.append(pd.DataFrame({"batch": b, "k": counts.index.to_numpy(), "n": total[counts.index].to_numpy()}))
    return pd.concat(out).sort_values(["batch", "k"]).reset_index(drop=True)


def read_output(sink: str) -> pd.DataFrame:
    frames = []
    for directory in glob.glob(os.path.join(sink, "batch_id=*")):
        batch = int(directory.rsplit("=", 1)[1])
        for part in glob.glob(os.path.join(directory, "part-*.parquet")):
            frames.append(pd.read_parquet(part).assign(batch=batch))
    if not frames:
        return pd.DataFrame({"batch": [], "k": [], "n": []})
    out = pd.concat(frames)[["batch", "k", "n"]]
    return out.sort_values(["batch", "k"]).reset_index(drop=True)


def run_layout(
    workers: int, parallelism: int, placement: str, args: argparse.Namespace, root: str, frames: list[pd.DataFrame]
) -> dict[str, Any]:
    """One run on a fresh cluster; returns per-batch metrics, ratios and the correctness check."""
    from pyspark.sql import SparkSession

    import buffering
    from buffering import Count
    from buffering.spark import ParquetSink, run_stream
    from buffering.spark.standalone import StandaloneCluster

    tag = f"{workers}x{parallelism}-{placement}"
    work = os.path.join(root, tag)
    checkpoint, sink = os.path.join(work, "ck"), os.path.join(work, "out")
    result: dict[str, Any] = {"workers": workers, "parallelism": parallelism, "placement": placement}
    with StandaloneCluster(workers=workers, cores=1, memory=args.worker_memory, directory=os.path.join(work, "cluster")) as cluster:
        spark = (
            SparkSession.builder.master(cluster.master_url)
            .appName(f"opbuffer-cluster-{tag}")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", args.executor_memory)
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
            .config("spark.sql.shuffle.partitions", str(parallelism))
            # Wait for every executor, so the first batch can spread over the whole cluster.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            killed: list[int] = []

            def on_batch(metrics: Any) -> None:
                if args.kill_worker_after is not None and metrics.batch_id == args.kill_worker_after and not killed:
                    cluster.kill_worker(workers - 1)
                    killed.append(metrics.batch_id)
                    log(f"[{tag}] killed worker {workers - 1} after batch {metrics.batch_id}")

            source = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(os.path.join(root, "in"))
            operator = buffering.cached_state(store="rocksdb", max_entries=args.keys)(buffering.aggregate({"n": Count()}))
            started = time.perf_counter()
            query = run_stream(
                source,
                operator,
                key="k",
                checkpoint_location=checkpoint,
                sink=ParquetSink(sink),
                parallelism=parallelism,
                placement=placement,
                trigger={"availableNow": True},
                on_batch=on_batch,
            )
            query.awaitTermination()
            result["seconds"] = time.perf_counter() - started
            metrics = query.batch_metrics
        finally:
            spark.stop()
    batches = []
    for m in metrics:
        starts = [p["start"] for p in sorted(m.per_instance, key=lambda p: p["instance"])]
        batches.append(
            {
                "batch": m.batch_id,
                "seconds": m.seconds,
                "cache_hit_ratio": m.cache_hit_ratio,
                "starts": starts,
                "committed": m.committed,
            }
        )
    after_first = [s for b in batches[1:] for s in b["starts"]]
    result["batches"] = batches
    result["instance_batches_after_first"] = len(after_first)
    result["warm_ratio"] = sum(s != "restored" for s in after_first) / len(after_first) if after_first else float("nan")
    result["resumed_ratio"] = sum(s == "resumed" for s in after_first) / len(after_first) if after_first else float("nan")
    result["restores"] = sum(s == "restored" for s in after_first)
    result["killed_after_batch"] = args.kill_worker_after
    ours, expected = read_output(sink), expected_output(frames)
    result["output_rows"] = len(ours)
    result["exact"] = bool(len(ours) == len(expected) and (ours.to_numpy() == expected.to_numpy()).all())
    return result


def parse_layouts(text: str) -> list[tuple[int, int]]:
    layouts = []
    for item in text.split(","):
        workers, _, parallelism = item.strip().partition("x")
        if not workers.isdigit() or not parallelism.isdigit():
            raise SystemExit(f"--layouts: {item!r} is not WORKERSxPARALLELISM (e.g. 2x4)")
        layouts.append((int(workers), int(parallelism)))
    return layouts


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000 rows of 2,000 keys")
    p.add_argument("--layouts", default="2x4,3x6", help="WORKERSxPARALLELISM, comma-separated (default 2x4,3x6)")
    p.add_argument("--placements", default="executor,batch", help="comma-separated: executor, batch")
    p.add_argument("--rows", type=int, default=None, help="input rows (default 200,000; --quick 20,000)")
    p.add_argument("--keys", type=int, default=None, help="distinct keys (default 20,000; --quick 2,000)")
    p.add_argument("--batches", type=int, default=6, help="micro-batches (default 6)")
    p.add_argument("--kill-worker-after", type=int, default=None, help="SIGKILL the last worker after this batch")
    p.add_argument("--worker-memory", default="1g")
    p.add_argument("--executor-memory", default="768m")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/cluster.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    args.rows = args.rows or (20_000 if args.quick else 200_000)
    args.keys = args.keys or (2_000 if args.quick else 20_000)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    started = time.perf_counter()
    root = tempfile.mkdtemp(prefix="opbuffer-cluster-bench-")
    try:
        frames = write_input(os.path.join(root, "in"), args.rows, args.keys, args.batches, args.seed)
        runs = []
        for workers, parallelism in parse_layouts(args.layouts):
            for placement in [p.strip() for p in args.placements.split(",") if p.strip()]:
                log(f"running {workers} workers x parallelism {parallelism}, placement={placement} ...")
                run = run_layout(workers, parallelism, placement, args, root, frames)
                runs.append(run)
                print_table(
                    ["batch", "seconds", "hit ratio", "starts"],
                    [[b["batch"], b["seconds"], b["cache_hit_ratio"], " ".join(b["starts"])] for b in run["batches"]],
                    title=f"{workers} workers, parallelism {parallelism}, placement={placement}",
                )
        print_table(
            ["layout", "placement", "seconds", "warm ratio", "resumed ratio", "restores", "exact"],
            [
                [f"{r['workers']}x{r['parallelism']}", r["placement"], r["seconds"], r["warm_ratio"], r["resumed_ratio"], r["restores"], r["exact"]]
                for r in runs
            ],
            title=f"run_stream on a standalone cluster: {args.rows:,} rows, {args.keys:,} keys, {args.batches} batches",
        )
        targets = []
        for r in runs:
            if r["placement"] != "executor":
                continue
            label = f"{r['workers']}x{r['parallelism']}"
            if args.kill_worker_after is None:  # a lost worker's instances must restore
                targets.append(check_target(f"{label} warm ratio after the first batch", r["warm_ratio"], 0.95))
                targets.append(check_target(f"{label} resumed ratio (one core per executor)", r["resumed_ratio"], 0.95))
            targets.append(check_target(f"{label} output exact", float(r["exact"]), 1.0))
        write_record(
            "cluster",
            params={k: v for k, v in vars(args).items() if k != "out"},
            results={"runs": runs},
            targets=targets,
            out=args.out,
            started=started,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
