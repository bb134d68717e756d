"""What a run will cost, judged before anything is built: memory, the simulated clock and
gradient work.

A scenario can be valid field by field and still be one no machine can run: 10¹² updates
(about 1.5 KB of trace each), a problem whose data alone is petabytes, a duration or a device
speed whose simulated time leaves the int64 nanosecond clock, or a local solve of 10¹⁸ steps
per update. :func:`preflight` refuses such a scenario with one line that names the field that
weighs most and the estimate, before any array is allocated or any draw is made (so a
scenario it lets through runs exactly as without it). The estimates are deliberately rough
(within a small factor): their job is to tell a run that fits from one that cannot, not to
predict the peak to the megabyte.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from simulator.errors import ScenarioError
from simulator.rules import unit_work
from simulator.scenario import PHASES

__all__ = ["CLOCK_LIMIT_NS", "GRADIENT_LIMIT", "available_memory", "check_memory",
           "check_problem", "max_updates",
           "memory_estimate", "parameters", "preflight", "problem_bytes", "size_text"]

# The engine's clock and the trace's times are int64 ns; a quarter of the range is kept as a
# margin for sums of times (a write's end plus a convoy's rest, a slice's end ...): 2^62 ns
# is 146 years of simulated time.
CLOCK_LIMIT_NS = 2 ** 62
# Gradient evaluations one run may make (updates × gradients per update): 2^40 ≈ 1.1·10¹²,
# about two weeks at a microsecond each, beyond any run this toolkit is for.
GRADIENT_LIMIT = 2 ** 40
# Bytes per trace row while the engine runs and the trace is built (a Python tuple of ~30
# values, its numpy columns and the bookkeeping lists), and per block operation of a row;
# measured on the default scenario at 40,000 updates (1.6 KB per update with 4 blocks).
ROW_BYTES = 1_400
OP_BYTES = 150
# Per virtual thread: its simpy process, local copy bookkeeping and schedule state (besides
# its dim-sized local vector).
THREAD_BYTES = 4_096
# Per thread and other thread of its device: the list of its peers (interference, slices).
PEER_BYTES = 40
# Per loss-curve checkpoint: the checkpoint grid (linspace, rounding, the list) and the curve's
# row; a scenario may ask for more points than updates, and the grid is made in full.
CURVE_BYTES = 64
# The normal score of the "largest plausible" duration draw (Φ(−8) ≈ 6·10⁻¹⁶).
_SCORE = 8.0


def available_memory() -> int:
    """This machine's available memory in bytes: /proc/meminfo's MemAvailable where there is
    one, else the physical pages available (os.sysconf)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 2 ** 63  # unknown: judge by the other limits only


def size_text(nbytes: float) -> str:
    """``nbytes`` in the largest decimal unit that keeps it >= 1 (e.g. 180 TB)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if nbytes < 1000 or unit == "EB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def parameters(spec: Any) -> int:
    """The length of a problem's parameter vector w, from its spec alone (real data sets
    have their dimension in the resolved spec)."""
    h, k, d = spec.hidden, spec.classes, spec.dim
    if spec.name == "mlp":
        return h * (d + 1) + k * (h + 1)
    if spec.name == "lstm_tagger":
        return d * h + 8 * h * h + 4 * h + k * h + k
    if spec.name == "dense_crf":
        return d * h + k * h + k + k * k + k
    return d


def problem_bytes(spec: Any) -> dict[str, float]:
    """Memory of building the problem a ``ProblemSpec`` describes, by the field that drives
    it: the data (with the synthetic held-out quarter and the temporaries of generating it)
    and the parameter-sized vectors of the optimum's solve."""
    n, d, params = spec.n_samples, spec.dim, parameters(spec)
    if spec.name == "sparse_logistic":
        nnz = max(1, round(spec.density * d))
        data = 1.25 * n * nnz * 24.0 + 8.0 * d * 4  # values, columns, CSR; per-sample choice
    elif spec.name in ("lstm_tagger", "dense_crf"):
        data = 1.25 * n * spec.length * 8.0 * (10 * spec.hidden + spec.classes + 2)
    else:  # dense rows (quadratic: and its thin SVD)
        data = (2.5 if spec.name == "quadratic" else 1.5) * n * d * 8.0
    parts = {"problem.n_samples": data if n >= d else 0.0,
             "problem.dim": (0.0 if n >= d else data) + 16 * 8.0 * params}
    return parts


