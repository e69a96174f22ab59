"""Three third-party-style stateful jobs, run as their authors run them: one ``availableNow`` run per arriving file.

A scheduled job: each time a file arrives it is written into the input
directory, the query starts with ``.trigger(availableNow=True)``, runs to its
end (the file's rows, then the batch without data Spark runs because the
watermark moved) and the next file waits for the next run. The Spark
checkpoint is the same across the runs. Every job runs three ways over the
same generated files:

(spark)    plain PySpark: ``df.withWatermark(...).groupBy(...).applyInPandasWithState(...)``
           (or ``.transformWithStateInPandas(...)``) ``.writeStream.outputMode("update")
           .foreachBatch(collect).option("checkpointLocation", ...).trigger(availableNow=True).start()``;
(opbuffer) the one-call change: ``buffering.spark.applyInPandasWithState(df.withWatermark(...)
           .groupBy(...), fn, ...)`` / ``transformWithStateInPandas(...)`` and exactly the same
           ``writeStream`` chain;
(local)    ``buffering.LocalRunner(fn, key=..., timeout="event", event_time=..., watermark_delay_ms=...,
           state_schema=...)``: ``process(file_frame)`` then ``idle()`` per file (the batch without
           data Spark would run). The file is read with ``pd.read_parquet`` and its timestamps made
           what Spark hands a pandas function (naive ``datetime64[ns]`` in the session time zone, UTC).

The jobs, written as their authors would write them (not adapted to opbuffer):

1. ``sessions``: event-time sessionization with ``applyInPandasWithState`` and
   ``EventTimeTimeout``, a 30-minute gap, watermark 10 minutes. The state holds
   the session's visits as ``array<struct<visit_time_as_milliseconds: long, page: string>>``
   plus its start and end; the function reads them back with attribute access
   (``v.visit_time_as_milliseconds``), splits a session at a gap of more than 30
   minutes and emits it when it closes (by a gap, or by its timeout). PySpark
   4.3's own applyInPandasWithState fails on any array field of a state schema
   (``KeyError: 'elementType'`` in the worker): then the script says so and,
   for the comparison, runs the variant ``sessions[json]`` (the visits as a
   JSON string in the state) on all three runners; opbuffer's and the local
   runner's array-state runs are compared with Spark's JSON-state rows.
2. ``twa``: time-weighted average temperature per sensor and 5-minute interval
   (key ``(sensor, interval_start)``, ``interval_start = window(ts, "5 minutes").start``),
   watermark 2 minutes, event-time timeout at the interval's end; emits the
   average when the timeout fires. Some readings arrive in a later file with
   timestamps behind the watermark (some exactly at it): Spark drops them by
   the watermark of the previous batch, and so must opbuffer; the dropped rows
   are counted per runner (Spark: ``numRowsDroppedByWatermark`` of the query's
   progress; opbuffer: ``query.batch_metrics[i].dropped_late_rows``; local:
   ``runner.last_batch_stats["dropped_late_rows"]``).
3. ``idle``: a ``transformWithStateInPandas`` ``StatefulProcessor`` with
   ``timeMode="EventTime"``: a ValueState of each user's last visit and visit
   count, an event-time timer at last seen + 10 minutes (the old one deleted);
   the timer emits an ``expired`` row. Spark's transformWithState needs the
   RocksDB state store provider (set for this job only).

Input: deterministic (``numpy.random.default_rng([seed, job])``); default 6
files, 2,000 users (jobs 1 and 3) and 1,000 sensors (job 2); ``--quick``: 3
files, 200 users, 100 sensors. Visits: each
file spans 30 minutes of event time; each user is active in a file with
probability 1/2, a burst of visits 3 minutes apart on average, one gap in ten
31-50 minutes (a new session); 3 % of the visits arrive one file late (behind
the watermark or not). Readings: each file spans 15 minutes; each sensor
reports every 150 s on average; 1.5 % of each file's readings are stragglers
from the 6 minutes before the file (the watermark is 2 minutes behind the
previous file's last reading), and per file 5 readings exactly at the
watermark the batch drops by and 5 one millisecond after it.

Output per job: rows per runner, whether opbuffer's and local's rows equal
Spark's exactly (multisets of rows), the differences (first 10), the
sessions / intervals / expired counts, the dropped late rows, the batches
run, and the wall time per runner (the runs' start .. ``awaitTermination``,
file writes excluded; local: read + process + idle) with spark / opbuffer
from the same run. Then the JSON record on one line (and in
``benchmarks/results/scheduled_jobs.json``).

    python -m benchmarks.scheduled_jobs [--quick] [--files 6] [--users 2000] [--sensors N]
        [--jobs sessions,twa,idle] [--parallelism 2] [--no-warmup] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

from ._common import local_spark_builder, log, machine_info, now, print_table, ratio, write_record

NAME = "scheduled_jobs"

FILES = 6
USERS = 2000
QUICK = {"files": 3, "users": 200}
JOBS = ("sessions", "twa", "idle")

T0 = pd.Timestamp("2026-01-05 08:00:00", tz="UTC")
T0_MS = T0.value // 1_000_000
MINUTE_MS = 60_000

TWS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# ============================================================== job 1: sessionization (applyInPandasWithState)
VISITS_SCHEMA = "user long, ts timestamp, page string"
SESSION_GAP_MS = 30 * MINUTE_MS
SESSIONS_WATERMARK = "10 minutes"
SESSIONS_WATERMARK_MS = 10 * MINUTE_MS
SESSIONS_OUTPUT = ("user long, session_start long, session_end long, visits long, distinct_pages long, "
                   "landing_page string, exit_page string, closed_by string")
SESSIONS_STATE = ("visits array<struct<visit_time_as_milliseconds: long, page: string>>, "
                  "session_start long, session_end long")
SESSIONS_STATE_JSON = "visits string, session_start long, session_end long"


def session_row(user: Any, times: list, pages: list, closed_by: str) -> pd.DataFrame:
    return pd.DataFrame({
        "user": [user], "session_start": [times[0]], "session_end": [times[-1]], "visits": [len(times)],
        "distinct_pages": [len(set(pages))], "landing_page": [pages[0]], "exit_page": [pages[-1]],
        "closed_by": [closed_by],
    })


def sessionize(key, pdf_iter, state):
    """A user's visits as sessions: a gap of more than 30 minutes ends one; the last one closes on its timeout."""
    from pyspark.sql import Row

    user = key[0]
    if state.hasTimedOut:
        visits, session_start, session_end = state.get
        state.remove()
        yield session_row(user, [v.visit_time_as_milliseconds for v in visits], [v.page for v in visits], "timeout")
        return

    visits = list(state.get[0]) if state.exists else []
    for pdf in pdf_iter:
        millis = pdf["ts"].astype("int64") // 1_000_000
        for t, page in zip(millis.tolist(), pdf["page"].tolist()):
            visits.append(Row(visit_time_as_milliseconds=t, page=page))
    visits.sort(key=lambda v: (v.visit_time_as_milliseconds, v.page))

    session = [visits[0]]
    for v in visits[1:]:
        if v.visit_time_as_milliseconds - session[-1].visit_time_as_milliseconds > SESSION_GAP_MS:
            yield session_row(user, [s.visit_time_as_milliseconds for s in session], [s.page for s in session], "gap")
            session = [v]
        else:
            session.append(v)
    start, end = session[0].visit_time_as_milliseconds, session[-1].visit_time_as_milliseconds
    state.update((session, start, end))
    state.setTimeoutTimestamp(end + SESSION_GAP_MS)


