"""A Spark Python worker's long-lived objects, frozen out of the garbage collector once.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused
Python worker. A full collection visits every object the collector tracks, and
a worker that has imported pandas, pyarrow, pyspark and opbuffer tracks about
80,000 of them (25-35 ms a collection on an idle core here; in the Spark workers
of ``benchmarks.spark_e2e`` at 100k tweets, two workers on two busy cores, 69 ms
median and up to 157 ms after every task). Nearly all of them are modules,
classes and functions, which never become garbage. :func:`freeze_once` collects once and
moves every object then alive into the permanent generation (``gc.freeze()``),
which later collections skip, so the daemon's collection after each task visits
only what was made since.

A frozen object that later becomes part of an unreachable reference cycle is
never freed, so the freeze happens once per process, at the start of its first
opbuffer task and only while it holds no operator instance (an instance a later
hand-over drops must stay collectable): what gets frozen is the imports and
Spark's own objects of that one task. Only a Spark task freezes (:func:`freeze_in_task`):
a task function called outside Spark (a test, a driver) leaves its process's
collector alone. ``OPBUFFER_GC_FREEZE=0`` in the executors' environment (e.g.
``spark.executorEnv.OPBUFFER_GC_FREEZE=0``) turns it off.
"""

from __future__ import annotations

import gc
import os

#: The environment variable that turns the freeze off when set to "0".
GC_FREEZE_ENV = "OPBUFFER_GC_FREEZE"

_frozen = False


def freeze_once(holds_instances: bool) -> bool:
    """Collect, then freeze every object alive: once per process, never while it holds operator instances.

    Returns True when this call froze them. A process that already holds an
    instance at its first call never freezes (its instances could be dropped
    later, in cycles the collector must still free).
    """
    global _frozen
    if _frozen:
        return False
    _frozen = True
    if holds_instances or os.environ.get(GC_FREEZE_ENV, "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    return True


def freeze_in_task() -> bool:
    """:func:`freeze_once` when called inside a Spark task (a Python worker); else nothing, and the once is kept.

    Whether the process holds operator instances is asked here, not by the caller: a worker
    runs the tasks of every query of its application (a run_batch task may follow a
    run_stream one).
    """
    from pyspark import TaskContext

    from . import _workers

    if TaskContext.get() is None:
        return False
    return freeze_once(_workers.holds_instances())
