"""Trace-driven simulation: re-run the exact recorded samples and per-block durations.

With the trace's own scenario the replay reproduces the run bit for bit. Values that do not
shape the interleaving (learning rate, problem size and data, metrics) may change; the
protocol, thread, block and update counts, the split, the placement (and the seed that draws a
shuffled one) and the devices may not: the recorded durations already carry the devices'
speeds, and other contention or another split would change how many updates each thread
performs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.engine import simulate
from simulator.errors import ScenarioError, TraceError
from simulator.hardware.slices import sliced_devices
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.scenario import Scenario, apply_override, plain, scenario_from_dict, scenario_to_dict
from simulator.timing import ReplaySource
from simulator.trace import Trace

__all__ = ["FIXED_BY_TRACE", "load_trace", "replay", "replay_scenario", "replay_source"]

FIXED_BY_TRACE = ("protocol", "threads", "blocks", "updates", "split", "placement")
# Other fields that shape the interleaving (or are already inside the recorded durations).
FIXED_SECTIONS = {"paramserver": ("staleness_limit", "accumulate", "warm_start", "fraction",
                                  "rebalance", "rebalance_after", "lock_free"),
                  "admm": ("local_steps",),
                  "sandblaster": ("units",),
                  "inject": ("stragglers", "pauses", "deaths"),
                  "hardware": ("convoys.join", "convoys.rest", "convoys.end_gap",
                               "convoys.end_catch_up", "shared_lines.factor", "time_slices",
                               "episodes")}


def load_trace(path: str | Path) -> Trace:
    """A trace from a ``trace.npz`` file or a run directory holding one."""
    path = Path(path)
    return Trace.load(path / "trace.npz" if path.is_dir() else path)


def replay_source(trace: Trace) -> ReplaySource:
    """Each thread's recorded (sample, read durations, gradient duration, write durations,
    idle before the update)."""
    threads = int(trace["thread"].max()) + 1 if len(trace) else 0
    order = np.lexsort((trace["thread_seq"], trace["thread"]))
    per_thread: list[list[tuple[int, list[int], int, list[int], int]]] = [
        [] for _ in range(threads)]
    reads, writes = trace["op_read_ns"], trace["op_write_ns"]
    # A run with write convoys recorded the drawn write durations too: the convoys
    # stretch them again exactly as they did.
    writes = trace.arrays.get("extra_write_drawn_ns", writes)
    for row in order.tolist():
        ops = trace.ops_of(row)
        per_thread[int(trace["thread"][row])].append(
            (int(trace["sample"][row]), reads[ops].tolist(), int(trace["grad_ns"][row]),
             writes[ops].tolist(), int(trace["idle_ns"][row])))
    return ReplaySource(per_thread)


def replay_scenario(trace: Trace, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """The trace's scenario with ``key=value`` overrides that keep its interleaving.

    Raises:
        TraceError: the embedded scenario cannot be read.
        ScenarioError: an override changes what the trace fixes (``FIXED_BY_TRACE``, the
            seed where it draws part of the interleaving, the devices, ``FIXED_SECTIONS``),
            or is invalid.
    """
    import tomllib
    try:
        data = tomllib.loads(trace.scenario_toml)
    except tomllib.TOMLDecodeError as err:
        raise TraceError(f"trace: embedded scenario is not valid TOML ({err})") from None
    original = scenario_from_dict(data)
    for text in overrides:
        apply_override(data, text)
    scenario = scenario_from_dict(data)
    for name in FIXED_BY_TRACE:
        if getattr(scenario.run, name) != getattr(original.run, name):
            raise ScenarioError(f"run.{name}", getattr(scenario.run, name),
                                f"is fixed by the trace ({getattr(original.run, name)})")
    drawn = _seed_draws(original)
    if drawn is not None and scenario.run.seed != original.run.seed:
        raise ScenarioError("run.seed", scenario.run.seed,
                            f"draws {drawn}, so it is fixed by the trace ({original.run.seed})")
    if scenario.devices != original.devices:
        raise ScenarioError("devices", scenario_to_dict(scenario)["devices"],
                            "are fixed by the trace")
    for section, names in FIXED_SECTIONS.items():
        for name in names:
            now, then = (_value(x, f"{section}.{name}") for x in (scenario, original))
            if now != then:
                shown = plain(now) if now is not None else "unset"
                raise ScenarioError(f"{section}.{name}", shown, "is fixed by the trace")
    _check_pool(trace, scenario, original)
    return scenario


def _check_pool(trace: Trace, scenario: Scenario, original: Scenario) -> None:
    """A simulated trace's durations carry the link's latency without a server pool and not
    with one (the pool spends it in flight): a replay may change S, not whether there is a
    pool, where a device has a latency. (A real trace's durations hold its latencies and
    waits whatever it ran: replayed without a pool, every event comes back in place.)

    Raises:
        ScenarioError: naming ``paramserver.servers``.
    """
    now, then = scenario.paramserver.servers, original.paramserver.servers
    if (trace.source != "real" and (now == 0) != (then == 0)
            and scenario.run.protocol == "paramserver"
            and any(d.latency for d in scenario.devices)):
        raise ScenarioError("paramserver.servers", now, f"the trace's durations "
                            f"{'carry' if then == 0 else 'leave out'} the link's latency "
                            f"(recorded with servers = {then}): a replay may change the "
                            "number of servers, not whether there is a pool, where a device "
                            "has a latency")


def _seed_draws(scenario: Scenario) -> str | None:
    """What of the interleaving ``run.seed`` draws beyond the recorded durations and
    samples (None: nothing): a shuffled placement, or the load balancer's moves of per-core
    time slices (``migrate`` > 0) on a device with fewer cores than threads, the only
    devices sliced (``simulator.hardware.slices``)."""
    if scenario.run.placement == "shuffled":
        return "the shuffled placement"
    threads = make_protocol(scenario.run.protocol, scenario).threads(scenario.run)
    for device in sliced_devices(scenario, threads):
        slices = scenario.hardware_of(device).time_slices
        assert slices is not None
        if slices.slicing == "per_core" and slices.migrate > 0:
            return "the load balancer's moves (hardware.time_slices.migrate)"
    return None


def _value(scenario: Scenario, dotted: str) -> object:
    """The value at a dotted path of ``scenario`` (None where a table on the way is
    unset)."""
    value: object = scenario
    for part in dotted.split("."):
        value = getattr(value, part) if value is not None else None
    return value


def _check_rows(trace: Trace, threads: int) -> None:
    """Raise TraceError where a row cannot be replayed: a negative sample, a thread the
    scenario does not have (its updates would never run), a negative duration."""
    columns = {"sample": trace["sample"], "thread": trace["thread"],
               "grad_ns": trace["grad_ns"], "idle_ns": trace["idle_ns"],
               "op_read_ns": trace["op_read_ns"], "op_write_ns": trace["op_write_ns"]}
    for name, values in columns.items():
        high = threads - 1 if name == "thread" else None
        bad = np.flatnonzero((values < 0) | (values > high if high is not None else False))
        if bad.size:
            allowed = f"in 0..{high}" if high is not None else ">= 0"
            raise TraceError(f"trace: {name}[{int(bad[0])}] = {int(values[bad[0]])}: must be "
                             f"{allowed} to be replayed")


def replay(trace: Trace, overrides: list[str] | tuple[str, ...] = (),
           ) -> tuple[Scenario, Problem, Trace]:
    """Re-run a trace's interleaving; returns the scenario, problem and new trace.

    Raises:
        TraceError: the trace ran under a scheduler (its durations count steps, and
            replayed as durations they give another run: its schedule replays it), a
            thread died in it (its abandoned update has no row to replay), or its embedded
            scenario cannot be read.
        ScenarioError: an override changes what the trace fixes, or is invalid.
    """
    if trace.source == "scheduled":
        raise TraceError("trace: recorded under a scheduler (source 'scheduled'), so its "
                         "durations count steps: replay its schedule with --schedule (explore "
                         "writes it to worst.schedule)")
    dead = trace.arrays.get("extra_dead_threads")
    if dead is not None and len(dead):
        raise TraceError(f"trace: thread(s) {', '.join(map(str, dead.tolist()))} died in this "
                         "run, and a dead thread's abandoned update has no row, so a replay "
                         "cannot reproduce the run")
    scenario = replay_scenario(trace, overrides)
    problem = make_problem(scenario.problem)
    _check_rows(trace, make_protocol(scenario.run.protocol, scenario).threads(scenario.run))
    if len(trace) and int(trace["sample"].max()) >= problem.n_samples:
        raise ScenarioError("problem.n_samples", problem.n_samples,
                            f"the trace uses sample {int(trace['sample'].max())}")
    replayed = simulate(scenario, problem, replay_source(trace))
    replayed.source = "replay"
    return scenario, problem, replayed