def sessionize_json(key, pdf_iter, state):
    """:func:`sessionize` with the visits kept as a JSON string (what plain Spark 4.3 can store)."""
    user = key[0]
    if state.hasTimedOut:
        visits_json, session_start, session_end = state.get
        state.remove()
        visits = json.loads(visits_json)
        yield session_row(user, [v["visit_time_as_milliseconds"] for v in visits], [v["page"] for v in visits], "timeout")
        return

    visits = json.loads(state.get[0]) if state.exists else []
    for pdf in pdf_iter:
        millis = pdf["ts"].astype("int64") // 1_000_000
        for t, page in zip(millis.tolist(), pdf["page"].tolist()):
            visits.append({"visit_time_as_milliseconds": t, "page": page})
    visits.sort(key=lambda v: (v["visit_time_as_milliseconds"], v["page"]))

    session = [visits[0]]
    for v in visits[1:]:
        if v["visit_time_as_milliseconds"] - session[-1]["visit_time_as_milliseconds"] > SESSION_GAP_MS:
            yield session_row(user, [s["visit_time_as_milliseconds"] for s in session], [s["page"] for s in session], "gap")
            session = [v]
        else:
            session.append(v)
    start, end = session[0]["visit_time_as_milliseconds"], session[-1]["visit_time_as_milliseconds"]
    state.update((json.dumps(session), start, end))
    state.setTimeoutTimestamp(end + SESSION_GAP_MS)


