"""What each real backend honours: the one table, and the check every real run makes first.

A real run either honours a scenario field, records in its resolved ``scenario.toml`` what
the hardware did instead (the run's flags decide it), leaves it inert (it belongs to a
protocol the backend does not run), or refuses it before anything starts: one
:class:`ScenarioError` naming the field, the value and the backend (exit 2 on the command
line). Backends: ``shm`` (CPU workers on a shared tensor, processes or threads), ``cuda``
(the same loop on a CUDA device) and ``ps`` (the torch.distributed parameter server).
``docs/semantics.md`` shows :data:`SUPPORT` as :func:`support_markdown` renders it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from simulator.errors import ScenarioError
from simulator.scenario import (
    HardwareSpec,
    InjectSpec,
    ParamServerSpec,
    Scenario,
    SweepingReadsSpec,
    TimingSpec,
    plain,
    with_overrides,
)

__all__ = ["BACKENDS", "PROTOCOL_OF", "RULE_MODES", "SUPPORT", "recorded",
           "refuse_torch_injections", "refuse_unmeasurable", "refuse_unsupported",
           "support_markdown"]

BACKENDS = ("shm", "cuda", "ps")
#: The simulator protocol each real mode runs (``ps`` runs ``paramserver`` or ``admm``).
PROTOCOL_OF = {"lockfree": "lockfree", "blocklock": "lockfree", "locked": "locked",
               "serial": "serial", "minibatch": "minibatch", "allreduce": "minibatch",
               "roundrobin": "roundrobin",
               "staleness_lr": "staleness_lr",
               "dcasgd": "dcasgd", "admm": "admm", "paramserver": "paramserver",
               "amp": "amp", "local": "local", "block_admm": "block_admm",
               "sandblaster": "sandblaster"}
#: Lock-free modes whose workers apply an update rule when their write begins.
RULE_MODES = ("staleness_lr", "dcasgd")
#: Modes whose workers take their updates in synchronous rounds.
ROUND_MODES = ("minibatch", "allreduce")
#: Model-parallel modes: one CPU process per stage (``realrun.pipeline``), which keep the
#: simulator's split and write mode (each stage alone writes its block).
PIPELINE_MODES = ("amp", "local", "block_admm")
#: The injections stage processes run (``realrun.worker.Slowed``: each phase stretched, held
#: in a pause, or the stage stopped by its death).
PIPELINE_INJECTIONS = ("stragglers", "pauses", "deaths")
#: Real-run modes whose writes are atomic per block (a lock per block write; ADMM's pushes).
ATOMIC_MODES = ("blocklock", "admm")

_SIMULATED_MACHINE = ("describes the simulated machine; a real run has the hardware itself "
                      "(asyngrad calibrate fits it from a real run)")
_NO_INJECTION = {"cuda": "CUDA and thread workers inject stragglers, pauses and deaths, not "
                 "into their updates (simulate it)",
                 "admm": "real ADMM workers inject delays, drops, rounded stores and stalls, "
                 "no errors (the simulator's admm adds none to its local solves)",
                 "ps-admm": "the parameter server's ADMM injects delays, drops, rounded "
                 "stores and stalls, no errors (the simulator's admm adds none to its local "
                 "solves)",
                 "pipeline": "stage processes inject stragglers, pauses and deaths, not into "
                 "their messages or updates (simulate it)"}
#: Why the ps backend's ADMM and Sandblaster refuse every ``[paramserver]`` option.
_NO_SERVER_OPTIONS = {
    "admm": "the simulator's admm has no server options: each push is applied whole, as it "
    "arrives (run.protocol = admm)",
    "sandblaster": "the simulator's sandblaster has no server options: its coordinator "
    "applies one L-BFGS step per round of work units, on one server (run.protocol = "
    "sandblaster)"}

#: Field (or section) → (shm and cuda, ps): what a real run does with it.
SUPPORT: tuple[tuple[str, str, str], ...] = (
    ("`name`, `problem.*`", "honoured", "honoured"),
    ("`run.protocol`", "recorded: the mode's (`lockfree`, `locked`, `serial`; on CPU worker "
     "processes also `minibatch` (`--mode minibatch`: a barrier in shared memory; "
     "`--mode allreduce`: a torch.distributed all-reduce), `roundrobin`, `staleness_lr`, "
     "`dcasgd` and `admm`; on torch workers (CUDA, threads) also `staleness_lr`); `amp`, "
     "`local` and `block_admm` with `--mode` their own (`realrun.pipeline`: one CPU process "
     "per stage, pipes between neighbours; under `block_admm` shared auxiliary variables "
     "instead); another non-default one refused",
     "recorded: `paramserver`, or `admm` or `sandblaster` where `run.protocol` says so (the "
     "server is Sandblaster's coordinator); another non-default one refused"),
    ("`run.threads`", "recorded: `--workers` (`amp`, `local`, `block_admm`: refused unless "
     "the stages, one process each)", "recorded: `--workers` (trainers)"),
    ("`run.updates`", "honoured: gradients computed (one per update), T split evenly (`amp`, "
     "`local`: (stage, sample) rows, as the simulator counts them; `block_admm`: a count "
     "both stages take their updates from, so a slower stage makes fewer)",
     "honoured: gradients computed (the server hands out the budget; `accumulate` n pushes "
     "n at a time); under `admm` pushes, each one row and one local solve of "
     "`admm.local_steps` gradients, as the simulator's admm counts them; under "
     "`sandblaster` work units, each one row and ⌈n/U⌉ gradients"),
    ("`run.lr`, `run.seed`", "honoured", "honoured"),
    ("`run.blocks`", "honoured", "refused unless 1 (the server holds one shard), or with a "
     "pool of S servers unless S (one shard each)"),
    ("`run.write_mode`", "recorded: `atomic_add` for `blocklock` and `admm`, else "
     "`load_store` (`amp`, `local`, `block_admm`: as set, inert: each stage alone writes its "
     "block); "
     "`atomic_add` refused with `lockfree` (under `locked` and `serial` one update writes at "
     "a time, so both modes store the same values)", "inert (pushes are applied whole)"),
    ("`run.lr_schedule`", "honoured: the factor at m = the updates a worker sees completed "
     "when its write begins, + 1 (a round's: exact)",
     "honoured: the server's factor at m = the versions applied when a push arrives + 1 (a "
     "round's: when it closes), as the simulator's server takes it; with a pool the "
     "coordinating server's, at m = the pushes it received + 1 when a push's shard 0 "
     "arrives, sent back to the trainer, which scales the other shards' parts by it"),
    ("`run.split`", "recorded: `even` (`amp`, `local`, `block_admm`: refused unless "
     "`shared`)",
     "refused unless `shared`"),
    ("`[hardware.sweeping_reads]`", "recorded: set (dense), unset (sparse, `minibatch`, "
     "`roundrobin`, `amp`, `local`, `block_admm`); a "
     "`lead` or `tail` other than 0 refused", "recorded: unset; as for shm"),
    ("`run.store_grain`, `run.placement`", "refused unless default", "refused unless default"),
    ("`[timing]`, `[[devices]]` (but a device's `name`), the other `[hardware.*]` tables",
     "refused unless default", "refused unless default"),
    ("`metrics.exact`, `metrics.every`", "recorded: `--measure` measures every "
     "`metrics.every`-th update, `--measure-every N` every N-th (`amp`, `local`, "
     "`block_admm`: each measured row's δ on its stage, from the stages' steps)",
     "recorded: as for shm (`admm`, `sandblaster`: no row measured, as simulated: their "
     "steps are not SGD steps; the loss curve is exact)"),
    ("`metrics.curve_points`", "honoured with `--measure` (the simulator's checkpoints); "
     "without: copies of the live vector, at most one per 10 ms poll, each once T / "
     "`curve_points` more updates were counted and only if none was counted during the copy",
     "honoured"),
    ("`[inject]`", "on CPU worker processes: `delay` (with `delay_dist`, "
     "`delay_max`), `error` (with `error_bound`, `error_relative`), `drop` and `write_bits` "
     "honoured, drawn by the simulator's injector (each update's delay, error and drop are the "
     "simulator's thread's; a delayed read copies the vector τ completions back from a "
     "history of the last completions' vectors); `pauses` honoured before an "
     "update's read; `stragglers` honoured: each phase takes `factor` (>= 1) times as long (a "
     "read's copy and a write's stores at its end); `deaths` honoured: the worker stops "
     "before its first update after its time (with `roundrobin` it keeps its turn for good, "
     "as the simulator's dead thread does: every other worker stops there, every write "
     "before that turn made, and the run ends early; one stopped that way with a death of "
     "its own is dead too); in rounds "
     "(`minibatch`, `allreduce`) all of these as the simulator's minibatch: τ counts rounds, "
     "a round's one write (worker 0's; the simulator's: the last to arrive) is lost where "
     "its writer's draw drops it and stretched where its writer straggles, and a death "
     "leaves the dead worker's round waiting for good: every other worker stops there and "
     "the run ends early (one with a death of its own is dead too); with `--measure` on a "
     "sparse problem `write_bits` refused; under `admm` delays, drops, `write_bits` (every "
     "value: a push is dense; the dual residual's Δz is what the rounded stores changed, a "
     "dropped push's 0), stragglers, pauses and deaths, `error` refused (the simulator's "
     "admm adds none to its local solves); under `amp`, `local` and `block_admm` "
     "`stragglers` (each of a stage's forwards, backwards and writes takes `factor` (>= 1) "
     "times as long), `pauses` (a stage starts none of them in its window) and `deaths` "
     "(the stage stops before its next one; under `amp` and `local` the others stop once "
     "no message can come, and the run ends early, under `block_admm` the other makes the "
     "rest of the updates, as simulated) honoured, every other injection refused; torch "
     "workers (CUDA, `--launch threads`) run stragglers, pauses and deaths the same way, no "
     "other injection (a "
     "field that injects nothing, such as `error_bound` without an `error`, is accepted)",
     "`delay`, `error` (with `accumulate` > 1 the trainers send the one server each gradient "
     "apart), `drop` "
     "and `write_bits` honoured, drawn by the "
     "server from the simulator's injector stream of the trainer's thread in its order: a "
     "pull is answered with the vector τ versions back, a push's gradient gets its error, a "
     "dropped push is a version that changes nothing, stored values are rounded; `pauses` "
     "and `deaths` run by the server on the run's clock (from the first pull): a pull in a "
     "pause window is told to pull again at its end, one after the death is answered with "
     "no gradients (the push in flight lands, as on CPU workers); with rounds "
     "(`paramserver.fraction` > 0) all of these as the simulator's rounds: τ counts rounds, "
     "errors over every coordinate (a round member's gradient is dense), a round's one "
     "write (its last push's) lost where that push's draw drops it, every value of it "
     "rounded, and a dead trainer still counted among the live ones: a round that needs it "
     "waits for good, every other trainer stops there and the run ends early (one with a "
     "death of its own is dead too; the pushes left waiting are in no row); "
     "`stragglers` honoured by the trainer: its gradients take `factor` (>= 1) times as long "
     "(the simulator's straggler is slower in its compute and memory phases, not its link; "
     "the pull's and push's copies are the server's); with a pool (`paramserver.servers` > "
     "1) `delay`, `error`, `drop` and `write_bits` as well, drawn by the trainer from the "
     "same stream in the same order: each server answers a pull with its shard τ of its "
     "versions back (a version: a push it received, in rounds a round it applied), a lost "
     "push is a header to every server, which counts it as a version that changes nothing "
     "(in rounds every part goes and a round is lost where the coordinating server finds "
     "its writer's draw dropped), and each server rounds its own stores; under `admm` the "
     "same delays, drops, "
     "`write_bits` (every value: a push is dense), pauses, deaths and stragglers (the local "
     "solve takes `factor` times as long), `error` refused; under `sandblaster` stragglers "
     "(a unit's gradients take `factor` times as long) and pauses (as above, and the "
     "trainer also waits out a window before computing its unit and before pushing it, "
     "and a unit handed to it when a round opens stays its own: the round waits for it, "
     "as the simulator's thread holds before each phase; one machine only: its trainers "
     "hold on the server's clock), the rest refused by the scenario for every backend"),
    ("`[paramserver]`", "inert", "honoured (`rule`: on each push the server keeps, as it "
     "receives it, with its exact staleness; `lock_free`: one update thread per trainer "
     "subtracts its pushes from the vector with no lock, measure mode's view is every push "
     "applied in completion order and the summary's `hardware_loss` what the real vector "
     "lacks; not with `warm_start` or `write_bits`; `servers`: 0 or 1, the one server "
     "serving one message at a time; S > 1, a pool on one machine (`--servers S`): shard 0 "
     "on the coordinating server, each other shard on a server process of its own, every "
     "trainer pulling and pushing shard by shard, each server serving its messages one at "
     "a time; with a pool `staleness_limit` and `rule` decided by the coordinating server "
     "when a push's shard 0 arrives, with its staleness then, and sent back to the trainer "
     "(a discarded push: a header to every shard server, no version; `staleness_lr`'s "
     "factor scales the other parts; `dcasgd`: each server compensates its own part towards "
     "its shard from the one that trainer pulled); `warm_start` and `rebalance` run by the "
     "coordinating server, which answers every pull first (a warm start ends when trainer 0 "
     "pulls after its W-th completion, whose parts every shard server then has; "
     "rebalancing times each push from its pull's arrival to its shard 0's application); "
     "`accumulate` n: the trainer pushes the mean of n gradients shard by shard (with "
     "errors: each gradient's own, dense), a push the budget left short is dropped by the "
     "coordinating server and a header to every shard server, no version; `fraction`: the "
     "coordinating server closes each round and tells every shard server its members, "
     "each applies their parts' mean and says so, and pulls wait until every server has; "
     "`lock_free` refused with a pool, not under torchrun); under `admm` and "
     "`sandblaster` refused unless default"),
    ("`[dcasgd]`", "honoured with `dcasgd`, else inert",
     "honoured with `paramserver.rule = dcasgd`, else inert"),
    ("`[amp]`, `[local]`", "honoured with `amp`, `local` (`max_active`: at most that many "
     "samples in the pipeline, refused where their messages would not fit in a pipe between "
     "stages; `update_every`), else inert", "inert"),
    ("`[block_admm]`", "honoured with `block_admm` (`rho`, `aux_lr`: the simulator's step, "
     "`simulator.protocols.staged.block_admm_step`, on every sample's z_i, u_i and h_i in "
     "shared memory, read and written by the two stages without a lock: where both take "
     "one sample at once a stage can read another's half-written values, which the "
     "simulator's atomic step never does), else inert",
     "inert"),
    ("`[sandblaster]`", "inert (it runs on the parameter server)", "honoured with "
     "`run.protocol = \"sandblaster\"`: the server hands each round's `units` out one by "
     "one to whichever trainer pulls (a pull when none is left waits for the next round), "
     "a trainer computes its unit's share of ∇f at the vector it pulled and pushes it, and "
     "once all are back the server applies the L-BFGS step of `memory` pairs to its "
     "vector (`simulator.protocols.sandblaster.Lbfgs`); one completion a round, else inert"),
    ("`[admm]`", "honoured with `admm` (CPU worker processes), else inert",
     "honoured with `run.protocol = \"admm\"` (each trainer sends its x_i with its push; "
     "the server keeps every x_i and computes the residuals after each push), else inert"),
)


def support_markdown() -> str:
    """:data:`SUPPORT` as a Markdown table (the one ``docs/semantics.md`` shows)."""
    lines = ["| field | `shm`, `cuda` | `ps` |", "|---|---|---|"]
    lines += [f"| {field} | {shm} | {ps} |" for field, shm, ps in SUPPORT]
    return "\n".join(lines) + "\n"


def refuse_unsupported(scenario: Scenario, backend: str, mode: str) -> None:
    """Refuse the first field ``backend`` running ``mode`` would not honour (:data:`SUPPORT`).

    Raises:
        ScenarioError: naming the field, its value and the backend.
    """
    found = _unsupported(scenario, backend, mode)
    if found is not None:
        field, value, reason = found
        raise ScenarioError(field, value, f"{reason}; refused by the {backend} backend")


def _unsupported(scenario: Scenario, backend: str, mode: str) -> tuple[str, Any, str] | None:
    """The first refused field as (field, value, reason), or None."""
    run, default = scenario.run, Scenario().run
    protocol = PROTOCOL_OF[mode]
    if run.protocol not in (default.protocol, protocol):
        return "run.protocol", run.protocol, (
            "the parameter server runs paramserver, admm or sandblaster" if backend == "ps"
            else "it runs on the parameter server: asyngrad real --backend ps"
            if run.protocol in ("paramserver", "sandblaster")
            else f"one process per stage: --mode {run.protocol}"
            if run.protocol in PIPELINE_MODES
            else f"this backend runs {protocol} (--mode {mode})")
    if run.write_mode == "atomic_add" and mode in ("lockfree", *RULE_MODES) and backend != "ps":
        return ("run.write_mode", run.write_mode, f"--mode {mode} writes in place "
                "(load_store); --mode blocklock locks each block write")
    for name in ("store_grain", "placement"):
        if getattr(run, name) != getattr(default, name):
            return f"run.{name}", getattr(run, name), _SIMULATED_MACHINE
    if backend == "ps" and mode in ("admm", "sandblaster"):
        found = _changed("paramserver", scenario.paramserver, ParamServerSpec(),
                         _NO_SERVER_OPTIONS[mode])
        if found is not None:
            return found
    if backend == "ps":
        options, inject = scenario.paramserver, scenario.inject
        if inject.deaths and (options.warm_start or options.rebalance):
            return ("inject.deaths", [dataclasses.asdict(d) for d in inject.deaths],
                    "a dead simulated thread never finishes (a warm start it holds never "
                    "ends, rebalancing still counts it) where a dead trainer tells the server "
                    "it is done (paramserver.warm_start, paramserver.rebalance)")
        if scenario.paramserver.lock_free and scenario.paramserver.warm_start:
            return ("paramserver.warm_start", scenario.paramserver.warm_start, "a lock-free "
                    "server's update threads do not hold pulls back (paramserver.lock_free)")
        if scenario.paramserver.lock_free and scenario.inject.write_bits:
            return ("inject.write_bits", scenario.inject.write_bits, "a lock-free server's "
                    "update threads store full precision (paramserver.lock_free)")
        if options.servers > 1:
            found = _pooled(scenario)
            if found is not None:
                return found
        elif run.blocks != 1:
            return "run.blocks", run.blocks, "the real server holds the vector as one shard"
        if run.split != "shared":
            return ("run.split", run.split, "the server hands out the updates to whichever "
                    "trainer asks (shared)")
    # (A real run records [hardware.sweeping_reads] with its defaults: accepted as such.)
    sweeps = scenario.hardware.sweeping_reads
    hardware = dataclasses.replace(scenario.hardware, sweeping_reads=None)
    return ((_changed("hardware.sweeping_reads", sweeps, SweepingReadsSpec())
             if sweeps is not None else None)
            or _changed("timing", scenario.timing, TimingSpec())
            or _changed("hardware", hardware, HardwareSpec())
            or _devices(scenario)
            or _injected(scenario.inject, *_injections(backend, mode))
            or _stalls(scenario.inject))


def _changed(section: str, spec: Any, default: Any,
             reason: str = _SIMULATED_MACHINE) -> tuple[str, Any, str] | None:
    """The first field of ``spec`` that differs from ``default``."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if value != getattr(default, f.name):
            shown = ([dataclasses.asdict(v) for v in value] if isinstance(value, tuple)
                     else value.to_dict() if hasattr(value, "to_dict")
                     else plain(value) if dataclasses.is_dataclass(value)
                     else value)
            return f"{section}.{f.name}", shown, reason
    return None


