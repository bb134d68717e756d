"""Controlled interleavings: a scheduler, not sampled durations, decides who acts next.

The timing engine shows what typical timings produce; the interesting interleavings are often
rare. Here the engine's own loop runs with a scheduler as its time source
(``simulator.clock.Scheduled``): every protocol, its update cut into atomic actions — one
block read, the gradient, one block load, one block store (``load_store``) or one block add
(``atomic_add``) — and at each step the scheduler picks the thread that performs its next
action. A run is fully described by its scenario and its schedule, the sequence of
chosen threads, written compactly as ``0x3.1.0x2`` (thread 0 three times, then 1, then 0
twice); replaying a schedule reproduces the run bit for bit.

Schedulers:

* ``random``: uniform among the runnable threads, seeded;
* ``roundrobin``: the runnable threads in turn;
* ``pct``: probabilistic concurrency testing (Burckhardt et al. 2010): random distinct thread
  priorities, d − 1 priority change points drawn uniformly among the run's steps; at each
  step the highest-priority runnable thread acts, and at the i-th change point the acting
  thread drops to priority i (below every initial one). A bug of depth d is found with
  probability at least 1/(n·k^(d−1)) per run (n steps, k threads);
* ``fixed``: follows a given schedule;
* ``dfs``: exhaustive enumeration (``enumerate_schedules``): every interleaving of a small
  case, optionally with at most c preemptions (switching away from a thread that could
  still act), resumable from a checkpoint file;
* ``adversarial``: greedy search (``greedy_schedule``): at each step, the thread whose action
  leads to the largest objective when the run then goes on without preemption.

Time in the resulting trace counts steps: the action at step s spans [s, s + 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.budget import preflight
from simulator.clock import refuse_unscheduled
from simulator.engine import Engine
from simulator.errors import ScenarioError
from simulator.metrics import relative_error
from simulator.problems import Problem, make_problem
from simulator.protocols import make_protocol
from simulator.scenario import Scenario, scenario_to_toml
from simulator.timing import sample_stream
from simulator.trace import Trace

__all__ = ["OBJECTIVES", "OPTIONS", "SCHEDULERS", "Property", "Scheduler", "enumerate_schedules",
           "explore", "format_schedule", "greedy_schedule", "parse_schedule",
           "refuse_options", "run_schedule", "search_violation", "shrink"]

MAX_STEPS = 10_000_000  # the longest schedule read (a controlled run's steps: ~4 an update)
SCHEDULERS = ("random", "roundrobin", "pct", "fixed", "dfs", "adversarial")
PROPERTY_SCHEDULERS = ("random", "roundrobin", "pct")  # those --property searches with


def format_schedule(choices: list[int]) -> str:
    """``[0, 0, 0, 1, 0, 0]`` → ``"0x3.1.0x2"``."""
    parts: list[str] = []
    i = 0
    while i < len(choices):
        j = i
        while j < len(choices) and choices[j] == choices[i]:
            j += 1
        parts.append(f"{choices[i]}x{j - i}" if j - i > 1 else str(choices[i]))
        i = j
    return ".".join(parts)


def parse_schedule(text: str) -> list[int]:
    """The inverse of :func:`format_schedule`.

    Raises:
        ScenarioError: not of the form ``T[xN].T[xN]...`` with integers T >= 0, N >= 1
            written in ASCII digits.
    """
    choices: list[int] = []
    for part in text.strip().split(".") if text.strip() else []:
        thread, sep, count = part.partition("x")
        # Only ASCII digits: str.isdigit() also accepts '²' (int() then fails) and '٣'.
        if not _digits(thread) or (sep and (not _digits(count) or int(count) < 1)):
            raise ScenarioError("--schedule", text, f"has a bad part {part!r} (expected "
                                "THREAD or THREADxCOUNT, separated by dots)")
        times = int(count) if count else 1
        if len(choices) + times > MAX_STEPS:  # (before building it: 0x10**12 is 8 TB)
            raise ScenarioError("--schedule", text[:60], f"has more than {MAX_STEPS:,} steps")
        choices.extend([int(thread)] * times)
    return choices


def _digits(text: str) -> bool:
    """``text`` is a non-empty run of ASCII digits."""
    return text.isascii() and text.isdigit()


class Scheduler:
    """Chooses the thread that acts at each step of one run (it keeps that run's state:
    ``chosen``, the schedule so far; a new run takes a new scheduler)."""

    rng: np.random.Generator  # random and pct only

    def __init__(self, kind: str, threads: int, seed: int = 0, depth: int = 1,
                 steps: int = 1, schedule: list[int] | None = None) -> None:
        if kind not in SCHEDULERS:
            raise ScenarioError("--scheduler", kind, f"must be one of {', '.join(SCHEDULERS)}")
        if depth < 1:
            raise ScenarioError("--depth", depth, "must be >= 1")
        if seed < 0:
            raise ScenarioError("--seed", seed, "must be >= 0")
        self.kind, self.threads = kind, threads
        if kind in ("random", "pct"):  # only these draw (seeding costs ≈ 20 µs a run)
            self.rng = np.random.default_rng([seed, 0x5C4ED])
        self.schedule = schedule or []
        self.step = 0
        self.last = -1
        self.chosen: list[int] = []  # the schedule so far
        self.preemptions = 0  # in it (:func:`_preempts`)
        self.seen: list[list[int]] = []  # dfs: the runnable threads at each step
        self._uniform: list[float] = []  # random: uniform draws on [0, 1), in chunks
        if kind == "pct":
            # Initial priorities d .. d+k−1 (distinct, random order); change points get 1..d−1.
            self.priority = (self.rng.permutation(threads) + depth).tolist()
            points = self.rng.choice(max(steps, depth), size=depth - 1, replace=False)
            self.changes = {int(p): depth - 1 - i for i, p in enumerate(sorted(points))}

    def choose(self, runnable: list[int]) -> int:
        """The thread that acts now (``runnable`` is sorted and not empty)."""
        step, self.step = self.step, self.step + 1
        if self.kind == "dfs":  # the prefix, then keep the running thread while it can act
            self.seen.append(list(runnable))
            if step < len(self.schedule):
                choice = self.schedule[step]
                if choice not in runnable:
                    raise ScenarioError("--schedule", format_schedule(self.schedule),
                                        f"picks thread {choice} at step {step}, which cannot "
                                        f"act (runnable: {runnable})")
            else:
                choice = self.last if self.last in runnable else runnable[0]
        elif self.kind == "random":
            if not self._uniform:
                self._uniform = self.rng.random(32).tolist()[::-1]
            choice = runnable[int(self._uniform.pop() * len(runnable))]
        elif self.kind == "roundrobin":
            later = [t for t in runnable if t > self.last]
            choice = later[0] if later else runnable[0]
        elif self.kind == "pct":
            choice = max(runnable, key=lambda t: self.priority[t])
            if step in self.changes:
                self.priority[choice] = self.changes[step]
        else:
            if step >= len(self.schedule):
                raise ScenarioError("--schedule", format_schedule(self.schedule),
                                    f"ends after {len(self.schedule)} steps; the run needs more")
            choice = self.schedule[step]
            if choice not in runnable:
                raise ScenarioError("--schedule", format_schedule(self.schedule),
                                    f"picks thread {choice} at step {step}, which cannot act "
                                    f"(runnable: {runnable})")
        self.preemptions += _preempts(self.chosen, step, choice, runnable)
        self.last = choice
        self.chosen.append(choice)
        return choice


@dataclass
class ScheduledRun:
    """A finished controlled run: its trace, the schedule that produced it and the
    preemptions in that schedule (switches away from a thread that could still act)."""

    trace: Trace
    schedule: list[int]
    problem: Problem
    preemptions: int

    @property
    def text(self) -> str:
        return format_schedule(self.schedule)


def run_schedule(scenario: Scenario, scheduler: Scheduler | Callable[[int], Scheduler],
                 problem: Problem | None = None) -> ScheduledRun:
    """Run ``scenario`` under ``scheduler``.

    Raises:
        ScenarioError: a field the scheduler cannot honour, or a schedule that does not fit
            the run.
    """
    return _Shared(scenario, problem).run(scheduler)


class _Shared:
    """What every controlled run of one scenario shares: the problem, the scenario text the
    traces carry and each thread's samples (drawn once, then read by index: a thread's i-th
    update takes its stream's i-th sample whatever the schedule)."""

    def __init__(self, scenario: Scenario, problem: Problem | None = None) -> None:
        preflight(scenario)  # checked once here, then by no run (Engine checked=True)
        refuse_unscheduled(scenario)
        self.scenario, self.text = scenario, scenario_to_toml(scenario)
        self.problem = problem if problem is not None else make_problem(scenario.problem)
        run = scenario.run
        self.threads = make_protocol(run.protocol, scenario).threads(run)
        self._streams = [sample_stream(run.seed, self.threads, t, self.problem.n_samples)
                         for t in range(self.threads)]
        self._samples: list[list[int]] = [[] for _ in range(self.threads)]

    def sample(self, thread: int, seq: int) -> int:
        """The sample of ``thread``'s ``seq``-th update."""
        drawn = self._samples[thread]
        while len(drawn) <= seq:
            drawn.append(int(self._streams[thread].take()))
        return drawn[seq]

    def run(self, scheduler: Scheduler | Callable[[int], Scheduler]) -> ScheduledRun:
        """One run under ``scheduler`` (or a factory of one, given the thread count)."""
        if callable(scheduler) and not isinstance(scheduler, Scheduler):
            scheduler = scheduler(self.threads)
        steps = _Steps(self)
        engine = Engine(self.scenario, self.problem, steps, choose=scheduler.choose,
                        text=self.text, checked=True)
        steps.writes(engine)
        trace = engine.run()
        if scheduler.kind == "fixed" and scheduler.step < len(scheduler.schedule):
            raise ScenarioError("--schedule", format_schedule(scheduler.schedule),
                                f"has {len(scheduler.schedule)} steps; the run ended after "
                                f"{scheduler.step} (a schedule of another scenario?)")
        return ScheduledRun(trace, scheduler.chosen, self.problem, scheduler.preemptions)


