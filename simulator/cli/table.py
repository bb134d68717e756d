"""The AsynGrad talk's Sync/Async × Sparse/Dense table: ``asyngrad table``."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from simulator.cli.common import command as subcommand
from simulator.cli.common import progress
from simulator.errors import ScenarioError

TABLE_FILES = ("table.csv", "table.md")


def _table(args: argparse.Namespace) -> int:
    import csv

    from simulator.rundir import check_out, publish
    from simulator.table import (
        COLUMNS,
        PIPELINE_ROWS,
        paper_table,
        pipeline_markdown,
        pipeline_table,
        table_markdown,
    )

    for name, value in (("--updates", args.updates), ("--threads", args.threads)):
        if value < 1:
            raise ScenarioError(name, value, "must be >= 1")
    yours = (args.scenario, args.set) if args.scenario is not None or args.set else None
    if args.model_parallel and (yours is not None or args.threads != 8):
        raise ScenarioError("--model-parallel", True, "runs the mlp's two stages, a thread "
                            "each: no scenario, --set or --threads")
    out = Path(args.out)
    check_out(out, TABLE_FILES)
    if args.model_parallel:
        with progress(len(PIPELINE_ROWS), args.quiet) as bar:
            cells = pipeline_table(args.updates, args.seed, bar.update)
        text = pipeline_markdown(cells)
    else:
        with progress(3 * (len(COLUMNS) + (yours is not None)), args.quiet) as bar:
            cells = paper_table(args.updates, args.threads, args.seed, bar.update, yours)
        text = table_markdown(cells)

    def write(where: Path) -> None:
        with open(where / "table.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, list(cells[0]))
            writer.writeheader()
            writer.writerows(cells)
        (where / "table.md").write_text(text)

    publish(out, TABLE_FILES, write)
    if not args.quiet:
        print(text, end="")
        print(f"wrote {out}/table.csv and table.md")
    return 0


def add_commands(commands: Any) -> None:
    """The group's subcommands, added to ``commands``."""
    command = partial(subcommand, commands)
    tab = command("table", "the Sync/Async × Sparse/Dense table of AsynGrad (sparse and dense "
                  "logistic, LSTM tagger, dense CRF), measured; a scenario or --set adds a "
                  "column of its problem (your model or data)", _table,
                  out="directory for table.csv and table.md")
    tab.add_argument("--updates", type=int, default=20_000, help="T per run (default 20000)")
    tab.add_argument("--threads", type=int, default=8, help="k (default 8)")
    tab.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    tab.add_argument("--model-parallel", action="store_true",
                     help="the model-parallel table instead: the mlp's two stages under a "
                     "synchronous pipeline (amp, one sample in flight), amp, local and "
                     "block_admm: speed-up, accuracy, per-stage staleness, error and time "
                     "at work")
