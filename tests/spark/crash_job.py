"""A run_stream job for the driver-crash trials: ``python -m tests.spark.crash_job INPUT CHECKPOINT SINK``.

Runs tweet stats over every file in INPUT (one file per micro-batch) until
they are all processed, with a ParquetSink at SINK; the test kills it with
SIGKILL at random points and restarts it on the same checkpoint.
"""

from __future__ import annotations

import sys

from buffering.spark._plan import ensure_python_workers


def main(argv: list[str]) -> None:
    input_dir, checkpoint, sink_dir = argv
    ensure_python_workers()
    from pyspark.sql import SparkSession

    import buffering
    from buffering.spark import ParquetSink, run_stream
    from tests.spark.test_run_stream import SCHEMA, STATS_SCHEMA, tweet_stats

    spark = (
        SparkSession.builder.master("local[2,4]")
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
    query = run_stream(
        source,
        buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats),
        key="tweet",
        output_schema=STATS_SCHEMA,
        checkpoint_location=checkpoint,
        sink=ParquetSink(sink_dir),
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
