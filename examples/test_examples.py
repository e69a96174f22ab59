"""The example operators, specified by their tests.

Deduplication and sessionization run in ``LocalRunner`` (plain Python, no
Spark; time moves only when a test moves it). Each example script also has a
Spark smoke test (marked ``spark`` and ``slow``) that runs its ``main()`` with
tiny sizes on the shared test SparkSession.

    pytest examples/test_examples.py -m "not spark"
"""

from __future__ import annotations

import pandas as pd
import pytest

import buffering
from buffering import LocalRunner
from dedup import first_seen
from sessionization import SESSION_GAP_MS, sessionize


class Clock:
    """Processing time in ms that the test moves by hand."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def events(*pairs: tuple[int, int]) -> pd.DataFrame:
    """Dedup input: ``(user, event_id)`` pairs in arrival order, ``ts`` = position."""
    return pd.DataFrame(
        {"user": [u for u, _ in pairs], "event_id": [e for _, e in pairs], "ts": list(range(len(pairs)))}
    ).astype("int64")


def emitted(out: pd.DataFrame) -> list[tuple[int, int]]:
    return [] if out.empty else list(zip(out["user"].tolist(), out["event_id"].tolist()))


def clicks(*pairs: tuple[int, int]) -> pd.DataFrame:
    """Sessionization input: ``(user, ts)`` pairs."""
    return pd.DataFrame({"user": [u for u, _ in pairs], "ts": [t for _, t in pairs]}).astype("int64")


def sessions(out: pd.DataFrame) -> dict[int, tuple[int, int, int]]:
    """Closed sessions by user: ``(start_ms, end_ms, clicks)``."""
    if out.empty:
        return {}
    return {row.user: (row.start_ms, row.end_ms, row.clicks) for row in out.itertuples(index=False)}


# ------------------------------------------------------------------ dedup


def dedup_runner(**kwargs) -> LocalRunner:
    return LocalRunner(first_seen, key="user", **kwargs)


def test_dedup_emits_an_event_id_the_first_time_a_user_sends_it():
    runner = dedup_runner()
    assert emitted(runner.process(events((1, 10), (1, 11)))) == [(1, 10), (1, 11)]


def test_dedup_drops_an_event_id_seen_in_an_earlier_batch():
    runner = dedup_runner()
    runner.process(events((1, 10)))
    assert emitted(runner.process(events((1, 10), (1, 12)))) == [(1, 12)]


def test_dedup_emits_copies_within_one_batch_once_keeping_the_first():
    runner = dedup_runner()
    out = runner.process(events((1, 10), (1, 10), (1, 11), (1, 10)))
    assert emitted(out) == [(1, 10), (1, 11)]
    assert out["ts"].tolist() == [0, 2]  # the first copy's row


def test_dedup_tracks_event_ids_per_user():
    runner = dedup_runner()
    runner.process(events((1, 10)))
    assert emitted(runner.process(events((2, 10), (1, 10)))) == [(2, 10)]


def test_dedup_emits_nothing_for_a_batch_of_only_copies():
    runner = dedup_runner()
    runner.process(events((1, 10), (2, 20)))
    assert runner.process(events((2, 20), (1, 10))).empty


def test_dedup_remembers_users_evicted_from_a_small_cache_into_rocksdb():
    tiny = buffering.cached_state(max_entries=2, store="rocksdb")(first_seen)
    runner = LocalRunner(tiny, key="user")
    runner.process(events(*[(user, 100 + user) for user in range(50)]))
    out = runner.process(events(*[(user, 100 + user) for user in range(50)], (7, 999)))
    assert emitted(out) == [(7, 999)]
    assert runner.stats()["instances"][0]["cache"]["evictions"] > 0


def test_dedup_remembers_seen_ids_across_a_restart_from_the_checkpoint(tmp_path):
    first = dedup_runner(checkpoint_location=tmp_path / "ckpt")
    first.process(events((1, 10), (2, 20)))
    first.close()
    second = dedup_runner(checkpoint_location=tmp_path / "ckpt", parallelism=2)  # another parallelism, too
    assert emitted(second.process(events((1, 10), (2, 20), (2, 21)))) == [(2, 21)]


# ------------------------------------------------------------------ sessionization


def session_runner(clock: Clock, **kwargs) -> LocalRunner:
    return LocalRunner(sessionize, key="user", timeout="processing", clock=clock, **kwargs)


def test_a_session_stays_open_while_the_user_is_active():
    runner = session_runner(Clock())
    assert runner.process(clicks((1, 100), (1, 200))).empty
    assert runner.advance_time(SESSION_GAP_MS).empty  # idle for exactly the gap: not yet longer


def test_a_session_is_emitted_once_the_user_is_idle_for_longer_than_the_gap():
    runner = session_runner(Clock())
    runner.process(clicks((1, 100), (1, 250), (1, 180)))
    assert sessions(runner.advance_time(SESSION_GAP_MS + 1)) == {1: (100, 250, 3)}


def test_a_click_within_the_gap_extends_the_session_and_restarts_the_timeout():
    clock = Clock()
    runner = session_runner(clock)
    runner.process(clicks((1, 100)))
    clock.now += SESSION_GAP_MS - 1
    assert runner.process(clicks((1, 900))).empty
    assert runner.advance_time(SESSION_GAP_MS - 1).empty  # gap counted from the last click
    assert sessions(runner.advance_time(2)) == {1: (100, 900, 2)}


def test_a_closed_session_is_emitted_once_and_its_state_removed():
    runner = session_runner(Clock())
    runner.process(clicks((1, 100)))
    runner.advance_time(SESSION_GAP_MS + 1)
    assert runner.get_state((1,)) is None
    assert runner.advance_time(10 * SESSION_GAP_MS).empty


def test_a_click_after_a_closed_session_starts_a_new_one():
    runner = session_runner(Clock())
    runner.process(clicks((1, 100)))
    runner.advance_time(SESSION_GAP_MS + 1)
    runner.process(clicks((1, 5_000)))
    assert sessions(runner.advance_time(SESSION_GAP_MS + 1)) == {1: (5_000, 5_000, 1)}


def test_users_time_out_independently():
    clock = Clock()
    runner = session_runner(clock)
    runner.process(clicks((1, 100), (2, 100)))
    clock.now += SESSION_GAP_MS // 2
    runner.process(clicks((2, 200)))
    assert sessions(runner.advance_time(SESSION_GAP_MS // 2 + 1)) == {1: (100, 100, 1)}
    assert sessions(runner.advance_time(SESSION_GAP_MS // 2)) == {2: (100, 200, 2)}


def test_open_sessions_and_their_timeouts_survive_a_restart_from_the_checkpoint(tmp_path):
    clock = Clock()
    first = session_runner(clock, checkpoint_location=tmp_path / "ckpt")
    first.process(clicks((1, 100), (1, 300)))
    first.close()
    second = session_runner(clock, checkpoint_location=tmp_path / "ckpt")
    assert sessions(second.advance_time(SESSION_GAP_MS + 1)) == {1: (100, 300, 2)}


# ------------------------------------------------------------------ Spark smoke tests (one per example script)


@pytest.mark.spark
@pytest.mark.slow
def test_tweet_stats_main_runs_on_spark_and_both_runs_agree(spark, tmp_path, capsys):
    import tweet_stats

    result = tweet_stats.main(
        ["--views", "3000", "--tweets", "200", "--users", "500", "--batches", "2", "--out", str(tmp_path)], spark=spark
    )
    assert result["agree"]
    assert [m["rows_in"] for m in result["batch_metrics"]] == [1500, 1500]
    assert sorted(result["plain_batches"]) == [0, 1]
    if result["chart"] is not None:  # matplotlib is the demo extra
        assert (tmp_path / "tweet_stats.png").stat().st_size > 0
    # The header names the cache the operator declares, and the chart draws the printed seconds.
    declared = buffering.spec_of(tweet_stats.TWEET_STATS).state.max_entries
    assert f"{declared:,}-entry cache" in capsys.readouterr().out
    assert result["opbuffer_batches"] == {m["batch_id"]: m["seconds"] for m in result["batch_metrics"]}


def _metrics_with_starts(batch_id, *starts):
    from buffering.spark import BatchMetrics

    return BatchMetrics(batch_id=batch_id, per_instance=[{"instance": i, "start": s} for i, s in enumerate(starts)])


def test_tweet_stats_says_how_many_instances_started_cold_and_explains_it_once(capsys):
    from tweet_stats import COLD_INSTANCE, batch_printer

    print_batch = batch_printer()
    print_batch(_metrics_with_starts(0, "new", "new", "new", "new"))
    print_batch(_metrics_with_starts(1, "resumed", "adopted", "restored", "resumed"))
    print_batch(_metrics_with_starts(2, "adopted", "resumed", "resumed", "resumed"))
    lines = capsys.readouterr().out.splitlines()
    assert "cold" not in lines[0]
    assert lines[1].endswith(", 2 of 4 instances cold (1 adopted, 1 restored)")
    assert lines[2] == f"    ({COLD_INSTANCE})"
    assert lines[3].endswith(", 1 of 4 instances cold (1 adopted)")
    assert len(lines) == 4


def test_tweet_stats_without_start_fields_prints_no_cold_instances(capsys):
    from buffering.spark import BatchMetrics
    from tweet_stats import batch_printer

    batch_printer()(BatchMetrics(batch_id=1, per_instance=[{"instance": 0}, {"instance": 1}]))
    assert "cold" not in capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.slow
def test_dedup_main_runs_on_spark_and_emits_each_first_copy_once(spark, tmp_path):
    import dedup

    result = dedup.main(["--events", "2000", "--users", "300", "--batches", "2", "--cache-entries", "20", "--out", str(tmp_path)], spark=spark)
    assert result["correct"]
    assert result["emitted"] == result["distinct"] < result["events"]


@pytest.mark.spark
@pytest.mark.slow
def test_sessionization_main_runs_on_spark_and_closes_every_session_on_timeout(spark, tmp_path):
    import sessionization

    result = sessionization.main(["--users", "20", "--clicks", "2", "--gap-ms", "500", "--out", str(tmp_path)], spark=spark)
    assert result["correct"]
    assert result["closed_per_run"] == [0, 10, 10]


@pytest.mark.spark
@pytest.mark.slow
def test_backfill_main_runs_on_spark_and_counts_every_view(spark, tmp_path):
    import backfill

    result = backfill.main(["--views", "3000", "--tweets", "200", "--users", "500", "--files", "2", "--out", str(tmp_path)], spark=spark)
    assert result["correct"]
    assert result["tweets"] > 0