def _devices(scenario: Scenario) -> tuple[str, Any, str] | None:
    """The first device field that describes another machine (a name is only a label)."""
    default = Scenario().devices
    if len(scenario.devices) != len(default):
        return "devices", len(scenario.devices), _SIMULATED_MACHINE
    return _changed("devices.0", dataclasses.replace(scenario.devices[0], name=default[0].name),
                    default[0])


#: The injections CPU worker processes run: delays, errors, drops and rounded stores, which
#: the simulator's injector draws update by update (``realrun.worker._injector``; delays read
#: ``realrun.worker.History``); stragglers, pauses and deaths (``realrun.worker.Slowed``),
#: in rounds and turns too (``realrun.worker.Rounds``, ``realrun.worker.Turns``); under ADMM
#: (CPU workers and the server) all but errors, which the simulator's admm does not add.
STALLS = ("stragglers", "pauses", "deaths")
DELAYS = ("delay", "delay_dist", "delay_max")
VALUE_INJECTIONS = (*DELAYS, "error", "drop", "write_bits", *STALLS)
ADMM_INJECTIONS = (*DELAYS, "drop", "write_bits", *STALLS)


def _stalls(inject: InjectSpec) -> tuple[str, Any, str] | None:
    """A fault real workers cannot run: a straggler faster than its core."""
    for i, straggler in enumerate(inject.stragglers):
        if straggler.factor < 1:
            return (f"inject.stragglers.{i}.factor", straggler.factor,
                    "a real worker cannot run faster than its core (factor >= 1)")
    return None


