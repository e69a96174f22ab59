"""The LRU-cache benchmark of the state-cache seed (Flink FLIP-325), on opbuffer's stores.

Records x in [0, N); key = (x % 500) + 500 * ((x // 1000) % 2); per record:
get the count, add 1, put it back. With an LRU cache of 250 / 500 / 1000
entries the hit rate is 0 / 50 / 100 %. Each configuration runs in the same
process, alternating, best of ``--repeat``; the table shows
WriteBackCache(RocksDBStore) / RocksDBStore and / MemoryStore.

    python -m benchmarks.state_cache [--size N] [--repeat R] [--policy lru]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from state import MemoryStore, RocksDBStore, Store, WriteBackCache

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
    root = tempfile.mkdtemp(prefix="opbuffer-bench-")
    results: dict[str, list[float]] = {}

    def run(label: str, make: Callable[[], Store]) -> None:
        store = make()
        try:
            rate = count_per_key(store, keys)
            if isinstance(store, WriteBackCache):
                stats = store.stats()
                results.setdefault(label + ":hit_ratio", []).append(stats["hit_ratio"])
            store.flush()
        finally:
            store.close()
        results.setdefault(label, []).append(rate)

    try:
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
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = {label: max(rates) for label, rates in results.items() if ":" not in label}
    hit = {label.split(":")[0]: rates[-1] for label, rates in results.items() if label.endswith(":hit_ratio")}
    return {"records_per_s": best, "hit_ratio": hit, "all_runs": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="records per run (default 1M)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best counts")
    parser.add_argument("--policy", default="lru", help="cache policy (lru, clock, lfu)")
    parser.add_argument("--quick", action="store_true", help="small size for a smoke run")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "state_cache.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.repeat = 30_000, 1
    if args.size < 2000:
        parser.error(f"--size must be >= 2000 for the hit-rate pattern, got {args.size}")

    print(f"state_cache: {args.size:,} records, policy={args.policy}, best of {args.repeat}", flush=True)
    data = measure(args.size, args.repeat, args.policy)
    rates = data["records_per_s"]
    rows = []
    ok = True
    for entries, hit_label in ((250, "0%"), (500, "50%"), (1000, "100%")):
        label = f"cache{entries}"
        vs_rocks = rates[label] / rates["rocksdb"]
        vs_memory = rates[label] / rates["memory"]
        target = TARGETS[entries]
        passed = vs_rocks >= target and (entries != 1000 or vs_memory >= TARGET_VS_MEMORY)
        ok &= passed
        rows.append(
            (
                f"{entries} ({hit_label})",
                f"{data['hit_ratio'][label]:.3f}",
                f"{rates[label]:,.0f}",
                f"{vs_rocks:.2f}x",
                f"{SEED_RATIOS[entries]}x",
                f">= {target}x" + (f", mem >= {TARGET_VS_MEMORY}x" if entries == 1000 else ""),
                f"{vs_memory:.2f}x",
                "PASS" if passed else "FAIL",
            )
        )
    header = ("cache size", "hit ratio", "records/s", "cache/rocksdb", "seed", "target", "cache/memory", "")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"  MemoryStore  {rates['memory']:>12,.0f} records/s")
    print(f"  RocksDBStore {rates['rocksdb']:>12,.0f} records/s")
    for row in [header] + rows:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    print("all targets met" if ok else "some targets missed")

    record = {
        "benchmark": "state_cache",
        "parameters": {"size": args.size, "repeat": args.repeat, "policy": args.policy},
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
        "results": data,
        "ratios": {
            str(e): {
                "vs_rocksdb": rates[f"cache{e}"] / rates["rocksdb"],
                "vs_memory": rates[f"cache{e}"] / rates["memory"],
            }
            for e in (250, 500, 1000)
        },
        "targets_met": ok,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
