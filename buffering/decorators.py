"""Decorators that configure an operator around an ``applyInPandasWithState``-shaped function.

``@mini_batch(...)`` and ``@cached_state(...)`` stack in any order. Each
returns a function that Spark's ``applyInPandasWithState`` still accepts
(same signature; a combiner, if set, is applied to the key's rows inside the
call) and records its configuration in ``fn.__opbuffer__`` (an
:class:`OperatorSpec`), which the runners read.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import pandas as pd

from state.ttl import check_ttl_ms

from .aggregations import Aggregation, Aggregations

UserFunction = Callable[[tuple, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]
Combiner = Union[Mapping[str, Aggregation], Callable[[pd.DataFrame], pd.DataFrame]]

_STORES = ("memory", "rocksdb")
#: cached_state(layout=...): blocks while the state fits the cache, then per key; one record per key; one
#: block per key group (state.blocks).
_LAYOUTS = ("auto", "key", "key_group")


def _positive_or_none(name: str, value: Any, kind: type = int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or not value > 0:
        raise ValueError(f"{name} must be a positive {kind.__name__} or None, got {value!r}")  # `not >`: NaN too


@dataclass(frozen=True)
class MiniBatchConfig:
    """When buffered rows are handed to the function, and how they are combined first."""

    max_rows: Optional[int] = None
    max_bytes: Optional[int] = None
    max_delay_ms: Optional[int] = None
    combine: Optional[Combiner] = None

    def __post_init__(self) -> None:
        _positive_or_none("max_rows", self.max_rows)
        _positive_or_none("max_bytes", self.max_bytes)
        _positive_or_none("max_delay_ms", self.max_delay_ms, float)
        if self.combine is not None and not callable(self.combine):
            if not isinstance(self.combine, Mapping) or not self.combine:
                raise TypeError(
                    f"combine must be a non-empty mapping {{output_column: Aggregation}} or a callable pdf -> pdf, "
                    f"got {self.combine!r}"
                )
            for name, agg in self.combine.items():
                if not isinstance(name, str) or not isinstance(agg, Aggregation):
                    raise TypeError(f"combine entry {name!r}: {agg!r} must map a column name to an Aggregation")

    @property
    def triggered(self) -> bool:
        """Whether a count, size or time trigger is set (without one, every micro-batch is flushed at its end)."""
        return self.max_rows is not None or self.max_bytes is not None or self.max_delay_ms is not None

    @property
    def aggregations(self) -> Optional[Aggregations]:
        if self.combine is None or callable(self.combine):
            return None
        return Aggregations(dict(self.combine))


@dataclass(frozen=True)
class StateConfig:
    """Where and how the operator's state lives."""

    max_entries: Optional[int] = None
    max_bytes: Optional[int] = None
    policy: str = "lru"
    store: str = "memory"
    path: Optional[str] = None
    low_watermark: Optional[float] = None
    high_watermark: Optional[float] = None
    #: State not updated for this many ms of processing time expires (None: never).
    ttl_ms: Optional[int] = None
    #: How the RocksDB state table keeps entries: one record per key, one block per key group, or "auto".
    layout: str = "auto"

    def __post_init__(self) -> None:
        if self.layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")
        if self.layout == "key_group" and self.policy != "lru":
            raise ValueError(
                f"cached_state(layout='key_group') takes no policy={self.policy!r} (key groups are evicted least "
                "recently used)"
            )
        _positive_or_none("max_entries", self.max_entries)
        check_ttl_ms("cached_state(ttl_ms=...)", self.ttl_ms)
        _positive_or_none("max_bytes", self.max_bytes)
        if self.store not in _STORES:
            raise ValueError(f"store must be one of {_STORES}, got {self.store!r}")
        if self.path is not None:
            if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path).strip():
                raise ValueError(f"path must name a directory, got {self.path!r}")
            if self.store != "rocksdb":
                raise ValueError(f"path={self.path!r} needs store='rocksdb'")
            # frozen dataclass: "~/state" means the home directory, as in a shell
            object.__setattr__(self, "path", os.path.expanduser(os.fspath(self.path)))
        from state.cache.policies import CachePolicy, check_policy_spec

        if isinstance(self.policy, CachePolicy):
            raise ValueError(
                f"cached_state(policy={self.policy!r}): every operator instance gets its own cache, so pass "
                "the policy class or a factory, not one instance they would share"
            )
        check_policy_spec(self.policy)  # raises on an unknown policy
        if (self.low_watermark is None) != (self.high_watermark is None):
            raise ValueError("give both low_watermark and high_watermark or neither")
        if self.low_watermark is not None:
            if not 0 < self.low_watermark < self.high_watermark <= 1:  # type: ignore[operator]
                raise ValueError(
                    f"need 0 < low_watermark < high_watermark <= 1, got {self.low_watermark!r}, {self.high_watermark!r}"
                )
            if self.max_entries is None and self.max_bytes is None:
                raise ValueError("watermarks are fractions of the cache's capacity: set max_entries or max_bytes")

    @property
    def cached(self) -> bool:
        return self.max_entries is not None or self.max_bytes is not None