def _pooled(scenario: Scenario) -> tuple[str, Any, str] | None:
    """What a pool of parameter servers (``paramserver.servers`` > 1) refuses: another
    number of blocks than servers. Every ``[paramserver]`` option runs (the staleness limit
    and the rule decided at shard 0's arrival, as the simulator's pool decides them; a warm
    start and rebalancing by the coordinating server, which answers the pulls; accumulation
    by the trainers and the coordinating server, which hands out the gradients; rounds by
    the coordinating server, which closes them and tells the shard servers, which apply a
    round's parts together: ``realrun.pool``); a lock-free server the scenario refuses with
    a pool itself, as the simulator's pool does not model it."""
    run, options = scenario.run, scenario.paramserver
    if run.blocks != options.servers:
        return ("run.blocks", run.blocks, f"each of the {options.servers} real servers "
                "holds one shard: run.blocks must equal paramserver.servers")
    return None


def _injections(backend: str, mode: str) -> tuple[tuple[str, ...], str]:
    """The injections ``backend`` runs in ``mode``, and why it runs no others."""
    if backend == "ps":
        if mode == "admm":  # (an error would change a gradient the local solve never adds)
            return ADMM_INJECTIONS, _NO_INJECTION["ps-admm"]
        return VALUE_INJECTIONS, ""
    if backend != "shm":
        return STALLS, _NO_INJECTION[backend]
    if mode in PIPELINE_MODES:
        return PIPELINE_INJECTIONS, _NO_INJECTION["pipeline"]
    if mode == "admm":
        return ADMM_INJECTIONS, _NO_INJECTION["admm"]
    return VALUE_INJECTIONS, ""


