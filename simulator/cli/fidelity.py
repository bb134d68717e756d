"""Simulation against hardware: ``asyngrad calibrate`` and ``compare``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import default_out, ns
from simulator.errors import AsyngradError, ScenarioError
from simulator.scenario import SLICINGS, DeviceSpec

COMPARE_FILES = ("compare.json", "compare.png")


def _compare(args: argparse.Namespace) -> int:

    from simulator.fidelity.compare import compare_runs
    from simulator.fidelity.figure import compare_figure
    from simulator.fidelity.report import compare_text
    from simulator.rundir import check_out, publish, write_json

    out = default_out(args.out, "compare")
    check_out(out, COMPARE_FILES)
    report = compare_runs(args.run_a, args.run_b)

    def write(where: Path) -> None:
        write_json(where / "compare.json", report)
        compare_figure(args.run_a, args.run_b).savefig(where / "compare.png", dpi=100)

    publish(out, COMPARE_FILES, write)
    if not args.quiet:
        print(compare_text(report))
        print(f"  wrote {out}/compare.json and compare.png")
    return 0


def _migrating(device: DeviceSpec, migrate: int) -> DeviceSpec:
    """``device`` with its per-core time slices' load balancer moving every ``migrate``
    ns."""
    hardware = device.hardware
    slices = hardware.time_slices if hardware is not None else None
    if hardware is None or slices is None or slices.slicing != "per_core":
        return device
    return dataclasses.replace(device, hardware=dataclasses.replace(
        hardware, time_slices=dataclasses.replace(slices, migrate=migrate)))


def _quantum(text: str) -> tuple[int, str]:
    """``--quantum``: ns, or ``auto`` to measure this machine's time slice (and say how)."""
    if text == "auto":
        from realrun.host.timeslice import measure_time_slice

        quantum, seen = measure_time_slice()
        return quantum, (f"{quantum / 1e6:.3g} ms, measured on this machine ({seen} turns "
                         "of two processes pinned to one core)")
    return ns("--quantum", text), ""


def _balanced_elsewhere(runs: list[str]) -> str:
    """Why this machine's load balancer may not be the one that moved the runs' workers (''
    when it is: real runs of unpinned CPU worker processes, recorded on this host)."""
    from simulator.rundir import run_real

    here = platform.node()
    for run in runs:
        real = run_real(run)
        if real is None:
            return f"{run} is not a real run"
        if real.get("backend") != "shm":
            return f"{run} ran on the {real.get('backend')} backend, not CPU processes"
        if real.get("host") != here:
            return f"{run} does not say it ran on this host ({here})"
        if real.get("cpus"):
            return f"{run}'s workers were pinned"
    return ""


def _migrate(text: str | None, cores: int, quantum: int, slicing: str,
             runs: list[str]) -> tuple[int, str]:
    """``--migrate``: ns, or ``auto`` to measure this machine's load balancer (and say how);
    not given, ``auto`` where it applies (per-core time slices, runs made here), else 0 and,
    with per-core slices, why not (also when the measurement fails).

    Raises:
        ScenarioError: ``text`` is not ns, or a value other than 0 without per-core slices.
        AsyngradError: ``auto`` given and this machine's balancer cannot be measured.
    """
    if text is None:
        if not (cores and quantum and slicing == "per_core"):
            return 0, ""
        elsewhere = _balanced_elsewhere(runs)
        if elsewhere:
            return 0, (f"none: not measured, as {elsewhere} (--migrate auto measures this "
                       "machine's balancer, --migrate NS gives one)")
        try:
            return _migrate("auto", cores, quantum, slicing, runs)
        except AsyngradError as err:  # a default does not stop the calibration
            return 0, f"none: the measurement failed ({err})"
    migrate = None if text == "auto" else ns("--migrate", text)
    if migrate == 0:
        return 0, ""
    if not (cores and quantum and slicing == "per_core"):
        raise ScenarioError("--migrate", text, "needs --cores, --quantum and --slicing per_core")
    if migrate is not None:
        return migrate, ""
    from realrun.host.timeslice import measure_migration

    migrate, moves = measure_migration(cores, quantum)
    return migrate, (f"{migrate / 1e6:.3g} ms between moves, measured on this machine "
                     f"({moves} moves of {cores + 1} processes spinning on {cores} cores)")


