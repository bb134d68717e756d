"""Calibrate the simulator on a real run, predict other worker counts, compare with reality.

For each calibration k (and, with several, all of them together: `asyngrad calibrate real1
real2 ...` also fits the contention between workers) and each predicted k': a real lock-free
run at every k involved (`asyngrad real --measure`), `asyngrad calibrate real{k} --pool
--cores C`, `asyngrad simulate` of the calibrated scenario at k', and `asyngrad compare
real{k'} sim` — the fidelity targets
of the simulation-vs-hardware table in bench/README.md (mean staleness gap, KS distance,
gradient error rate gap, final suboptimality ratio, throughput), and how the updates met in
time (the share of writes that overlapped another write, the error rate at staleness 0), and
the workers' rhythm (measured staleness over what independent phases give). With repeats, a
second table splits each error-rate gap into what the share of updates at staleness 0, their
errors and the stale updates' errors each move it by (`asyngrad compare`'s ``gap_split``),
and a third how the pairs of writes that met were staggered (their start lags, and how often
each lag lost stores), real against each prediction.

    python bench/fidelity.py --calibrate 2 --predict 4,8,16 --cores 16
    python bench/fidelity.py --calibrate 1,2 --predict 2,3 --cores 2 --quantum auto
    python bench/fidelity.py --backend ps --set run.protocol=paramserver --calibrate 2 --predict 3

With ``--repeats R`` every real run is made R times (run.seed = 0 … R−1: sampling order and
the machine's own noise both vary), every prediction is simulated with the same R seeds, and the
table sets the simulation's spread against the hardware's: each real k' run compared with every
other (the noise floor of each target) beside each simulation compared with the real run of its
seed. Calibration uses the seed-0 run.

    python bench/fidelity.py --calibrate 2 --predict 2,3 --cores 2 --quantum auto --repeats 5

Real runs record where the host had their CPUs (``real.cpu_latency``: near, far, or changing
during the run). With repeats the comparisons are also split by that state — real runs within
a state and across states, each prediction against the near runs and the far ones — and
``--by-state`` also calibrates from the first near run and the first far run where seed 0's was
not in that state (rows ``K@STATE.SEED``), so that a prediction can be read against runs in
its calibration's state. ``--from-repeats`` also calibrates from all R real runs at each count
together (rows ``KxR``: `asyngrad calibrate realK realK.1 ... --pool`): a core's pace that
changes between runs but holds within one is then in the fit (with ``--episodes``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

from simulator.cli import main as asyngrad
from simulator.fidelity.compare import LAG_EDGES, OFFSET_EDGES, meeting_lags, offsets
from simulator.rundir import latency_pair, placement, run_cpu_latency
from simulator.trace import Trace


def _run(*argv: str) -> None:
    status = asyngrad(list(argv))
    if status != 0:
        raise SystemExit(f"bench/fidelity.py: asyngrad {' '.join(argv)} exited {status}")


def _share(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _real_dir(work: Path, k: int, repeat: int) -> Path:
    return work / (f"real{k}" if repeat == 0 else f"real{k}.{repeat}")


def _compare(a: Path, b: Path, out: Path) -> dict:
    _run("compare", str(a), str(b), "--out", str(out), "--quiet")
    return json.loads((out / "compare.json").read_text())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _spread(values: list[float | None], spec: str = ".3f") -> str:
    """median [min–max] of the values that exist, n/a when none does."""
    kept = [v for v in values if v is not None]
    if not kept:
        return "n/a"
    return (f"{_median(kept):{spec}} [{min(kept):{spec}}–{max(kept):{spec}}]"
            if len(kept) > 1 else format(kept[0], spec))


def _targets(report: dict) -> dict:
    """The issue's four fidelity measures (and the loss curves' distance) of one comparison."""
    st, ge, loss = report["staleness"], report["gradient_error"], report["loss"]
    apart = loss["max_abs_log10_ratio"]
    ia, ib = report["interference"]["a"], report["interference"]["b"]
    split = ge.get("gap_split") or {}
    return {"staleness_a": st["mean_a"], "staleness_b": st["mean_b"],
            "gap": st["relative_mean_gap"], "ks": st["ks_distance"],
            "error_a": ge["a"]["rate"], "error_b": ge["b"]["rate"],
            "rate_gap": (None if ge["a"]["rate"] is None or ge["b"]["rate"] is None
                         else abs(ge["a"]["rate"] - ge["b"]["rate"])),  # (ADMM: none)
            "final_ratio": loss["final_ratio"],
            "loss_apart": None if apart is None else 10 ** apart,
            # where the error-rate gap comes from (asyngrad compare's gap_split, b − a)
            "fresh_a": ia["fresh_share"], "fresh_b": ib["fresh_share"],
            "fresh_error_a": ia["error_rate_fresh"], "fresh_error_b": ib["error_rate_fresh"],
            "stale_error_a": ia["error_rate_stale"], "stale_error_b": ib["error_rate_stale"],
            **{f"from_{key}": value for key, value in split.items()}}


def _spread_table(args: argparse.Namespace, work: Path,
                  plans: list[tuple[str, list[str]]]) -> list[dict]:
    """Each prediction simulated with every repeat's seed and compared with the real run of
    that seed, beside every pair of real runs at k' compared with each other."""
    repeats = range(args.repeats)
    floors = {}
    for target in args.predict:
        pairs = [{**_targets(_compare(_real_dir(work, target, i), _real_dir(work, target, j),
                                      work / f"cmp_real{target}_{i}_{j}")),
                  "states": [_state(work, target, i), _state(work, target, j)]}
                 for i, j in itertools.combinations(repeats, 2)]
        floors[target] = pairs
    print("| calibrated at | predicted k' | staleness mean real / sim: median [range] | "
          "staleness gap sim vs real (real vs real) | KS sim vs real (real vs real) | "
          "error rate real / sim | error-rate gap sim vs real (real vs real) | final f − f* "
          "ratio sim/real (real/real) | loss curves apart sim vs real (real vs real) |")
    print("|---:|---:|---|---|---|---|---|---|---|")
    rows = []
    for k, _ in plans:
        calibrated = work / f"cal{k}.toml"
        for target in args.predict:
            pairs = []
            for r in repeats:
                sim = work / f"sim{k}_{target}.{r}"
                _run("simulate", str(calibrated), "--set", f"run.threads={target}", "--set",
                     f"run.seed={r}", "--out", str(sim), "--quiet")
                pairs.append({**_targets(_compare(_real_dir(work, target, r), sim,
                                                  work / f"cmp{k}_{target}.{r}")),
                              "state": _state(work, target, r)})
            floor = floors[target]
            gaps = [abs(p["gap"]) for p in pairs]
            floor_gaps = [abs(p["gap"]) for p in floor]

            def both(key: str, spec: str = ".3f", sims: list = pairs,
                     reals: list = floor) -> str:
                return (f"{_spread([p[key] for p in sims], spec)} "
                        f"({_spread([p[key] for p in reals], spec)})")

            rows.append({"calibrated": k, "calibration_state": _plan_state(work, k),
                         "predicted": target, "sim_vs_real": pairs, "real_vs_real": floor})
            print(f"| {k} | {target} | {_spread([p['staleness_a'] for p in pairs])} / "
                  f"{_spread([p['staleness_b'] for p in pairs])} | "
                  f"{_spread(gaps, '.1%')} ({_spread(floor_gaps, '.1%')}) | {both('ks')} | "
                  f"{_spread([p['error_a'] for p in pairs])} / "
                  f"{_spread([p['error_b'] for p in pairs])} | {both('rate_gap')} | "
                  f"{both('final_ratio', '.2f')} | {both('loss_apart', '.2f')} |", flush=True)
    _split_table(rows)
    _lag_table(args, work, plans)
    _offset_table(args, work, plans)
    if any(p["state"] is not None for row in rows for p in row["sim_vs_real"]):
        _state_tables(rows, floors)
    return rows


