"""Is ``max_bytes`` a bound on memory? RSS growth of a process pushing millions of distinct keys through a cache.

Each configuration runs in a fresh Python process (so one run's heap does
not hide another's): a ``WriteBackCache(max_bytes=M)`` over a RocksDBStore
(``block_cache_bytes=--store-memory``: a block cache of that size, memtables
capped at half of it; index and filter blocks outside), then N puts of distinct keys; every
evicted entry is written to RocksDB. The process's resident set size (RSS)
is read before the first put and every 20k puts; the table shows the peak
growth divided by M. Value kinds: small ints, tuples (int, 12-char str,
float), 10 KB random blobs (N/50 of them: N x 10 KB would not fit the disk).
The manager row: one ``CacheManager(M)`` over 4 LRU caches, one per table
of one store (as an operator instance's tables), keys spread over the 4.
The key_group row: a ``KeyGroupCache(max_bytes=M)`` (``cached_state(layout="key_group")``)
taking the keys in batches of 4096 (of 256 blobs; evictions write whole key groups). Every batch
touches every key group of a state several times the bound, the layout's worst case: it is slow
there (each batch reloads and writes back whole key groups), and the row checks its memory.
The store row is the floor: no cache, RocksDB alone takes the same keys in
write batches of 256 (as evictions write them); the last column subtracts
it, leaving what the cache itself adds.

Target: peak RSS growth <= 2.0 x max_bytes everywhere. The growth includes
RocksDB's memory, and the cache's own bookkeeping, which a byte bound has to
count (see state/cache/estimator.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._common import check_target, log, make_parser, print_table, resolve_size, write_record

NAME = "memory_bound"
RSS_EVERY = 20_000
KEY_GROUP_BATCH = 4096
BLOB_BYTES = 10 * 1024


def _value_maker(kind: str, seed: int) -> Any:
    rng = random.Random(seed)
    if kind == "int":
        return lambda i: i % 1000
    if kind == "tuple":
        return lambda i: (i, f"name-{i % 100000:07d}", i * 0.5)
    if kind == "blob":
        return lambda i: rng.randbytes(BLOB_BYTES)
    raise ValueError(f"unknown value kind {kind!r}")


def child(config: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this (fresh) process: returns the RSS growth and the cache's view of itself."""
    import gc

    from state import CacheManager, RocksDBStore, WriteBackCache
    from state.cache import current_rss_bytes

    max_bytes = int(config["max_bytes"])
    keys = int(config["keys"])
    make = _value_maker(config["kind"], config["seed"])
    with tempfile.TemporaryDirectory(prefix="opbuffer-membound-") as tmp:
        store = RocksDBStore(os.path.join(tmp, "db"), block_cache_bytes=int(config["store_memory"]))
        manager = None
        if config["policy"] == "store":  # no cache: the same keys written as evictions write them
            return _store_only(store, keys, make)
        if config["policy"] == "key_group":
            return _key_groups(store, keys, make, max_bytes, 256 if config["kind"] == "blob" else KEY_GROUP_BATCH)
        if config["policy"] == "manager":
            manager = CacheManager(max_bytes, memory_limit=64 << 30)  # no shrinking on pressure: the bound alone
            caches = [WriteBackCache(store.table(f"t{i}"), policy="lru", manager=manager, name=f"t{i}") for i in range(4)]
        else:
            caches = [WriteBackCache(store, max_bytes=max_bytes, policy=config["policy"])]
        gc.collect()
        base = peak = current_rss_bytes()
        started = time.perf_counter()
        n_caches = len(caches)
        for i in range(keys):
            caches[i % n_caches].put(i, make(i))
            if i % RSS_EVERY == 0:
                peak = max(peak, current_rss_bytes())
        peak = max(peak, current_rss_bytes())
        seconds = time.perf_counter() - started
        stats = [c.stats() for c in caches]
        result = {
            "peak_growth_bytes": peak - base,
            "end_growth_bytes": current_rss_bytes() - base,
            "base_rss_bytes": base,
            "seconds": seconds,
            "entries": sum(s["entries"] for s in stats),
            "estimated_bytes": sum(s["estimated_bytes"] for s in stats),
            "entry_bytes": stats[0]["entry_bytes"],
            "evictions": sum(s["evictions"] for s in stats),
        }
        for c in caches:
            c.close()
        if manager is not None:
            manager.close()
        store.close()
    return result


def _store_only(store: Any, keys: int, make: Any) -> dict[str, Any]:
    """The floor under every row: RocksDB alone takes the same keys, in write batches of 256."""
    import gc

    from state.cache import current_rss_bytes
    from state.cache.malloc import pin_mmap_threshold

    pin_mmap_threshold()  # as a bounded cache does, so the rows compare alike
    gc.collect()
    base = peak = current_rss_bytes()
    started = time.perf_counter()
    for start in range(0, keys, 256):
        store.put_many((i, make(i)) for i in range(start, min(keys, start + 256)))
        if start % RSS_EVERY < 256:
            peak = max(peak, current_rss_bytes())
    peak = max(peak, current_rss_bytes())
    seconds = time.perf_counter() - started
    store.close()
    return {"peak_growth_bytes": peak - base, "end_growth_bytes": current_rss_bytes() - base, "base_rss_bytes": base,
            "seconds": seconds, "entries": 0, "estimated_bytes": 0, "entry_bytes": 0, "evictions": 0}


