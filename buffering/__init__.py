"""Mini-batch buffers, aggregations, decorators and runners (built on :mod:`checkpoint` and :mod:`state`).

    import buffering
    from buffering.aggregations import Count, ApproxDistinct

    @buffering.mini_batch(max_rows=1000, max_delay_ms=100, combine={"views": Count(), "viewers": ApproxDistinct("user")})
    @buffering.cached_state(max_entries=100_000, store="rocksdb")
    def tweet_stats(key, rows, state): ...

    runner = buffering.LocalRunner(tweet_stats, key=["tweet"], checkpoint_location="/tmp/ckpt")
    out = runner.process(batch_df)
"""

from . import aggregations
from .aggregations import (
    Aggregation,
    Aggregations,
    ApproxDistinct,
    CollectSet,
    Count,
    First,
    Last,
    Max,
    Mean,
    Min,
    Sum,
)
from .buffer import MiniBatchBuffer
from .decorators import (
    AggregateOperator,
    MiniBatchConfig,
    OperatorSpec,
    StateConfig,
    aggregate,
    cached_state,
    mini_batch,
    spec_of,
)
from .local import LocalRunner
from .operator import OperatorInstance
from .windows import Hopping, Session, Tumbling

__all__ = [
    "AggregateOperator",
    "Aggregation",
    "Aggregations",
    "ApproxDistinct",
    "CollectSet",
    "Count",
    "First",
    "Hopping",
    "Last",
    "LocalRunner",
    "Max",
    "Mean",
    "MiniBatchBuffer",
    "MiniBatchConfig",
    "Min",
    "OperatorInstance",
    "OperatorSpec",
    "StateConfig",
    "Session",
    "Sum",
    "Tumbling",
    "aggregate",
    "aggregations",
    "cached_state",
    "mini_batch",
    "spec_of",
]
