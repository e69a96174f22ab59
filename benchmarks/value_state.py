"""Value-state throughput: ``get`` / ``update`` / ``add`` ops/ms per store (Flink's ValueStateBenchmark shape).

Setup: ``--size`` int keys (default 500k) with random 64-bit longs in each of

* ``memory``      - MemoryStore (per-key puts);
* ``rocksdb``     - RocksDBStore bulk-loaded with put_many and left as loaded
                    (at this size RocksDB keeps it all in its memtable, as in
                    Flink's benchmark, which never flushes): the baseline of the target;
* ``rocksdb-sst`` - the same, then ``flush()``ed, so reads come from SST files
                    through the block cache (state at rest after a checkpoint);
* ``cache``       - WriteBackCache(RocksDBStore, max_entries large enough for
                    every key including the added ones); the setup puts go
                    through the cache, then ``cache.flush()`` (a checkpoint), so
                    every key is cached and clean when measuring starts.

Measured, per repetition and per store (store order rotated each repetition):

* ``get``    - ``get`` over ``--ops`` existing keys in random order;
* ``update`` - ``put`` of a new random long over ``--ops`` existing keys in random order;
* ``add``    - ``put`` of ``--ops`` keys that are not in the store yet.

Every store sees the same key lists in a repetition; each repetition draws
fresh ones. Reported: median ops/ms over the repetitions. The cache's
counters are checked to prove the measured phase was all hits (warm cache,
no evictions).

Flink reports heap/RocksDB ~7.8x for get. Target: cache/rocksdb >= 10x for
get and update.

    python -m benchmarks.value_state [--quick] [--size N] [--ops N] [--repeat N] [--policy lru|clock|lfu] [--out PATH]
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from state import MemoryStore, RocksDBStore, WriteBackCache

from ._common import (
    check_target,
    log,
    make_parser,
    median,
    now,
    print_table,
    ratio,
    resolve_repeat,
    resolve_size,
    temp_dir,
    timed,
    write_record,
)

NAME = "value_state"
STORES = ("memory", "rocksdb", "rocksdb-sst", "cache")
OPS = ("get", "update", "add")
TARGET_GET_UPDATE = 10.0
FLINK_HEAP_OVER_ROCKSDB_GET = 7.8
SETUP_CHUNK = 10_000


def _random_long(rng: random.Random) -> int:
    return rng.getrandbits(64) - (1 << 63)


def _run_get(store: Any, keys: list[int]) -> None:
    get = store.get
    for k in keys:
        get(k)


def _run_put(store: Any, keys: list[int], values: list[int]) -> None:
    put = store.put
    for k, v in zip(keys, values):
        put(k, v)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=500_000, quick_size=20_000,
                         size_help="number of keys set up in each store")
    parser.add_argument("--ops", type=int, default=None,
                        help="operations per measurement (default 100,000; --quick 5,000; at most --size)")
    parser.add_argument("--policy", default="lru", help="the cache's eviction policy: lru (default), clock, lfu")
    args = parser.parse_args(argv)
    started = now()
    n_keys = resolve_size(args)
    repeat = resolve_repeat(args, default=5, quick=2)
    n_ops = args.ops if args.ops is not None else (5_000 if args.quick else 100_000)
    n_ops = max(1, min(n_ops, n_keys))
    rng = random.Random(args.seed)
    max_entries = n_keys + repeat * n_ops + 1  # every key, the added ones too: no eviction ever

    params = {
        "keys": n_keys,
        "ops_per_measurement": n_ops,
        "repeat": repeat,
        "seed": args.seed,
        "value": "random 64-bit long (int)",
        "cache_max_entries": max_entries,
        "cache_policy": args.policy,
        "rocksdb_setup": "put_many in chunks of 10k; 'rocksdb' left as loaded, 'rocksdb-sst' flushed to SST",
        "cache_setup": "per-key cache.put of every key, then cache.flush()",
        "statistic": "median over repetitions",
        "quick": args.quick,
    }
    print(f"value_state: {n_keys:,} keys, {n_ops:,} ops per measurement, {repeat} repetitions (median), "
          f"pid {os.getpid()}", flush=True)

    keys = list(range(n_keys))
    values = [_random_long(rng) for _ in keys]

    with temp_dir("opbuffer-bench-value-state-") as tmp:
        stores: dict[str, Any] = {}
        setup_s: dict[str, float] = {}

        log("setup: memory")
        memory = MemoryStore()
        setup_s["memory"] = timed(lambda: _run_put(memory, keys, values))
        stores["memory"] = memory

        for label in ("rocksdb", "rocksdb-sst"):
            log(f"setup: {label}")
            store = RocksDBStore(os.path.join(tmp, label))

            def load(store: RocksDBStore = store, label: str = label) -> None:
                for i in range(0, n_keys, SETUP_CHUNK):
                    store.put_many(zip(keys[i:i + SETUP_CHUNK], values[i:i + SETUP_CHUNK]))
                if label == "rocksdb-sst":
                    store.flush()

            setup_s[label] = timed(load)
            stores[label] = store

        log("setup: cache")
        cache = WriteBackCache(RocksDBStore(os.path.join(tmp, "cache-backend")), max_entries=max_entries,
                               policy=args.policy)

        def load_cache() -> None:
            _run_put(cache, keys, values)
            cache.flush()

        setup_s["cache"] = timed(load_cache)
        stores["cache"] = cache
        cache_before = cache.stats()
        if cache_before["entries"] != n_keys or cache_before["dirty"] != 0:
            print(f"WARNING: cache after setup holds {cache_before['entries']:,} entries "
                  f"({cache_before['dirty']:,} dirty), expected {n_keys:,} clean", flush=True)

        # seconds[store][op] -> one float per repetition
        seconds: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in STORES}
        next_new_key = n_keys
        for rep in range(repeat):
            existing = rng.sample(keys, n_ops)           # shuffled existing keys for get
            to_update = rng.sample(keys, n_ops)          # shuffled existing keys for update
            update_values = [_random_long(rng) for _ in range(n_ops)]
            new_keys = list(range(next_new_key, next_new_key + n_ops))
            rng.shuffle(new_keys)
            new_values = [_random_long(rng) for _ in range(n_ops)]
            next_new_key += n_ops
            order = STORES[rep % len(STORES):] + STORES[:rep % len(STORES)]
            log(f"repetition {rep + 1}/{repeat}: {' '.join(order)}")
            for label in order:
                store = stores[label]
                seconds[label]["get"].append(timed(lambda: _run_get(store, existing)))
                seconds[label]["update"].append(timed(lambda: _run_put(store, to_update, update_values)))
                seconds[label]["add"].append(timed(lambda: _run_put(store, new_keys, new_values)))

        cache_after = cache.stats()
        measured_misses = cache_after["misses"] - cache_before["misses"]
        measured_hits = cache_after["hits"] - cache_before["hits"]
        measured_evictions = cache_after["evictions"] - cache_before["evictions"]
        warm = measured_misses == 0 and measured_evictions == 0
        for store in stores.values():
            store.close()

    ops_per_ms = {s: {op: [n_ops / (sec * 1e3) for sec in seconds[s][op]] for op in OPS} for s in STORES}
    med = {s: {op: median(ops_per_ms[s][op]) for op in OPS} for s in STORES}

    rows = []
    ratios: dict[str, dict[str, float]] = {}
    for op in OPS:
        r = {
            "cache/rocksdb": ratio(med["cache"][op], med["rocksdb"][op]),
            "cache/rocksdb-sst": ratio(med["cache"][op], med["rocksdb-sst"][op]),
            "cache/memory": ratio(med["cache"][op], med["memory"][op]),
            "memory/rocksdb": ratio(med["memory"][op], med["rocksdb"][op]),
        }
        ratios[op] = r
        rows.append([op, med["memory"][op], med["rocksdb"][op], med["rocksdb-sst"][op], med["cache"][op],
                     r["cache/rocksdb"], r["cache/rocksdb-sst"], r["cache/memory"], r["memory/rocksdb"]])
    print()
    print_table(
        ["op", "memory", "rocksdb", "rocksdb-sst", "cache", "cache/rocksdb", "cache/rocksdb-sst", "cache/memory",
         "memory/rocksdb"],
        rows,
        title=f"ops/ms (median of {repeat}; {n_ops:,} ops each, {n_keys:,} keys) and ratios",
    )
    spread_rows = [[s, op, min(ops_per_ms[s][op]), med[s][op], max(ops_per_ms[s][op])] for op in OPS for s in STORES]
    print()
    print_table(["store", "op", "min", "median", "max"], spread_rows, title="ops/ms spread over repetitions")
    print()
    print(f"cache during the measured phase: {measured_hits:,} hits, {measured_misses:,} misses, "
          f"{measured_evictions:,} evictions -> {'warm (all hits)' if warm else 'NOT WARM'}")
    print(f"reference: Flink heap/RocksDB for get ~{FLINK_HEAP_OVER_ROCKSDB_GET}x; "
          f"here memory/rocksdb get = {ratios['get']['memory/rocksdb']:.2f}x")
    targets = [
        check_target("cache/rocksdb get", ratios["get"]["cache/rocksdb"], TARGET_GET_UPDATE, unit="x"),
        check_target("cache/rocksdb update", ratios["update"]["cache/rocksdb"], TARGET_GET_UPDATE, unit="x"),
    ]

    results = {
        "ops_per_ms_median": med,
        "ops_per_ms_all": ops_per_ms,
        "seconds_all": seconds,
        "ratios": ratios,
        "setup_seconds": setup_s,
        "cache_measured": {
            "hits": measured_hits,
            "misses": measured_misses,
            "evictions": measured_evictions,
            "warm": warm,
            "stats_after_setup": cache_before,
            "stats_after_measurement": cache_after,
        },
        "reference": {"flink_heap_over_rocksdb_get": FLINK_HEAP_OVER_ROCKSDB_GET},
    }
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
