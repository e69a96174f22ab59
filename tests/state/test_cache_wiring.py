"""The cache's policy and memory budget reach the operators: cached_state, LocalRunner, the Spark task plan."""

from __future__ import annotations

import pytest

from buffering import LocalRunner, cached_state
from buffering.spark.stream import MEMORY_BUDGET_CONF, StreamRunner, _memory_budget_conf
from state import LRUPolicy
from state.cache import shared_manager

from ..buffering.helpers import Clock, count_sum, frame

BUDGET = 64 << 20


@pytest.mark.parametrize("policy", [LRUPolicy, lambda: LRUPolicy()], ids=["class", "factory"])
def test_a_policy_class_or_factory_gives_every_operator_instance_its_own_policy(tmp_path, policy):
    fn = cached_state(max_entries=2, store="rocksdb", path=str(tmp_path), policy=policy)(count_sum)
    runner = LocalRunner(fn, key="k", parallelism=2, clock=Clock())
    try:
        for _ in range(2):
            runner.process(frame(k=list(range(20)), v=[1] * 20))
        policies = [instance.cache.policy for instance in runner.instances]
        assert policies[0] is not policies[1]
        assert runner.get_state(7) == (2, 2)
    finally:
        runner.close()


def test_local_runner_instances_share_one_memory_budget(tmp_path):
    fn = cached_state(store="rocksdb", path=str(tmp_path))(count_sum)
    runner = LocalRunner(fn, key="k", parallelism=3, clock=Clock(), memory_budget=BUDGET)
    try:
        runner.process(frame(k=list(range(100)), v=[1] * 100))
        caches = [stats["cache"] for stats in runner.stats()["instances"]]
        granted = [cache["granted_bytes"] for cache in caches]
        assert all(g > 0 for g in granted) and sum(granted) <= BUDGET
        managers = {id(instance.cache._manager) for instance in runner.instances}
        assert managers == {id(shared_manager(BUDGET))}
    finally:
        runner.close()


def test_two_runners_with_the_same_budget_share_one_manager(tmp_path):
    runners = [
        LocalRunner(cached_state(store="rocksdb", path=str(tmp_path / str(i)))(count_sum), key="k", clock=Clock(),
                    memory_budget=BUDGET + 1)
        for i in range(2)
    ]
    try:
        for runner in runners:
            runner.process(frame(k=[1, 2], v=[1, 1]))
        manager = shared_manager(BUDGET + 1)
        assert {id(r.instances[0].cache._manager) for r in runners} == {id(manager)}
        assert sum(manager.blocks_of(r.instances[0].cache) for r in runners) <= manager.total_blocks
    finally:
        for runner in runners:
            runner.close()


@pytest.mark.parametrize("budget", [0, -1, 1.5, "64m", True, 1000])
def test_a_bad_memory_budget_is_refused_naming_it(tmp_path, budget):
    with pytest.raises(ValueError, match=f"memory_budget must be .* got {budget!r}"):
        LocalRunner(count_sum, key="k", memory_budget=budget, checkpoint_location=tmp_path)


@pytest.mark.parametrize("text, expected", [("536870912", 512 << 20), ("512m", 512 << 20), ("2g", 2 << 30), (None, None)])
def test_the_spark_conf_memory_budget_is_read_as_bytes(text, expected):
    assert _memory_budget_conf(text) == expected


def test_a_spark_conf_memory_budget_that_is_no_size_is_refused_naming_the_conf():
    with pytest.raises(ValueError, match=f"{MEMORY_BUDGET_CONF}='lots'"):
        _memory_budget_conf("lots")


def _schema(*names: str):
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField(name, LongType()) for name in names])


def test_stream_runner_ships_the_memory_budget_to_the_tasks(tmp_path):
    schema = _schema("k", "v")
    runner = StreamRunner(
        count_sum, input_schema=schema, key="k", output_schema=_schema("k", "n", "s"),
        checkpoint_location=str(tmp_path), sink="noop", parallelism=2, memory_budget=BUDGET,
    )
    assert runner.plan.memory_budget == BUDGET


def test_stream_runner_refuses_a_bad_memory_budget_naming_it(tmp_path):
    schema = _schema("k", "v")
    with pytest.raises(ValueError, match="memory_budget must be .* got -5"):
        StreamRunner(
            count_sum, input_schema=schema, key="k", output_schema=_schema("k", "n", "s"),
            checkpoint_location=str(tmp_path), sink="noop", parallelism=2, memory_budget=-5,
        )