# ============================================================== job 2: time-weighted average (applyInPandasWithState)
READINGS_SCHEMA = "sensor long, ts timestamp, temperature double"
INTERVAL = "5 minutes"
INTERVAL_MS = 5 * MINUTE_MS
TWA_WATERMARK = "2 minutes"
TWA_WATERMARK_MS = 2 * MINUTE_MS
TWA_OUTPUT = "sensor long, interval_start timestamp, avg_temperature double, readings long, out_of_order long"
TWA_STATE = ("readings long, first_ts long, last_ts long, last_temperature double, weighted_sum double, "
             "out_of_order long")


def time_weighted_average(key, pdf_iter, state):
    """Per sensor and 5-minute interval: each reading holds until the next one (or the interval's end).

    A reading older than the last one kept arrived out of order: counted, not weighted.
    """
    sensor, interval_start = key
    start_ms = pd.Timestamp(interval_start).value // 1_000_000
    end_ms = start_ms + INTERVAL_MS
    if state.hasTimedOut:
        readings, first_ts, last_ts, last_temperature, weighted_sum, out_of_order = state.get
        state.remove()
        weighted_sum += last_temperature * (end_ms - last_ts)
        average = weighted_sum / (end_ms - first_ts)
        yield pd.DataFrame({"sensor": [sensor], "interval_start": [pd.Timestamp(interval_start)],
                            "avg_temperature": [round(average, 4)], "readings": [readings],
                            "out_of_order": [out_of_order]})
        return

    if state.exists:
        readings, first_ts, last_ts, last_temperature, weighted_sum, out_of_order = state.get
    else:
        readings, first_ts, last_ts, last_temperature, weighted_sum, out_of_order = 0, None, None, None, 0.0, 0
    times, temperatures = [], []
    for pdf in pdf_iter:
        times.extend((pdf["ts"].astype("int64") // 1_000_000).tolist())
        temperatures.extend(pdf["temperature"].tolist())
    for t, temperature in sorted(zip(times, temperatures)):
        readings += 1
        if last_ts is None:
            first_ts, last_ts, last_temperature = t, t, temperature
        elif t >= last_ts:
            weighted_sum += last_temperature * (t - last_ts)
            last_ts, last_temperature = t, temperature
        else:
            out_of_order += 1
    state.update((readings, first_ts, last_ts, last_temperature, weighted_sum, out_of_order))
    state.setTimeoutTimestamp(end_ms)


# ============================================================== job 3: idle users (transformWithStateInPandas)
IDLE_MS = 10 * MINUTE_MS
IDLE_WATERMARK = "5 minutes"
IDLE_WATERMARK_MS = 5 * MINUTE_MS
IDLE_OUTPUT = "user long, event string, last_seen long, visits long, watermark long"


class ExpireIdleUsers(StatefulProcessor):
    """A user's last visit in a ValueState; an event-time timer 10 minutes after it emits ``expired``."""

    def init(self, handle) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        self.handle = handle
        self.last_visit = handle.getValueState(
            "last_visit", StructType([StructField("last_seen", LongType()), StructField("visits", LongType())])
        )

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        latest, visits = None, 0
        for pdf in rows:
            if pdf.empty:
                continue
            visits += len(pdf)
            seen = int(pdf["ts"].max().value // 1_000_000)
            latest = seen if latest is None else max(latest, seen)
        if self.last_visit.exists():
            last_seen, before = self.last_visit.get()
            self.handle.deleteTimer(last_seen + IDLE_MS)
            latest = last_seen if latest is None else max(latest, last_seen)
            visits += before
        self.last_visit.update((latest, visits))
        self.handle.registerTimer(latest + IDLE_MS)
        yield pd.DataFrame({"user": [key[0]], "event": ["active"], "last_seen": [latest], "visits": [visits],
                            "watermark": [timerValues.getCurrentWatermarkInMs()]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        last_seen, visits = self.last_visit.get()
        self.last_visit.clear()
        yield pd.DataFrame({"user": [key[0]], "event": ["expired"], "last_seen": [last_seen], "visits": [visits],
                            "watermark": [timerValues.getCurrentWatermarkInMs()]})

    def close(self) -> None:
        pass


# ============================================================== input
def generate_visits(n_files: int, users: int, seed: int) -> list[pd.DataFrame]:
    """Visits ``(user, ts, page)``; file i spans [T0 + 30 min * i, + 30 min); 3 % of the visits arrive a file late."""
    rng = np.random.default_rng([seed, 1])
    span = 30 * MINUTE_MS
    pages = np.array([f"/p{i:02d}" for i in range(20)])
    page_weights = 1.0 / np.arange(1, 21)
    page_weights /= page_weights.sum()
    user_col, ts_col = [], []
    for i in range(n_files):
        active = np.flatnonzero(rng.random(users) < 0.5)
        counts = rng.poisson(4, size=len(active)) + 1
        owner = np.repeat(active, counts)
        gaps = np.where(rng.random(len(owner)) < 0.1, rng.integers(31 * MINUTE_MS, 50 * MINUTE_MS, len(owner)),
                        rng.exponential(3 * MINUTE_MS, len(owner)).astype(np.int64))
        starts = np.repeat(rng.integers(0, span, len(active)), counts)
        first = np.repeat(np.cumsum(np.r_[0, counts[:-1]]), counts)
        gaps[first == np.arange(len(owner))] = 0  # the burst's first visit is at its start
        offsets = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[np.cumsum(counts) - counts], counts) + starts
        keep = offsets < span
        user_col.append(owner[keep])
        ts_col.append(T0_MS + i * span + offsets[keep])
    users_ = np.concatenate(user_col).astype(np.int64)
    ts = np.concatenate(ts_col).astype(np.int64)
    page = rng.choice(pages, size=len(ts), p=page_weights)
    file_of = (ts - T0_MS) // span + (rng.random(len(ts)) < 0.03)
    frames = []
    for i in range(n_files):
        sel = file_of == i
        frame = pd.DataFrame({"user": users_[sel], "ts": ts[sel], "page": page[sel]})
        frame = frame.sample(frac=1.0, random_state=int(rng.integers(1 << 31))).reset_index(drop=True)
        frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True).astype("datetime64[us, UTC]")
        frames.append(frame)
    return frames


def generate_readings(n_files: int, sensors: int, seed: int) -> list[pd.DataFrame]:
    """Readings ``(sensor, ts, temperature)``; file i spans [T0 + 15 min * i, + 15 min), plus late readings."""
    rng = np.random.default_rng([seed, 2])
    span = 15 * MINUTE_MS
    base = rng.uniform(15.0, 25.0, sensors)
    frames, max_so_far = [], None
    for i in range(n_files):
        per = rng.poisson(span / 150_000, sensors)
        sensor = np.repeat(np.arange(sensors), per)
        ts = T0_MS + i * span + rng.integers(0, span, len(sensor))
        extra_sensor, extra_ts = [], []
        if max_so_far is not None:
            # Stragglers from the 6 minutes before this file: behind the watermark (dropped) or not.
            n_late = max(1, int(0.015 * len(sensor)))
            extra_sensor.append(rng.integers(0, sensors, n_late))
            extra_ts.append(T0_MS + i * span - rng.integers(1, 6 * MINUTE_MS, n_late))
            # Exactly at the watermark this batch drops by (dropped) and one millisecond after it (kept).
            watermark = max_so_far - TWA_WATERMARK_MS
            extra_sensor.append(rng.integers(0, sensors, 10))
            extra_ts.append(np.r_[np.full(5, watermark), np.full(5, watermark + 1)])
        all_sensor = np.concatenate([sensor, *extra_sensor]).astype(np.int64)
        all_ts = np.concatenate([ts, *extra_ts]).astype(np.int64)
        max_so_far = max(int(ts.max()), max_so_far or 0)
        temperature = np.round(base[all_sensor] + rng.normal(0.0, 1.5, len(all_sensor)), 1)
        frame = pd.DataFrame({"sensor": all_sensor, "ts": all_ts, "temperature": temperature})
        frame = frame.sample(frac=1.0, random_state=int(rng.integers(1 << 31))).reset_index(drop=True)
        frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True).astype("datetime64[us, UTC]")
        frames.append(frame)
    return frames


def late_rows_of(files: list[pd.DataFrame], delay_ms: int) -> int:
    """Rows a scheduled run drops as late, from the data alone: event time at or before the watermark
    the previous run left (the latest event time of the files before - the delay)."""
    late, latest = 0, None
    for frame in files:
        millis = frame["ts"].astype("int64") // 1000  # datetime64[us, UTC]
        if latest is not None:
            late += int((millis <= latest - delay_ms).sum())
        latest = max(int(millis.max()), latest if latest is not None else int(millis.max()))
    return late


WATERMARK_DELAYS_MS = {"sessions": SESSIONS_WATERMARK_MS, "twa": TWA_WATERMARK_MS, "idle": IDLE_WATERMARK_MS}


def write_file(directory: str, i: int, frame: pd.DataFrame) -> str:
    """File ``i`` arrives in ``directory`` (modification time in file order, as the file source orders them)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{i:05d}.parquet")
    frame.to_parquet(path, index=False)
    os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    return path


def read_arrived_file(path: str) -> pd.DataFrame:
    """The arrived file as a pandas function under Spark sees its rows: timestamps naive UTC, nanoseconds."""
    frame = pd.read_parquet(path)
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
    return frame


# ============================================================== the queries, as their authors write them
def sessions_query(spark: Any, source: str, checkpoint: str, collect: Callable, *, opbuffer: bool,
                   state: str = "array") -> Any:
    from buffering.spark import applyInPandasWithState

    fn, state_schema = (sessionize, SESSIONS_STATE) if state == "array" else (sessionize_json, SESSIONS_STATE_JSON)
    visits = spark.readStream.schema(VISITS_SCHEMA).parquet(source)
    if opbuffer:
        sessions = applyInPandasWithState(visits.withWatermark("ts", SESSIONS_WATERMARK).groupBy("user"),
                                          fn, SESSIONS_OUTPUT, state_schema, "Update", "EventTimeTimeout")
    else:
        sessions = (visits.withWatermark("ts", SESSIONS_WATERMARK).groupBy("user")
                    .applyInPandasWithState(fn, SESSIONS_OUTPUT, state_schema, "Update", "EventTimeTimeout"))
    return (sessions.writeStream.outputMode("update").foreachBatch(collect)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def twa_query(spark: Any, source: str, checkpoint: str, collect: Callable, *, opbuffer: bool, state: str = "") -> Any:
    from pyspark.sql import functions as F

    from buffering.spark import applyInPandasWithState

    readings = (spark.readStream.schema(READINGS_SCHEMA).parquet(source)
                .withWatermark("ts", TWA_WATERMARK)
                .withColumn("interval_start", F.window("ts", INTERVAL).start))
    if opbuffer:
        averages = applyInPandasWithState(readings.groupBy("sensor", "interval_start"), time_weighted_average,
                                          TWA_OUTPUT, TWA_STATE, "Update", "EventTimeTimeout")
    else:
        averages = (readings.groupBy("sensor", "interval_start")
                    .applyInPandasWithState(time_weighted_average, TWA_OUTPUT, TWA_STATE, "Update", "EventTimeTimeout"))
    return (averages.writeStream.outputMode("update").foreachBatch(collect)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def idle_query(spark: Any, source: str, checkpoint: str, collect: Callable, *, opbuffer: bool, state: str = "") -> Any:
    from buffering.spark import transformWithStateInPandas

    visits = spark.readStream.schema(VISITS_SCHEMA).parquet(source).withWatermark("ts", IDLE_WATERMARK)
    if opbuffer:
        events = transformWithStateInPandas(visits.groupBy("user"), ExpireIdleUsers(), IDLE_OUTPUT, "Update", "EventTime")
    else:
        events = visits.groupBy("user").transformWithStateInPandas(
            statefulProcessor=ExpireIdleUsers(), outputStructType=IDLE_OUTPUT, outputMode="Update", timeMode="EventTime")
    return (events.writeStream.outputMode("update").foreachBatch(collect)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def local_runner(job: str, state: str = "array") -> Any:
    from buffering import LocalRunner

    if job == "sessions":
        fn, schema = (sessionize, SESSIONS_STATE) if state == "array" else (sessionize_json, SESSIONS_STATE_JSON)
        return LocalRunner(fn, key="user", timeout="event", event_time="ts",
                           watermark_delay_ms=SESSIONS_WATERMARK_MS, state_schema=schema)
    if job == "twa":
        return LocalRunner(time_weighted_average, key=["sensor", "interval_start"], timeout="event", event_time="ts",
                           watermark_delay_ms=TWA_WATERMARK_MS, state_schema=TWA_STATE)
    if job == "idle":
        return LocalRunner(ExpireIdleUsers(), key="user", time_mode="EventTime", event_time="ts",
                           watermark_delay_ms=IDLE_WATERMARK_MS)
    raise ValueError(job)


def local_frame(job: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The columns the Spark query adds before grouping (job 2's interval), added in pandas."""
    if job == "twa":
        frame = frame.assign(interval_start=frame["ts"].dt.floor(INTERVAL.replace(" minutes", "min")))
    return frame


QUERIES = {"sessions": sessions_query, "twa": twa_query, "idle": idle_query}
OUTPUT_SCHEMAS = {"sessions": SESSIONS_OUTPUT, "twa": TWA_OUTPUT, "idle": IDLE_OUTPUT}


# ============================================================== runners
@dataclass
class Run:
    runner: str
    variant: str
    rows: list[tuple] = field(default_factory=list)
    #: Output rows per batch id (Spark, opbuffer) or per process/idle call (local).
    batches: dict[int, list[tuple]] = field(default_factory=dict)
    seconds: float = 0.0
    dropped_late_rows: Optional[int] = None
    batches_run: int = 0
    error: Optional[str] = None


def _value(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, (pd.Timestamp, np.datetime64)) or hasattr(v, "isoformat"):
        return None if pd.isna(v) else pd.Timestamp(v).isoformat()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v


def rows_of(pdf: pd.DataFrame, columns: list[str]) -> list[tuple]:
    if pdf is None or pdf.empty:
        return []
    return [tuple(_value(v) for v in row) for row in pdf[columns].itertuples(index=False, name=None)]


def columns_of(schema: str) -> list[str]:
    return [part.strip().split()[0] for part in schema.split(",")]


def _spark_progress(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        try:
            out.append(json.loads(p.json))
        except Exception:  # noqa: BLE001 - older shapes
            out.append(dict(p))
    return out


def run_spark(spark: Any, job: str, files: list[pd.DataFrame], workdir: str, *, opbuffer: bool,
              state: str = "array") -> Run:
    """One availableNow run per file, the same checkpoint across runs (plain Spark or opbuffer's one-call change)."""
    runner = "opbuffer" if opbuffer else "spark"
    tag = f"{runner}-{job}-{state}"
    source, checkpoint = os.path.join(workdir, f"in-{tag}"), os.path.join(workdir, f"ck-{tag}")
    columns = columns_of(OUTPUT_SCHEMAS[job])
    out: dict[int, pd.DataFrame] = {}

    def collect(df: Any, batch_id: int) -> None:
        out[batch_id] = df.toPandas()  # idempotent by batch id

    run = Run(runner, state if job == "sessions" else "", dropped_late_rows=0)
    for i, frame in enumerate(files):
        write_file(source, i, frame)
        started = now()
        query = QUERIES[job](spark, source, checkpoint, collect, opbuffer=opbuffer, state=state)
        try:
            query.awaitTermination()
        finally:
            run.seconds += now() - started
        if opbuffer:
            metrics = list(query.batch_metrics)
            run.batches_run += len(metrics)
            run.dropped_late_rows += sum(int(m.dropped_late_rows) for m in metrics)
        else:
            progress = [p for p in _spark_progress(query) if p.get("batchId") is not None]
            run.batches_run += len({p["batchId"] for p in progress})
            run.dropped_late_rows += sum(int(op.get("numRowsDroppedByWatermark", 0))
                                         for p in progress for op in p.get("stateOperators", []))
    run.batches = {b: rows_of(pdf, columns) for b, pdf in sorted(out.items())}
    run.rows = [r for b in sorted(run.batches) for r in run.batches[b]]
    return run


def run_local(job: str, files: list[pd.DataFrame], workdir: str, *, state: str = "array") -> Run:
    """``process(file)`` then ``idle()`` per arrived file: one availableNow run each."""
    source = os.path.join(workdir, f"in-local-{job}-{state}")
    columns = columns_of(OUTPUT_SCHEMAS[job])
    run = Run("local", state if job == "sessions" else "", dropped_late_rows=0)
    runner = local_runner(job, state)
    try:
        call = 0
        for i, frame in enumerate(files):
            path = write_file(source, i, frame)
            started = now()
            got = runner.process(local_frame(job, read_arrived_file(path)))
            run.dropped_late_rows += int(runner.last_batch_stats.get("dropped_late_rows", 0))
            version = runner.version
            idle = runner.idle()
            run.seconds += now() - started
            run.batches_run += 1 + (runner.version != version)
            for pdf in (got, idle):
                run.batches[call] = rows_of(pdf, columns)
                call += 1
    finally:
        runner.close()
    run.rows = [r for b in sorted(run.batches) for r in run.batches[b]]
    return run


def compare(reference: list[tuple], got: list[tuple], limit: int = 10) -> dict[str, Any]:
    """Multiset comparison: equal, and the first rows only in one of them (with their multiplicity)."""
    ref, mine = Counter(reference), Counter(got)
    only_ref = sorted((ref - mine).items(), key=repr)
    only_got = sorted((mine - ref).items(), key=repr)
    return {
        "equal": not only_ref and not only_got,
        "only_in_spark": [[list(r), n] for r, n in only_ref[:limit]],
        "only_in_runner": [[list(r), n] for r, n in only_got[:limit]],
        "n_only_in_spark": sum(n for _, n in only_ref),
        "n_only_in_runner": sum(n for _, n in only_got),
    }


def first_differing_batch(reference: Run, got: Run) -> Optional[int]:
    """The first batch id whose rows differ (Spark and opbuffer number their batches alike)."""
    for b in sorted(set(reference.batches) | set(got.batches)):
        if Counter(reference.batches.get(b, [])) != Counter(got.batches.get(b, [])):
            return b
    return None


def counts_of(job: str, rows: list[tuple]) -> dict[str, int]:
    if job == "sessions":
        by = Counter(r[7] for r in rows)
        return {"sessions": len(rows), "closed_by_gap": by.get("gap", 0), "closed_by_timeout": by.get("timeout", 0)}
    if job == "twa":
        return {"intervals": len(rows), "out_of_order_readings": sum(r[4] for r in rows)}
    by = Counter(r[1] for r in rows)
    return {"expired": by.get("expired", 0), "active": by.get("active", 0)}


def is_array_state_failure(exc: BaseException) -> bool:
    """PySpark 4.3's applyInPandasWithState worker cannot read a state schema with an array field."""
    return "elementType" in str(exc)


@contextmanager
def session_conf(spark: Any, settings: dict[str, str]) -> Iterator[Any]:
    """The session's SQL confs set for the block, restored afterwards."""
    previous = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield spark
    finally:
        for k, v in previous.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def tws_state_store(spark: Any) -> Any:
    """Spark 4.3 runs transformWithState on the RocksDB state store provider only (set for job 3)."""
    return session_conf(spark, {"spark.sql.streaming.stateStore.providerClass": TWS_PROVIDER})


# ============================================================== per job
def run_job(spark: Any, job: str, files: list[pd.DataFrame], workdir: str) -> dict[str, Any]:
    """The job's runs and their comparison with Spark's rows."""
    runs: list[Run] = []
    notes: list[str] = []
    reference: Optional[Run] = None
    if job == "sessions":
        try:
            reference = run_spark(spark, job, files, workdir, opbuffer=False, state="array")
            runs.append(reference)
            variants = ["array"]
        except Exception as exc:  # noqa: BLE001
            if not is_array_state_failure(exc):
                raise
            notes.append("plain Spark cannot run array state (PySpark's applyInPandasWithState worker: "
                         "KeyError: 'elementType'); Spark's rows are those of the JSON-state variant")
            runs.append(Run("spark", "array", error="KeyError: 'elementType'"))
            reference = run_spark(spark, job, files, workdir, opbuffer=False, state="json")
            runs.append(reference)
            variants = ["array", "json"]
        for state in variants:
            runs.append(run_spark(spark, job, files, workdir, opbuffer=True, state=state))
        for state in variants:
            runs.append(run_local(job, files, workdir, state=state))
    else:
        with (tws_state_store(spark) if job == "idle" else nullcontext()):
            reference = run_spark(spark, job, files, workdir, opbuffer=False)
            runs += [reference, run_spark(spark, job, files, workdir, opbuffer=True)]
        runs.append(run_local(job, files, workdir))
    result: dict[str, Any] = {"input_rows": sum(len(f) for f in files), "notes": notes, "runs": [],
                              "late_rows_by_the_data": late_rows_of(files, WATERMARK_DELAYS_MS[job])}
    for run in runs:
        entry: dict[str, Any] = {"runner": run.runner, "variant": run.variant, "error": run.error}
        if run.error is None:
            entry.update(rows=len(run.rows), seconds=round(run.seconds, 3), batches_run=run.batches_run,
                         dropped_late_rows=run.dropped_late_rows, counts=counts_of(job, run.rows))
            if run is not reference:
                entry["vs_spark"] = compare(reference.rows, run.rows)
                if not entry["vs_spark"]["equal"] and run.runner == "opbuffer":
                    entry["first_differing_batch"] = first_differing_batch(reference, run)
        result["runs"].append(entry)
    ok = [r for r in result["runs"] if r["error"] is None]
    spark_s = next(r["seconds"] for r in ok if r["runner"] == "spark")
    result["spark_over_opbuffer"] = {r["variant"] or "-": round(ratio(spark_s, r["seconds"]), 3)
                                     for r in ok if r["runner"] == "opbuffer"}
    result["all_equal"] = all(r["vs_spark"]["equal"] for r in ok if "vs_spark" in r)
    return result


def report_job(job: str, result: dict[str, Any]) -> None:
    print()
    table = []
    spark_s = next(r["seconds"] for r in result["runs"] if r["runner"] == "spark" and r["error"] is None)
    for r in result["runs"]:
        name = r["runner"] + (f"[{r['variant']}]" if r["variant"] else "")
        if r["error"]:
            table.append([name, "failed", "-", "-", "-", "-", "-", r["error"]])
            continue
        equal = "reference" if "vs_spark" not in r else ("yes" if r["vs_spark"]["equal"] else "NO")
        counts = " ".join(f"{k}={v}" for k, v in r["counts"].items())
        table.append([name, r["rows"], equal, r["dropped_late_rows"], r["batches_run"], r["seconds"],
                      ratio(spark_s, r["seconds"]) if r["runner"] != "spark" else "-", counts])
    print_table(["runner", "rows", "== spark", "late dropped", "batches", "seconds", "spark/this", "counts"], table,
                title=f"job {job}: {result['input_rows']:,} input rows in {result['files']} files, "
                      f"one availableNow run per file")
    print(f"late rows [{job}] by the data (event time <= the previous files' latest - the delay): "
          f"{result['late_rows_by_the_data']}")
    for note in result["notes"]:
        print(f"note [{job}]: {note}")
    for r in result["runs"]:
        diff = r.get("vs_spark")
        if diff and not diff["equal"]:
            name = r["runner"] + (f"[{r['variant']}]" if r["variant"] else "")
            print(f"DIFF [{job}] {name}: {diff['n_only_in_spark']} rows only in spark, "
                  f"{diff['n_only_in_runner']} only in {name}"
                  + (f"; first differing batch {r['first_differing_batch']}" if "first_differing_batch" in r else ""))
            for row, n in diff["only_in_spark"]:
                print(f"  spark only x{n}: {tuple(row)}")
            for row, n in diff["only_in_runner"]:
                print(f"  {name} only x{n}: {tuple(row)}")
    ratios = ", ".join(f"{k}: {v:.2f}x" for k, v in result["spark_over_opbuffer"].items())
    print(f"spark/opbuffer [{job}] (same run): {ratios}; all equal to spark: {'yes' if result['all_equal'] else 'NO'}")


def start_spark(args: argparse.Namespace) -> Any:
    spark = (local_spark_builder("opbuffer-scheduled-jobs", master=args.master, driver_memory=args.driver_memory,
                                 parallelism=args.parallelism)
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def warm_up(spark: Any, workdir: str) -> None:
    """An untimed run of each Spark runner on a few users, so neither pays the session's first query alone."""
    files = generate_visits(1, 20, seed=99)
    run_spark(spark, "sessions", files, os.path.join(workdir, "warmup"), opbuffer=False, state="json")
    run_spark(spark, "sessions", files, os.path.join(workdir, "warmup"), opbuffer=True, state="json")


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--files", type=int, default=None, help=f"arriving files, one run each (default {FILES}; --quick {QUICK['files']})")
    parser.add_argument("--users", type=int, default=None, help=f"users of jobs 1 and 3 (default {USERS:,}; --quick {QUICK['users']})")
    parser.add_argument("--sensors", type=int, default=None, help="sensors of job 2 (default: half the users)")
    parser.add_argument("--quick", action="store_true", help="a small size (smoke test)")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)}")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--parallelism", type=int, default=2, help="shuffle partitions (= opbuffer's instances)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    parser.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/scheduled_jobs.json)")
    args = parser.parse_args(argv)
    n_files = args.files or (QUICK["files"] if args.quick else FILES)
    users = args.users or (QUICK["users"] if args.quick else USERS)
    sensors = args.sensors or max(1, users // 2)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}: choose from {list(JOBS)}")
    started = now()
    params = {"files": n_files, "users": users, "sensors": sensors, "jobs": jobs, "seed": args.seed,
              "master": args.master, "parallelism": args.parallelism, "quick": args.quick,
              "load_start": list(os.getloadavg())}
    results: dict[str, Any] = {}
    root = tempfile.mkdtemp(prefix="opbuffer-scheduled-")
    spark = None
    try:
        spark = start_spark(args)
        if not args.no_warmup:
            log("warm-up ...")
            warm_up(spark, root)
        inputs = {"sessions": lambda: generate_visits(n_files, users, args.seed),
                  "twa": lambda: generate_readings(n_files, sensors, args.seed),
                  "idle": lambda: generate_visits(n_files, users, args.seed + 1)}
        for job in jobs:
            log(f"job {job} ...")
            files = inputs[job]()
            try:
                result = run_job(spark, job, files, os.path.join(root, job))
            except Exception as exc:  # noqa: BLE001 - report and go on with the next job
                traceback.print_exc()
                results[job] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
                print(f"job {job}: FAILED {type(exc).__name__}: {str(exc)[:500]}")
                continue
            result["files"] = n_files
            results[job] = result
            report_job(job, result)
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    params["load_end"] = list(os.getloadavg())
    print()
    summary = {job: (r.get("all_equal") if "error" not in r else "error") for job, r in results.items()}
    print(f"equal to spark: {summary}; runtime {now() - started:.1f} s")
    record = {"benchmark": NAME, "params": params, "results": results, "machine": machine_info(),
              "runtime_s": round(now() - started, 3)}
    write_record(NAME, params=params, results=results, out=args.out, started=started)
    print(json.dumps(record, default=str))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
