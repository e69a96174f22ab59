"""Mini-batch buffering under key skew: the seed's tweet-view count, unbuffered vs buffered, per tweet cardinality.

Workload (the seed's experiment, "Apache Flink: towards a 20x throughput
improvement using in-memory buffers"): ``--size`` views (default 100k) of
tweets by ``--users`` users (default 25k); tweet ids uniform over the
cardinality and users uniform over the users, as the seed's generator does
(``Random.nextInt``), with a fixed seed. Columns ``view``, ``user``,
``tweet``, all int64 (the seed uses "user-N"/"tweet-N" strings; int keys take
the vectorized key-group path). Cardinalities: 20000, 10000, 1000, 100, 20, 1.

The operator: one ``applyInPandasWithState``-shaped function
``tweet_stats(key, rows, state)`` whose state is ``(views, HllPartial of the
viewers)`` and which emits one ``(tweet, views, viewers)`` row per call (the
seed's ``TweetStats``; ``--no-emit`` drops it). It accepts both shapes of rows:

* raw views (unbuffered): adds ``len(rows)`` views and a sketch of the rows'
  users, built exactly as ``ApproxDistinct("user")`` builds one (same lg_k,
  register type, and the same int values fed to ``datasketches``), merged with
  ``ApproxDistinct.merge_many``. The sketch is built directly rather than
  through ``ApproxDistinct.partial(rows)`` because that costs ~0.5 ms of pandas
  per call, which would inflate the unbuffered side's cost and so the ratio;
* a combined row (buffered): ``views`` (a ``Count()`` partial) and ``viewers``
  (an ``ApproxDistinct("user")`` partial), merged into the state.

Both modes use ``@cached_state(max_entries=--max-entries, store="rocksdb")``
(default 10,000 entries: the 20000-key run spills to RocksDB, the smaller ones
fit). Unbuffered = ``@mini_batch(max_rows=1)``; buffered =
``@mini_batch(max_rows=1000, max_delay_ms=100, combine={"views": Count(),
"viewers": ApproxDistinct("user")})``. They run in a ``LocalRunner(fn,
key="tweet", clock=<injected>)`` with **no checkpoint location** (the seed has
no checkpoint in its measured loop; the RocksDB working store lives in a temp
dir the operator owns), fed in micro-batches of ``--batch-rows`` (1000) rows.
The injected clock advances ``--clock-step-ms`` (10 ms) per micro-batch.

Timed per run: every ``process(batch)``, a final ``advance_time(100)`` (drains
whatever the time trigger still holds) and a flush of the write-back cache to
RocksDB (the state is in the store at the end, as in the seed). Runner setup
(RocksDB open) and teardown are not timed. Throughput = views / seconds;
best of ``--repeat`` (buffered, default 3) and ``--repeat-unbuffered``
(default 2) runs, the two modes alternating within a cardinality.

Measured size: one unbuffered call per view is slow. Per cardinality, an
untimed calibration run over the first ``--calibration-views`` views
estimates a full unbuffered run; if that estimate exceeds
``--budget-s`` (60 s), BOTH modes are measured on the first
``--prefix-views`` (20k) views instead, and the table says so (column
``views``). The ratio always compares the two modes on the same views.
Additionally, the buffered mode is run once on all ``--size`` views when its
own estimate fits the budget (column ``buffered all``); nothing is
extrapolated.

Correctness, per cardinality: both modes end with the exact view count per
tweet (equal to each other and to a pandas count of the measured views), and
every HLL estimate lies within the sketch's 3-sigma bounds of the exact
number of distinct viewers; the largest unbuffered/buffered estimate
difference is reported. The last emitted row per tweet equals its final state.

Seed: ~45x at 20 keys; above 1x at 10k and 20k keys (the article gives only
a chart otherwise). Targets: ratio >= 45x at 20 keys, >= 2x at 20000 keys.

    python -m benchmarks.minibatch [--quick] [--size N] [--cardinalities 20000,20] [--max-entries N]
                                   [--prefix-views N] [--budget-s S] [--repeat N] [--no-emit] [--profile CARD]
"""

from __future__ import annotations

import cProfile
import io
import math
import os
import pstats
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd

from buffering import ApproxDistinct, Count, LocalRunner, cached_state, mini_batch
from buffering.aggregations import HllPartial

