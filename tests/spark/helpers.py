"""Shared pieces of the Spark runner tests: input files, reference runs, output collection."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd


def write_batches(directory: str, frames: list[pd.DataFrame], first: int = 0) -> str:
    """One parquet file per frame, named so a file source reads them in order (one per micro-batch);
    ``first``: the number of the first file, to add files after those of an earlier call."""
    os.makedirs(directory, exist_ok=True)
    for i, frame in enumerate(frames, start=first):
        path = os.path.join(directory, f"part-{i:05d}.parquet")
        frame.to_parquet(path, index=False)
        # The file source orders files by modification time: make that the name order.
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    return directory


def views(n_batches: int, rows: int, tweets: int, users: int, seed: int = 7) -> list[pd.DataFrame]:
    """Skewed (zipf-like) views of tweets by users, ``n_batches`` frames of ``rows`` rows."""
    rng = np.random.default_rng(seed)
    out = []
    ranks = np.arange(1, tweets + 1)
    weights = 1.0 / ranks
    weights /= weights.sum()
    for b in range(n_batches):
        out.append(
            pd.DataFrame(
                {
                    "tweet": rng.choice(tweets, size=rows, p=weights).astype(np.int64),
                    "user": rng.integers(0, users, size=rows).astype(np.int64),
                    "ts": (np.arange(rows, dtype=np.int64) + b * rows) * 10,
                }
            )
        )
    return out


def count_views(key, rows, state):
    """Views per tweet so far, kept in the state (an applyInPandasWithState function)."""
    views_ = state.get[0] if state.exists else 0
    for pdf in rows:
        views_ += len(pdf)
    state.update((views_,))
    yield pd.DataFrame({"tweet": [key[0]], "views": [views_]})


def stream_of(spark: Any, directory: str, schema: str, files_per_trigger: int = 1) -> Any:
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_trigger).parquet(directory)


def collect_sink(into: list[tuple[int, pd.DataFrame]]) -> Callable[[Any, int], None]:
    """A sink that keeps each batch's rows (replacing a re-delivered batch id: idempotent)."""

    def sink(df: Any, batch_id: int) -> None:
        pdf = df.toPandas()
        for i, (b, _) in enumerate(into):
            if b == batch_id:
                into[i] = (batch_id, pdf)
                return
        into.append((batch_id, pdf))

    return sink


def reference_apply_in_pandas_with_state(
    spark: Any,
    directory: str,
    input_schema: str,
    fn: Callable[..., Iterator[pd.DataFrame]],
    key: list[str],
    output_schema: str,
    state_schema: str,
    checkpoint: str,
    timeout: str = "NoTimeout",
    watermark: tuple[str, str] | None = None,
) -> list[tuple[int, pd.DataFrame]]:
    """Spark's own groupBy().applyInPandasWithState over the same files, one batch per file.

    ``watermark``: ``(event time column, delay)`` for ``withWatermark`` (event-time timeouts).
    """
    out: list[tuple[int, pd.DataFrame]] = []
    stream = stream_of(spark, directory, input_schema)
    if watermark is not None:
        stream = stream.withWatermark(*watermark)
    query = (
        stream
        .groupBy(*key)
        .applyInPandasWithState(fn, output_schema, state_schema, "Update", timeout)
        .writeStream.outputMode("update")
        .foreachBatch(collect_sink(out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return out


def latest_per_key(batches: list[tuple[int, pd.DataFrame]], key: list[str]) -> pd.DataFrame:
    """The last row emitted for each key (the final state as the output shows it), sorted by key."""
    frames = [pdf.assign(_batch=b) for b, pdf in sorted(batches, key=lambda t: t[0]) if len(pdf)]
    allrows = pd.concat(frames, ignore_index=True)
    last = allrows.groupby(key, sort=True).tail(1).sort_values(key).drop(columns=["_batch"])
    return last.reset_index(drop=True)


def all_rows(batches: list[tuple[int, pd.DataFrame]], sort_by: list[str]) -> pd.DataFrame:
    frames = [pdf.assign(batch=b) for b, pdf in batches if len(pdf)]
    allrows = pd.concat(frames, ignore_index=True)
    return allrows.sort_values(["batch", *sort_by]).reset_index(drop=True)