def _key_groups(store: Any, keys: int, make: Any, max_bytes: int, batch: int) -> dict[str, Any]:
    """A KeyGroupCache(max_bytes=M) (cached_state(layout="key_group")) takes the keys in batches (as an
    aggregate's merges write them; one key at a time costs it a call per key): KEY_GROUP_BATCH keys, 256
    of the 10 KB blobs (the 2.5 MB a batch of the store row holds, not 40 MB of the caller's values)."""
    import gc

    from state.blocks import KeyGroupCache
    from state.cache import current_rss_bytes

    cache = KeyGroupCache(store, max_bytes=max_bytes)
    gc.collect()
    base = peak = current_rss_bytes()
    started = time.perf_counter()
    for start in range(0, keys, batch):
        cache.put_many((i, make(i)) for i in range(start, min(keys, start + batch)))
        if start % RSS_EVERY < batch:
            peak = max(peak, current_rss_bytes())
    peak = max(peak, current_rss_bytes())
    seconds = time.perf_counter() - started
    stats = cache.stats()
    cache.close()
    return {"peak_growth_bytes": peak - base, "end_growth_bytes": current_rss_bytes() - base, "base_rss_bytes": base,
            "seconds": seconds, "entries": stats["entries"], "estimated_bytes": stats["estimated_bytes"],
            "entry_bytes": 0, "evictions": stats["evictions"]}


def run_config(config: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory_bound", "--child", json.dumps(config)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"configuration {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__ or NAME, default_size=5_000_000, quick_size=1_000_000,
                         size_help="distinct keys per configuration (blob rows: 1/50 of it)")
    parser.add_argument("--max-bytes", type=int, default=50 << 20, help="the cache's byte bound (default 50 MB)")
    parser.add_argument("--store-memory", type=int, default=16 << 20,
                        help="RocksDB's own memory cap, block_cache_bytes (default 16 MB)")
    parser.add_argument("--policies", default="store,lru,clock,lfu,manager,key_group",
                        help="'store' is the floor: RocksDB alone, no cache, the same keys")
    parser.add_argument("--kinds", default="int,tuple,blob")
    parser.add_argument("--child", default=None, help=argparse_suppress())
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    started = time.perf_counter()
    size = resolve_size(args)
    rows, results, targets = [], {}, []
    for policy in args.policies.split(","):
        for kind in args.kinds.split(","):
            keys = size // 50 if kind == "blob" else size
            config = {"policy": policy, "kind": kind, "keys": keys, "max_bytes": args.max_bytes,
                      "store_memory": args.store_memory, "seed": args.seed}
            log(f"{policy} / {kind}: {keys:,} keys ...")
            r = run_config(config)
            ratio = r["peak_growth_bytes"] / args.max_bytes
            log(f"  {policy} / {kind}: peak RSS growth {r['peak_growth_bytes'] / 2**20:.1f} MB = {ratio:.2f} x max_bytes")
            results[f"{policy}/{kind}"] = dict(r, keys=keys, ratio=ratio)
            floor = results.get(f"store/{kind}")
            share = "" if floor is None or policy == "store" else \
                f"{(r['peak_growth_bytes'] - floor['peak_growth_bytes']) / args.max_bytes:.2f}"
            if floor is not None and policy != "store":
                results[f"{policy}/{kind}"]["cache_share"] = float(share)
            rows.append([policy, kind, f"{keys:,}", f"{r['peak_growth_bytes'] / 2**20:.1f}",
                         f"{r['end_growth_bytes'] / 2**20:.1f}", f"{r['estimated_bytes'] / 2**20:.1f}",
                         f"{r['entries']:,}", f"{r['seconds']:.1f}", f"{ratio:.2f}", share])
    print_table(["policy", "values", "keys", "peak RSS growth MB", "end growth MB", "cache estimate MB",
                 "entries", "seconds", "growth / max_bytes", "minus store-only / max_bytes"], rows,
                title=f"{NAME}: max_bytes {args.max_bytes / 2**20:.0f} MB, RocksDB capped at "
                      f"{args.store_memory / 2**20:.0f} MB, each row a fresh process")
    for label, r in results.items():
        if not label.startswith("store/"):
            targets.append(check_target(f"RSS growth / max_bytes, {label}", r["ratio"], 2.0, at_most=True))
    write_record(NAME, params={"size": size, "max_bytes": args.max_bytes, "store_memory": args.store_memory,
                               "policies": args.policies, "kinds": args.kinds},
                 results=results, targets=targets, out=args.out, started=started)
    return results


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