from ._common import (
    check_target,
    log,
    make_parser,
    now,
    print_table,
    ratio,
    resolve_repeat,
    resolve_size,
    timed,
    write_record,
)

NAME = "minibatch"
CARDINALITIES = (20_000, 10_000, 1_000, 100, 20, 1)
QUICK_CARDINALITIES = (500, 20, 1)
USERS = 25_000
BUFFER_MAX_ROWS = 1_000
BUFFER_MAX_DELAY_MS = 100
SEED_RATIO_AT_20 = 45.0
#: what the seed's article states per cardinality (the rest is only in its chart)
SEED_RATIOS: dict[int, str] = {20_000: ">1", 10_000: ">1", 20: "~45"}
TARGETS = {20: 45.0, 20_000: 2.0}
HLL_SIGMAS = 3

# ---------------------------------------------------------------- the operator
VIEWERS = ApproxDistinct("user")
_DS = VIEWERS._ds  # the datasketches module ApproxDistinct uses
_TGT = getattr(_DS.tgt_hll_type, VIEWERS.tgt_type)
EMIT = True  # set by main(); read by tweet_stats


def _sketch_of_users(users: np.ndarray) -> HllPartial:
    """The users' sketch as ApproxDistinct("user") builds it: same lg_k/type, int64 values fed as Python ints."""
    sketch = _DS.hll_sketch(VIEWERS.lg_k, _TGT)
    update = sketch.update
    for u in users.tolist():
        update(u)
    return HllPartial(sketch)


def tweet_stats(key: tuple, rows: Any, state: Any):
    """State ``(views, HllPartial)``; rows are raw views or combined rows (``views``, ``viewers``)."""
    if state.exists:
        views, hll = state.get
        partials = [hll]
    else:
        views, partials = 0, []
    for pdf in rows:
        if not len(pdf):
            continue
        if "viewers" in pdf.columns:  # combined by the buffer: a Count partial and an HLL partial per row
            views += sum(pdf["views"].tolist())
            partials.extend(pdf["viewers"].tolist())
        else:  # raw views
            views += len(pdf)
            partials.append(_sketch_of_users(pdf["user"].to_numpy(np.int64)))
    if not partials:
        return
    hll = partials[0] if len(partials) == 1 else VIEWERS.merge_many(partials)
    state.update((views, hll))
    if EMIT:
        yield pd.DataFrame({"tweet": [key[0]], "views": [views], "viewers": [VIEWERS.result(hll)]})


def make_operators(max_entries: int) -> dict[str, Any]:
    state = cached_state(max_entries=max_entries, store="rocksdb")
    return {
        "unbuffered": mini_batch(max_rows=1)(state(tweet_stats)),
        "buffered": mini_batch(
            max_rows=BUFFER_MAX_ROWS,
            max_delay_ms=BUFFER_MAX_DELAY_MS,
            combine={"views": Count(), "viewers": ApproxDistinct("user")},
        )(state(tweet_stats)),
    }


# ---------------------------------------------------------------- workload
def generate_views(n: int, cardinality: int, users: int, seed: int) -> pd.DataFrame:
    """Uniform tweets over ``cardinality`` and users over ``users`` (the seed's generator), fixed seed."""
    rng = np.random.default_rng([seed, cardinality])
    return pd.DataFrame({
        "view": np.arange(n, dtype=np.int64),
        "user": rng.integers(0, users, n, dtype=np.int64),
        "tweet": rng.integers(0, cardinality, n, dtype=np.int64),
    })


def split_batches(views: pd.DataFrame, batch_rows: int) -> list[pd.DataFrame]:
    return [views.iloc[i:i + batch_rows].reset_index(drop=True) for i in range(0, len(views), batch_rows)]


# ---------------------------------------------------------------- one run
@dataclass
class Run:
    seconds: float
    views: int
    state: dict[int, tuple[int, HllPartial]]
    last_emitted: Optional[pd.DataFrame]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def views_per_s(self) -> float:
        return self.views / self.seconds if self.seconds else math.inf


