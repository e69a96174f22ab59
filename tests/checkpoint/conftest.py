"""Fixtures of the checkpoint tests."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import pytest

from checkpoint import CheckpointStorage
from state import RocksDBStore, StoreError

from .helpers import TABLES, open_tables


@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    """A checkpoint location in tmp_path."""
    return CheckpointStorage(tmp_path / "ckpt")


@pytest.fixture
def make_tables(tmp_path) -> Iterator[Callable[..., dict[str, RocksDBStore]]]:
    """``make_tables(names=TABLES, max_parallelism=128, track=False)``: fresh stores in tmp_path, closed afterwards."""
    made = []
    counter = itertools.count()

    def make(names=TABLES, max_parallelism: int = 128, track: bool = False) -> dict[str, RocksDBStore]:
        tables = open_tables(tmp_path / f"db{next(counter)}", names, max_parallelism, track)
        made.append(tables)
        return tables

    yield make
    for tables in made:
        try:
            next(iter(tables.values())).close()
        except StoreError:
            pass
