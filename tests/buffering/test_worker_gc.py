"""A Spark Python worker's objects are frozen out of the garbage collector once, at its first opbuffer task.

Each case runs in a fresh interpreter: freezing is once per process, and the
test process must keep its own collector as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from buffering.spark._gc import GC_FREEZE_ENV


def run_worker(body: str, env: dict[str, str] | None = None) -> Any:
    """Run ``body`` in a fresh interpreter (``_gc`` and ``gc`` imported); it prints one JSON value."""
    script = "import gc, json\nfrom buffering.spark import _gc\n" + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=os.getcwd(), timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_first_task_of_a_process_freezes_every_object_alive():
    result = run_worker(
        """
        before = gc.get_freeze_count()
        froze = _gc.freeze_once(holds_instances=False)
        print(json.dumps([before, froze, gc.get_freeze_count()]))
        """
    )
    before, froze, after = result
    assert before == 0 and froze is True
    assert after > 1000  # the imports' modules, classes and functions


def test_later_tasks_freeze_nothing_more():
    result = run_worker(
        """
        _gc.freeze_once(holds_instances=False)
        frozen = gc.get_freeze_count()
        made_since = [[i] for i in range(1000)]
        print(json.dumps([_gc.freeze_once(holds_instances=False), frozen, gc.get_freeze_count()]))
        """
    )
    again, frozen, after = result
    assert again is False and after == frozen


def test_garbage_left_before_the_freeze_is_collected_not_frozen():
    result = run_worker(
        """
        import weakref
        class Node:
            pass
        cycle = Node()
        cycle.me = cycle  # unreachable once deleted, freed only by a collection
        alive = weakref.ref(cycle)
        del cycle
        _gc.freeze_once(holds_instances=False)
        print(json.dumps(alive() is None))
        """
    )
    assert result is True


def test_a_process_that_already_holds_instances_is_never_frozen():
    result = run_worker(
        """
        first = _gc.freeze_once(holds_instances=True)
        later = _gc.freeze_once(holds_instances=False)
        print(json.dumps([first, later, gc.get_freeze_count()]))
        """
    )
    assert result == [False, False, 0]


def test_outside_a_spark_task_nothing_is_frozen_and_the_once_is_kept():
    result = run_worker(
        """
        outside = _gc.freeze_in_task()
        count = gc.get_freeze_count()
        print(json.dumps([outside, count, _gc.freeze_once(holds_instances=False)]))
        """
    )
    assert result == [False, 0, True]


def test_the_environment_variable_turns_the_freeze_off():
    result = run_worker(
        """
        print(json.dumps([_gc.freeze_once(holds_instances=False), gc.get_freeze_count()]))
        """,
        env={GC_FREEZE_ENV: "0"},
    )
    assert result == [False, 0]


_RUN_ONE_TASK = """
from pyspark.sql.types import LongType, StructField, StructType
from buffering.spark import _task, _workers
from buffering.spark.stream import StreamRunner
from tests.buffering.helpers import count_sum
schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
output = StructType([StructField(c, LongType()) for c in ("k", "n", "s")])
runner = StreamRunner(count_sum, input_schema=schema, key="k", output_schema=output,
                      checkpoint_location=CKPT, sink="noop", parallelism=1, workdir=WORK)
context, _ = runner.context(0)
list(_task.run_task(runner.plan, context, iter([]), partition_id=0))
(live,) = _workers._LIVE.values()
collectable = any(o is live.instance for o in gc.get_objects())
print(json.dumps([gc.get_freeze_count(), collectable]))
_workers.close_all()
"""


def test_a_spark_task_freezes_before_it_makes_its_instance(tmp_path):
    """Inside a Spark task, run_task freezes at its start: the instance it then makes stays collectable."""
    as_spark_task = "from pyspark import TaskContext\nTaskContext.get = classmethod(lambda cls: object())\n"
    frozen, collectable = run_worker(
        f"CKPT, WORK = {str(tmp_path / 'ckpt')!r}, {str(tmp_path / 'work')!r}\n" + as_spark_task + _RUN_ONE_TASK
    )
    assert frozen > 1000 and collectable is True


def test_a_task_function_called_outside_spark_leaves_the_collector_alone(tmp_path):
    frozen, _ = run_worker(f"CKPT, WORK = {str(tmp_path / 'ckpt')!r}, {str(tmp_path / 'work')!r}\n" + _RUN_ONE_TASK)
    assert frozen == 0


def test_a_spark_task_in_a_process_holding_instances_freezes_nothing(tmp_path):
    """Whatever task comes next (a run_batch one included), a process holding a stream's instances never freezes."""
    held_then_task = (
        f"CKPT, WORK = {str(tmp_path / 'ckpt')!r}, {str(tmp_path / 'work')!r}\n"
        + _RUN_ONE_TASK.replace("_workers.close_all()", "")
        + "from pyspark import TaskContext\nTaskContext.get = classmethod(lambda cls: object())\n"
        + "print(json.dumps([_gc.freeze_in_task(), gc.get_freeze_count()]))\n_workers.close_all()\n"
    )
    assert run_worker(held_then_task) == [False, 0]