def run_once(fn: Any, batches: list[pd.DataFrame], clock_step_ms: int, *, keep: bool = True,
             profile: Optional[cProfile.Profile] = None) -> Run:
    """Feed ``batches`` through a fresh LocalRunner; time processing + final drain + cache flush."""
    ticks = [0]

    def clock() -> int:
        ticks[0] += clock_step_ms
        return ticks[0]

    runner = LocalRunner(fn, key="tweet", clock=clock)
    try:
        runner.process(batches[0].iloc[:0])  # untimed: opens the instance's RocksDB working store
        outputs: list[pd.DataFrame] = []

        def work() -> None:
            for batch in batches:
                outputs.append(runner.process(batch))
            outputs.append(runner.advance_time(BUFFER_MAX_DELAY_MS))  # time trigger: nothing may stay buffered
            for instance in runner.instances:
                if instance.cache is not None:
                    instance.cache.flush()

        if profile is not None:
            profile.enable()
        seconds = timed(work)
        if profile is not None:
            profile.disable()
        n = sum(len(b) for b in batches)
        instance = runner.instances[0]
        stats = instance.stats()
        if stats.get("pending_rows"):
            raise AssertionError(f"{stats['pending_rows']} rows still buffered after the final drain")
        state: dict[int, tuple[int, HllPartial]] = {}
        last = None
        if keep:
            state = {k[0]: v for k, v in runner.state().items()}
            frames = [o for o in outputs if len(o)]
            if frames:
                last = pd.concat(frames, ignore_index=True).groupby("tweet", sort=True).last()
        return Run(seconds, n, state, last, stats)
    finally:
        runner.close()


# ---------------------------------------------------------------- verification
def verify(views: pd.DataFrame, runs: dict[str, Run], emit: bool) -> dict[str, Any]:
    """Exact view counts, HLL estimates within 3-sigma bounds of the exact distinct viewers, emitted == state."""
    exact_views = views.groupby("tweet").size()
    exact_viewers = views.groupby("tweet")["user"].nunique()
    problems: list[str] = []
    out: dict[str, Any] = {"tweets": int(len(exact_views))}
    estimates: dict[str, pd.Series] = {}
    for mode, run in runs.items():
        state = run.state
        if set(state) != set(exact_views.index.tolist()):
            problems.append(f"{mode}: state holds {len(state)} tweets, expected {len(exact_views)}")
            continue
        tweets = exact_views.index.tolist()
        counts = pd.Series([state[t][0] for t in tweets], index=exact_views.index)
        bad_counts = int((counts != exact_views).sum())
        if bad_counts:
            problems.append(f"{mode}: {bad_counts} tweets with a wrong view count")
        est = pd.Series([state[t][1].estimate() for t in tweets], index=exact_views.index)
        lo = np.array([state[t][1].sketch.get_lower_bound(HLL_SIGMAS) for t in tweets])
        hi = np.array([state[t][1].sketch.get_upper_bound(HLL_SIGMAS) for t in tweets])
        truth = exact_viewers.to_numpy()
        outside = int(((truth < lo - 1e-9) | (truth > hi + 1e-9)).sum())
        if outside:
            problems.append(f"{mode}: {outside} tweets whose exact viewer count is outside the {HLL_SIGMAS}-sigma bounds")
        rel = np.abs(est.to_numpy() - truth) / np.maximum(truth, 1)
        out[mode] = {
            "wrong_view_counts": bad_counts,
            "hll_outside_bounds": outside,
            "hll_max_rel_error": float(rel.max()),
            "hll_mean_rel_error": float(rel.mean()),
        }
        estimates[mode] = est
        if emit:
            last = run.last_emitted
            if last is None or len(last) != len(tweets):
                problems.append(f"{mode}: emitted rows cover {0 if last is None else len(last)} tweets, expected {len(tweets)}")
            else:
                state_viewers = pd.Series([VIEWERS.result(state[t][1]) for t in tweets], index=exact_views.index)
                if not (last["views"].reindex(exact_views.index).to_numpy() == counts.to_numpy()).all() or not (
                    last["viewers"].reindex(exact_views.index).to_numpy() == state_viewers.to_numpy()
                ).all():
                    problems.append(f"{mode}: the last emitted row of some tweet differs from its final state")
    if len(estimates) == 2:
        a, b = estimates["unbuffered"], estimates["buffered"]
        diff = (a - b).abs() / np.maximum(exact_viewers, 1)
        out["hll_unbuffered_vs_buffered_max_rel_diff"] = float(diff.max())
        out["hll_identical_estimates"] = int((a == b).sum())
    out["ok"] = not problems
    out["problems"] = problems
    return out


