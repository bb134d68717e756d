"""Calibration: fit the simulator's timing model to a recorded run.

From a run directory (real or simulated) this module fits, per worker and per operation, the
distribution of durations the simulator draws from, and writes a normal scenario whose
devices carry the fitted timings (one device per worker, so worker r is simulated by thread
r with worker r's own timing).

Each hardware model has its own fitter module in this package (convoys, passing, common,
rhythm, interference, shared, stores, speeds, episodes); this module runs them in order,
each on the durations the earlier ones took their effect out of, and puts what they fitted
on the devices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import AsyngradError, ScenarioError
from simulator.fidelity.common import common_fits
from simulator.fidelity.contention import contention, per_thread
from simulator.fidelity.convoys import fit_convoys, forms_convoys, probed_meetings, usable_convoys
from simulator.fidelity.durations import fit_phase
from simulator.fidelity.episodes import fit_episodes
from simulator.fidelity.interference import fit_interference
from simulator.fidelity.rhythm import with_rhythm
from simulator.fidelity.runs import (
    alone_samples,
    alone_writes,
    deflated,
    median_write,
    operation_samples,
    pooled_samples,
    read_run,
    running_together,
)
from simulator.fidelity.shared import fit_shared
from simulator.fidelity.speeds import at_speed_one, core_speeds
from simulator.fidelity.stores import fit_store_window
from simulator.metrics import trace_rhythm
from simulator.rundir import run_shared_write, run_write_meetings
from simulator.scenario import (
    DeviceSpec,
    HardwareSpec,
    Scenario,
    plain,
    spec_from_dict,
    upgrade_device,
)
from simulator.trace import Trace

PHASES = ("read", "grad", "write", "idle")

# Interference acts among the threads of one device; devices of one thread each lose it.
_APART = ("{}: interference acts only among threads of one device, so the durations keep "
          "it as measured")
_PER_WORKER = _APART.format("per-worker devices (no --pool)")
_PER_CORE = _APART.format("a device per core (--speeds kept)")


@dataclass(frozen=True)
class Models:
    """What every calibration fits before the durations: each hardware model's report, and
    the runs as the durations are then fitted (trace with the fitted effects taken out, the
    rows every worker ran, the writes that met no other when convoys were fitted)."""

    convoy: dict[str, Any]
    sharing: dict[str, Any]
    stores: dict[str, Any]
    bins: dict[str, Any]
    common: dict[str, Any]
    slowed: dict[str, Any]
    runs: list[tuple[Trace, np.ndarray, np.ndarray | None]]

    def timing(self, **fields: Any) -> dict[str, Any]:
        """A device's plain timing of ``fields`` (the durations) with every model's fitted
        fields (in the old flat keys: ``_device`` moves them to the hardware tables)."""
        timing = {name: plain(value) for name, value in fields.items()}
        for report in (self.convoy, self.common, self.slowed, self.sharing, self.stores):
            if report.get("fields"):
                timing.update(report["fields"])
        return timing

    def report(self) -> dict[str, Any]:
        """The models' part of the fit report."""
        return {"convoys": self.convoy, "common": self.common,
                "interference": _public(self.slowed), "shared": _public(self.sharing),
                "stores": self.stores}