def refuse_unmeasurable(scenario: Scenario, mode: str, sparse: bool) -> None:
    """Refuse what measure mode's rebuild (``realrun.rebuild``) cannot replay as ``mode``'s
    workers stored it: rounded stores of rounds on a ``sparse`` problem (a round stores
    every coordinate, the rebuild rounds those of its writer's sample), and of a pool's
    accumulated pushes (``paramserver``: its servers round their whole shards).

    Raises:
        ScenarioError: naming inject.write_bits.
    """
    if mode in ROUND_MODES and sparse and scenario.inject.write_bits:
        raise ScenarioError("inject.write_bits", scenario.inject.write_bits,
                            "measure mode's rebuild rounds a store over its sample's "
                            "coordinates, where a round's (dense) write rounds every one (run "
                            "without --measure, or simulate it); refused by the shm backend")
    options = scenario.paramserver
    if (mode == "paramserver" and options.servers > 1
            and (options.accumulate > 1 or options.fraction > 0) and sparse
            and scenario.inject.write_bits):
        raise ScenarioError("inject.write_bits", scenario.inject.write_bits,
                            "measure mode's rebuild rounds an accumulated push's or a round's "
                            "stores over its writer's sample's coordinates, where a pool's "
                            "servers round their whole shards (run without --measure, or "
                            "simulate it)")


