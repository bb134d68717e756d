"""``asyngrad``: the command line, one module per command group.

Every user error (a bad scenario value, a corrupt trace, a bad flag) prints one line naming
the field and value and exits with status 2; nothing is written before the input is known good.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from simulator.cli import bounds, explore, fidelity, real, runs, table
from simulator.cli.common import Parser
from simulator.errors import AsyngradError, ScenarioError

__all__ = ["main"]

GROUPS = (runs, bounds, explore, table, fidelity, real)


def _parser() -> Parser:
    parser = Parser(prog="asyngrad", description="Simulate and analyse asynchronous "
                    "lock-free SGD (AsynGrad, Hogwild!).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.add_commands(commands)
    return parser


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM takes Ctrl-C's way out (a real run stops its workers and keeps its partial
    trace): a KeyboardInterrupt that says so."""
    raise KeyboardInterrupt("SIGTERM")


#: The arguments that name a file or directory, by how an error names them.
_PATHS = {"out": "--out", "scenario": "scenario", "trace": "trace", "run_dir": "RUN",
          "run_a": "run_a", "run_b": "run_b"}


def _refuse_empty(args: Any) -> None:
    """Refuse a path given as an empty string: ``Path('')`` is '.', which a command would
    read or write instead."""
    for dest, name in _PATHS.items():
        given = getattr(args, dest, None)
        for value in given if isinstance(given, list) else [given]:
            if value is not None and not value.strip():
                raise ScenarioError(name, value, "must not be empty")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyngrad`` command; returns the exit status (SIGTERM is handled
    as Ctrl-C while it runs, from the main thread)."""
    import signal
    import threading

    args = _parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        _refuse_empty(args)
        return int(args.run(args))
    except AsyngradError as err:
        print(f"asyngrad: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print("asyngrad: interrupted; no partial result was written", file=sys.stderr)
        return 143 if err.args == ("SIGTERM",) else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