def fit_models(loaded: list[tuple[Path, Trace, Scenario]], convoys: str, shared: str,
               common: str, interference: str, cores: int, quantum: int,
               episode: dict[str, Any] | None = None, apart: str | None = None) -> Models:
    """The hardware models of one or more runs, each fitted on the durations the ones before
    it took their effect out of: convoys and shared lines (fitted with the writes'
    slowdowns unless ``interference`` is off), the store window, then (after the speed
    ``episode``'s slow rows and the shared writes are deflated) common factors and
    interference; ``apart`` (why each thread will have a device of its own, where
    interference does not act): interference is not fitted, the durations keep it, and
    ``write_shared`` is the marked writes' median over the others' (a joint factor would
    leave the marked writes' slowdown under the other's gradient to a model that is off)."""
    traces = [trace for _, trace, _ in loaded]
    spans = [running_together(trace) for trace in traces]
    convoy, sharing, scales = _convoys_and_shared(list(zip(traces, spans, strict=True)),
                                                  convoys, shared, cores, quantum,
                                                  [path for path, _, _ in loaded],
                                                  interference != "off" and apart is None)
    stores = fit_store_window([trace for _, trace, run in loaded
                               if run.hardware.sweeping_reads is not None])
    if episode is not None and episode["fields"]:  # the durations at the cores' own pace
        own = 1 / episode["fields"]["slow_factor"]
        traces = [deflated(trace, {phase: (rows, np.full(rows.size, own)) for phase in PHASES})
                  for trace, rows in zip(traces, episode["slow_rows"], strict=True)]
    if sharing["fields"]:  # the marked writes as drawn
        traces = [deflated(trace, factors)
                  for trace, factors in zip(traces, sharing["deflate"], strict=True)]
    runs = [(trace, together, alone_writes(trace, together) if forms_convoys(convoy) else None)
            for trace, together in zip(traces, spans, strict=True)]
    bins, common_fit = common_fits(runs, common)
    slowed = fit_interference(runs, "off" if apart else interference, scales)
    if apart and interference != "off":
        slowed["why"] = apart
    return Models(convoy, sharing, stores, bins, common_fit, slowed, runs)


def run_samples(models: Models, scenarios: list[Scenario]) -> list[dict[int, dict[str, Any]]]:
    """Per run, per worker: the durations to fit (:func:`operation_samples`) as drawn with
    the others idle; with convoys, the writes' times alone (the write alone: convoys stretch
    it again)."""
    per_run = []
    for index, ((trace, together, alone_rows), scenario) in enumerate(
            zip(models.runs, scenarios, strict=True)):
        if models.slowed["deflate"] and models.slowed["deflate"][index]:
            trace = deflated(trace, models.slowed["deflate"][index])
        mine = operation_samples(trace, scenario, together)
        if alone_rows is not None:
            alone = alone_samples(trace, scenario, together)
            for worker, ops in mine.items():
                ops.update(alone[worker])
        per_run.append(mine)
    return per_run


def _device(name: str, timing: dict[str, Any], cores: int, quantum: int, slicing: str,
            sweep: bool, **fields: Any) -> DeviceSpec:
    """A calibrated device: the machine's cores and time slices (preemptive), the fitted
    timing and hardware models (``sweep``: with the store window of reads that see the
    writes in flight)."""
    data = {"name": name, "cores": cores, "timing": timing, **fields}
    if quantum:
        data.update(quantum=quantum, slicing=slicing, preempt=True)
    return spec_from_dict(DeviceSpec, upgrade_device(data, sweep), "devices")


def _calibrated(scenario: Scenario, devices: list[DeviceSpec]) -> Scenario:
    """``scenario`` on the calibrated ``devices``, which hold every fitted model; of the
    run's own hardware tables only its reads that see writes in flight stay. The recorded
    durations already contain stragglers and network links: they are dropped."""
    hardware = HardwareSpec(sweeping_reads=scenario.hardware.sweeping_reads)
    return replace(scenario, name=f"{scenario.name}-calibrated", devices=tuple(devices),
                   hardware=hardware, inject=replace(scenario.inject, stragglers=()))


def _sweeps(loaded: list[tuple[Path, Trace, Scenario]]) -> bool:
    """Whether the runs' reads saw the writes in flight."""
    return any(run.hardware.sweeping_reads is not None for _, _, run in loaded)


def _check_repeats(loaded: list[tuple[Path, Trace, Scenario]], speeds: str) -> None:
    """Repeats of one run: one problem, block count and worker count; no ``speeds``."""
    base_path, _, scenario = loaded[0]
    for path, _, other in loaded[1:]:
        if (other.problem, other.run.blocks, other.run.threads) != (
                scenario.problem, scenario.run.blocks, scenario.run.threads):
            raise AsyngradError(f"calibrate: {path} is not a repeat of {base_path} (another "
                                "problem, block count or worker count)")
    if len(loaded) > 1 and speeds != "off":
        raise AsyngradError(f"--speeds = '{speeds}': fits one run (which core was slow "
                            "changes between runs: --episodes fits that)")


