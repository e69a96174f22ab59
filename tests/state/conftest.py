"""Fixtures of the state tests: every test that takes ``store`` runs once per backend."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from state import MemoryStore, RocksDBStore, Store, StoreError, WriteBackCache
from state.blocks import KeyGroupCache

BACKENDS = ["memory", "rocksdb"]
POLICIES = ["lru", "clock", "lfu"]


def _close_quietly(store: Store) -> None:
    try:
        store.close()
    except StoreError:
        pass


@pytest.fixture
def make_backend(tmp_path) -> Iterator[Callable[..., Store]]:
    """``make_backend(kind, **kwargs)``: a fresh MemoryStore or RocksDBStore (in tmp_path), closed afterwards."""
    made: list[Store] = []
    counter = iter(range(1_000_000))

    def make(kind: str, **kwargs) -> Store:
        if kind == "memory":
            store: Store = MemoryStore(**kwargs)
        elif kind == "rocksdb":
            store = RocksDBStore(tmp_path / f"db{next(counter)}", **kwargs)
        else:
            raise AssertionError(kind)
        made.append(store)
        return store

    yield make
    for store in reversed(made):
        _close_quietly(store)


@pytest.fixture(params=BACKENDS)
def backend_kind(request) -> str:
    return request.param


@pytest.fixture
def store(backend_kind, make_backend) -> Store:
    """Every backend: a MemoryStore, and a RocksDBStore in tmp_path."""
    return make_backend(backend_kind)


@pytest.fixture(params=POLICIES)
def policy(request) -> str:
    return request.param


@pytest.fixture
def make_cache(make_backend) -> Iterator[Callable[..., WriteBackCache]]:
    """``make_cache(kind, **cache_kwargs)``: a WriteBackCache over a fresh backend of ``kind``."""
    made: list[WriteBackCache] = []

    def make(kind: str, **kwargs) -> WriteBackCache:
        cache = WriteBackCache(make_backend(kind), **kwargs)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        try:
            cache.close()
        except Exception:  # a test may leave an unserializable value behind on purpose
            pass


ANY_STORES = ["memory-plain", "memory-cache", "rocksdb-plain", "rocksdb-cache", "rocksdb-key_groups", "rocksdb-synced_key_groups"]


@pytest.fixture(params=ANY_STORES)
def any_store(request, make_backend) -> Store:
    """Every backend, bare and behind a small WriteBackCache, and a small KeyGroupCache over RocksDB,
    without and with watermarks (caches must look like stores)."""
    kind, wrapper = request.param.split("-")
    backend = make_backend(kind)
    if wrapper == "plain":
        return backend
    if wrapper == "cache":
        return WriteBackCache(backend, max_entries=2)
    if wrapper == "synced_key_groups":
        return KeyGroupCache(backend, max_entries=4, low_watermark=0.25, high_watermark=0.5)
    return KeyGroupCache(backend, max_entries=2)