def _split_table(rows: list[dict]) -> None:
    """Where each prediction's error-rate gap comes from (`asyngrad compare`'s split of
    sim − real): the share of updates at staleness 0, their error rate, the stale updates'
    error rate, and what each moves the gap by; medians over the repeats."""
    print("\nWhere the error-rate gap comes from (sim − real = the share of updates at "
          "staleness 0 moving it + their errors + the stale updates' errors; medians over "
          "the repeats).\n")
    print("| calibrated at | predicted k' | share at staleness 0 real / sim | error rate at "
          "staleness 0 real / sim | error rate above 0 real / sim | gap sim − real | from the "
          "share | from errors at 0 | from errors above 0 |")
    print("|---:|---:|---|---|---|---:|---:|---:|---:|")
    for row in rows:
        pairs = row["sim_vs_real"]

        def median(key: str, spec: str = ".3f", sims: list = pairs) -> str:
            kept = [p[key] for p in sims if p.get(key) is not None]
            return "n/a" if not kept else format(_median(kept), spec)

        gaps = [p["error_b"] - p["error_a"] for p in pairs
                if p["error_a"] is not None and p["error_b"] is not None]  # (ADMM: none)
        gap = format(_median(gaps), "+.3f") if gaps else "n/a"
        print(f"| {row['calibrated']} | {row['predicted']} | {median('fresh_a')} / "
              f"{median('fresh_b')} | {median('fresh_error_a')} / {median('fresh_error_b')} | "
              f"{median('stale_error_a')} / {median('stale_error_b')} | "
              f"{gap} | {median('from_fresh_share', '+.3f')} | "
              f"{median('from_fresh_errors', '+.3f')} | {median('from_stale_errors', '+.3f')} |",
              flush=True)


