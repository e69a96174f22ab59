"""Concatenating many small output frames (one per key) faster than ``pd.concat``."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

#: numpy dtype kinds whose concatenation numpy does as pandas does (bool, ints, floats, objects).
_PLAIN_KINDS = frozenset("biufO")


def concat_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(frames, ignore_index=True)``, block by block when every frame is laid out alike.

    A user function yields one small frame per key, and ``pd.concat`` of
    hundreds of one-row frames costs about 80 µs a frame. When every frame
    has the same unique column labels and the same blocks (the same plain
    numpy dtypes, bool, int, uint, float or object, holding the same columns),
    each block's values are joined with one ``np.concatenate``: the same frame
    about 15 times faster. Anything else (datetimes, categoricals, extension
    dtypes, differing columns, dtypes or layouts) goes to ``pd.concat``.

    The fast path reads pandas' block manager (``DataFrame._mgr``); should a
    pandas release change it, every call takes the ``pd.concat`` way.
    """
    if len(frames) < 2:
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    try:
        joined = _concat_blocks(frames)
    except AttributeError:  # another pandas' internals
        joined = None
    return pd.concat(frames, ignore_index=True) if joined is None else joined


def _layout(frame: pd.DataFrame) -> list[tuple[np.dtype, tuple[int, ...]]] | None:
    """``(dtype, column positions)`` per block, or None if a block is not a plain numpy one."""
    layout = []
    for block in frame._mgr.blocks:
        values = block.values
        if not isinstance(values, np.ndarray) or values.dtype.kind not in _PLAIN_KINDS:
            return None
        layout.append((values.dtype, tuple(block.mgr_locs)))
    return layout


def _concat_blocks(frames: Sequence[pd.DataFrame]) -> pd.DataFrame | None:
    first = frames[0]
    if not isinstance(first, pd.DataFrame) or not first.columns.is_unique:
        return None
    layout = _layout(first)
    if layout is None:
        return None
    columns = first.columns
    labels = columns.tolist()
    parts: list[list[np.ndarray]] = [[] for _ in layout]
    for frame in frames:
        if not isinstance(frame, pd.DataFrame) or frame.columns.tolist() != labels:
            return None
        blocks = frame._mgr.blocks
        if len(blocks) != len(layout):
            return None
        for part, block, (dtype, positions) in zip(parts, blocks, layout):
            values = block.values
            if not isinstance(values, np.ndarray) or values.dtype != dtype or tuple(block.mgr_locs) != positions:
                return None
            part.append(values)
    data: dict[object, np.ndarray] = {}
    for part, (_, positions) in zip(parts, layout):
        joined = np.concatenate(part, axis=1)  # a block's values are (its columns, rows)
        for row, position in enumerate(positions):
            data[labels[position]] = joined[row]
    return pd.DataFrame({label: data[label] for label in labels}, columns=columns, copy=False)


class FrameCollector:
    """The output frames of one flush, joined every ``every`` frames as they come.

    A flush calls the user's function once per key and each call yields a small
    frame; holding ten thousand of them until the batch ends keeps hundreds of
    thousands of Python objects alive, and every full garbage collection of the
    batch walks them all (measured: 6 full collections, 40 % of a batch of 10k
    keys). Joining them in runs of ``every`` leaves a few frames alive instead.
    ``frames()`` keeps the order of ``add``; joining them gives what joining
    every frame at once gives.
    """

    __slots__ = ("every", "_joined", "_pending")

    def __init__(self, every: int = 256) -> None:
        self.every = every
        self._joined: list[pd.DataFrame] = []
        self._pending: list[pd.DataFrame] = []

    def add(self, frames: Sequence[pd.DataFrame]) -> None:
        """Take one call's frames; every ``every`` pending frames are joined into one (O(rows) per join)."""
        self._pending.extend(frames)
        if len(self._pending) >= self.every:
            self._joined.append(concat_frames(self._pending))
            self._pending = []

    def frames(self) -> list[pd.DataFrame]:
        """Everything added, in order: the joined runs, then the frames not yet joined."""
        return self._joined + self._pending