def _check_scenario_out(out: Path, marker: str) -> None:
    """Raises AsyngradError where ``out`` cannot take a calibrated scenario: it exists and
    is not one (its first bytes are not ``marker``; a binary file included), or a folder
    above it is a file (checked before the calibration runs)."""
    from simulator.rundir import file_above

    above = file_above(out)
    if above is not None:
        raise AsyngradError(f"--out = '{out}': {above} is not a directory")
    try:
        mine = out.is_file() and out.read_bytes().startswith(marker.encode())
    except OSError as err:
        raise AsyngradError(f"--out = '{out}': cannot be read ({err.strerror or err})"
                            ) from None
    if out.exists() and not mine:
        raise AsyngradError(f"--out = '{out}': exists and is not a calibrated scenario; "
                            "choose a new file name")


def _calibrate(args: argparse.Namespace) -> int:
    from simulator.fidelity.calibrate import calibrate, calibrate_counts
    from simulator.fidelity.report import MARKER, calibrated_toml
    from simulator.fidelity.runs import run_workers
    from simulator.rundir import run_cpu_latency

    out = Path(args.out)
    _check_scenario_out(out, MARKER)
    if args.cores < 0:
        raise ScenarioError("--cores", args.cores, "must be >= 0 (0: one per thread)")
    quantum, measured = _quantum(args.quantum)
    migrate, balancer = _migrate(args.migrate, args.cores, quantum, args.slicing,
                                 list(args.run_dir))
    if args.common == "rhythm" and not args.quiet:
        print("common factors: fitted to the runs' rhythm where their workers kept one (up to "
              "12 simulations of the calibrated scenario, at most 20,000 updates each)...",
              flush=True)
    resolved = [Path(run).resolve() for run in args.run_dir]
    for index, run in enumerate(args.run_dir):
        if resolved[index] in resolved[:index]:
            raise AsyngradError(f"RUN = '{run}': given twice")
    counts = {run_workers(run) for run in args.run_dir}
    if len(counts) > 1 and args.speeds != "off":
        raise AsyngradError(f"--speeds = '{args.speeds}': fits one run (each worker on a core "
                            "of its own), not several worker counts")
    if len(counts) > 1 and args.episodes != "off":
        raise AsyngradError(f"--episodes = '{args.episodes}': fits one run or repeats of one "
                            "worker count, not several worker counts")
    if len(counts) > 1:
        scenario, report = calibrate_counts(args.run_dir, args.cores, quantum, args.slicing,
                                            args.convoys, args.common, args.interference,
                                            args.shared)
    else:  # one run, or repeats of one worker count fitted together
        scenario, report = calibrate(list(args.run_dir), args.pool, args.cores, quantum,
                                     args.slicing, args.convoys, args.common,
                                     args.interference, args.speeds, args.episodes,
                                     args.shared)
    if migrate:
        scenario = dataclasses.replace(scenario, devices=tuple(
            _migrating(d, migrate) for d in scenario.devices))
        report["migrate"] = balancer or f"{migrate / 1e6:.3g} ms between moves (given)"
    elif balancer:
        report["migrate"] = balancer
    if measured:
        report["time_slice"] = measured
    # Where the host put the runs' CPUs (real runs on a virtual machine): a scenario fitted
    # with the CPUs near each other predicts a run with them near.
    report["cpu_latency"] = {str(run): run_cpu_latency(run) for run in args.run_dir}
    text = calibrated_toml(scenario, report)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(text)
        staging.replace(out)
    except OSError as err:
        with contextlib.suppress(OSError):  # the staging file may never have been made
            staging.unlink(missing_ok=True)
        raise AsyngradError(f"--out = '{out}': cannot be written ({err.strerror or err})"
                            ) from None
    if not args.quiet:
        for line in text.splitlines()[1:]:
            if not line.startswith("#"):
                break
            print(line[2:])
        print(f"wrote {out}; simulate it with: asyngrad simulate {out} --out DIR")
    return 0


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
    cal = command("calibrate", "fit the simulator's timing model to a recorded (real) run",
                  _calibrate, scenario=False, out="scenario file to write (TOML)")
    cal.add_argument("run_dir", metavar="RUN", nargs="+",
                     help="a run directory (from asyngrad real, simulate or replay); repeats "
                          "of one run (same problem and worker count) are fitted together; "
                          "runs of one problem at different worker counts also fit the "
                          "contention between workers (a slowdown per other worker; pooled)")
    cal.add_argument("--pool", action="store_true",
                     help="one timing for all workers on one device (to predict other k)")
    cal.add_argument("--cores", type=int, default=0,
                     help="with --pool: the machine's cores, shared by the threads (0: one "
                          "per thread)")
    cal.add_argument("--quantum", default="0", metavar="NS",
                     help="with --cores: threads beyond the cores run in OS-like time slices "
                          "of NS ns (0: they take turns per action; auto: measure this "
                          "machine's slice)")
    cal.add_argument("--slicing", choices=SLICINGS, default="per_core",
                     help="time slices per core (each thread keeps its core, as Linux keeps "
                          "processes, until a core goes idle; default) or global (all threads "
                          "rotate over all cores)")
    cal.add_argument("--migrate", default=None, metavar="NS",
                     help="with --slicing per_core: the OS load balancer moves a waiting "
                          "thread to another core every NS ns on average (0: only to a core "
                          "left idle; auto: measure this machine's balancer). Default: auto "
                          "where it applies (--cores and --quantum given, per-core slicing, "
                          "and real runs of unpinned CPU processes that say they ran on this "
                          "host), else 0 (also when the measurement fails; the file says why)")
    for flag, default, what in (
            ("--convoys", "auto", "write convoys (overlapping writes that end together): fit "
             "them when the run shows them (for runs of one worker, in the meetings their "
             "probe made: real.write_meetings, from asyngrad real --probe), or, when its "
             "overlapping writes end apart, what their meetings lose (passing writes) (auto, "
             "default); convoys whenever "
             "writes met (on); neither (off)"),
            ("--common", "rhythm", "common factors (durations of one phase alike on workers "
             "that start it together): with one strength chosen so the simulation keeps the "
             "run's rhythm (rhythm, default: fitted only when the run's staleness is below "
             "0.95 of the independent-phase value, as compare reports it, and the simulation "
             "without them does not keep it; otherwise none), when some phase's "
             "correlation reaches 0.05 (auto), whenever two workers ran (on), or never "
             "(off)"),
            ("--interference", "auto", "slowdowns of a worker's phase under another's (a "
             "write while the other computes, say), with --pool or several worker counts "
             "(per-worker devices, or a device per core with --speeds kept, keep them in the "
             "durations): fit them when one reaches 0.1 "
             "(auto, default), whenever two workers ran (on), or never (off)"),
            ("--shared", "auto", "writes slowed on lines another worker read last "
             "([hardware.shared_lines]: the worker still holds them from its own read, no one "
             "wrote them since): fit the factor when it is 1.2x or more (or 1/1.2 or less) "
             "(auto, default), whenever two workers ran (on), or never (off)"),
            ("--speeds", "off", "with --pool and one worker per core (--cores = the run's "
             "workers): each core's own speed, from each worker's median gradient time (a "
             "busy sibling hyperthread or a throttled core runs a worker slower for the whole "
             "run): keep them when they differ by over 10%% (auto), always (on), or never "
             "(off, default); thread j is then simulated on core j mod cores"),
            ("--episodes", "off", "speed episodes: cores that switch to a slower pace for "
             "milliseconds at a time (the workers' gradient times in two levels): keep them "
             "when the levels are 1.2x or more apart and well separated (auto), whenever two "
             "levels are found (on), or never (off, default); one run")):
        choices = ("auto", "on", "rhythm", "off") if flag == "--common" else ("auto", "on", "off")
        cal.add_argument(flag, choices=choices, default=default, help=what)

    cmp = command("compare", "fidelity report of run B against run A (simulated or real)",
                  _compare, scenario=False, out="directory for compare.json and compare.png "
                  "(default runs/compare)", out_required=False)
    cmp.add_argument("run_a", help="a run directory")
    cmp.add_argument("run_b", help="another run directory of the same problem")