class _Steps:
    """The engine's duration source under a scheduler: the shared samples, and the steps
    each phase takes, as the trace records them: one per block read, one for the gradient,
    per block write one add (``atomic_add``) or a load and a store (``load_store``), per
    grain with ``run.store_grain``."""

    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self._seq = [0] * shared.threads
        self._store, self._grain, self._dim = 1, 0, shared.problem.dim

    def writes(self, engine: Engine) -> None:
        """Take the write mode and grain of ``engine``'s run."""
        self._store = 1 if engine.atomic else 2
        self._grain = 0 if engine.atomic else self.shared.scenario.run.store_grain

    def next_sample(self, thread: int) -> int:
        seq, self._seq[thread] = self._seq[thread], self._seq[thread] + 1
        return self.shared.sample(thread, seq)

    def remaining(self, thread: int) -> int | None:
        return None

    def durations(self, thread: int, fractions: Sequence[float]) -> tuple[list[int], int,
                                                                          list[int]]:
        if not self._grain:
            return [1] * len(fractions), 1, [self._store] * len(fractions)
        return [1] * len(fractions), 1, [self._store * -(-round(f * self._dim) // self._grain)
                                         for f in fractions]

    def idle(self, thread: int) -> int:
        return 0

    def coupled(self, thread: int) -> bool:
        return False

    def slowness(self, thread: int, t: int) -> float:
        return 1.0

    def place(self, thread: int, core: int) -> None:
        pass

    def at(self, thread: int, phase: int, t: int) -> list[int]:
        raise AssertionError("a scheduled run draws no durations")

    def done(self, thread: int) -> None:
        pass


def _log10_interleavings(steps: list[int], shared: bool) -> float:
    """log10 of the orderings of one run's steps, ``steps[i]`` of them by thread i (N in
    all, k threads): k^N where the threads share the updates (``run.split = "shared"``:
    each thread's part of the N steps may change from schedule to schedule), else the
    multinomial N!/(n_0!···n_{k−1}!).

    An upper bound on the number of schedules when every schedule takes N steps (and, split
    evenly, each thread its n_i): lock-free protocols on dense problems without drops. Gates
    (a lock, a barrier, a turn), drops and sparse updates can make a schedule longer, so
    there it is an estimate.
    """
    n = sum(steps)
    if shared:
        return n * math.log10(max(len(steps), 1))
    return (math.lgamma(n + 1) - sum(math.lgamma(s + 1) for s in steps)) / math.log(10)


def _lost_fraction(t: Trace, f_star: float) -> float:
    moved = np.diff(t["op_offsets"])
    return float(np.max(t["lost_blocks"] / np.maximum(moved, 1), initial=0.0))


OBJECTIVES: dict[str, Callable[[Trace, float], float]] = {
    "lost_fraction": _lost_fraction,
    "grad_error": lambda t, f_star: float(np.max(relative_error(t), initial=0.0)),
    "staleness": lambda t, f_star: float(t["staleness"].max(initial=0)),
    "lost_blocks": lambda t, f_star: float(t["lost_blocks"].sum()),
    "suboptimality": lambda t, f_star: float(t["curve_loss"][-1] - f_star),
}


def _objective(scenario: Scenario, name: str,
               flag: str = "--objective") -> Callable[[Trace, float], float]:
    """The objective ``name``'s measure on a trace of ``scenario``.

    Raises:
        ScenarioError: an unknown objective, or ``grad_error`` where the runs measure no
            gradient error (``metrics.exact`` off, or a protocol whose updates are not SGD
            steps: the serialized view's δ is off and every run would score 0).
    """
    if name not in OBJECTIVES:
        raise ScenarioError(flag, name, f"must be one of {', '.join(OBJECTIVES)}")
    if name == "grad_error":
        protocol = scenario.run.protocol
        if not scenario.metrics.exact:
            raise ScenarioError(flag, name, "needs the exact metrics (metrics.exact = true): "
                                "without them no run measures a gradient error")
        if not make_protocol(protocol, scenario).exact_view:
            raise ScenarioError(flag, name, f"is not measured under {protocol}: its updates "
                                "are not SGD steps, so the serialized view has no gradient "
                                "error to score")
    return OBJECTIVES[name]


def _identical(shared: _Shared, text: str, objective: str,
               value: float) -> tuple[ScheduledRun, bool]:
    """Run schedule ``text`` twice and compare every array of the two traces (a check for
    nondeterminism the schedule does not control) and the objective with ``value`` (NaN
    equals NaN: a diverged run replays too); returns the run and the verdict."""
    runs = [shared.run(Scheduler("fixed", shared.threads, schedule=parse_schedule(text)))
            for _ in range(2)]
    same = all(np.array_equal(values, runs[1].trace[name], equal_nan=True)
               for name, values in runs[0].trace.arrays.items())
    again = OBJECTIVES[objective](runs[0].trace, runs[0].problem.optimum()[1])
    return runs[0], (same and runs[0].text == runs[1].text == text
                     and bool(np.array_equal(again, value, equal_nan=True)))


def explore(scenario: Scenario, kind: str, runs: int, objective: str, depth: int = 1,
            seed: int = 0, keep: int = 5, progress: Callable[[int], object] | None = None,
            preemptions: int | None = None, checkpoint: str | None = None,
            ) -> tuple[dict[str, Any], ScheduledRun]:
    """Run ``runs`` schedules of ``kind`` and keep the ``keep`` worst by ``objective``
    (largest value); the worst one is run again to check that it reproduces bit for bit.
    Returns the report and that rerun.

    Raises:
        ScenarioError: an unknown scheduler or objective (or one the runs do not
            measure: :func:`_objective`), runs or keep < 1, depth < 1, preemptions or a
            checkpoint with a scheduler other than dfs.
    """
    measure = _objective(scenario, objective)
    refuse_options(kind, {"--preemptions": preemptions, "--checkpoint": checkpoint})
    if kind == "fixed":
        raise ScenarioError("--scheduler", kind, "replays one schedule: use asyngrad replay "
                            "--schedule")
    if kind == "adversarial":
        result, value, tried = greedy_schedule(scenario, objective, progress)
        again, same = _identical(_Shared(scenario, result.problem), result.text, objective,
                                 value)
        return {"scenario": scenario.name, "scheduler": kind, "objective": objective,
                "runs": tried, "steps_per_run": len(result.schedule),
                "values": {"mean": value, "p50": value, "max": value, "min": value},
                "worst": [{"value": value, "schedule": result.text}],
                "replayed_identically": same}, again
    if kind == "dfs":  # every interleaving (up to runs = the limit), then replay the worst
        report = enumerate_schedules(scenario, objective, preemptions, runs, checkpoint,
                                     progress)
        text = report["worst"][0]["schedule"]
        again, same = _identical(_Shared(scenario), text, objective,
                                 report["worst"][0]["value"])
        report["replayed_identically"] = same
        return report, again
    for name, count in (("--runs", runs), ("--keep", keep)):
        if count < 1:
            raise ScenarioError(name, count, "must be >= 1")
    shared = _Shared(scenario)
    f_star = shared.problem.optimum()[1]
    threads = shared.threads
    # Steps of a run, for pct's change points: every update's actions.
    probe = shared.run(Scheduler("roundrobin", threads))
    steps = len(probe.schedule)
    found: list[tuple[float, int, str]] = []
    values = []
    for run in range(runs):
        result = shared.run(Scheduler(kind, threads, seed + run, depth, steps))
        value, text = measure(result.trace, f_star), result.text
        values.append(value)
        if all(text != kept for _, _, kept in found):
            found.append((value, seed + run, text))
        found.sort(key=lambda item: (-item[0], item[1]))
        del found[keep:]
        if progress:
            progress(1)
    worst_value, _, worst_text = found[0]
    again, deterministic = _identical(shared, worst_text, objective, worst_value)
    return {
        "scenario": scenario.name, "scheduler": kind,
        "depth": depth if kind == "pct" else None, "runs": runs,
        "seed": _drawn(kind, seed), "objective": objective, "steps_per_run": steps,
        "threads": threads,
        "log10_interleavings_estimate": _log10_interleavings(
            [probe.schedule.count(t) for t in range(threads)], scenario.run.split == "shared"),
        "values": _spread(values, 0.5),
        "worst": [{"value": value, "seed": _drawn(kind, run_seed), "schedule": text}
                  for value, run_seed, text in found],
        "replayed_identically": bool(deterministic),
    }, again


# The options of ``asyngrad explore`` each scheduler honours; one given to any other is
# refused, not ignored. A --property search honours --runs, --seed and --depth the same way.
# roundrobin draws nothing: its one schedule is the same every run.
OPTIONS = {"--runs": ("random", "pct", "dfs"), "--seed": ("random", "pct"),
           "--depth": ("pct",), "--keep": ("random", "pct"),
           "--preemptions": ("dfs",), "--checkpoint": ("dfs",)}


def _drawn(kind: str, seed: int) -> int | None:
    """A scheduler's seed as reported: None for one that draws nothing."""
    return seed if kind in OPTIONS["--seed"] else None


def refuse_options(kind: str, given: dict[str, Any]) -> None:
    """Refuse an option (``given``: flag to value, None where not given) that the scheduler
    ``kind`` would ignore: only pct has a depth, random and pct a seed, dfs a preemption
    bound and a checkpoint; adversarial runs as many schedules as its search takes,
    roundrobin one (it draws nothing), and dfs keeps only the worst.

    Raises:
        ScenarioError: an unknown scheduler, or an option given that ``kind`` does not
            honour.
    """
    if kind not in SCHEDULERS:
        raise ScenarioError("--scheduler", kind, f"must be one of {', '.join(SCHEDULERS)}")
    for flag, value in given.items():
        if value is not None and kind not in OPTIONS[flag]:
            raise ScenarioError(flag, value, f"applies to --scheduler "
                                f"{' or '.join(OPTIONS[flag])} only (not {kind})")


def enumerate_schedules(scenario: Scenario, objective: str, preemptions: int | None = None,
                        limit: int | None = None, checkpoint: str | None = None,
                        progress: Callable[[int], object] | None = None) -> dict[str, Any]:
    """Every interleaving of ``scenario`` (depth-first, by re-execution), or those with at
    most ``preemptions`` preemptions; stops after ``limit`` schedules, saving where it was to
    ``checkpoint`` (a JSON file) so that a later call resumes there. Reports the exact worst
    schedule by ``objective`` and the distribution of its values over the schedules run.

    The checkpoint records what it was made for (the scenario as TOML, the objective and
    the preemption bound); it resumes only a call for the same three.

    Raises:
        ScenarioError: an unknown objective (or one the runs do not measure),
            preemptions < 0, limit < 1, or a checkpoint that is not one or was made for
            another scenario, objective or preemption bound.
    """
    measure = _objective(scenario, objective)
    if preemptions is not None and preemptions < 0:
        raise ScenarioError("--preemptions", preemptions, "must be >= 0")
    if limit is not None and limit < 1:
        raise ScenarioError("--limit", limit, "must be >= 1")
    shared = _Shared(scenario)
    f_star = shared.problem.optimum()[1]
    threads = shared.threads
    # The DFS stack: per step of the current path, the runnable threads, the ones tried,
    # and the preemptions up to and including that step.
    stack: list[tuple[list[int], list[int], int]] = []
    prefix: list[int] = []
    values: list[float] = []
    worst: tuple[float, str] | None = None
    state = Path(checkpoint) if checkpoint else None
    made_for = {"scenario": shared.text, "objective": objective, "preemptions": preemptions}
    if state is not None and state.is_file():
        saved = _resume(state, made_for)
        stack = [(list(a), list(b), int(c)) for a, b, c in saved["stack"]]
        prefix, values = saved["prefix"], saved["values"]
        worst = (saved["worst"][0], saved["worst"][1]) if saved["worst"] else None
    done = False
    ran = 0
    while True:
        scheduler = Scheduler("dfs", threads, schedule=prefix)
        result = shared.run(scheduler)
        path, seen = result.schedule, scheduler.seen
        count = stack[-1][2] if stack else 0
        for step in range(len(stack), len(path)):
            count += _preempts(path, step, path[step], seen[step])
            stack.append((seen[step], [path[step]], count))
        value = measure(result.trace, f_star)
        values.append(value)
        if worst is None or value > worst[0]:
            worst = (value, result.text)
        ran += 1
        if progress:
            progress(1)
        following = _backtrack(stack, path, preemptions)
        if following is None:
            done = True
            break
        prefix = following
        if limit is not None and ran >= limit:
            break
    if state is not None:
        if done:
            state.unlink(missing_ok=True)
        else:
            state.write_text(json.dumps({"made_for": made_for, "stack": stack,
                                         "prefix": prefix, "values": values,
                                         "worst": list(worst) if worst else None}))
    assert worst is not None
    return {"scenario": scenario.name, "scheduler": "dfs", "objective": objective,
            "preemptions": preemptions, "complete": done, "schedules": len(values),
            "threads": threads, "values": _histogram(values),
            "worst": [{"value": worst[0], "schedule": worst[1]}]}


def _resume(state: Path, made_for: dict[str, Any]) -> dict[str, Any]:
    """The saved search in checkpoint ``state``, if it was made for ``made_for``.

    Raises:
        ScenarioError: the file is not a dfs checkpoint, or was made for another scenario,
            objective or preemption bound (its search would not be this one's).
    """
    try:
        saved = json.loads(state.read_text())
        made = saved["made_for"]
        if not isinstance(made, dict) or {"stack", "prefix", "values", "worst"} - set(saved):
            raise KeyError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise ScenarioError("--checkpoint", str(state), "is not a checkpoint of this "
                            "version's dfs (delete it to start over)") from None
    for key, flag in (("scenario", ""), ("objective", "--objective"),
                      ("preemptions", "--preemptions")):
        then, now = made.get(key, "?"), made_for[key]
        if then != now:
            shown = ("another scenario" if not flag else
                     f"{flag} {'any' if then is None else then}, not "
                     f"{'any' if now is None else now}")
            raise ScenarioError("--checkpoint", str(state), f"was made for {shown} (use "
                                "another file, or delete it to start over)")
    return saved


def _preempts(path: list[int], step: int, thread: int, runnable: list[int]) -> int:
    """1 when choosing ``thread`` at ``step`` switches away from the thread of the step
    before while that one could still act (a preemption), else 0."""
    return int(step > 0 and thread != path[step - 1] and path[step - 1] in runnable)


def _backtrack(stack: list[tuple[list[int], list[int], int]], path: list[int],
               preemptions: int | None) -> list[int] | None:
    """The next prefix of the depth-first search after ``path``: the deepest step with an
    untried runnable thread within the preemption bound, that thread chosen there (its
    entry on ``stack`` updated, deeper ones popped); None when every one was tried."""
    while stack:
        step = len(stack) - 1
        runnable, tried, _ = stack[-1]
        before = stack[step - 1][2] if step else 0
        options = [t for t in runnable if t not in tried and (
            preemptions is None or before + _preempts(path, step, t, runnable) <= preemptions)]
        if options:
            tried.append(options[0])
            stack[-1] = (runnable, tried, before + _preempts(path, step, options[0], runnable))
            return [*path[:step], options[0]]
        stack.pop()
    return None


def _histogram(values: list[float]) -> dict[str, Any]:
    """The spread of the objective over the schedules run, with a 10-bin histogram of its
    finite values."""
    finite = np.asarray(values)[np.isfinite(values)]
    counts, edges = (np.histogram(finite, bins=10) if finite.size
                     else (np.zeros(0, int), np.zeros(0)))
    return {**_spread(values, 0.5, 0.95), "histogram": counts.tolist(),
            "edges": edges.tolist(), "not_finite": len(values) - int(finite.size)}


def _spread(values: list[float], *quantiles: float) -> dict[str, float]:
    """Mean, quantiles, max and min of the objective over the schedules run (a run that
    diverged gives inf or NaN: they stay in, without floating-point warnings)."""
    spread = np.asarray(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        return {"mean": float(spread.mean()),
                **{f"p{round(100 * q)}": float(np.quantile(spread, q)) for q in quantiles},
                "max": float(spread.max()), "min": float(spread.min())}


_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b, ">": lambda a, b: a > b,
}


@dataclass(frozen=True)
class Property:
    """``METRIC OP VALUE`` over a run, e.g. ``lost_fraction <= 0.5`` (no update loses more
    than half its blocks) or ``suboptimality <= 0.1`` (after the scenario's T updates)."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Property:
        """Raises ScenarioError naming ``--property`` for anything else."""
        for op in ("<=", ">=", "<", ">"):
            metric, sep, value = text.partition(op)
            if sep:
                metric = metric.strip()
                try:
                    number = float(value)
                except ValueError:
                    number = math.nan
                if metric in OBJECTIVES and math.isfinite(number):
                    return cls(metric, op, number)
                break
        raise ScenarioError("--property", text, "must look like METRIC OP VALUE with METRIC "
                            f"one of {', '.join(OBJECTIVES)} and OP one of <=, >=, <, >")

    def holds(self, trace: Trace, f_star: float) -> bool:
        return _OPS[self.op](OBJECTIVES[self.metric](trace, f_star), self.value)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def _runs_of(schedule: list[int]) -> list[tuple[int, int]]:
    return [(int(p.split("x")[0]), int(p.split("x")[1]) if "x" in p else 1)
            for p in format_schedule(schedule).split(".") if p]


def _expand(runs: list[tuple[int, int]]) -> list[int]:
    return [thread for thread, count in runs for _ in range(count)]


def shrink(scenario: Scenario, prop: Property, schedule: list[int],
           problem: Problem | None = None) -> tuple[list[int], ScheduledRun]:
    """A minimal prefix that still violates ``prop``: the run follows the prefix, then lets
    each thread run until it cannot act (no further preemption).

    Prefixes are written as runs of one thread (``0x3.1``) and ordered by their number of
    runs, then of steps. From ``schedule``, the first strictly smaller candidate that still
    violates replaces the current prefix, until none does; the candidates, in this order:
    the prefix cut after each of its runs (shortest first), the prefix without one of its
    runs, the prefix with one of its runs a step shorter, the prefix with two adjacent runs
    swapped (smaller only where that merges runs). Minimal means exactly that: no such
    candidate of the result violates ``prop`` (a local minimum; a smaller counterexample
    that none of these moves reaches may exist). The search is deterministic.

    Raises:
        ScenarioError: ``schedule`` does not violate ``prop``.
    """
    shared = _Shared(scenario, problem)
    f_star = shared.problem.optimum()[1]

    def violates(prefix: list[int]) -> ScheduledRun | None:
        try:
            result = shared.run(Scheduler("dfs", shared.threads, schedule=prefix))
        except ScenarioError:  # the prefix picks a thread that cannot act there
            return None
        return None if prop.holds(result.trace, f_star) else result

    best = violates(schedule)
    if best is None:
        raise ScenarioError("--schedule", format_schedule(schedule),
                            f"does not violate {prop}")
    runs = _runs_of(schedule)
    changed = True
    while changed:
        changed = False
        # Shortest prefixes first, then single removals (a run of one thread, or one step of
        # a run), then swaps of adjacent runs (which merge runs of the same thread).
        candidates = [runs[:j] for j in range(len(runs))]
        candidates += [runs[:i] + runs[i + 1:] for i in range(len(runs))]
        candidates += [[*runs[:i], (thread, count - 1), *runs[i + 1:]]
                       for i, (thread, count) in enumerate(runs) if count > 1]
        candidates += [[*runs[:i], runs[i + 1], runs[i], *runs[i + 2:]]
                       for i in range(len(runs) - 1)]
        size = (len(runs), sum(count for _, count in runs))
        for candidate in candidates:
            merged = _runs_of(_expand(candidate))
            if (len(merged), sum(count for _, count in merged)) >= size:
                continue  # only strictly smaller prefixes: the search always ends
            result = violates(_expand(candidate))
            if result is not None:
                runs, best, changed = merged, result, True
                break
    return _expand(runs), best


def search_violation(scenario: Scenario, prop: Property, kind: str, runs: int,
                     depth: int = 2, seed: int = 0,
                     progress: Callable[[int], object] | None = None,
                     ) -> dict[str, Any]:
    """Run schedules of ``kind`` until one violates ``prop``; shrink it. The report holds the
    violating schedule, the minimal counterexample (``counterexample``: the shrunk prefix,
    after which each thread runs until it cannot act; ``counterexample_schedule``: the whole
    schedule that run executed, which replays as written), its metric and its preemptions
    (``counterexample_preemptions``: switches away from a thread that could still act;
    ``counterexample`` is None when every run satisfied the property).

    Raises:
        ScenarioError: a metric the runs do not measure, a scheduler other than random,
            roundrobin or pct, runs < 1.
    """
    measure = _objective(scenario, prop.metric, "--property")
    if kind not in PROPERTY_SCHEDULERS:
        raise ScenarioError("--scheduler", kind, "with --property must be one of "
                            f"{', '.join(PROPERTY_SCHEDULERS)}")
    if runs < 1:
        raise ScenarioError("--runs", runs, "must be >= 1")
    shared = _Shared(scenario)
    f_star = shared.problem.optimum()[1]
    threads = shared.threads
    probe = shared.run(Scheduler("roundrobin", threads))
    steps = len(probe.schedule)
    report: dict[str, Any] = {"scenario": scenario.name, "property": str(prop),
                              "scheduler": kind, "depth": depth if kind == "pct" else None,
                              "counterexample": None}
    for run in range(runs):
        result = shared.run(Scheduler(kind, threads, seed + run, depth, steps))
        if progress:
            progress(1)
        if not prop.holds(result.trace, f_star):
            minimal, shrunk = shrink(scenario, prop, result.schedule, shared.problem)
            report.update(
                runs_until_found=run + 1, found=result.text,
                found_value=measure(result.trace, f_star),
                counterexample=format_schedule(minimal),
                counterexample_schedule=shrunk.text,
                counterexample_value=measure(shrunk.trace, f_star),
                counterexample_preemptions=shrunk.preemptions,
                run=shrunk)
            return report
    report["runs_until_found"] = None
    return report


def greedy_schedule(scenario: Scenario, objective: str,
                    progress: Callable[[int], object] | None = None,
                    ) -> tuple[ScheduledRun, float, int]:
    """Build a schedule step by step, each time choosing the runnable thread that maximises
    ``objective`` of the run completed without further preemption (ties: the lowest thread).
    Returns the run, its objective and how many runs the search took."""
    measure = _objective(scenario, objective)
    shared = _Shared(scenario)
    f_star = shared.problem.optimum()[1]
    threads = shared.threads
    prefix: list[int] = []
    tried = 0
    while True:
        scheduler = Scheduler("dfs", threads, schedule=prefix)
        current = shared.run(scheduler)
        tried += 1
        if len(prefix) >= len(current.schedule):
            return current, measure(current.trace, f_star), tried
        best: tuple[float, int] | None = None
        for thread in scheduler.seen[len(prefix)]:
            run = shared.run(Scheduler("dfs", threads, schedule=[*prefix, thread]))
            tried += 1
            value = measure(run.trace, f_star)
            if best is None or value > best[0]:
                best = (value, thread)
        assert best is not None
        prefix.append(best[1])
        if progress:
            progress(1)