def _check_staged(scenario: Scenario) -> None:
    """Refuse a model-parallel run: its stages' phases are forwards and backwards of shares
    of the model, which the data-parallel timing model does not describe.

    Raises:
        ScenarioError: naming run.protocol.
    """
    from simulator.protocols import PROTOCOLS

    protocol = scenario.run.protocol
    if protocol in PROTOCOLS and PROTOCOLS[protocol].owns_loop:
        raise ScenarioError("run.protocol", protocol, "a model-parallel run's phases are "
                            "its stages' forwards and backwards, which calibrate does not fit "
                            "(simulate the scenario with its own timing)")


def calibrate(run_dir: str | Path | list[str | Path], pool: bool = False, cores: int = 0,
              quantum: int = 0, slicing: str = "per_core",
              convoys: str = "auto", common: str = "off",
              interference: str = "off", speeds: str = "off",
              episodes: str = "off", shared: str = "off") -> tuple[Scenario, dict[str, Any]]:
    """The calibrated scenario of a run directory, or of repeats of one run (several run
    directories of one problem at one worker count, fitted together), and the fit report.

    ``pool`` fits one timing to all workers together and puts every thread on one device
    with ``cores`` cores (0: one per thread): the form to predict other worker counts on the
    same machine, where threads beyond the cores time-share them (per action, or in time
    slices of ``quantum`` ns as an OS scheduler does, rotating per core or over all cores
    as ``slicing`` says, preemptively: a slice's end stops an action midway).
    ``convoys``: fit write convoys when found (``auto``), whenever there are pairs to fit
    (``on``), or never (``off``); ``common``: likewise for common
    factors (``auto`` keeps them when some phase's c reaches 0.05; off unless asked for:
    see docs/fidelity.md for what they do to a prediction); ``interference``: likewise for
    the slowdowns of one worker's phases under another's (``auto`` keeps them when one
    reaches 0.1), the durations then fitted as drawn with the others idle (with ``pool``
    only: without it each worker has a device of its own, where interference does not act,
    so none is fitted and the durations keep it as measured); ``speeds`` (with
    ``pool``, one worker per core, one run): each core's own speed (:func:`core_speeds`), so
    the simulation puts thread j on a device of one core with core j mod ``cores``'s speed;
    ``episodes``: the cores' speed episodes (:func:`fit_episodes`; ``auto`` keeps them when
    found), taken out of every duration before the rest is fitted; ``shared``: likewise for
    ``[hardware.shared_lines]`` (:func:`fit_shared`; ``auto`` keeps a factor of 1.2 or more, or
    1/1.2 or less), taken out of the marked writes before the rest is fitted. Repeats add up: every
    fit sees the updates of all of them (a core's pace that changes between runs but holds
    within one shows as long episodes).

    Raises:
        AsyngradError: not a run directory, an unreadable trace, fewer than 2 updates,
            repeats of different problems, block or worker counts, ``speeds`` with repeats,
            or a model-parallel run.
    """
    paths = [Path(d) for d in (run_dir if isinstance(run_dir, list) else [run_dir])]
    loaded = [(path, *read_run(path)) for path in paths]
    _check_repeats(loaded, speeds)
    scenario = loaded[0][2]
    _check_staged(scenario)
    episode = fit_episodes([trace for _, trace, _ in loaded], episodes)
    apart = _PER_WORKER if not pool and any(  # each worker on a device of its own
        np.unique(trace["thread"]).size > 1 for _, trace, _ in loaded) else None
    models = fit_models(loaded, convoys, shared, common, interference, cores, quantum,
                        episode, apart)
    samples = _worker_samples(models, loaded)
    pace: dict[str, Any] = (core_speeds(samples, scenario.run.threads, cores, speeds) if pool
            else {"kept": False, "why": "per-worker timings (no --pool) carry each one's speed"})
    if pace["kept"] and models.slowed.get("fields"):
        # A device per core: the interference taken out of the durations would never act
        # again, so the durations keep it (the speeds from them, as kept before).
        models = fit_models(loaded, convoys, shared, common, interference, cores, quantum,
                            episode, _PER_CORE)
        samples = _worker_samples(models, loaded)
        pace = core_speeds(samples, scenario.run.threads, cores, "on")
    if pace["kept"]:
        samples = at_speed_one(samples, pace["speeds"])
    if pool:
        samples = {-1: pooled_samples(samples)}
    devices, fits = [], {}
    for worker, ops in samples.items():
        fitted = {op: fit_phase(ops, op) for op in PHASES}
        name = "all workers" if worker < 0 else f"worker {worker}"
        fits[name] = {op: fit.describe() for op, fit in fitted.items()}
        devices.append(_device(name.replace(" ", ""),
                               models.timing(**{op: f.duration for op, f in fitted.items()}),
                               cores, quantum, slicing, _sweeps(loaded),
                               **(episode["fields"] or {})))
    if pace["kept"]:  # one device per core, thread j on device j mod cores
        devices = [replace(devices[0], name=f"core{j}", cores=1, speed=speed)
                   for j, speed in enumerate(pace["speeds"])]
    calibrated, report = _finish(loaded, paths, _calibrated(scenario, devices), models,
                                 fits, common, repeats=True)
    runs = [(trace, rows) for trace, rows, _ in models.runs]
    return calibrated, {**report, "contention": contention(runs), "speeds": pace,
                        "episodes": _public(episode)}