def refuse_torch_injections(inject: InjectSpec) -> None:
    """Refuse what torch workers (CUDA, or ``--launch threads``) do not inject: everything
    but stragglers, pauses and deaths.

    Raises:
        ScenarioError: naming the first such field.
    """
    found = _injected(inject, STALLS, "torch workers (--launch threads, CUDA) inject "
                      "stragglers, pauses and deaths, not into their updates (CPU worker "
                      "processes do; or simulate it)")
    if found is not None:
        raise ScenarioError(*found)


def _injected(inject: InjectSpec, runs: tuple[str, ...],
              reason: str) -> tuple[str, Any, str] | None:
    """The first ``[inject]`` field that injects something the backend does not run (the
    parameters of an injection that is off, such as ``error_bound`` without an ``error``,
    inject nothing), with ``reason``; ``runs``: the injections it runs."""
    on = {"delay": inject.max_delay, "delay_dist": inject.max_delay,
          "delay_max": inject.max_delay, "error": inject.error != "none",
          "drop": inject.drop, "write_bits": inject.write_bits,
          "stragglers": inject.stragglers, "pauses": inject.pauses, "deaths": inject.deaths}
    on = {name: used for name, used in on.items() if name not in runs}
    injects = dataclasses.replace(InjectSpec(), **{name: getattr(inject, name)
                                                   for name, used in on.items() if used})
    return _changed("inject", injects, InjectSpec(), reason)


