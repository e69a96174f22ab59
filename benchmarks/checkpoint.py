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
* with ``--s3``: restore at parallelism 1 from a copy of the checkpoint on an
  S3 API server (moto's server mode on 127.0.0.1, started and stopped by the
  benchmark, reached through s3fs), measured right after the local restore of
  the same repetition; the ratio S3 / local is of the same run. Loopback
  latency is well under a millisecond per request; real S3 answers in
  10-50 ms, so this is a floor of what the requests cost. Needs ``s3fs`` and
  ``moto[server]`` (the ``test`` extra); with ``--only-restore`` only the
  SST snapshot, the deltas and the p=1 restores (local, copied, S3) run, no
  baseline (1M keys in well under a minute);
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
                                    [--s3] [--only-restore]
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


class _S3Copy:
    """A copy of a local checkpoint on a moto S3 server on 127.0.0.1 (started here, stopped by ``close``)."""

    def __init__(self, location: str, latency_ms: float = 0.0) -> None:
        try:
            import s3fs

            from tests.s3_server import start_s3_server  # run from the repository root, as every benchmark
        except ImportError as exc:
            raise SystemExit(f"--s3 needs s3fs and moto[server] (pip install -e '.[test]'): {exc}") from exc
        self.server = start_s3_server(bucket="opbuffer-bench")
        atexit.register(self.server.stop)  # stopped by its pid even when the benchmark fails
        self.storage_options = self.server.storage_options
        fs = s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True)
        self.url = f"s3://{self.server.bucket}/ckpt"
        start = now()
        for directory, _, names in os.walk(location):
            for name in names:
                local = os.path.join(directory, name)
                rel = os.path.relpath(local, location).replace(os.sep, "/")
                fs.put_file(local, f"{self.server.bucket}/ckpt/{rel}")
        self.upload_seconds = now() - start
        self.storage = CheckpointStorage(self.url, storage_options=self.storage_options, create=False)
        self.latency_s = latency_ms / 1000
        self.requests: dict[str, int] = {}
        # Count every request the restores send (and delay it, with --s3-latency-ms), through botocore's
        # event hooks on the client of the storage's own s3fs filesystem.
        s3 = self.storage._fs.fs  # type: ignore[attr-defined]  # the s3fs filesystem behind the location
        s3.ls(self.server.bucket)  # connects: s3.s3 is the client from here on
        s3.s3.meta.events.register("before-call.s3", self._before_call)

    async def _before_call(self, event_name: str, **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        self.requests[op] = self.requests.get(op, 0) + 1
        if self.latency_s:
            import asyncio

            await asyncio.sleep(self.latency_s)  # on the event loop: concurrent requests wait together

    def close(self) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=1_000_000, quick_size=20_000,
                         size_help="keys in the store")
    parser.add_argument("--value-bytes", type=int, default=100, help="random bytes per value (default 100)")
    parser.add_argument("--s3", action="store_true",
                        help="also restore from a copy of the checkpoint on a moto S3 server on 127.0.0.1 (via s3fs)")
    parser.add_argument("--s3-latency-ms", type=float, default=0.0,
                        help="with --s3: delay every request by this many ms (real S3 answers in 10-50 ms)")
    parser.add_argument("--only-restore", action="store_true",
                        help="skip the record-encoded snapshot, the re-sharded restore and the per-key baselines")
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
        "s3": "moto server on 127.0.0.1 via s3fs" if args.s3 else None,
        "s3_latency_ms": args.s3_latency_ms if args.s3 else None,
        "only_restore": args.only_restore,
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
        for encoding in ("sst",) if args.only_restore else ("sst", "records"):
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
        s3 = None
        s3_requests: dict[str, int] = {}
        if args.s3:
            log("setup: copying the checkpoint to the S3 server")
            s3 = _S3Copy(sst_location, args.s3_latency_ms)
            log(f"setup: uploaded in {s3.upload_seconds:.1f} s")
        for r in range(repeat):
            target = fresh_store()
            restore_reports["p1"] = measure(
                "restore_p1", lambda: restore(storage, version, range(MAX_P), {"state": target}))
            if r == 0:
                if list(target.iter_raw()) != items:
                    raise SystemExit("restore at parallelism 1 differs from the source state")
            drop(target)

            if s3 is not None:  # right after the local restore: the same repetition, the same machine state
                target = fresh_store()
                s3.requests.clear()
                restore_reports["s3"] = measure(
                    "restore_p1_s3", lambda: restore(s3.storage, version, range(MAX_P), {"state": target}))
                s3_requests = dict(s3.requests)
                if r == 0 and list(target.iter_raw()) != items:
                    raise SystemExit("restore from the S3 server differs from the source state")
                drop(target)
                log(f"restore p=1: local {seconds['restore_p1'][-1]:.2f} s, S3 {seconds['restore_p1_s3'][-1]:.2f} s "
                    f"(requests: {s3_requests})")

            if other_fs is not None:
                target = fresh_store()
                restore_reports["copied"] = measure(
                    "restore_p1_copied", lambda: restore(other_fs, version, range(MAX_P), {"state": target}))
                if r == 0 and list(target.iter_raw()) != items:
                    raise SystemExit("restore from another filesystem differs from the source state")
                drop(target)

            if args.only_restore:
                continue

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


        if s3 is not None:
            s3.close()
        # ---------------------------------------------------------- baselines: one put per key
        for r in range(0 if args.only_restore else repeat):
            target = fresh_store()
            cf_put = target._create().put  # the column family itself (a table is created at its first write)

            def per_key_raw() -> None:
                for k, v in items:
                    cf_put(k, v)

            measure("per_key_raw_put", per_key_raw)
            drop(target)
            target = fresh_store()
            cf_put = target._create().put  # the column family itself (a table is created at its first write)

            def per_key_raw_flushed() -> None:
                for k, v in items:
                    cf_put(k, v)
                target.flush()

            measure("per_key_raw_put_flush", per_key_raw_flushed)
            drop(target)
        sample = items[: min(len(items), PUBLIC_PUT_SAMPLE)]
        decoded = [(denormalize_key(decode_key(k, 2)), pickle.loads(v)) for k, v in sample]
        sample_bytes = sum(len(k) + len(v) for k, v in sample)
        for r in range(0 if args.only_restore else repeat):
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
    nan = float("nan")

    def mbps(name: str, mb: float = state_mb) -> float:
        return mb / s[name] if name in s else nan

    def sec(name: str) -> float:
        return s.get(name, nan)

    public_put_mbps = (sample_bytes / 1e6) / s["per_key_store_put_sample"] if "per_key_store_put_sample" in s else nan
    rows = [
        ["full snapshot write (sst)", sec("full_write_sst"), mbps("full_write_sst"), file_bytes["sst"] / 1e6],
        ["full snapshot write (records)", sec("full_write_records"), mbps("full_write_records"),
         file_bytes.get("records", nan) / 1e6],
        ["delta write, 1 % changed", sec("delta_write"), mbps("delta_write"), delta_bytes / 1e6],
        ["commit (manifest + retention)", sec("delta_commit"), nan, nan],
        ["restore p=1 (sst + deltas)", sec("restore_p1"), mbps("restore_p1"), nan],
        ["restore p=1 from the S3 server (sst + deltas)", sec("restore_p1_s3"), mbps("restore_p1_s3"), nan],
        ["restore p=4, 4 instances in turn", sec("restore_p4"), mbps("restore_p4"), nan],
        ["restore p=1 (records, write batches)", sec("restore_records_p1"), mbps("restore_records_p1"), nan],
        ["restore p=1, SST files copied (other filesystem)", sec("restore_p1_copied"), mbps("restore_p1_copied"), nan],
        ["one raw cf.put per key", sec("per_key_raw_put"), mbps("per_key_raw_put"), nan],
        ["one raw cf.put per key + flush() to SST", sec("per_key_raw_put_flush"), mbps("per_key_raw_put_flush"), nan],
        [f"one store.put per key ({len(sample):,} keys)", sec("per_key_store_put_sample"), public_put_mbps, nan],
    ]
    rows = [row for row in rows if row[1] == row[1]]  # drop what this run did not measure (NaN)
    print()
    print_table(["operation", "seconds", "state MB/s", "file MB"], rows,
                title=f"{n_keys:,} keys, {state_mb:.1f} MB of state; median of {repeat}")
    if s3 is not None:
        latency = f", {args.s3_latency_ms:g} ms added per request" if args.s3_latency_ms else ""
        print(f"S3 server: moto on 127.0.0.1{latency}; requests of one restore: {s3_requests}")
    ratios = {
        "restore_p1_vs_raw_put": ratio(sec("per_key_raw_put"), s["restore_p1"]),
        "restore_p1_vs_raw_put_flush": ratio(sec("per_key_raw_put_flush"), s["restore_p1"]),
        "restore_p4_vs_raw_put": ratio(sec("per_key_raw_put"), sec("restore_p4")),
        "restore_records_vs_raw_put": ratio(sec("per_key_raw_put"), sec("restore_records_p1")),
        "restore_p1_copied_vs_raw_put": ratio(sec("per_key_raw_put"), sec("restore_p1_copied")),
        "restore_p1_vs_store_put": ratio(mbps("restore_p1"), public_put_mbps),
        "sst_restore_vs_records_restore": ratio(sec("restore_records_p1"), s["restore_p1"]),
        "delta_pct_of_full": 100.0 * ratio(s["delta_write"], s["full_write_sst"]),
        "delta_bytes_pct_of_full": 100.0 * ratio(delta_bytes, file_bytes["sst"]),
        "full_write_records_vs_sst": ratio(s["full_write_sst"], sec("full_write_records")),
        # > 1: restoring from the S3 server takes this many times as long as from the local path.
        "restore_p1_s3_vs_local": ratio(sec("restore_p1_s3"), s["restore_p1"]),
        "restore_p1_s3_vs_copied": ratio(sec("restore_p1_s3"), sec("restore_p1_copied")),
    }
    ratio_rows = [
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
        ["restore p=1: S3 server time / local path time", ratios["restore_p1_s3_vs_local"]],
        ["restore p=1: S3 server time / SST files copied time", ratios["restore_p1_s3_vs_copied"]],
    ]
    print()
    print_table(["ratio", "value"], [r for r in ratio_rows if r[1] == r[1]], title="ratios (same run)")
    targets = []
    if not args.only_restore:
        targets = [
            check_target("restore p=1 vs one store.put per key", ratios["restore_p1_vs_store_put"], TARGET_RESTORE,
                         unit="x"),
            check_target("restore p=1 vs one raw cf.put per key", ratios["restore_p1_vs_raw_put"], TARGET_RESTORE,
                         unit="x"),
        ]
    targets.append(check_target("1 % delta cost, % of a full snapshot", ratios["delta_pct_of_full"],
                                TARGET_DELTA_PCT, at_most=True, unit="%"))
    results = {
        "median_seconds": s,
        "seconds_all": seconds,
        "state_bytes": state_bytes,
        "file_bytes": file_bytes,
        "delta_bytes": delta_bytes,
        "mb_per_s": {name: mbps(name) for name in s if name not in ("delta_commit", "per_key_store_put_sample")},
        "store_put_sample_mb_per_s": public_put_mbps,
        "ratios": ratios,
        "s3_upload_seconds": s3.upload_seconds if s3 is not None else None,
        "s3_requests_per_restore": s3_requests if s3 is not None else None,
        "restore_reports": {k: {"sections": v.sections, "sst_files": v.sst_files, "records": v.records,
                                "bytes": v.bytes} for k, v in restore_reports.items()},
    }
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results

if __name__ == "__main__":
    main(sys.argv[1:])
