"""The LRU-cache benchmark of the state-cache seed (Flink FLIP-325), on opbuffer's stores.

Records x in [0, N); key = (x % 500) + 500 * ((x // 1000) % 2); per record:
get the count, add 1, put it back. With an LRU cache of 250 / 500 / 1000
entries the hit rate is 0 / 50 / 100 %. Each configuration runs in the same
process, alternating, best of ``--repeat``; the table shows
WriteBackCache(RocksDBStore) / RocksDBStore and / MemoryStore.

Diagnostic column ``ideal/rocksdb``: the least work any write-back LRU cache of
that size must do, timed on the same RocksDBStore. The hit/miss/eviction
schedule of an LRU of that size is computed beforehand (untimed); the timed
loop then does only what the schedule forces: a plain ``dict`` read on a hit,
``store.get`` on a miss, and the evicted (dirty) values written with
``store.put_many`` in batches of ``IDEAL_WRITE_BATCH``. No recency, dirty or
size bookkeeping is timed, so no real cache can beat it: a target above this
ceiling cannot be met by any cache over this store. Its final counts are
checked against the exact ones.

Diagnostic line ``API floor``: the same loop over ``MinimalDictCache``, the
least a cache behind ``get``/``put`` methods can cost in CPython at 100 % hits
(a dict of live values and a dict of dirty ones; no recency, no bound, no
backend). Its rate over RocksDBStore's bounds the 100 % ratio of any such cache.

    python -m benchmarks.state_cache [--size N] [--repeat R] [--policy lru] [--quick] [--out PATH]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import Counter, OrderedDict
from typing import Any, Callable

from state import MemoryStore, RocksDBStore, Store, WriteBackCache

from ._common import check_target, make_parser, now, print_table, resolve_repeat, resolve_size, temp_dir, write_record

NAME = "state_cache"
SEED_RATIOS = {250: 0.956, 500: 1.87, 1000: 21.6}
TARGETS = {250: 1.0, 500: 2.5, 1000: 25.0}
TARGET_VS_MEMORY = 0.8
#: Evicted values per put_many of the ideal cache. At most half the smallest cache (250), so an
#: evicted key, re-read no sooner than cache-size records later, is written before it is read.
IDEAL_WRITE_BATCH = 125


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


class MinimalDictCache:
    """The cheapest get/put cache there is: live values and dirty values in two dicts (see the module doc)."""

    def __init__(self) -> None:
        self._live: dict[Any, Any] = {}
        self._dirty: dict[Any, Any] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self._live[key]
        except KeyError:
            return default

    def put(self, key: Any, value: Any) -> None:
        self._live[key] = value
        self._dirty[key] = value


def lru_schedule(keys: list[int], capacity: int) -> list[tuple[int, bool, int | None]]:
    """Per record ``(key, hit, evicted key or None)`` of an LRU cache of ``capacity`` entries (untimed)."""
    resident: OrderedDict[int, None] = OrderedDict()
    schedule: list[tuple[int, bool, int | None]] = []
    for key in keys:
        if key in resident:
            resident.move_to_end(key)
            schedule.append((key, True, None))
            continue
        resident[key] = None
        evicted = resident.popitem(last=False)[0] if len(resident) > capacity else None
        schedule.append((key, False, evicted))
    return schedule


def ideal_cache(store: RocksDBStore, schedule: list[tuple[int, bool, int | None]]) -> tuple[float, dict[int, int]]:
    """Run the schedule's forced work only (see the module doc); return records per second and final counts."""
    get = store.get
    put_many = store.put_many
    live: dict[int, int] = {}
    evicted_values: list[tuple[int, int]] = []
    add = evicted_values.append
    start = time.perf_counter()
    for key, hit, evicted in schedule:
        if hit:
            live[key] += 1
        else:
            value = get(key)
            live[key] = 1 if value is None else value + 1
            if evicted is not None:
                add((evicted, live.pop(evicted)))
                if len(evicted_values) >= IDEAL_WRITE_BATCH:
                    put_many(evicted_values)
                    evicted_values.clear()
    rate = len(schedule) / (time.perf_counter() - start)
    put_many(evicted_values)
    put_many(live.items())
    return rate, {key[0]: value for key, value in store.items()}


def _fresh_rocksdb(root: str, label: str) -> RocksDBStore:
    path = os.path.join(root, label)
    shutil.rmtree(path, ignore_errors=True)
    return RocksDBStore(path)


def measure(size: int, repeat: int, policy: str) -> dict[str, Any]:
    keys = seed_keys(size)
    results: dict[str, list[float]] = {}
    schedules = {entries: lru_schedule(keys, entries) for entries in (250, 500, 1000)}
    expected = dict(Counter(keys))

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
            minimal = MinimalDictCache()
            count_per_key(minimal, keys[:1000])  # every key present: the measured pass is all hits
            results.setdefault("api_floor", []).append(count_per_key(minimal, keys))  # type: ignore[arg-type]
            for entries, schedule in schedules.items():
                store = _fresh_rocksdb(root, f"ideal{entries}")
                try:
                    rate, counts = ideal_cache(store, schedule)
                finally:
                    store.close()
                if counts != expected:
                    raise AssertionError(f"the ideal cache of {entries} entries counted wrong")
                results.setdefault(f"ideal{entries}", []).append(rate)
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
        ideal = rates[f"ideal{entries}"] / rates["rocksdb"]
        ratios[str(entries)] = {"vs_rocksdb": vs_rocks, "vs_memory": vs_memory, "ideal_vs_rocksdb": ideal}
        rows.append(
            (f"{entries} ({hit_label})", data["hit_ratio"][label], rates[label], vs_rocks, SEED_RATIOS[entries],
             vs_memory, ideal, TARGETS[entries])
        )
    print_table(
        ("cache size", "hit ratio", "records/s", "cache/rocksdb", "seed", "cache/memory", "ideal/rocksdb", "target"), rows
    )
    api_floor = rates["api_floor"] / rates["rocksdb"]
    ratios["api_floor_vs_rocksdb"] = api_floor
    print(f"  API floor (two dicts behind get/put, all hits): {rates['api_floor']:,.0f} records/s = "
          f"{api_floor:.2f}x RocksDBStore (the 100% target is {TARGETS[1000]:g}x)")
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