def _lag_table(args: argparse.Namespace, work: Path,
               plans: list[tuple[str, list[str]]]) -> None:
    """How the pairs of writes that met were staggered, pooled over the repeats: the real runs
    at each k' and each prediction's simulations (`simulator.fidelity.compare.meeting_lags`)."""
    edges = "/".join(f"{e:g}" for e in LAG_EDGES[1:-1])
    print(f"\nHow the writes that met were staggered (classified pairs pooled over the "
          f"repeats; lag: the second write's start after the first's, over the median lone "
          f"write W; bins split at {edges} W).\n")
    print("| runs | k' | pairs per update | lossy | median lag | share of pairs by lag | "
          "lossy by lag |")
    print("|---|---:|---:|---:|---:|---|---|")

    def cells(lags: dict[str, Any]) -> list[str]:
        return [f"{lags['pairs_per_update']:.3f}", _share(lags["lossy"], ".2f"),
                f"{_share(lags['median_lag'], '.2f')} W",
                " / ".join(_share(v, ".2f") for v in lags["shares"]),
                " / ".join(_share(v, ".2f") for v in lags["lossy_by_lag"])]

    _pooled_rows(args, work, plans, meeting_lags, cells, 5)


def _pooled_rows(args: argparse.Namespace, work: Path, plans: list[tuple[str, list[str]]],
                 measure: Callable[[list[Trace]], dict[str, Any] | None],
                 cells: Callable[[dict[str, Any]], list[str]], columns: int) -> None:
    """One table row for the real runs at each k' and for each prediction's simulations:
    ``measure`` of their traces pooled over the repeats, printed as ``columns`` ``cells``
    (n/a where ``measure`` gives None)."""
    def row(label: str, target: int, dirs: list[Path]) -> None:
        found = measure([Trace.load(d / "trace.npz") for d in dirs])
        shown = " | ".join(cells(found)) if found is not None else "n/a" + " |" * (columns - 1)
        print(f"| {label} | {target} | {shown} |", flush=True)

    for target in args.predict:
        row("real", target, [_real_dir(work, target, r) for r in range(args.repeats)])
        for k, _ in plans:
            row(f"calibrated at {k}", target,
                [work / f"sim{k}_{target}.{r}" for r in range(args.repeats)])


def _offset_table(args: argparse.Namespace, work: Path,
                  plans: list[tuple[str, list[str]]]) -> None:
    """How far apart the workers start their writes and how that moves, pooled over the
    repeats: the real runs at each k' and each prediction's simulations
    (`simulator.fidelity.compare.offsets`)."""
    edges = "/".join(f"{e:g}" for e in OFFSET_EDGES[1:-1])
    print(f"\nHow far apart the workers start their writes (pooled over the repeats; offset: "
          f"the time to another worker's nearest write start, over the median lone write W; "
          f"bins split at {edges} W; next / now: the median ratio of a worker's next offset "
          f"to this one, bins below 2 W; end gap: of two writes that met, by their start "
          f"lag, bins below 1 W).\n")
    print("| runs | k' | share of writes by offset | next / now | end gap (W) |")
    print("|---|---:|---|---|---|")

    def cells(found: dict[str, Any]) -> list[str]:
        return [" / ".join(_share(v, ".2f") for v in found[key])
                for key in ("shares", "next_over_now", "end_gap")]

    _pooled_rows(args, work, plans, offsets, cells, 3)


def _state(work: Path, k: int, repeat: int) -> str | None:
    """The placement of a real run's CPUs (near, far, changing; None: not measured)."""
    return placement(run_cpu_latency(_real_dir(work, k, repeat)))


