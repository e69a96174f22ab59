"""The LRU-cache benchmark of the state-cache seed (Flink FLIP-325), on opbuffer's stores.

Records x in [0, N); key = (x % 500) + 500 * ((x // 1000) % 2); per record:
get the count, add 1, put it back. With an LRU cache of 250 / 500 / 1000
entries the hit rate is 0 / 50 / 100 %. Each configuration runs in the same
process, alternating, best of ``--repeat``; the table shows
WriteBackCache(RocksDBStore) / RocksDBStore and / MemoryStore.

    python -m benchmarks.state_cache [--size N] [--repeat R] [--policy lru] [--quick] [--out PATH]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any, Callable

from state import MemoryStore, RocksDBStore, Store, WriteBackCache

from ._common import check_target, make_parser, now, print_table, resolve_repeat, resolve_size, temp_dir, write_record

NAME = "state_cache"
SEED_RATIOS = {250: 0.956, 500: 1.87, 1000: 21.6}
TARGETS = {250: 1.0, 500: 2.5, 1000: 25.0}
TARGET_VS_MEMORY = 0.8


def seed_keys(n: int) -> list[int]:
    return [(x % 500) + 500 * ((x // 1000) % 2) for x in range(n)]


def count_per_key(store: Store, keys: list[int]) -> float:
    """Run the seed's count aggregation; return records per second."""
    get = store.get
    put = store.put
    start = time.perf_counter()
    for key in keys:
        value = get(key)
        if value is None:
            value = 0
        put(key, value + 1)
    return len(keys) / (time.perf_counter() - start)


def _fresh_rocksdb(root: str, label: str) -> RocksDBStore:
    path = os.path.join(root, label)
    shutil.rmtree(path, ignore_errors=True)
    return RocksDBStore(path)


def measure(size: int, repeat: int, policy: str) -> dict[str, Any]:
    keys = seed_keys(size)
    results: dict[str, list[float]] = {}

    with temp_dir("opbuffer-bench-") as root:

        def run(label: str, make: Callable[[], Store]) -> None:
            store = make()
            try:
                rate = count_per_key(store, keys)
                if isinstance(store, WriteBackCache):
                    results.setdefault(label + ":hit_ratio", []).append(store.stats()["hit_ratio"])
                store.flush()
            finally:
                store.close()
            results.setdefault(label, []).append(rate)

        for _ in range(repeat):  # alternate configurations so drift hits all alike
            run("memory", MemoryStore)
            run("rocksdb", lambda: _fresh_rocksdb(root, "rocksdb"))
            for entries in (250, 500, 1000):
                run(
                    f"cache{entries}",
                    lambda entries=entries: WriteBackCache(
                        _fresh_rocksdb(root, f"cache{entries}"), max_entries=entries, policy=policy
                    ),
                )
    best = {label: max(rates) for label, rates in results.items() if ":" not in label}
    hit = {label.split(":")[0]: rates[-1] for label, rates in results.items() if label.endswith(":hit_ratio")}
    return {"records_per_s": best, "hit_ratio": hit, "all_runs": results}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__ or NAME, default_size=1_000_000, quick_size=30_000, size_help="records per run")
    parser.add_argument("--policy", default="lru", help="cache policy (lru, clock, lfu)")
    args = parser.parse_args(argv)
    size = resolve_size(args)
    repeat = resolve_repeat(args, default=3, quick=1)
    if size < 2000:
        parser.error(f"--size must be >= 2000 for the hit-rate pattern, got {size}")
    started = now()

    print(f"state_cache: {size:,} records, policy={args.policy}, best of {repeat}", flush=True)
    data = measure(size, repeat, args.policy)
    rates = data["records_per_s"]
    print(f"  MemoryStore  {rates['memory']:>12,.0f} records/s")
    print(f"  RocksDBStore {rates['rocksdb']:>12,.0f} records/s")
    rows = []
    targets = []
    ratios = {}
    for entries, hit_label in ((250, "0%"), (500, "50%"), (1000, "100%")):
        label = f"cache{entries}"
        vs_rocks = rates[label] / rates["rocksdb"]
        vs_memory = rates[label] / rates["memory"]
        ratios[str(entries)] = {"vs_rocksdb": vs_rocks, "vs_memory": vs_memory}
        rows.append(
            (f"{entries} ({hit_label})", data["hit_ratio"][label], rates[label], vs_rocks, SEED_RATIOS[entries], vs_memory)
        )
    print_table(("cache size", "hit ratio", "records/s", "cache/rocksdb", "seed", "cache/memory"), rows)
    for entries, hit_label in ((250, "0%"), (500, "50%"), (1000, "100%")):
        targets.append(check_target(f"cache/rocksdb at {hit_label} hits", ratios[str(entries)]["vs_rocksdb"], TARGETS[entries]))
    targets.append(check_target("cache/memory at 100% hits", ratios["1000"]["vs_memory"], TARGET_VS_MEMORY))
    write_record(
        NAME,
        params={"size": size, "repeat": repeat, "policy": args.policy},
        results={**data, "ratios": ratios},
        targets=targets,
        out=args.out,
        started=started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