def memory_estimate(scenario: Any) -> dict[str, float]:
    """Bytes a run of ``scenario`` needs, by the field that drives each part (problem data,
    trace rows, their block operations, threads, delay history, loss curve)."""
    run = scenario.run
    params = parameters(scenario.problem)
    parts = problem_bytes(scenario.problem)
    parts["run.updates"] = run.updates * ROW_BYTES
    parts["run.blocks"] = run.updates * OP_BYTES * run.blocks
    parts["run.threads"] = run.threads * (THREAD_BYTES + 8.0 * params + PEER_BYTES * run.threads)
    parts["inject.delay"] = (scenario.inject.max_delay + 1) * 8.0 * params
    parts["metrics.curve_points"] = (scenario.metrics.curve_points + 1) * CURVE_BYTES
    return parts


def max_updates() -> int:
    """The most updates one run can hold in this machine's available memory (the trace rows
    of a one-block run; the smallest problem and the rest are left out), capped at
    ``GRADIENT_LIMIT``."""
    return min(GRADIENT_LIMIT, available_memory() // (ROW_BYTES + OP_BYTES))


def check_memory(parts: dict[str, float], values: dict[str, Any]) -> None:
    """Refuse what ``parts`` (bytes by the field that asks for them) adds up to when it
    exceeds this machine's available memory, naming the field that weighs most with its
    value (``values``) and the estimate.

    Raises:
        ScenarioError: naming that field.
    """
    total, available = sum(parts.values()), available_memory()
    if total > available:
        field = max(parts, key=lambda name: parts[name])
        raise ScenarioError(field, values[field],
                            f"the run needs about {size_text(total)}, this machine has "
                            f"{size_text(available)} available")


def check_problem(spec: Any) -> None:
    """Refuse a problem whose data cannot fit in this machine's memory.

    Raises:
        ScenarioError: naming problem.dim or problem.n_samples, with the estimate.
    """
    check_memory(problem_bytes(spec), {"problem.dim": spec.dim,
                                        "problem.n_samples": spec.n_samples})


def _update_terms(scenario: Any, device: int) -> list[tuple[float, dict[str, float]]]:
    """The largest plausible duration (ns) of each part of one update on ``device`` (its
    four phases, with every factor that lengthens them, and its network messages), each with
    its factors by field: a draw in ms, every other factor as the multiple it applies."""
    spec, run = scenario.devices[device], scenario.run
    timing, hardware = scenario.timing_of(device), scenario.hardware_of(device)
    prefix = f"devices.{device}.timing" if spec.timing is not None else "timing"
    slow = timing.slowdown(run.threads)
    common = {f"devices.{device}.speed": 1 / spec.speed}
    if hardware.episodes is not None:
        common[f"{_table(scenario, device, 'episodes')}.factor"] = hardware.episodes.factor
    for i, straggler in enumerate(scenario.inject.stragglers):
        common[f"inject.stragglers.{i}.factor"] = max(straggler.factor, 1.0)
    interference = hardware.interference
    rows = (interference.slowdowns if interference is not None else None) or ((0.0,) * 4,) * 4
    under = _table(scenario, device, "interference")
    terms = []
    for index, phase in enumerate(("read", "grad", "write", "idle")):
        duration = getattr(timing, phase)
        key = next(k for k in ("mean", "high", "values") if k in duration.to_dict())
        factors = {**common, f"{prefix}.{phase}.{key}": duration.at_score(_SCORE) / 1e6,
                   f"{prefix}.{phase}_per_thread": slow[index],
                   f"{under}.{phase}_under_{PHASES[int(np.argmax(rows[index][:3]))]}":
                       1 + sum(rows[index])}
        if phase == "grad" and run.protocol in _WORK:
            factors[_WORK[run.protocol]] = _grad_work(scenario)
        if phase == "write" and hardware.shared_lines is not None:
            factors[f"{_table(scenario, device, 'shared_lines')}.factor"] = (
                hardware.shared_lines.factor)
        if phase == "write" and hardware.convoys is not None:
            factors[f"{_table(scenario, device, 'convoys')}.join"] = (
                1 + hardware.convoys.join + hardware.convoys.rest)
        terms.append((1e6 * math.prod(factors.values()), factors))
    link = {f"devices.{device}.latency": 2.0 * spec.latency,
            f"devices.{device}.bandwidth": (8.0 * parameters(scenario.problem) / spec.bandwidth
                                            if spec.bandwidth else 0.0)}
    if hardware.time_slices is not None:
        link[f"{_table(scenario, device, 'time_slices')}.quantum"] = (
            float(hardware.time_slices.quantum) * run.threads)
    terms.extend((value, {name: value}) for name, value in link.items())
    return terms


def _table(scenario: Any, device: int, name: str) -> str:
    """Where the device's hardware table ``name`` is set: its own, or the scenario's."""
    own = scenario.devices[device].hardware
    if own is not None and getattr(own, name) is not None:
        return f"devices.{device}.hardware.{name}"
    return f"hardware.{name}"


#: The field that sets how many gradients an update of a protocol computes.
_WORK = {"admm": "admm.local_steps", "paramserver": "paramserver.accumulate",
         "sandblaster": "sandblaster.units"}


def _grad_work(scenario: Any) -> int:
    """Gradients computed per update (local solves, accumulated pushes and Sandblaster's
    work units, ⌈n/U⌉ samples each, take several)."""
    if scenario.run.protocol == "admm":
        return scenario.admm.local_steps
    if scenario.run.protocol == "paramserver":
        return scenario.paramserver.accumulate
    if scenario.run.protocol == "sandblaster":  # (the spec's samples: an estimate)
        return unit_work(scenario.problem.n_samples, scenario.sandblaster.units)
    return 1


def _field_value(scenario: Any, field: str) -> Any:
    value: Any = scenario
    for part in field.split("."):
        value = value[int(part)] if part.isdigit() else getattr(value, part)
    return list(value) if isinstance(value, tuple) else value


def _check_clock(scenario: Any) -> None:
    """Refuse a run whose simulated time can leave the int64 ns clock: one update's largest
    plausible duration, or T of them (and the last pause), beyond ``CLOCK_LIMIT_NS``."""
    run = scenario.run
    waits = max((p.end for p in scenario.inject.pauses), default=0)
    for device in range(len(scenario.devices)):
        terms = _update_terms(scenario, device)
        update = sum(value for value, _ in terms)
        if not update < CLOCK_LIMIT_NS:
            factors = max(terms, key=lambda term: term[0])[1]
            field = max(factors, key=lambda name: factors[name])
            raise ScenarioError(field, _field_value(scenario, field),
                                f"one update can take about {update:.3g} ns of simulated "
                                f"time, beyond the int64 ns clock ({CLOCK_LIMIT_NS:.3g} ns)")
        if not update * run.updates + waits < CLOCK_LIMIT_NS:
            raise ScenarioError("run.updates", run.updates,
                                f"at up to {update:.3g} ns per update the run can last "
                                f"{update * run.updates:.3g} ns of simulated time, beyond "
                                f"the int64 ns clock ({CLOCK_LIMIT_NS:.3g} ns)")


def preflight(scenario: Any) -> None:
    """Refuse a scenario that cannot run here: its memory estimate exceeds this machine's
    available memory, its simulated time can leave the int64 ns clock, or it asks for more
    than ``GRADIENT_LIMIT`` gradient evaluations. Pure: reads the scenario and this
    machine's free memory, draws nothing.

    Raises:
        ScenarioError: naming the field that weighs most, with the estimate.
    """
    work = _grad_work(scenario)
    if scenario.run.updates * work > GRADIENT_LIMIT:
        field = ("run.updates" if scenario.run.updates > GRADIENT_LIMIT
                 else _WORK[scenario.run.protocol])
        raise ScenarioError(field, _field_value(scenario, field),
                            f"the run computes about {scenario.run.updates * work:.3g} "
                            f"gradients, more than {GRADIENT_LIMIT:.3g} (2^40, weeks at a "
                            "microsecond each)")
    values = {name: _field_value(scenario, name) for name in memory_estimate(scenario)}
    check_memory(memory_estimate(scenario), values)
    _check_clock(scenario)