def _plan_state(work: Path, label: str) -> str | None:
    """The placement of the run a calibration was fitted to (None for a joint fit or one whose
    run was not probed)."""
    if label.isdigit():
        return _state(work, int(label), 0)
    count, _, state = label.partition("@")
    return state.split(".")[0] if count.isdigit() and state else None


def _cells(pairs: list[dict]) -> str:
    """``n: gap, KS, error-rate gap`` medians [ranges] of some comparisons."""
    if not pairs:
        return "none"
    return (f"{len(pairs)}: {_spread([abs(p['gap']) for p in pairs], '.1%')}, "
            f"{_spread([p['ks'] for p in pairs])}, {_spread([p['rate_gap'] for p in pairs])}")


def _state_tables(rows: list[dict], floors: dict[int, list[dict]]) -> None:
    """The same comparisons split by where the host had each real run's CPUs: real runs in one
    placement state against each other and across states (the noise floor within a state and
    the host's own gap), and each prediction against the real runs in each state."""
    print("\nBy the CPUs' placement (`real.cpu_latency`; runs that changed state are left "
          "out). Cells: number of comparisons: staleness gap, KS, error-rate gap, median "
          "[range].\n")
    print("| k' | real near vs near | real far vs far | real near vs far |")
    print("|---:|---|---|---|")
    for target, floor in floors.items():
        split = {name: [p for p in floor if sorted(map(str, p["states"])) == pair]
                 for name, pair in (("near", ["near", "near"]), ("far", ["far", "far"]),
                                    ("across", ["far", "near"]))}
        print(f"| {target} | {_cells(split['near'])} | {_cells(split['far'])} | "
              f"{_cells(split['across'])} |")
    print("\n| calibrated at | its CPUs | k' | sim vs real runs near | sim vs real runs far |")
    print("|---:|---|---:|---|---|")
    for row in rows:
        sims = row["sim_vs_real"]
        print(f"| {row['calibrated']} | {row['calibration_state'] or 'n/a'} | "
              f"{row['predicted']} | {_cells([p for p in sims if p['state'] == 'near'])} | "
              f"{_cells([p for p in sims if p['state'] == 'far'])} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", type=_ints, default=[2], help="worker counts to fit")
    parser.add_argument("--predict", type=_ints, default=[4, 8, 16], help="counts to predict")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quantum", default="0",
                        help="time slice (ns; 0: none; auto: measure this machine's)")
    parser.add_argument("--slicing", default="per_core", help="per_core or global")
    parser.add_argument("--migrate", default=None,
                        help="calibrate --migrate (ns between load-balancer moves; 0: only to "
                             "an idle core; auto: measure this machine's, once; default: "
                             "calibrate's)")
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--mode", default="lockfree")
    parser.add_argument("--backend", default="shm",
                        help="shm (CPU worker processes, --mode) or ps (the parameter server "
                             "on loopback: paramserver, its [paramserver] options by --set)")
    parser.add_argument("--set", action="append", default=[], help="scenario overrides")
    parser.add_argument("--convoys", default="auto", help="calibrate --convoys (auto, on, off)")
    parser.add_argument("--common", default=None,
                        help="calibrate --common (rhythm, auto, on, off; default: calibrate's)")
    parser.add_argument("--interference", default="auto",
                        help="calibrate --interference (auto, on, off)")
    parser.add_argument("--shared", default="auto",
                        help="calibrate --shared (auto, on, off)")
    parser.add_argument("--speeds", default="off",
                        help="calibrate --speeds (auto, on, off): each core's own speed")
    parser.add_argument("--episodes", default="off",
                        help="calibrate --episodes (auto, on, off): the cores' speed episodes")
    parser.add_argument("--pin", action="store_true",
                        help="real runs pin worker r to CPU r (asyngrad real --pin)")
    parser.add_argument("--keep", default=None, help="keep the run directories here")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: reuse real runs already there (compare calibrations "
                             "on the same real runs)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--from-repeats", action="store_true",
                        help="with --repeats: also calibrate from all repeats at each count "
                             "together (rows KxR)")
    parser.add_argument("--by-state", action="store_true",
                        help="with --repeats: also calibrate from the first run whose CPUs "
                             "were near and the first far (real.cpu_latency) where seed 0's "
                             "were not")
    parser.add_argument("--repeats", type=int, default=1,
                        help="real runs and simulations per worker count (seeds 0 … R−1); "
                             "more than one prints the spread table")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    overrides = [v for o in [f"run.updates={args.updates}", *args.set] for v in ("--set", o)]
    if args.quantum == "auto" or args.migrate == "auto":  # measured once, used by every fit
        from realrun.host.timeslice import measure_migration, measure_time_slice

        if args.quantum == "auto":
            args.quantum = str(measure_time_slice()[0])
        if args.migrate == "auto":
            args.migrate = str(measure_migration(args.cores, int(args.quantum))[0])
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{args.mode if args.backend == 'shm' else 'ps'}, {args.updates:,} updates, "
          f"calibrated with --pool --cores {args.cores}"
          f" --quantum {args.quantum} --slicing {args.slicing}"
          f" --migrate {args.migrate or '(default)'} --convoys {args.convoys}"
          f" --common {args.common or '(default)'} --interference {args.interference}"
          f" --shared {args.shared}"
          f" --speeds {args.speeds} --episodes {args.episodes}"
          + (", workers pinned" if args.pin else ""))
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    if args.by_state and args.repeats < 2:
        parser.error("--by-state: needs --repeats 2 or more")
    if args.from_repeats and args.repeats < 2:
        parser.error("--from-repeats: needs --repeats 2 or more")
    for repeat in range(args.repeats):  # repeats outside, counts inside: load falls on all
        for k in sorted(set(args.calibrate) | set(args.predict)):
            out = _real_dir(work, k, repeat)
            if args.reuse and (out / "trace.npz").is_file():
                continue
            seed = ["--set", f"run.seed={repeat}"] if args.repeats > 1 else []
            # --probe: the placement (real.cpu_latency) splits the tables by state, and the
            # runs of one worker give calibrate their writes' meetings and shared cost (the
            # shared-memory workers'; a parameter server's trainers share nothing).
            how = (["--backend", "ps"] if args.backend == "ps"
                   else ["--mode", args.mode, "--probe", *(["--pin"] if args.pin else [])])
            _run("real", "--workers", str(k), *how, "--dtype", "float64", "--measure",
                 "--out", str(out), "--quiet", *overrides, *seed)
    # Each calibration count alone (--pool), and all of them together, which also fits the
    # contention between workers as a slowdown per other worker.
    plans = [(str(k), [str(work / f"real{k}"), "--pool"]) for k in args.calibrate]
    if len(args.calibrate) > 1:
        plans.append(("+".join(map(str, args.calibrate)),
                      [str(work / f"real{k}") for k in args.calibrate]))
    if args.from_repeats:
        plans += _repeat_plans(args, work)
    if args.by_state:
        plans += _state_plans(args, work)
    for k, sources in plans:
        pooled = "--pool" in sources
        one = pooled and len(sources) == 2  # one run: each core's speed can be fitted
        _run("calibrate", *sources, "--out", str(work / f"cal{k}.toml"), "--cores",
             str(args.cores), "--quantum", args.quantum, "--slicing", args.slicing,
             *(["--migrate", args.migrate] if args.migrate else []),
             "--convoys", args.convoys, *(["--common", args.common] if args.common else []),
             "--interference", args.interference, "--shared", args.shared,
             *(["--speeds", args.speeds] if one else []),
             *(["--episodes", args.episodes] if pooled else []),
             "--quiet")
    rows = (_spread_table(args, work, plans) if args.repeats > 1
            else _single_table(args, work, plans))
    _placements(args, work)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _repeat_plans(args: argparse.Namespace, work: Path) -> list[tuple[str, list[str]]]:
    """With ``--from-repeats``: a calibration from all R real runs at each calibrated count
    together (repeats of one run: ``asyngrad calibrate`` fits them as one), labelled
    ``KxR``."""
    return [(f"{k}x{args.repeats}", [*(str(_real_dir(work, k, r)) for r in range(args.repeats)),
                                     "--pool"])
            for k in args.calibrate]


