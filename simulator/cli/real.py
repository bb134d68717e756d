"""Real runs: ``asyngrad real`` (shared-memory workers, CUDA, the parameter server)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import print_summary, progress
from simulator.errors import AsyngradError, ScenarioError


def _real(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401 - the real backend's one optional dependency
    except ImportError:
        raise AsyngradError("asyngrad real needs PyTorch: pip install torch "
                            "(or the project's extra: pip install -e '.[torch]')") from None
    from realrun.runner import MODES, run_real, summary_extra
    from realrun.support import PIPELINE_MODES
    from simulator.rundir import check_out, latency_line, write_run
    from simulator.scenario import load_scenario

    # The ps backend runs --workers trainers (default 2) whatever run.threads says: the
    # scenario is checked at that count (Sandblaster's units >= threads).
    sets = ([f"run.threads={args.workers or 2}", *args.set] if args.backend == "ps"
            else args.set)
    scenario = load_scenario(args.scenario, sets)
    check_out(args.out)
    if args.mode is None and args.backend != "ps":  # the scenario's protocol, where a mode runs it
        args.mode = (scenario.run.protocol if scenario.run.protocol in MODES else "lockfree")
    if args.workers is None:  # (a model-parallel mode: one process per stage)
        args.workers = (1 if args.mode == "serial" else scenario.run.threads
                        if args.mode in PIPELINE_MODES else 2)
    if args.backend == "ps":
        return _real_ps(args, scenario)
    if args.backend != "shm":
        raise ScenarioError("--backend", args.backend, "must be shm or ps")
    if args.servers is not None:
        raise ScenarioError("--servers", args.servers, "a flag of the parameter server "
                            "(--backend ps)")
    with progress(scenario.run.updates, args.quiet) as bar:
        run = run_real(scenario, args.workers, args.mode, args.dtype, args.timeout, bar.update,
                       measure_every=args.measure_every if args.measure_every is not None
                       else scenario.metrics.every if args.measure else None,
                       device=args.device, launch=args.launch, pattern=args.pattern,
                       pin=args.pin, probe=args.probe,
                       notice=None if args.quiet else _notice)
    if run.failure is not None and not args.quiet:
        _notice(f"writing the partial run to {args.out}/")
    summary = write_run(args.out, run.scenario, run.trace, run.problem,
                        extra=summary_extra(run))
    if run.failure is not None:
        who = "" if run.failure["worker"] is None else f"worker {run.failure['worker']}: "
        print(f"asyngrad: real run stopped after {len(run.trace)} updates ({who}"
              f"{run.failure['reason']}); partial results in {args.out}/", file=sys.stderr)
        return 1
    if not args.quiet:
        print_summary(summary, Path(args.out), run.seconds)
        print(f"  {summary['real']['updates_per_wall_second']:.4g} updates per wall second "
              f"with {run.workers} {run.mode} worker(s), {run.dtype}, on {run.device}"
              + ("" if run.device == "cpu" else f" ({run.launch}, {run.pattern} parameters)"))
        _print_loss(run.hardware_loss)
        if run.cpu_latency is not None:
            print("  " + latency_line(run.cpu_latency))
    return 0


def _print_loss(loss: dict[str, Any] | None) -> None:
    """What the hardware lost (measure mode of lock-free writes), if measured."""
    if loss is not None:
        print(f"  hardware lost: |rebuilt w_T − real w_T| = "
              f"{loss['rebuilt_vs_real_norm']:.3g} (max element "
              f"{loss['rebuilt_vs_real_max']:.3g})")


def _notice(text: str) -> None:
    """What a stopped run does while the user waits, on stderr."""
    print(f"asyngrad: {text} ...", file=sys.stderr, flush=True)


def _real_ps(args: argparse.Namespace, scenario: Any) -> int:
    """``asyngrad real --backend ps``: a parameter server and K trainers on loopback."""
    from realrun.ps import ROWS, run_ps, summary_extra
    from simulator.rundir import write_run
    from simulator.scenario import with_overrides

    if args.pin:
        raise ScenarioError("--pin", "on", "pins the shared-memory workers; not with "
                            "--backend ps")
    for flag, value, default in (("--mode", args.mode, None),
                                 ("--device", args.device, "cpu"),
                                 ("--launch", args.launch, None),
                                 ("--pattern", args.pattern, "shared"),
                                 ("--probe", "on" if args.probe else None, None)):
        if value != default:
            raise ScenarioError(flag, value, "a flag of the shared-memory workers; the ps "
                                "backend runs paramserver ([paramserver] options), or admm "
                                "or sandblaster where run.protocol says so, on the CPU")
    if args.measure_every is not None:
        if args.measure_every < 1:
            raise ScenarioError("--measure-every", args.measure_every, "must be >= 1")
        scenario = with_overrides(scenario, [f"metrics.every={args.measure_every}"])
    if args.servers is not None:  # a pool: one shard (block) per server
        if args.servers < 1:
            raise ScenarioError("--servers", args.servers, "must be >= 1")
        scenario = with_overrides(scenario, [f"paramserver.servers={args.servers}",
                                             f"run.blocks={args.servers}"])
    with progress(scenario.run.updates, args.quiet) as bar:
        run = run_ps(scenario, args.workers, args.dtype, progress=bar.update,
                     measure=args.measure or args.measure_every is not None,
                     limit=args.timeout)
    summary = write_run(args.out, run.scenario, run.trace, run.problem,
                        extra=summary_extra(run))
    if run.failure is not None:
        print(f"asyngrad: parameter server stopped after {run.pushes} pushes "
              f"({len(run.trace)} {ROWS.get(run.scenario.run.protocol, 'gradients')}; "
              f"{run.failure['reason']}); partial results in "
              f"{args.out}/", file=sys.stderr)
        return 1
    if not args.quiet:
        print_summary(summary, Path(args.out), run.seconds)
        real = summary["real"]
        print(f"  {real['pushes_per_wall_second']:.4g} pushes per wall second from "
              f"{run.workers} trainer(s); discarded {summary['discarded']} gradients "
              f"({real['discarded_fraction']:.1%})"
              + (f"; retired trainers {summary['retired_threads']}"
                 if summary.get("retired_threads") else ""))
        _print_loss(run.hardware_loss)
    return 0


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
    real = command("real", "train with real lock-free worker processes", _real)
    real.add_argument("--workers", type=int, default=None,
                      help="worker processes (default 2; 1 with --mode serial; amp, "
                      "local and block_admm: run.threads, one per stage)")
    real.add_argument("--mode", default=None,
                      help="lockfree, blocklock (a lock per block write), locked, serial, "
                      "minibatch (synchronous rounds), allreduce, roundrobin, staleness_lr, "
                      "dcasgd, admm, amp, local or block_admm (one process per stage); "
                      "default: "
                      "run.protocol where it is one of these, else lockfree")
    real.add_argument("--dtype", default="float32", help="float32 (default) or float64")
    real.add_argument("--timeout", type=float, default=None,
                      help="stop the run after this many seconds (partial results kept)")
    real.add_argument("--measure", action="store_true",
                      help="exact gradient errors: rebuild the serialized view offline")
    real.add_argument("--measure-every", type=int, default=None, metavar="N",
                      help="measure mode, computing the exact gradient of every N-th update")
    real.add_argument("--backend", default="shm",
                      help="shm (default: workers on one shared parameter vector) or ps (a "
                      "parameter server and K trainers on torch.distributed; its options "
                      "come from the scenario's [paramserver] section, or with "
                      "run.protocol = admm consensus ADMM's from [admm])")
    real.add_argument("--servers", type=int, default=None, metavar="S",
                      help="with --backend ps: a pool of S server ranks, one shard of the "
                      "vector each (sets paramserver.servers and run.blocks to S)")
    real.add_argument("--device", default="cpu",
                      help="where gradients run: cpu (default), cuda or cuda:N")
    real.add_argument("--launch", default=None,
                      help="workers as spawned processes or as threads of one process (on "
                      "CUDA each with its own stream); default: processes on the CPU, the "
                      "faster measured on CUDA")
    real.add_argument("--pattern", default="shared",
                      help="shared (default: parameters on the device, updated in place by "
                      "every worker) or host (master parameters in host memory, each worker "
                      "computes on its device copy and pushes its step)")
    real.add_argument("--probe", action="store_true",
                      help="probe the CPUs before the start (seconds): the cache-line latency "
                      "between two workers' CPUs (real.cpu_latency), what a write costs on "
                      "lines the other CPU copied last (real.shared_write) and how two writes "
                      "meet (real.write_meetings); calibrate needs the last two for runs of "
                      "one worker")
    real.add_argument("--pin", action="store_true",
                      help="pin worker r to CPU r (mod the CPUs this process may use): no "
                      "two workers share a core while another is idle, as the simulator's "
                      "per-core slicing assumes (unpinned, the OS may pile them up at the "
                      "start)")