# ---------------------------------------------------------------- profiling
def profile_text(profile: cProfile.Profile, limit: int = 25) -> str:
    buf = io.StringIO()
    stats = pstats.Stats(profile, stream=buf)
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return buf.getvalue()


# ---------------------------------------------------------------- main
def _parse_cards(text: str) -> list[int]:
    cards = [int(x) for x in text.split(",") if x.strip()]
    if not cards or any(c < 1 for c in cards):
        raise SystemExit(f"--cardinalities must be positive ints, got {text!r}")
    return cards


def main(argv: list[str] | None = None) -> dict:
    global EMIT
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=100_000, quick_size=1_000,
                         size_help="views generated per cardinality")
    parser.add_argument("--cardinalities", default=None,
                        help="comma-separated tweet cardinalities (default 20000,10000,1000,100,20,1; "
                             "--quick 500,20,1)")
    parser.add_argument("--users", type=int, default=USERS, help="distinct users (default 25,000)")
    parser.add_argument("--batch-rows", type=int, default=1_000, help="rows per LocalRunner micro-batch (default 1,000)")
    parser.add_argument("--max-entries", type=int, default=10_000,
                        help="cached_state max_entries in both modes (default 10,000)")
    parser.add_argument("--clock-step-ms", type=int, default=10, help="injected clock advance per micro-batch (default 10)")
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="largest estimated seconds for one full unbuffered run before both modes use the prefix "
                             "(default 60)")
    parser.add_argument("--prefix-views", type=int, default=None,
                        help="views measured when a full run is over budget (default 20,000; --quick 500)")
    parser.add_argument("--calibration-views", type=int, default=None,
                        help="untimed unbuffered views per cardinality used to estimate a full run "
                             "(default 2,000; --quick 300)")
    parser.add_argument("--repeat-unbuffered", type=int, default=None,
                        help="unbuffered runs per cardinality, best reported (default 2; --quick 1)")
    parser.add_argument("--no-emit", action="store_true", help="tweet_stats emits no output rows")
    parser.add_argument("--profile", type=int, default=None, metavar="CARD",
                        help="after measuring, cProfile one run of each mode at this cardinality (prefix size) "
                             "and print the top functions")
    args = parser.parse_args(argv)
    started = now()
    EMIT = not args.no_emit
    n_views = resolve_size(args)
    cards = _parse_cards(args.cardinalities) if args.cardinalities else list(
        QUICK_CARDINALITIES if args.quick else CARDINALITIES)
    repeat_b = resolve_repeat(args, default=3, quick=1)
    repeat_u = args.repeat_unbuffered if args.repeat_unbuffered is not None else (1 if args.quick else 2)
    if repeat_u < 1:
        raise SystemExit("--repeat-unbuffered must be positive")
    prefix = args.prefix_views if args.prefix_views is not None else (500 if args.quick else 20_000)
    prefix = max(1, min(prefix, n_views))
    calib = args.calibration_views if args.calibration_views is not None else (300 if args.quick else 2_000)
    calib = max(1, min(calib, prefix, n_views))
    operators = make_operators(args.max_entries)

    params = {
        "views": n_views,
        "users": args.users,
        "cardinalities": cards,
        "generator": "uniform tweets over the cardinality, uniform users (numpy default_rng([seed, cardinality]))",
        "seed": args.seed,
        "batch_rows": args.batch_rows,
        "clock_step_ms_per_batch": args.clock_step_ms,
        "unbuffered": "mini_batch(max_rows=1)",
        "buffered": f"mini_batch(max_rows={BUFFER_MAX_ROWS}, max_delay_ms={BUFFER_MAX_DELAY_MS}, "
                    "combine={'views': Count(), 'viewers': ApproxDistinct('user')})",
        "state": f"cached_state(max_entries={args.max_entries}, store='rocksdb'); state = (views, HllPartial lg_k="
                 f"{VIEWERS.lg_k} {VIEWERS.tgt_type})",
        "checkpoint": "none (RocksDB working store in a temp dir owned by the operator)",
        "emit": EMIT,
        "timed": "process() of every micro-batch + advance_time(100) + write-back cache flush to RocksDB",
        "repeat_buffered": repeat_b,
        "repeat_unbuffered": repeat_u,
        "statistic": "best (max views/s) over repetitions",
        "budget_s": args.budget_s,
        "prefix_views": prefix,
        "calibration_views": calib,
        "quick": args.quick,
    }
    print(f"minibatch: {n_views:,} views, {args.users:,} users, cardinalities {cards}, micro-batches of "
          f"{args.batch_rows:,}, cache max_entries {args.max_entries:,} over RocksDB, no checkpoint, "
          f"emit={'yes' if EMIT else 'no'}; best of {repeat_u} (unbuffered) / {repeat_b} (buffered); "
          f"pid {os.getpid()}", flush=True)

    results: dict[str, Any] = {"per_cardinality": {}}
    rows = []
    all_ok = True
    for card in cards:
        views = generate_views(n_views, card, args.users, args.seed)
        log(f"[{card}] calibrating unbuffered on {calib:,} views")
        cal = run_once(operators["unbuffered"], split_batches(views.iloc[:calib], args.batch_rows),
                       args.clock_step_ms, keep=False)
        est_full_u = cal.seconds / calib * n_views
        use_prefix = est_full_u > args.budget_s
        measured = views.iloc[:prefix] if use_prefix else views
        n_measured = len(measured)
        batches = split_batches(measured, args.batch_rows)
        log(f"[{card}] unbuffered estimate for all {n_views:,} views: {est_full_u:.0f} s -> measuring both modes on "
            f"{'the first ' if use_prefix else 'all '}{n_measured:,} views")
        runs: dict[str, list[Run]] = {"unbuffered": [], "buffered": []}
        for rep in range(max(repeat_u, repeat_b)):
            order = ("unbuffered", "buffered") if rep % 2 == 0 else ("buffered", "unbuffered")
            for mode in order:
                if len(runs[mode]) >= (repeat_u if mode == "unbuffered" else repeat_b):
                    continue
                run = run_once(operators[mode], batches, args.clock_step_ms, keep=not runs[mode])
                runs[mode].append(run)
                log(f"[{card}] {mode} run {len(runs[mode])}: {run.seconds:.2f} s, {run.views_per_s:,.0f} views/s, "
                    f"{run.stats['calls']:,} fn calls")
        best = {mode: max(r.views_per_s for r in rs) for mode, rs in runs.items()}
        r = ratio(best["buffered"], best["unbuffered"])
        check = verify(measured, {mode: rs[0] for mode, rs in runs.items()}, EMIT)
        all_ok &= check["ok"]
        for problem in check["problems"]:
            print(f"CORRECTNESS [{card}]: {problem}", flush=True)

        # The buffered mode on all views, when it fits the budget (never extrapolated).
        full_b: Any = None
        full_b_note = ""
        full_check = None
        if use_prefix:
            est_full_b = n_views / best["buffered"]
            if est_full_b <= args.budget_s:
                log(f"[{card}] buffered on all {n_views:,} views (estimate {est_full_b:.0f} s)")
                run = run_once(operators["buffered"], split_batches(views, args.batch_rows), args.clock_step_ms)
                full_b = run.views_per_s
                full_check = verify(views, {"buffered": run}, EMIT)
                all_ok &= full_check["ok"]
                for problem in full_check["problems"]:
                    print(f"CORRECTNESS [{card}, all views, buffered]: {problem}", flush=True)
            else:
                full_b_note = f"skipped (est. {est_full_b:.0f} s)"
        else:
            full_b = best["buffered"]

        target = TARGETS.get(card)
        rows.append([
            card,
            n_measured,
            best["unbuffered"],
            best["buffered"],
            r,
            SEED_RATIOS.get(card, "chart only"),
            "-" if target is None else f">={target:g}x {'PASS' if r >= target else 'FAIL'}",
            full_b if full_b is not None else full_b_note,
            runs["unbuffered"][0].stats["calls"],
            runs["buffered"][0].stats["calls"],
            "ok" if check["ok"] else "FAILED",
        ])
        results["per_cardinality"][str(card)] = {
            "views_measured": n_measured,
            "measured_on_prefix": use_prefix,
            "unbuffered_full_run_estimate_s": est_full_u,
            "unbuffered_views_per_s_best": best["unbuffered"],
            "buffered_views_per_s_best": best["buffered"],
            "ratio": r,
            "unbuffered_seconds_all": [x.seconds for x in runs["unbuffered"]],
            "buffered_seconds_all": [x.seconds for x in runs["buffered"]],
            "buffered_all_views_per_s": full_b,
            "buffered_all_views_note": full_b_note or None,
            "fn_calls": {mode: rs[0].stats["calls"] for mode, rs in runs.items()},
            "flushes": {mode: rs[0].stats["flushes"] for mode, rs in runs.items()},
            "cache": {mode: rs[0].stats.get("cache") for mode, rs in runs.items()},
            "verification": check,
            "verification_buffered_all_views": full_check,
            "seed_ratio": SEED_RATIOS.get(card),
        }
        log(f"[{card}] ratio {r:.2f}x ({best['buffered']:,.0f} / {best['unbuffered']:,.0f} views/s)")

    print()
    any_prefix = any(v["measured_on_prefix"] for v in results["per_cardinality"].values())
    print_table(
        ["tweets", "views", "unbuffered views/s", "buffered views/s", "ratio", "seed ratio", "target",
         f"buffered all {n_views // 1000}k views/s", "fn calls unbuf", "fn calls buf", "check"],
        rows,
        title=f"views/s, best of {repeat_u} (unbuffered) / {repeat_b} (buffered); ratio = buffered / unbuffered "
              f"on the same views",
    )
    if any_prefix:
        print(f"NOTE: where 'views' < {n_views:,}, a full unbuffered run was estimated above {args.budget_s:g} s, so "
              f"BOTH modes were measured on the first {prefix:,} views (throughput in views/s, not extrapolated).")
    print("seed ratio: the article states ~45x at 20 keys and >1x at 10k/20k; other cardinalities are only in its chart.")
    for card in cards:
        c = results["per_cardinality"][str(card)]["cache"]
        print(f"cache [{card}]: " + "; ".join(
            f"{mode} hit_ratio {s['hit_ratio']:.3f}, misses {s['misses']:,}, evictions {s['evictions']:,}"
            for mode, s in c.items() if s))
    for card in cards:
        v = results["per_cardinality"][str(card)]["verification"]
        if "unbuffered" in v and "buffered" in v:
            print(f"verify [{card}]: {v['tweets']:,} tweets, view counts exact in both modes: "
                  f"{v['unbuffered']['wrong_view_counts'] == 0 and v['buffered']['wrong_view_counts'] == 0}; "
                  f"HLL max rel error unbuffered {v['unbuffered']['hll_max_rel_error']:.4f}, buffered "
                  f"{v['buffered']['hll_max_rel_error']:.4f}, outside {HLL_SIGMAS}-sigma bounds "
                  f"{v['unbuffered']['hll_outside_bounds'] + v['buffered']['hll_outside_bounds']}; "
                  f"modes differ by at most {v['hll_unbuffered_vs_buffered_max_rel_diff']:.4f} (rel), "
                  f"{v['hll_identical_estimates']:,} identical estimates")
    print(f"correctness: {'ALL OK' if all_ok else 'FAILED'}")

    targets = []
    for card, threshold in TARGETS.items():
        if str(card) in results["per_cardinality"]:
            targets.append(check_target(f"buffered/unbuffered at {card} keys",
                                        results["per_cardinality"][str(card)]["ratio"], threshold, unit="x"))
    results["correctness_ok"] = all_ok

    if args.profile is not None:
        card = args.profile
        views = generate_views(n_views, card, args.users, args.seed)
        batches = split_batches(views.iloc[:prefix], args.batch_rows)
        results["profiles"] = {}
        for mode in ("unbuffered", "buffered"):
            prof = cProfile.Profile()
            run = run_once(operators[mode], batches, args.clock_step_ms, keep=False, profile=prof)
            text = profile_text(prof)
            print(f"\n==== cProfile: {mode}, {card} tweets, {len(views.iloc[:prefix]):,} views, "
                  f"{run.seconds:.2f} s under the profiler ====")
            print(text)
            results["profiles"][mode] = text

    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