def _state_plans(args: argparse.Namespace, work: Path) -> list[tuple[str, list[str]]]:
    """With ``--by-state``: a calibration from the first real run (lowest seed) in each
    placement state, near and far, at every calibrated count of two or more workers, labelled
    ``K@STATE.SEED`` (seed 0 is the plain K row's run)."""
    plans = []
    for k in args.calibrate:
        for state in ("near", "far"):
            seeds = [r for r in range(1, args.repeats) if _state(work, k, r) == state]
            if k > 1 and _state(work, k, 0) != state and seeds:
                plans.append((f"{k}@{state}.{seeds[0]}",
                              [str(_real_dir(work, k, seeds[0])), "--pool"]))
    return plans


def _placements(args: argparse.Namespace, work: Path) -> None:
    """Where the host had each real run's CPUs: the cache-line latency between two of them
    before / after the run (``real.cpu_latency``; hundreds of ns: far apart, a slower machine
    for dense shared writes), so that rows can be read against the state of their runs."""
    cells = []
    for repeat in range(args.repeats):
        for k in sorted(set(args.calibrate) | set(args.predict)):
            latency = run_cpu_latency(_real_dir(work, k, repeat))
            if latency is not None:
                cells.append(f"{_real_dir(work, k, repeat).name} {latency_pair(latency)}")
    if cells:
        print("\nCPU-to-CPU cache line before / after each real run, ns: " + ", ".join(cells))


