"""Batched store round trips: put vs put_many, get vs get_many (multi-get), on a 1M-key RocksDBStore.

Setup: a RocksDBStore with ``--size`` int keys (default 1M), each holding
``--value-bytes`` random bytes (incompressible), bulk-loaded with put_many in
chunks of 10k and then ``flush()``ed to SST files. A few untimed
``get_many`` calls bring the block cache to its steady state.

Measured, ``--repeat`` times with the order of the sides alternated, each
with ``--batch`` keys (default 10k), median reported:

(a) flushing dirty keys
    * store:  per-key ``store.put(k, v)``  vs  one ``store.put_many(pairs)``
              (the write path only; no memtable flush on either side);
    * cache:  a WriteBackCache holding the dirty entries, timed ``cache.flush()``
              (serialize + one write batch + ``store.flush()``)  vs  the same
              keys and values ``store.put`` one by one then ``store.flush()``.
              The memtable is flushed (untimed) before each side, so each
              side's ``store.flush()`` writes only its own keys.
(b) loading misses (existing keys, uniformly random)
    * per-key ``store.get(k)``  vs  ``store.get_many(keys)`` (rocksdict multi-get)
      vs  ``store.get_many`` of the keys sorted in RocksDB key order (key group,
      then key), timed with and without the sort.

Block cache fairness: every side of every measurement draws its own fresh
random key set (never a key set another side just read), after the warm-up.
With ~1M keys the SST data is about twice the 64 MB block cache, so each side
sees the same steady-state mix of cached and uncached blocks and neither is
artificially warm; all files sit in the OS page cache, so "uncached" means a
block-cache miss, not a disk read.

Diagnostic rows (``raw``) time rocksdict itself with pre-encoded keys and
pre-serialized values (per-key Rdict put/get vs one WriteBatch / one
multi-get, and a multi-get of the encoded keys sorted in bytes order), i.e.
what batching can save once the per-key Python work (normalize, encode,
pickle) is taken out. They use the store's private
``_cf``/``_handle``/``_encode`` and are not part of the targets.

Target: >= 2x for flush + load together (per-key put + get over put_many + get_many).

    python -m benchmarks.batched_io [--quick] [--size N] [--batch N] [--repeat N] [--out PATH]
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any, Callable

from rocksdict import WriteBatch

from state import RocksDBStore, WriteBackCache

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

NAME = "batched_io"
TARGET_TOGETHER = 2.0
LOAD_CHUNK = 10_000
WARMUP_READS = 5


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=1_000_000, quick_size=50_000,
                         size_help="keys bulk-loaded into the store")
    parser.add_argument("--batch", type=int, default=None, help="keys per measurement (default 10,000; --quick 2,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="random bytes per value (default 100)")
    args = parser.parse_args(argv)
    started = now()
    n_keys = resolve_size(args)
    batch = args.batch if args.batch is not None else (2_000 if args.quick else 10_000)
    batch = max(1, min(batch, n_keys))
    repeat = resolve_repeat(args, default=7, quick=2)
    rng = random.Random(args.seed)
    value_bytes = args.value_bytes

    params = {
        "keys": n_keys,
        "batch": batch,
        "value": f"{value_bytes} random bytes",
        "value_bytes": value_bytes,
        "repeat": repeat,
        "seed": args.seed,
        "setup": "put_many in chunks of 10k, then store.flush()",
        "block_cache_bytes": 64 << 20,
        "key_sets": "fresh uniformly random existing keys for every side of every measurement",
        "statistic": "median over repetitions; side order alternated per repetition",
        "quick": args.quick,
    }
    print(f"batched_io: {n_keys:,} keys x {value_bytes} B, {batch:,} keys per measurement, "
          f"{repeat} repetitions (median)", flush=True)

    keys = range(n_keys)

    def fresh_keys() -> list[int]:
        return rng.sample(keys, batch)

    def fresh_values() -> list[bytes]:
        return [rng.randbytes(value_bytes) for _ in range(batch)]

    seconds: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        seconds.setdefault(name, []).append(value)

    with temp_dir("opbuffer-bench-batched-io-") as tmp:
        store = RocksDBStore(os.path.join(tmp, "db"))
        log("setup: bulk load")

        def load() -> None:
            for i in range(0, n_keys, LOAD_CHUNK):
                chunk = range(i, min(i + LOAD_CHUNK, n_keys))
                store.put_many([(k, rng.randbytes(value_bytes)) for k in chunk])
            store.flush()

        setup_s = timed(load)
        for _ in range(WARMUP_READS):
            store.get_many(fresh_keys())

        # Time RocksDBStore.flush() inside cache.flush() by wrapping the instance's method.
        sst_s: list[float] = []
        original_flush = store.flush

        def timed_store_flush() -> None:
            start = now()
            original_flush()
            sst_s.append(now() - start)

        cf = store._cf
        handle = store._handle
        encode = store._encode
        dumps = store.serializer.dumps

        def kv(ks: list[int]) -> list[tuple[int, bytes]]:
            return list(zip(ks, fresh_values()))

        # ---- the measurements; each builds its inputs untimed and returns seconds
        def m_put_per_key() -> float:
            pairs = kv(fresh_keys())

            def run() -> None:
                put = store.put
                for k, v in pairs:
                    put(k, v)
            return timed(run)

        def m_put_many() -> float:
            pairs = kv(fresh_keys())
            return timed(lambda: store.put_many(pairs))

        def m_cache_flush(pairs: list[tuple[int, bytes]]) -> float:
            cache = WriteBackCache(store, max_entries=batch + 1)
            for k, v in pairs:
                cache.put(k, v)  # a put does not read the backend: batch dirty entries, nothing loaded
            assert cache.dirty_count() == len(pairs) and cache.stats()["misses"] == 0
            original_flush()  # untimed: the memtable holds only what this side writes
            store.flush = timed_store_flush  # type: ignore[method-assign]
            try:
                elapsed = timed(lambda: cache.flush(durable=True))  # like the per-key side's store.flush()
            finally:
                del store.flush
            record("cache_flush_sst", sst_s[-1])
            return elapsed  # the cache is dropped, not closed: close() would close the store

        def m_cache_per_key(pairs: list[tuple[int, bytes]]) -> float:
            original_flush()

            def run() -> None:
                put = store.put
                for k, v in pairs:
                    put(k, v)
                start = now()
                original_flush()
                record("per_key_flush_sst", now() - start)
            return timed(run)

        def m_get_per_key() -> float:
            ks = fresh_keys()

            def run() -> None:
                get = store.get
                for k in ks:
                    get(k)
            return timed(run)

        def m_get_many() -> float:
            ks = fresh_keys()
            return timed(lambda: store.get_many(ks))

        key_group = store.key_group

        def m_get_many_sorted() -> float:
            ks = fresh_keys()
            sorted_keys: list[int] = []

            def sort() -> None:
                # RocksDB order: 2-byte key group, then the key (big-endian; keys here are >= 0)
                sorted_keys[:] = sorted(ks, key=lambda k: (key_group(k), k))
            sort_s = timed(sort)
            record("sort_for_get_many", sort_s)
            return timed(lambda: store.get_many(sorted_keys))

        def m_raw_put_per_key() -> float:
            pairs = [(encode((k,)), dumps(v)) for k, v in kv(fresh_keys())]

            def run() -> None:
                put = cf.put
                for k, v in pairs:
                    put(k, v)
            return timed(run)

        def m_raw_write_batch() -> float:
            pairs = [(encode((k,)), dumps(v)) for k, v in kv(fresh_keys())]

            def run() -> None:
                wb = WriteBatch(raw_mode=True)
                wb.set_default_column_family(handle)
                put = wb.put
                for k, v in pairs:
                    put(k, v)
                cf.write(wb)
            return timed(run)

        def m_raw_get_per_key() -> float:
            raw_keys = [encode((k,)) for k in fresh_keys()]

            def run() -> None:
                get = cf.get
                for k in raw_keys:
                    get(k)
            return timed(run)

        def m_raw_multi_get() -> float:
            raw_keys = [encode((k,)) for k in fresh_keys()]
            return timed(lambda: cf.get(raw_keys))

        def m_raw_multi_get_sorted() -> float:
            # What a store could do inside get_many: sort the encoded keys (bytes order == RocksDB
            # order), multi-get, put the values back in the caller's order. Sort and unsort are timed.
            raw_keys = [encode((k,)) for k in fresh_keys()]

            def run() -> None:
                order = sorted(range(len(raw_keys)), key=raw_keys.__getitem__)
                values = cf.get([raw_keys[i] for i in order])
                out: list[Any] = [None] * len(order)
                for i, v in zip(order, values):
                    out[i] = v
            return timed(run)

        pairs_of_sides: list[tuple[str, Callable[[], float], str, Callable[[], float]]] = [
            ("put_per_key", m_put_per_key, "put_many", m_put_many),
            ("get_per_key", m_get_per_key, "get_many", m_get_many),
            ("raw_put_per_key", m_raw_put_per_key, "raw_write_batch", m_raw_write_batch),
            ("raw_get_per_key", m_raw_get_per_key, "raw_multi_get", m_raw_multi_get),
        ]
        for rep in range(repeat):
            log(f"repetition {rep + 1}/{repeat}")
            flip = rep % 2 == 1
            for a_name, a_fn, b_name, b_fn in pairs_of_sides:
                for name, fn in ((b_name, b_fn), (a_name, a_fn)) if flip else ((a_name, a_fn), (b_name, b_fn)):
                    record(name, fn())
            # the sorted read paths run after the unsorted ones (their own fresh keys)
            record("get_many_sorted", m_get_many_sorted())
            record("raw_multi_get_sorted", m_raw_multi_get_sorted())
            # cache flush vs the same keys and values one by one (alternating which side goes first)
            same_pairs = kv(fresh_keys())
            if flip:
                record("cache_per_key_put_and_flush", m_cache_per_key(same_pairs))
                record("cache_flush", m_cache_flush(same_pairs))
            else:
                record("cache_flush", m_cache_flush(same_pairs))
                record("cache_per_key_put_and_flush", m_cache_per_key(same_pairs))
        store.close()

    med = {name: median(values) for name, values in seconds.items()}
    ms = {name: value * 1e3 for name, value in med.items()}
    best = {name: min(values) * 1e3 for name, values in seconds.items()}
    sorted_incl = [s + t for s, t in zip(seconds["get_many_sorted"], seconds["sort_for_get_many"])]
    ms["get_many_sorted_incl_sort"] = median(sorted_incl) * 1e3
    best["get_many_sorted_incl_sort"] = min(sorted_incl) * 1e3

    # (label, per-key paths, batched paths): ratio = sum(per-key) / sum(batched)
    comparisons = [
        ("flush_put_vs_put_many", "flush: store.put vs put_many", ["put_per_key"], ["put_many"]),
        ("flush_per_key_put_and_flush_vs_cache_flush", "flush: put+store.flush vs cache.flush",
         ["cache_per_key_put_and_flush"], ["cache_flush"]),
        ("load_get_vs_get_many", "load: get vs get_many", ["get_per_key"], ["get_many"]),
        ("load_get_vs_get_many_sorted", "load: get vs get_many(sorted)", ["get_per_key"], ["get_many_sorted"]),
        ("load_get_vs_get_many_sorted_incl_sort", "load: get vs sort+get_many(sorted)", ["get_per_key"],
         ["get_many_sorted_incl_sort"]),
        ("flush_load_together_store", "flush+load: store", ["put_per_key", "get_per_key"], ["put_many", "get_many"]),
        ("flush_load_together_via_cache", "flush+load: via cache.flush",
         ["cache_per_key_put_and_flush", "get_per_key"], ["cache_flush", "get_many"]),
        ("raw_put_vs_write_batch", "raw rocksdict: put vs WriteBatch", ["raw_put_per_key"], ["raw_write_batch"]),
        ("raw_get_vs_multi_get", "raw rocksdict: get vs multi-get", ["raw_get_per_key"], ["raw_multi_get"]),
        ("raw_get_vs_sorted_multi_get", "raw rocksdict: get vs sort+multi-get", ["raw_get_per_key"],
         ["raw_multi_get_sorted"]),
        ("raw_flush_load_together", "raw rocksdict: flush+load", ["raw_put_per_key", "raw_get_per_key"],
         ["raw_write_batch", "raw_multi_get"]),
    ]
    ratios: dict[str, float] = {}
    ratios_best: dict[str, float] = {}
    rows = []
    for key, label, per_key, batched in comparisons:
        a = sum(ms[n] for n in per_key)
        b = sum(ms[n] for n in batched)
        ratios[key] = ratio(a, b)
        ratios_best[key] = ratio(sum(best[n] for n in per_key), sum(best[n] for n in batched))
        rows.append([label, a, b, ratios[key], ratios_best[key]])
    together_ratio = ratios["flush_load_together_store"]

    def us(name_ms: float) -> float:
        return name_ms * 1e3 / batch

    print()
    print_table(
        ["operation", "per-key ms", "batched ms", "per-key/batched", "(best-of ratio)"],
        rows,
        title=f"{batch:,} keys per measurement, median of {repeat} ({n_keys:,}-key store); "
              f"best-of ratio = min per-key / min batched",
    )
    print()
    print_table(
        ["path", "median ms", "us/key", "min ms", "max ms"],
        [[name, ms[name], us(ms[name]), min(seconds[name]) * 1e3, max(seconds[name]) * 1e3]
         for name in ("put_per_key", "put_many", "cache_flush", "cache_flush_sst", "cache_per_key_put_and_flush",
                      "per_key_flush_sst", "get_per_key", "get_many", "get_many_sorted", "sort_for_get_many",
                      "raw_put_per_key", "raw_write_batch", "raw_get_per_key", "raw_multi_get",
                      "raw_multi_get_sorted")],
        title="per path (cache_flush includes cache_flush_sst; cache_per_key_put_and_flush includes per_key_flush_sst)",
    )
    read_paths = {
        "store.get per key": ms["get_per_key"],
        "store.get_many": ms["get_many"],
        "store.get_many sorted (sort excluded)": ms["get_many_sorted"],
        "store.get_many sorted (sort included)": ms["get_many_sorted_incl_sort"],
    }
    fastest = min(read_paths, key=read_paths.get)  # type: ignore[arg-type]
    print()
    print(f"fastest read path: {fastest} ({read_paths[fastest]:.1f} ms for {batch:,} keys); "
          f"get_many unsorted {ms['get_many']:.1f} ms vs sorted {ms['get_many_sorted']:.1f} ms "
          f"(+{ms['sort_for_get_many']:.1f} ms to sort)")
    print(f"faster write path: {'store.put_many' if ms['put_many'] < ms['put_per_key'] else 'store.put per key'}; "
          f"via the cache: {'cache.flush' if ms['cache_flush'] < ms['cache_per_key_put_and_flush'] else 'per-key put'}")
    print(f"python share of the batched store paths: put_many {ms['put_many']:.1f} ms vs raw WriteBatch "
          f"{ms['raw_write_batch']:.1f} ms; get_many {ms['get_many']:.1f} ms vs raw multi-get {ms['raw_multi_get']:.1f} ms")
    targets = [check_target("flush+load per-key/batched (store put/get vs put_many/get_many)", together_ratio,
                            TARGET_TOGETHER, unit="x")]

    results = {
        "median_ms": ms,
        "best_ms": best,
        "seconds_all": seconds,
        "ratios": ratios,
        "ratios_best_of": ratios_best,
        "fastest_read_path": fastest,
        "setup_seconds": setup_s,
    }
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