def _worker_samples(models: Models, loaded: list[tuple[Path, Trace, Scenario]]
                    ) -> dict[int, dict[str, np.ndarray]]:
    """Each worker's duration samples per phase over the runs, with the models' effects
    taken out."""
    per_run = run_samples(models, [run for _, _, run in loaded])
    return {worker: {op: np.concatenate([mine[worker][op] for mine in per_run])
                     for op in ops} for worker, ops in per_run[0].items()}


def _finish(loaded: list[tuple[Path, Trace, Scenario]], paths: list[Path],
            calibrated: Scenario, models: Models, fits: dict[str, Any], common: str,
            repeats: bool) -> tuple[Scenario, dict[str, Any]]:
    """The calibrated scenario, with ``--common rhythm``'s common factors fitted to the
    runs' rhythm (of repeats, their mean at the longest one's length; of several worker
    counts, each run's), and the fit report."""
    rhythms = {_rhythm_key(path, run, len(loaded) > 1 and repeats): trace_rhythm(trace)
               for path, trace, run in loaded}
    common_fit = models.common
    if common == "rhythm":
        if repeats:
            couplings = [r["coupling"] for r in rhythms.values() if r["coupling"] is not None]
            wanted = [(loaded[0][2].run.threads, max(len(t) for _, t, _ in loaded),
                       float(np.mean(couplings)) if couplings else None)]
        else:
            wanted = [(run.run.threads, len(trace), rhythm["coupling"])
                      for (_, trace, run), rhythm in zip(loaded, rhythms.values(), strict=True)]
        calibrated, common_fit = with_rhythm(calibrated, wanted, models.bins)
    return calibrated, {
        "source": loaded[0][1].source, "run": ", ".join(str(path) for path in paths),
        "fits": fits, "rows_fitted": int(sum(rows.size for _, rows, _ in models.runs)),
        "rows": sum(len(trace) for trace, _, _ in models.runs), **models.report(),
        "common": common_fit, "rhythm": rhythms}


def _rhythm_key(path: Path, run: Scenario, named: bool) -> str:
    """A run's key in the report's rhythm: its worker count (and, among repeats, its name)."""
    return f"{run.run.threads} ({path.name})" if named else str(run.run.threads)