def _single_table(args: argparse.Namespace, work: Path,
                  plans: list[tuple[str, list[str]]]) -> list[dict]:
    """One real run per count: each prediction against it, with how the updates met."""
    print("| calibrated at | predicted k' | staleness mean real / sim (gap) | KS | error rate "
          "real / sim | final f − f* ratio sim/real | updates/s real / sim | writes overlapping "
          "a write real / sim | error rate at staleness 0 real / sim | staleness / independent "
          "real / sim | median ‖δ‖/‖g‖ real / sim | loss curves apart (at most) |")
    print("|---:|---:|---|---:|---|---:|---|---|---|---|---|---:|")
    rows = []
    for k, _ in plans:
        calibrated = work / f"cal{k}.toml"
        for target in args.predict:
            sim, report = work / f"sim{k}_{target}", work / f"cmp{k}_{target}"
            _run("simulate", str(calibrated), "--set", f"run.threads={target}", "--out",
                 str(sim), "--quiet")
            _run("compare", str(work / f"real{target}"), str(sim), "--out", str(report),
                 "--quiet")
            r = json.loads((report / "compare.json").read_text())
            st, ge, th = r["staleness"], r["gradient_error"], r["throughput"]
            ratio = r["loss"]["final_ratio"]
            ia, ib = r["interference"]["a"], r["interference"]["b"]
            ya, yb = r["rhythm"]["a"], r["rhythm"]["b"]
            apart = r["loss"]["max_abs_log10_ratio"]
            apart = None if apart is None else 10 ** apart
            rows.append({"calibrated": k, "predicted": target, **{
                "staleness_real": st["mean_a"], "staleness_sim": st["mean_b"],
                "gap": st["relative_mean_gap"], "ks": st["ks_distance"],
                "error_real": ge["a"]["rate"], "error_sim": ge["b"]["rate"],
                "final_ratio": ratio, "ups_real": th["updates_per_second_a"],
                "ups_sim": th["updates_per_second_b"],
                "write_overlap_real": ia["write_overlap_rate"],
                "write_overlap_sim": ib["write_overlap_rate"],
                "fresh_error_real": ia["error_rate_fresh"],
                "fresh_error_sim": ib["error_rate_fresh"],
                "coupling_real": ya["coupling"], "coupling_sim": yb["coupling"],
                "error_p50_real": ge["a"]["p50"], "error_p50_sim": ge["b"]["p50"],
                "loss_apart": apart}})
            print(f"| {k} | {target} | {_share(st['mean_a'])} / {_share(st['mean_b'])} "
                  f"({_share(st['relative_mean_gap'], '.1%')}) | {st['ks_distance']:.3f} | "
                  f"{_share(ge['a']['rate'])} / {_share(ge['b']['rate'])} | "
                  f"{'n/a' if ratio is None else format(ratio, '.2f')} | "
                  f"{th['updates_per_second_a']:,.0f} / {th['updates_per_second_b']:,.0f} | "
                  f"{_share(ia['write_overlap_rate'])} / {_share(ib['write_overlap_rate'])} | "
                  f"{_share(ia['error_rate_fresh'])} / {_share(ib['error_rate_fresh'])} | "
                  f"{_share(ya['coupling'])} / {_share(yb['coupling'])} | "
                  f"{_share(ge['a']['p50'], '.3g')} / {_share(ge['b']['p50'], '.3g')} | "
                  f"{'n/a' if apart is None else format(apart, '.2f') + '×'} |",
                  flush=True)
    return rows


if __name__ == "__main__":
    main()
