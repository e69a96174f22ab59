"""Shared helpers of the benchmarks: timing, an aligned table, the JSON record, argparse.

Every benchmark measures its baseline and its candidate in the same process
run (these machines are noisy), prints a table of ratios and a PASS/FAIL line
per target, and writes a JSON record to ``benchmarks/results/<name>.json``.
A missed target is reported, never turned into a non-zero exit status.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"

now = time.perf_counter


# ---------------------------------------------------------------- timing
class Timer:
    """``with Timer() as t: ...`` then ``t.seconds`` (perf_counter)."""

    __slots__ = ("start", "seconds")

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> "Timer":
        self.start = now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = now() - self.start

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


def timed(fn: Callable[[], Any], *, collect: bool = True) -> float:
    """Seconds one call of ``fn`` takes.

    With ``collect`` a full garbage collection runs first (untimed), so a
    measurement is not charged for garbage an earlier one left behind. The
    collector stays enabled while ``fn`` runs: a store that keeps millions of
    Python objects alive really pays for it.
    """
    if collect:
        gc.collect()
    start = now()
    fn()
    return now() - start


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; nan for no values."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.inf


# ---------------------------------------------------------------- output
def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """Print ``rows`` under ``headers``: text columns left-aligned, numbers right-aligned. Returns the text."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows if i < len(row))
        for i in range(len(headers))
    ]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(values: Sequence[str], align_numbers: bool) -> str:
        parts = []
        for i, text in enumerate(values):
            right = align_numbers and numeric[i]
            parts.append(text.rjust(widths[i]) if right else text.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(headers, True))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(row, True) for row in cells)
    text = "\n".join(out)
    print(text, flush=True)
    return text


def check_target(label: str, value: float, threshold: float, *, at_most: bool = False, unit: str = "") -> dict:
    """Print ``TARGET <label>: <value> >= <threshold> PASS|FAIL`` and return it as a dict (never raises)."""
    met = value <= threshold if at_most else value >= threshold
    op = "<=" if at_most else ">="
    print(f"TARGET {label}: {_cell(float(value))}{unit} {op} {_cell(float(threshold))}{unit}  {'PASS' if met else 'FAIL'}",
          flush=True)
    return {"label": label, "value": value, "threshold": threshold, "op": op, "met": met}


def log(message: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- machine info and the JSON record
def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        info["rocksdict"] = version("rocksdict")
    except Exception:
        pass
    return info


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return _jsonable(item())
    return str(value)


def write_record(
    name: str,
    *,
    params: dict[str, Any],
    results: dict[str, Any],
    targets: Sequence[dict] = (),
    out: str | os.PathLike[str] | None = None,
    started: float | None = None,
) -> Path:
    """Write the JSON record of one run; ``out`` overrides ``benchmarks/results/<name>.json``."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "machine": machine_info(),
        "params": params,
        "results": results,
        "targets": list(targets),
        "all_targets_met": all(t["met"] for t in targets),
    }
    if started is not None:
        record["runtime_s"] = round(now() - started, 3)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(record), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    print(f"record: {path}", flush=True)
    return path


# ---------------------------------------------------------------- argparse
def make_parser(description: str, *, default_size: int, quick_size: int, size_help: str) -> argparse.ArgumentParser:
    """A parser with ``--size``, ``--quick``, ``--out``, ``--repeat`` and ``--seed``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", type=int, default=None,
                        help=f"{size_help} (default {default_size:,}; --quick: {quick_size:,})")
    parser.add_argument("--quick", action="store_true", help="a small size that runs in a few seconds (smoke test)")
    parser.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/<name>.json)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per measurement (median is reported)")
    parser.add_argument("--seed", type=int, default=1234, help="random seed of the workload")
    parser.set_defaults(_default_size=default_size, _quick_size=quick_size)
    return parser


def resolve_size(args: argparse.Namespace) -> int:
    """``--size`` if given, else the quick or the default size."""
    if args.size is not None:
        if args.size < 1:
            raise SystemExit(f"--size must be positive, got {args.size}")
        return args.size
    return args._quick_size if args.quick else args._default_size


def resolve_repeat(args: argparse.Namespace, default: int, quick: int) -> int:
    if args.repeat is not None:
        if args.repeat < 1:
            raise SystemExit(f"--repeat must be positive, got {args.repeat}")
        return args.repeat
    return quick if args.quick else default


# ---------------------------------------------------------------- temp dirs
@contextmanager
def temp_dir(prefix: str) -> Iterator[str]:
    """A fresh directory (tempfile.mkdtemp), removed afterwards whatever happens."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def local_spark_builder(app_name: str, *, master: str, driver_memory: str, parallelism: int) -> Any:
    """A SparkSession builder for a Spark benchmark: workers run this interpreter and import this repository.

    Loopback only, no UI or console progress, Arrow on, ``parallelism``
    shuffle partitions. The caller adds its own settings and calls
    ``getOrCreate()``.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Workers unpickle functions of this package: make the repository importable there.
    root = str(Path(__file__).resolve().parent.parent)
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(parallelism))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
