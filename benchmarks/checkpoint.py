"""Checkpoints: full snapshot and 1 % delta write speed, restore (also re-sharded) vs one put per key.

Setup: a RocksDBStore (table ``state``, max_parallelism 128) holding ``--size``
int keys (default 1M), each a pickled ``--value-bytes`` random bytes value
(incompressible), bulk-loaded with put_many; change tracking on.
"State MB" below is the sum of raw key + raw value bytes (what RocksDB
holds), the unit of every MB/s.

Measured, ``--repeat`` times each (median):

* full snapshot write (``CheckpointWriter.write`` with no previous version),
  SST-encoded sections (the default) and record-encoded ones;
* delta write after 1 % of the keys changed (``drain_changes`` + ``write``
  on top of the last committed version; each repetition commits one more
  delta, so the chain grows), and its cost as % of the full snapshot's time;
* restore of the last version (snapshot + deltas) into a fresh store at
  parallelism 1 (one instance restores key groups 0..127) and re-sharded to 4
  (four fresh stores, each restores ``key_group_range(i, 4)``, one after the
  other, times summed); the restored content is checked against the source;
* restore of the record-encoded full snapshot (write batches instead of SST
  ingestion);
* restore at parallelism 1 from a copy of the checkpoint on another
  filesystem (``/dev/shm`` when it is one): the SST files cannot be
  hard-linked into the store then and are copied (as from a remote
  location); skipped when no other filesystem is at hand;
* baselines: one ``store.put(key, value)`` per key through the public API
  (key and value decoded first, as a naive restore would) over every key,
  reported as a rate; one raw ``put`` per key
  (rocksdict column family, raw key and value bytes already in memory: the
  cheapest per-key path, through the store's private ``_cf``), also followed
  by ``flush()`` (the durability SST ingestion gives: RocksDB fsyncs every
  ingested file, so the restore pays for writing the state to disk once).

Targets: restore at parallelism 1 >= 10x faster than one put per key (checked
against ``store.put`` and against the raw put); a 1 % delta costs <= 5 % of a
full snapshot. Every measurement starts after an untimed ``os.sync()``.

The checkpoints and the stores live in one temp directory (one filesystem),
so a restore hard-links the checkpoint's SST files into the store (RocksDB
then fsyncs files that are already on disk) unless stated otherwise; the
checkpoint files are in the page cache (just written or read).

    python -m benchmarks.checkpoint [--quick] [--size N] [--repeat N] [--value-bytes N] [--out PATH]
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
import random
import shutil
import sys
import tempfile
from typing import Any, Callable

from checkpoint import CheckpointStorage, CheckpointWriter, commit, restore
from state import RocksDBStore, decode_key, denormalize_key, key_group_range

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
    write_record,
)

NAME = "checkpoint"
MAX_P = 128
LOAD_CHUNK = 10_000
CHANGED_FRACTION = 0.01
PUBLIC_PUT_SAMPLE = 1 << 62  # every key: the per-key baseline is measured in full, not on a sample
TARGET_RESTORE = 10.0
TARGET_DELTA_PCT = 5.0


def _copy_to_other_filesystem(location: str, tmp: str) -> str | None:
    """A copy of the checkpoint ``location`` on a filesystem other than ``tmp``'s (``/dev/shm``), or None."""
    shm = "/dev/shm"
    try:
        if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp).st_dev:
            return None
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(location) for f in fs)
        stat = os.statvfs(shm)
        if stat.f_bavail * stat.f_frsize < 2 * size + (256 << 20):
            return None
        parent = tempfile.mkdtemp(prefix="opbuffer-bench-ckpt-", dir=shm)
    except OSError:
        return None
    atexit.register(shutil.rmtree, parent, True)  # RAM: gone even when the benchmark fails
    copy = os.path.join(parent, "ckpt")
    shutil.copytree(location, copy)
    return copy


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=1_000_000, quick_size=20_000,
                         size_help="keys in the store")
    parser.add_argument("--value-bytes", type=int, default=100, help="random bytes per value (default 100)")
    args = parser.parse_args(argv)
    started = now()
    n_keys = resolve_size(args)
    repeat = resolve_repeat(args, default=3, quick=1)
    rng = random.Random(args.seed)
    value_bytes = args.value_bytes
    n_changed = max(1, int(n_keys * CHANGED_FRACTION))

    params = {
        "keys": n_keys,
        "value": f"pickled {value_bytes} random bytes",
        "value_bytes": value_bytes,
        "max_parallelism": MAX_P,
        "changed_keys_per_delta": n_changed,
        "repeat": repeat,
        "seed": args.seed,
        "statistic": "median over repetitions",
        "quick": args.quick,
    }
    print(f"checkpoint: {n_keys:,} keys x ~{value_bytes} B, delta = {n_changed:,} changed keys, "
          f"{repeat} repetitions (median)", flush=True)
    seconds: dict[str, list[float]] = {}

    def measure(name: str, fn: Callable[[], Any]) -> Any:
        gc.collect()
        os.sync()  # untimed: no measurement pays for the dirty pages of an earlier one
        start = now()
        out = fn()
        seconds.setdefault(name, []).append(now() - start)
        return out

    with temp_dir("opbuffer-bench-checkpoint-") as tmp:
        counter = iter(range(1_000_000))

        def fresh_store() -> RocksDBStore:
            return RocksDBStore(os.path.join(tmp, f"db{next(counter)}"), max_parallelism=MAX_P, table="state")

        def drop(store: RocksDBStore) -> None:
            store.close()
            shutil.rmtree(store.path, ignore_errors=True)

        log("setup: bulk load")
        src = fresh_store()
        for i in range(0, n_keys, LOAD_CHUNK):
            src.put_many([(k, rng.randbytes(value_bytes)) for k in range(i, min(i + LOAD_CHUNK, n_keys))])
        src.flush()
        src.track_changes()
        items = list(src.iter_raw())
        state_bytes = sum(len(k) + len(v) for k, v in items)
        state_mb = state_bytes / 1e6
        tables = {"state": src}
        log(f"setup: {len(items):,} entries, {state_mb:.1f} MB")

        # ---------------------------------------------------------- full snapshots
        file_bytes: dict[str, int] = {}
        for encoding in ("sst", "records"):
            for r in range(repeat):
                location = os.path.join(tmp, f"ckpt-{encoding}-{r}")
                writer = CheckpointWriter(location, key_groups=range(MAX_P), task=0, snapshot_encoding=encoding)
                report = measure(f"full_write_{encoding}", lambda: writer.write(1, tables, None, None))
                file_bytes[encoding] = report.bytes
                if r < repeat - 1:
                    shutil.rmtree(location)
            commit(location, 1, [report])
            log(f"full snapshot ({encoding}): {median(seconds[f'full_write_{encoding}']):.2f} s, "
                f"{report.bytes / 1e6:.1f} MB file")
        sst_location = os.path.join(tmp, f"ckpt-sst-{repeat - 1}")
        records_location = os.path.join(tmp, f"ckpt-records-{repeat - 1}")
        src.drain_changes()

        # ---------------------------------------------------------- deltas (1 % of the keys change)
        storage = CheckpointStorage(sst_location)
        writer = CheckpointWriter(storage, key_groups=range(MAX_P), task=0)
        version = 1
        delta_reports = []
        for r in range(repeat):
            changed = rng.sample(range(n_keys), n_changed)
            src.put_many([(k, rng.randbytes(value_bytes)) for k in changed])
            previous = storage.read_manifest(version)

            def write_delta() -> Any:
                changes = {"state": src.drain_changes()}
                return writer.write(version + 1, tables, changes, previous)

            report = measure("delta_write", write_delta)
            delta_reports.append(report)
            measure("delta_commit", lambda: commit(storage, version + 1, [report]))
            version += 1
        delta_bytes = median([r.bytes for r in delta_reports])
        delta_kinds = [(r.snapshots, r.deltas) for r in delta_reports]
        log(f"delta: {median(seconds['delta_write']) * 1e3:.1f} ms, {delta_bytes / 1e6:.2f} MB, "
            f"(snapshots, deltas) per repetition {delta_kinds}")
        items = list(src.iter_raw())  # the state the last version holds

        # ---------------------------------------------------------- restores
        restore_reports = {}
        other_fs = _copy_to_other_filesystem(sst_location, tmp)
        for r in range(repeat):
            target = fresh_store()
            restore_reports["p1"] = measure(
                "restore_p1", lambda: restore(storage, version, range(MAX_P), {"state": target}))
            if r == 0:
                if list(target.iter_raw()) != items:
                    raise SystemExit("restore at parallelism 1 differs from the source state")
            drop(target)

            targets4 = [fresh_store() for _ in range(4)]

            def restore4() -> None:
                for i, t in enumerate(targets4):
                    restore(storage, version, key_group_range(i, 4, MAX_P), {"state": t})

            measure("restore_p4", restore4)
            if r == 0:
                union = [kv for t in targets4 for kv in t.iter_raw()]
                if union != items:
                    raise SystemExit("restore at parallelism 4 differs from the source state")
            for t in targets4:
                drop(t)

            target = fresh_store()
            restore_reports["records"] = measure(
                "restore_records_p1", lambda: restore(records_location, 1, range(MAX_P), {"state": target}))
            drop(target)

            if other_fs is not None:
                target = fresh_store()
                restore_reports["copied"] = measure(
                    "restore_p1_copied", lambda: restore(other_fs, version, range(MAX_P), {"state": target}))
                if r == 0 and list(target.iter_raw()) != items:
                    raise SystemExit("restore from another filesystem differs from the source state")
                drop(target)

        # ---------------------------------------------------------- baselines: one put per key
        for r in range(repeat):
            target = fresh_store()
            cf_put = target._cf.put

            def per_key_raw() -> None:
                for k, v in items:
                    cf_put(k, v)

            measure("per_key_raw_put", per_key_raw)
            drop(target)
            target = fresh_store()
            cf_put = target._cf.put

            def per_key_raw_flushed() -> None:
                for k, v in items:
                    cf_put(k, v)
                target.flush()

            measure("per_key_raw_put_flush", per_key_raw_flushed)
            drop(target)
        sample = items[: min(len(items), PUBLIC_PUT_SAMPLE)]
        decoded = [(denormalize_key(decode_key(k, 2)), pickle.loads(v)) for k, v in sample]
        sample_bytes = sum(len(k) + len(v) for k, v in sample)
        for r in range(repeat):
            target = fresh_store()

            def per_key_public() -> None:
                put = target.put
                for key, value in decoded:
                    put(key, value)

            measure("per_key_store_put_sample", per_key_public)
            drop(target)
        src.close()
        if other_fs is not None:
            shutil.rmtree(os.path.dirname(other_fs), ignore_errors=True)

    s = {name: median(values) for name, values in seconds.items()}

    def mbps(name: str, mb: float = state_mb) -> float:
        return mb / s[name]

    public_put_mbps = (sample_bytes / 1e6) / s["per_key_store_put_sample"]
    rows = [
        ["full snapshot write (sst)", s["full_write_sst"], mbps("full_write_sst"), file_bytes["sst"] / 1e6],
        ["full snapshot write (records)", s["full_write_records"], mbps("full_write_records"),
         file_bytes["records"] / 1e6],
        ["delta write, 1 % changed", s["delta_write"], mbps("delta_write"), delta_bytes / 1e6],
        ["commit (manifest + retention)", s["delta_commit"], float("nan"), float("nan")],
        ["restore p=1 (sst + deltas)", s["restore_p1"], mbps("restore_p1"), float("nan")],
        ["restore p=4, 4 instances in turn", s["restore_p4"], mbps("restore_p4"), float("nan")],
        ["restore p=1 (records, write batches)", s["restore_records_p1"], mbps("restore_records_p1"), float("nan")],
        *([["restore p=1, SST files copied (other filesystem)", s["restore_p1_copied"], mbps("restore_p1_copied"),
            float("nan")]] if "restore_p1_copied" in s else []),
        ["one raw cf.put per key", s["per_key_raw_put"], mbps("per_key_raw_put"), float("nan")],
        ["one raw cf.put per key + flush() to SST", s["per_key_raw_put_flush"], mbps("per_key_raw_put_flush"),
         float("nan")],
        [f"one store.put per key ({len(sample):,} keys)", s["per_key_store_put_sample"], public_put_mbps,
         float("nan")],
    ]
    print()
    print_table(["operation", "seconds", "state MB/s", "file MB"], rows,
                title=f"{n_keys:,} keys, {state_mb:.1f} MB of state; median of {repeat}")
    ratios = {
        "restore_p1_vs_raw_put": ratio(s["per_key_raw_put"], s["restore_p1"]),
        "restore_p1_vs_raw_put_flush": ratio(s["per_key_raw_put_flush"], s["restore_p1"]),
        "restore_p4_vs_raw_put": ratio(s["per_key_raw_put"], s["restore_p4"]),
        "restore_records_vs_raw_put": ratio(s["per_key_raw_put"], s["restore_records_p1"]),
        "restore_p1_copied_vs_raw_put": (ratio(s["per_key_raw_put"], s["restore_p1_copied"])
                                         if "restore_p1_copied" in s else float("nan")),
        "restore_p1_vs_store_put": ratio(mbps("restore_p1"), public_put_mbps),
        "sst_restore_vs_records_restore": ratio(s["restore_records_p1"], s["restore_p1"]),
        "delta_pct_of_full": 100.0 * ratio(s["delta_write"], s["full_write_sst"]),
        "delta_bytes_pct_of_full": 100.0 * ratio(delta_bytes, file_bytes["sst"]),
        "full_write_records_vs_sst": ratio(s["full_write_sst"], s["full_write_records"]),
    }
    print()
    print_table(["ratio", "value"], [
        ["restore p=1 speed-up over one raw put per key", ratios["restore_p1_vs_raw_put"]],
        ["restore p=1 speed-up over one raw put per key + flush", ratios["restore_p1_vs_raw_put_flush"]],
        ["restore p=4 speed-up over one raw put per key", ratios["restore_p4_vs_raw_put"]],
        ["restore p=1, SST files copied, speed-up over one raw put per key", ratios["restore_p1_copied_vs_raw_put"]],
        ["restore p=1 speed-up over one store.put per key", ratios["restore_p1_vs_store_put"]],
        ["records restore speed-up over one raw put per key", ratios["restore_records_vs_raw_put"]],
        ["SST ingestion speed-up over write batches (restore)", ratios["sst_restore_vs_records_restore"]],
        ["delta write time, % of full snapshot", ratios["delta_pct_of_full"]],
        ["delta bytes, % of full snapshot", ratios["delta_bytes_pct_of_full"]],
        ["full write: sst time / records time", ratios["full_write_records_vs_sst"]],
    ], title="ratios (same run)")
    targets = [
        check_target("restore p=1 vs one store.put per key", ratios["restore_p1_vs_store_put"], TARGET_RESTORE,
                     unit="x"),
        check_target("restore p=1 vs one raw cf.put per key", ratios["restore_p1_vs_raw_put"], TARGET_RESTORE,
                     unit="x"),
        check_target("1 % delta cost, % of a full snapshot", ratios["delta_pct_of_full"], TARGET_DELTA_PCT,
                     at_most=True, unit="%"),
    ]
    results = {
        "median_seconds": s,
        "seconds_all": seconds,
        "state_bytes": state_bytes,
        "file_bytes": file_bytes,
        "delta_bytes": delta_bytes,
        "mb_per_s": {name: mbps(name) for name in s if name not in ("delta_commit", "per_key_store_put_sample")},
        "store_put_sample_mb_per_s": public_put_mbps,
        "ratios": ratios,
        "restore_reports": {k: {"sections": v.sections, "sst_files": v.sst_files, "records": v.records,
                                "bytes": v.bytes} for k, v in restore_reports.items()},
    }
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