@dataclass(frozen=True)
class OperatorSpec:
    """Everything a runner needs to run a decorated function (introspectable: ``fn.__opbuffer__``)."""

    function: Optional[UserFunction]
    mini_batch: Optional[MiniBatchConfig] = None
    state: StateConfig = field(default_factory=StateConfig)
    #: Set by :func:`aggregate`: the accumulators are the state, the results are the output.
    aggregations: Optional[Aggregations] = None
    #: A transformWithStateInPandas ``StatefulProcessor`` (then ``function`` is None).
    processor: Any = None
    #: Set by ``aggregate(..., window=...)``: the windows (a :class:`buffering.windows.WindowConfig`).
    window: Any = None

    def replace(self, **changes: Any) -> "OperatorSpec":
        return dataclasses.replace(self, **changes)


def spec_of(fn: Any) -> OperatorSpec:
    """The OperatorSpec of a decorated function, or a default one for a plain function."""
    spec = getattr(fn, "__opbuffer__", None)
    if isinstance(spec, OperatorSpec):
        return spec
    from .processor import is_processor

    if is_processor(fn):
        return OperatorSpec(function=None, processor=fn)
    if not callable(fn):
        raise TypeError(f"expected a function (key, rows, state) -> iterator of DataFrames, got {fn!r}")
    return OperatorSpec(function=fn)


