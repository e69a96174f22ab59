"""Helpers of the operator-layer tests: a test clock, small operators, and ways to compare runs."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
import pandas as pd

from checkpoint import read_state


class Clock:
    """An injected processing-time clock: ``clock()`` returns ``clock.now`` (ms); tests move it by hand."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def count_sum(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Per key: running count of rows and sum of ``v``; emits the running totals once per call."""
    n, s = state.get if state.exists else (0, 0)
    for frame in rows:
        n += len(frame)
        s += int(frame["v"].sum())
    state.update((n, s))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


def count_sum_of_partials(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The same logic as :func:`count_sum`, written for ``combine={"n": Count(), "s": Sum("v")}``."""
    n, s = state.get if state.exists else (0, 0)
    for frame in rows:
        n += int(frame["n"].sum())
        s += int(frame["s"].sum())
    state.update((n, s))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


class Recorder:
    """Wraps an operator function, recording ``(key, [rows frame, ...], has_timed_out)`` of every call."""

    def __init__(self, fn: Callable[..., Iterator[pd.DataFrame]] = count_sum) -> None:
        self.fn = fn
        self.calls: list[tuple[tuple, list[pd.DataFrame], bool]] = []

    def __call__(self, key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        frames = [f.copy() for f in rows]
        self.calls.append((key, frames, bool(state.hasTimedOut)))
        return self.fn(key, iter(frames), state)

    def rows_of(self, key: tuple, column: str = "v") -> list:
        """Every value of ``column`` handed to the function for ``key``, in call order."""
        return [v for k, frames, _ in self.calls if k == key for f in frames for v in f[column].tolist()]


def frame(**columns: Iterable[Any]) -> pd.DataFrame:
    return pd.DataFrame({name: list(values) for name, values in columns.items()})


def random_batches(rng: np.random.Generator, n_batches: int, max_rows: int, n_keys: int) -> list[pd.DataFrame]:
    """Small random micro-batches of ``k`` (int key) and ``v`` (int value); some may be empty."""
    out = []
    for _ in range(n_batches):
        n = int(rng.integers(0, max_rows + 1))
        out.append(pd.DataFrame({"k": rng.integers(0, n_keys, n).astype(np.int64),
                                 "v": rng.integers(0, 100, n).astype(np.int64)}))
    return out


def plain(value: Any) -> Any:
    """``value`` with numpy scalars/arrays turned into Python objects (for equality across code paths)."""
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def checkpoint_table(location: Any, table: str = "state", version: Optional[int] = None) -> dict[tuple, Any]:
    """``read_state`` of a table as ``{key tuple: value}`` (values made plain)."""
    df = read_state(location, version, table=table)
    key_columns = [c for c in df.columns if c != "state"]
    return {
        tuple(plain(row[c]) for c in key_columns): plain(row["state"])
        for _, row in df.iterrows()
    }


def with_batch(outputs: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-batch outputs as one frame with a ``batch`` column, sorted by batch then key (canonical order)."""
    tagged = [f.assign(batch=i) for i, f in enumerate(outputs) if len(f)]
    if not tagged:
        return pd.DataFrame(columns=["batch"])
    out = pd.concat(tagged, ignore_index=True)
    sort_by = ["batch"] + [c for c in out.columns if c != "batch"]
    return out.sort_values(sort_by, kind="stable").reset_index(drop=True)


def split_blocks_failing_once(monkeypatch: Any) -> None:
    """Make the operator's next conversion of block records into per-key records fail with "disk full"
    (the ones after it succeed)."""
    import buffering.operator as operator_module

    split = operator_module.split_blocks
    calls = []

    def fails_once(table: Any, key_groups: range) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk full")
        return split(table, key_groups)

    monkeypatch.setattr(operator_module, "split_blocks", fails_once)