def recorded(scenario: Scenario, mode: str, workers: int, sparse: bool,
             measure_every: int | None, backend: str = "shm") -> Scenario:
    """``scenario`` as a real run's resolved scenario states what ran: the mode's protocol and
    write mode at ``workers`` threads, each worker's fixed share of the updates (``split =
    even``; not for ``ps``, whose server hands them out and applies pushes whole, so the
    write mode is inert there), whether a copy of the vector holds part of another worker's
    in-place write in flight (``[hardware.sweeping_reads]``: dense shared vectors; a pull is
    a consistent copy), and whether and how often it measured the serialized view
    (``measure_every``, None: not at all). ``mode`` ``paramserver`` is the ps backend's."""
    every = measure_every or scenario.metrics.every
    overrides = [f"run.threads={workers}", f"run.protocol={PROTOCOL_OF[mode]}",
                 f"metrics.exact={'true' if measure_every is not None else 'false'}",
                 f"metrics.every={every}"]
    server = backend == "ps" or mode == "paramserver"
    staged = mode in PIPELINE_MODES  # (the simulator's split and write mode)
    if not server and not staged:
        overrides += ["run.split=even", "run.write_mode="
                      f"{'atomic_add' if mode in ATOMIC_MODES else 'load_store'}"]
    # No read overlaps a write in rounds (the barrier) or turns, nor a pull a push on the
    # server.
    sweeps = (SweepingReadsSpec()
              if not server and mode not in ("roundrobin", *ROUND_MODES, *PIPELINE_MODES)
              and (not sparse or mode == "admm") else None)  # (ADMM moves every coordinate)
    scenario = with_overrides(scenario, overrides)
    return dataclasses.replace(scenario, hardware=dataclasses.replace(
        scenario.hardware, sweeping_reads=sweeps))