def _combine_rows(config: MiniBatchConfig, frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """The key's rows combined as the buffer would: the callable's frame, or one row of partials."""
    rows = pd.concat(list(frames), ignore_index=True)
    if callable(config.combine):
        return config.combine(rows)
    aggs = config.aggregations
    assert aggs is not None
    partial = aggs.partial(rows)
    return pd.DataFrame({name: [value] for name, value in partial.items()})


def _wrap(fn: Any, spec: OperatorSpec) -> Callable[..., Iterator[pd.DataFrame]]:
    inner = spec.function
    if inner is None:
        raise TypeError("this operator has no user function to call")
    config = spec.mini_batch

    @functools.wraps(inner)
    def call(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        # Called by Spark's applyInPandasWithState: Spark's state is the system of
        # record; the only work done here is combining the key's rows first.
        if config is not None and config.combine is not None and not getattr(state, "hasTimedOut", False):
            combined = _combine_rows(config, rows)
            return inner(key, iter([combined]), state)
        return inner(key, rows, state)

    call.__opbuffer__ = spec  # type: ignore[attr-defined]
    return call


def mini_batch(
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    max_delay_ms: Optional[int] = None,
    combine: Optional[Combiner] = None,
) -> Callable[[Any], Any]:
    """Buffer rows per key until a trigger fires, then call the function once per buffered key.

    ``max_rows`` counts buffered rows of all keys together; ``max_bytes`` their
    estimated size; ``max_delay_ms`` the age of the oldest pending row. With
    ``combine`` ({output_column: Aggregation} or a callable pdf -> pdf) the
    buffer keeps one partial per key and the function receives one combined row.
    """
    config = MiniBatchConfig(max_rows, max_bytes, max_delay_ms, combine)

    def decorate(fn: Any) -> Any:
        spec = spec_of(fn)
        if spec.processor is not None and combine is not None:
            raise ValueError(
                f"combine= is for functions of rows; the processor {type(spec.processor).__name__} "
                "handles its rows itself"
            )
        if spec.aggregations is not None:
            if combine is not None:
                raise ValueError("aggregate() operators combine with their own aggregations; drop combine=")
            return _with_spec(fn, spec.replace(mini_batch=dataclasses.replace(config, combine=dict(spec.aggregations))))
        return _with_spec(fn, spec.replace(mini_batch=config))

    return decorate


def cached_state(
    max_entries: Optional[int] = None,
    max_bytes: Optional[int] = None,
    policy: Any = "lru",
    store: str = "memory",
    path: Optional[str] = None,
    low_watermark: Optional[float] = None,
    high_watermark: Optional[float] = None,
    ttl_ms: Optional[int] = None,
    layout: str = "auto",
) -> Callable[[Any], Any]:
    """Keep the operator's state in ``store`` ("memory" or "rocksdb") behind a bounded write-back cache.

    With neither ``max_entries`` nor ``max_bytes`` there is no cache: state
    goes straight to the store.

    ``ttl_ms`` (a positive int, or None for state that never expires): a key's
    state expires ``ttl_ms`` of processing time after its last update, as a
    transformWithState variable's TTL in Spark: every update sets the expiry
    to the batch's processing time + ``ttl_ms``; from the first batch whose
    processing time is at or past it, the function sees the key without
    state, and the batch's end removes it (a sweep whose work is proportional
    to the keys that expire). The expiries are checkpointed with the state.
    Spark's own ``applyInPandasWithState`` has no TTL: the runners apply it.

    ``layout`` (how an ``aggregate()``'s state is kept): ``"key"``, one
    cache entry and one RocksDB record per key; ``"key_group"``, one block per
    key group in the cache and in RocksDB (:class:`state.blocks.KeyGroupCache`);
    or ``"auto"`` (the default), blocks while the state fits the cache, then
    per key. Blocks take the per-key work out of merging, write-backs,
    checkpoints, restores and reads of keys not cached, but a write-back
    rewrites the whole block of every key group it touches and the bounds
    evict whole key groups: they win when most keys change between
    checkpoints (an aggregate over hot keys) and ``max_entries`` /
    ``max_bytes`` hold the instance's state, and lose by far when the state
    is several times the bounds (every batch then loads and writes back whole
    key groups for a few keys each). ``"auto"`` starts with blocks where they
    apply (an aggregate whose aggregations all have a column form, cached in
    front of a RocksDB working store with the LRU policy) and, at the end of
    the first batch in which its cache evicted a key group, turns the
    instance's block records into per-key records (one pass over its state)
    and goes on per key for the rest of the instance's life; an instance that
    opens per-key records (a restore, an adopted store) keeps them. A tumbling
    or hopping windowed aggregate keeps each window's entry in its key's block
    (closing windows reads and deletes them as byte ranges); session windows,
    functions and processors keep the per-key layout (``"key_group"`` is
    refused for them, ``"auto"`` takes ``"key"``). Blocks take the bounds, the
    watermarks (dirty key groups written back whole, least recently modified
    first) and a runner's ``memory_budget`` and ``ttl_ms`` as the per-key
    layout does (the expiries stay per key, in their own tables), but no
    policy other than LRU. Every layout restores a checkpoint written with
    another (converted as it is read).
    """
    config = StateConfig(max_entries, max_bytes, policy, store, path, low_watermark, high_watermark, ttl_ms, layout)

    def decorate(fn: Any) -> Any:
        spec = spec_of(fn)
        if ttl_ms is not None and spec.window is not None:
            raise ValueError(
                f"cached_state(ttl_ms={ttl_ms!r}) expires state by processing time; a windowed aggregate's "
                "windows are deleted when the watermark closes them"
            )
        if layout == "key_group" and (spec.aggregations is None or (spec.window is not None and spec.window.spec.merges)):
            what = "a session window (a key's sessions are one value, merged as they touch)" if spec.window is not None else (
                "a processor" if spec.processor is not None else "a function (its state is read and written per key)"
            )
            raise ValueError(
                f"cached_state(layout={layout!r}) is for aggregate(), whose accumulators are merged many keys "
                f"at a time; {what} keeps the per-key layout"
            )
        if ttl_ms is not None and spec.processor is not None:
            raise ValueError(
                f"cached_state(ttl_ms={ttl_ms!r}) expires a function's state; the processor "
                f"{type(spec.processor).__name__} sets a TTL per state variable (the ttlDurationMs of "
                "getValueState/getListState/getMapState)"
            )
        return _with_spec(fn, spec.replace(state=config))

    return decorate


def _with_spec(fn: Any, spec: OperatorSpec) -> Any:
    if isinstance(fn, AggregateOperator) or spec.processor is not None:
        # A copy carries the spec: the user's object stays as it was (Spark still takes either).
        clone = copy.copy(fn)
        clone.__opbuffer__ = spec
        return clone
    return _wrap(fn, spec)


class AggregateOperator:
    """A ready operator whose state is the accumulators of ``aggregations`` and whose output is their results.

    Use it as a runner's ``fn``; stack ``mini_batch``/``cached_state`` on it like on a function.
    ``key_columns``: the names of the key columns, written before the outputs
    when Spark's ``applyInPandasWithState`` calls the operator (Spark passes
    the key's values but not its column names); the runners know the key and
    add its columns themselves, and refuse a different ``key``.
    """

    def __init__(
        self,
        aggregations: Mapping[str, Aggregation],
        key_columns: Optional[Sequence[str]] = None,
        window: Any = None,
    ) -> None:
        self.aggregations = Aggregations(dict(aggregations))
        self.key_columns = None if key_columns is None else tuple(key_columns)
        #: A :class:`buffering.windows.WindowConfig` (None: one result per key, no windows).
        self.window = window
        if self.key_columns is not None:
            clash = [c for c in self.key_columns if c in self.aggregations]
            if clash:
                raise ValueError(f"aggregate(): key column(s) {clash} are also output columns of the aggregations")
        if window is not None:
            from .windows import check_window_columns

            check_window_columns(self.key_columns or (), list(self.aggregations))
        self.__opbuffer__ = OperatorSpec(
            function=None,
            mini_batch=MiniBatchConfig(combine=dict(aggregations)),
            aggregations=self.aggregations,
            window=window,
        )

    def __call__(self, key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        """applyInPandasWithState form: state holds the accumulator (pickled in a one-field tuple)."""
        import pickle

        if self.window is not None:
            raise TypeError(
                "a windowed aggregate(..., window=...) runs under opbuffer's runners (LocalRunner, run_stream); "
                "under Spark's own applyInPandasWithState use groupBy(window(...), key).agg(...)"
            )

        aggs = self.aggregations
        accumulator = pickle.loads(state.get[0]) if state.exists else aggs.empty()
        frames = [f for f in rows if len(f)]
        if frames:
            accumulator = aggs.merge(accumulator, aggs.partial(pd.concat(frames, ignore_index=True)))
        state.update((pickle.dumps(accumulator, 5),))
        columns: dict[str, list[Any]] = {}
        if self.key_columns is not None:
            if len(key) != len(self.key_columns):
                raise ValueError(
                    f"aggregate(key={list(self.key_columns)}) got the key {tuple(key)!r} of {len(key)} column(s) "
                    f"from Spark: group by exactly the key columns"
                )
            columns.update({name: [value] for name, value in zip(self.key_columns, key)})
        columns.update({name: [value] for name, value in aggs.result(accumulator).items()})
        yield pd.DataFrame(columns)


def check_operator_key(fn: Any, key_columns: Sequence[str]) -> None:
    """Raise ValueError when ``fn`` is ``aggregate(..., key=...)`` naming other key columns than a runner's."""
    declared = getattr(fn, "key_columns", None) if isinstance(fn, AggregateOperator) else None
    if declared is not None and list(declared) != list(key_columns):
        raise ValueError(f"fn is aggregate(..., key={list(declared)}) but the runner's key is {list(key_columns)}")


def aggregate(
    aggregations: Mapping[str, Aggregation],
    *,
    key: Union[str, Sequence[str], None] = None,
    window: Any = None,
    grace: Any = 0,
    emit: str = "watermark",
) -> AggregateOperator:
    """A ready operator with no user function: ``{output_column: Aggregation}`` per key, fully vectorized.

    ``key`` (optional) names the key columns for Spark's own
    ``groupBy(key).applyInPandasWithState(operator, ...)``, so that its output
    has them before the outputs; the opbuffer runners add them anyway.

    ``window`` (optional): :class:`~buffering.windows.Tumbling`,
    :class:`~buffering.windows.Hopping` or :class:`~buffering.windows.Session`
    over the runner's ``event_time=`` column: one result per key and window,
    with ``window_start``/``window_end`` columns (UTC timestamps). A window
    closes, and its state is deleted, when the watermark reaches its end +
    ``grace`` (a duration: ms, Timedelta or "1 minute"); rows of closed
    windows are late (dropped, counted). ``emit="watermark"`` emits each
    window once, when it closes (Spark's append mode); ``emit="update"``
    emits every window a batch changed with its running result.
    """
    if not isinstance(aggregations, Mapping) or not aggregations:
        raise TypeError(f"aggregate() needs a non-empty mapping {{output_column: Aggregation}}, got {aggregations!r}")
    config = None
    if window is not None:
        from .windows import WindowConfig

        config = WindowConfig.of(window, grace, emit)
    elif grace != 0 or emit != "watermark":
        raise ValueError(f"aggregate(grace={grace!r}, emit={emit!r}) is for windows: give window=...")
    columns = None
    if key is not None:
        columns = [key] if isinstance(key, str) else list(key) if isinstance(key, (list, tuple)) else None
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise TypeError(f"aggregate(key=...) takes a column name or a list of them, got {key!r}")
    return AggregateOperator(aggregations, columns, window=config)