def calibrate_counts(run_dirs: list[str | Path], cores: int = 0, quantum: int = 0,
                     slicing: str = "per_core", convoys: str = "auto",
                     common: str = "off", interference: str = "off", shared: str = "off",
                     ) -> tuple[Scenario, dict[str, Any]]:
    """One pooled timing fitted from runs of one problem at two or more worker counts, with
    the contention between them as a slowdown per other worker.

    For each of read, gradient, write (whole-vector durations) and the local work between
    updates (idle), the mean duration of every run (the updates made while all its workers
    ran) is fitted by least squares as b·(1 + x·(k − 1)) over the worker counts k: x (at
    least 0) is the scenario's ``*_per_thread`` and the distribution is the one fitted on
    the fewest-worker run with its draws divided by 1 + x·(k_min − 1), i.e. one worker
    alone. Everything lands on one device with ``cores`` cores (0: one per thread) and
    time slices of ``quantum`` ns (``slicing`` as in :func:`calibrate`). Write convoys are
    fitted from the runs' pairs together; with convoys, the write means are those of the
    time a write runs alone, met writes censored at the meeting (:func:`write_survival`).
    Common factors are fitted from the runs' pairs of phases
    together (runs of one worker have none), and so are interference, whose fitted
    slowdowns are taken out of every duration before the means are compared, and
    ``write_shared`` (``shared``, :func:`fit_shared`), taken out of the marked writes.

    Raises:
        AsyngradError: fewer than two runs, a repeated worker count, runs of different
            problems or block counts, or a run directory that cannot be read.
    """
    if len(run_dirs) < 2:
        raise AsyngradError("calibrate: contention needs runs at two or more worker counts")
    loaded = sorted(((Path(d), *read_run(Path(d))) for d in run_dirs),
                    key=lambda item: item[2].run.threads)
    counts = [scenario.run.threads for _, _, scenario in loaded]
    if len(set(counts)) != len(counts):
        raise AsyngradError(f"calibrate: the runs' worker counts {counts} repeat; give one "
                            "run per worker count (repeats of a single count are fitted "
                            "together)")
    base_path, _, base = loaded[0]
    for path, _, scenario in loaded[1:]:
        if scenario.problem != base.problem or scenario.run.blocks != base.run.blocks:
            raise AsyngradError(f"calibrate: {path} trains another problem or block count "
                                f"than {base_path}")
    models = fit_models(loaded, convoys, shared, common, interference, cores, quantum)
    pooled = [pooled_samples(mine) for mine in run_samples(models, [s for _, _, s in loaded])]
    timing, found, fits = per_thread(counts, pooled)
    device = _device("allworkers", models.timing(**timing), cores, quantum, slicing,
                     _sweeps(loaded))
    calibrated, report = _finish(loaded, [Path(d) for d in run_dirs],
                                 _calibrated(base, [device]), models,
                                 {f"all workers at k = {counts[0]}": fits}, common,
                                 repeats=False)
    return calibrated, {**report, "worker_counts": counts, "contention": found}


def _convoys_and_shared(runs: list[tuple[Trace, np.ndarray]], convoys: str, shared: str,
                        cores: int, quantum: int, paths: list[Path], interference: bool
                        ) -> tuple[dict[str, Any], dict[str, Any], list[np.ndarray] | None]:
    """The convoy report (:func:`fit_convoys`; from the runs' probes, read from ``paths``,
    when every run has one worker: :func:`probed_meetings`), the ``write_shared`` one
    (:func:`fit_shared`, on the writes' times alone when convoys form, with the writes'
    ``interference``; from the probes too when every run has one worker) and per run each
    row's write factor (None when not fitted); with a factor the convoys are fitted again
    with it."""
    alone = all(np.unique(trace["thread"]).size < 2 for trace, _ in runs)
    if alone and convoys != "off":
        convoy = probed_meetings([run_write_meetings(path) for path in paths], convoys,
                                 median_write(runs) or None)
    else:
        convoy = fit_convoys(runs, convoys)
    sharing = fit_shared(runs, shared, censor=forms_convoys(convoy),
                         probes=[run_shared_write(path) for path in paths],
                         interference=interference)
    if not sharing["fields"]:
        return usable_convoys(convoy, cores, quantum), sharing, None
    factor = sharing["fields"]["write_shared"]
    if forms_convoys(convoy) and not alone:
        convoy = fit_convoys(runs, convoys, factor)
    scales = []
    for (trace, _), deflate in zip(runs, sharing["deflate"], strict=True):
        scale = np.ones(len(trace))
        scale[deflate["write"][0]] = factor
        scales.append(scale)
    return usable_convoys(convoy, cores, quantum), sharing, scales


def _public(report: dict[str, Any]) -> dict[str, Any]:
    """A fit report without its working arrays."""
    return {key: value for key, value in report.items() if key not in ("deflate", "slow_rows")}
