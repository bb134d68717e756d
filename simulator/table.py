"""The Sync/Async × Sparse/Dense table of the AsynGrad talk, filled with measured numbers.

Rows: synchronous (``locked``) and asynchronous lock-free (``lockfree``) training with k
threads; columns: a sparse model (``sparse_logistic``, the Hogwild regime) and three dense
ones (``logistic``; ``lstm_tagger``, the paper's model, and ``dense_crf``, the talk's second
experiment, both with per-token accuracy), and, where a scenario is given, a column of its own
problem (a user's model or data). Each cell:
gradient error rate, median relative error ‖δ‖/‖g‖, mean staleness, the speedup in simulated
time over a serial run of the same T updates, and the final training and held-out accuracy
and suboptimality (the serial run's are given alongside).
"""

from __future__ import annotations

from typing import Any

from simulator.engine import Engine
from simulator.metrics import summarize
from simulator.problems import Problem, make_problem
from simulator.scenario import Scenario, load_scenario

__all__ = ["COLUMNS", "paper_table", "table_markdown"]

COLUMNS: dict[str, tuple[str, ...]] = {
    "sparse": ("problem.name=sparse_logistic", "problem.dim=1000", "problem.density=0.01",
               "problem.n_samples=2000"),
    "dense": ("problem.name=logistic", "problem.dim=100", "problem.n_samples=1000"),
    # The paper's model: exact metrics on every 4th update (each costs a second BPTT).
    "lstm": ("problem.name=lstm_tagger", "problem.dim=50", "problem.hidden=16",
             "problem.n_samples=200", "run.lr=0.05", "metrics.every=4"),
    # The talk's second experiment, the dense CRF (same data as the LSTM's).
    "crf": ("problem.name=dense_crf", "problem.dim=50", "problem.hidden=16",
            "problem.n_samples=200", "run.lr=0.1", "metrics.every=4"),
}
HEADINGS = {"sparse": "Sparse (sparse_logistic)", "dense": "Dense (logistic)",
            "lstm": "Dense (lstm_tagger)", "crf": "Dense (dense_crf)"}
ROWS = {"sync": "locked", "async": "lockfree"}


def _run(scenario: Scenario, problem: Problem) -> dict[str, Any]:
    engine = Engine(scenario, problem)
    trace = engine.run()
    summary = summarize(trace, engine.problem, scenario)
    summary["accuracy"] = engine.problem.accuracy(trace["w_final"])
    summary["held_out"] = engine.problem.held_out_accuracy(trace["w_final"])
    return summary


def paper_table(updates: int = 20_000, threads: int = 8, seed: int = 0,
                progress: Any = None,
                yours: tuple[str | None, list[str]] | None = None) -> list[dict[str, Any]]:
    """One row per (row, column) cell with its measured numbers. ``yours`` = (scenario file or
    None, overrides) adds a column ``yours``: that scenario's problem and run settings (its
    own model or data, learning rate ...), run in the table's rows."""
    cells = []
    columns: dict[str, tuple[str | None, list[str]]] = {
        name: (None, list(overrides)) for name, overrides in COLUMNS.items()}
    if yours is not None:
        columns["yours"] = yours
    bases = {column: [*overrides, f"run.updates={updates}", f"run.seed={seed}",
                      "metrics.curve_points=10"] for column, (_, overrides) in columns.items()}
    # One problem (data and optimum) for each column's three runs: its spec is theirs. All
    # are built first, so a user's model that cannot be built is refused before any run.
    problems = {column: make_problem(load_scenario(path, bases[column]).problem)
                for column, (path, _) in columns.items()}
    for column, (path, _) in columns.items():
        base, problem = bases[column], problems[column]
        serial = _run(load_scenario(path, [*base, "run.protocol=serial"]), problem)
        if progress:
            progress(1)
        for row, protocol in ROWS.items():
            s = _run(load_scenario(path, [*base, f"run.protocol={protocol}",
                                          f"run.threads={threads}"]), problem)
            if progress:
                progress(1)
            error = s["gradient_error"]
            cells.append({
                "row": row, "column": column, "protocol": protocol, "threads": threads,
                "problem": s["problem"]["name"], "error_rate": error["rate"],
                "relative_error_p50": error["relative"]["p50"],
                "staleness_mean": s["staleness"]["mean"],
                "speedup": serial["time"]["span_ns"] / s["time"]["span_ns"],
                "accuracy": s["accuracy"], "serial_accuracy": serial["accuracy"],
                "held_out_accuracy": s["held_out"],
                "serial_held_out_accuracy": serial["held_out"],
                "suboptimality": s["loss"]["final_suboptimality"],
                "serial_suboptimality": serial["loss"]["final_suboptimality"],
            })
    return cells


def table_markdown(cells: list[dict[str, Any]]) -> str:
    """The table as Markdown (a row per protocol, a column per model), one line of numbers
    per cell."""
    def cell(row: str, column: str) -> str:
        c = next(c for c in cells if c["row"] == row and c["column"] == column)
        held = ("" if c["held_out_accuracy"] is None else
                f"; held out {c['held_out_accuracy']:.3f} (serial "
                f"{c['serial_held_out_accuracy']:.3f})")
        return (f"error rate {c['error_rate']:.3f}, median ‖δ‖/‖g‖ "
                f"{c['relative_error_p50']:.2g}, staleness {c['staleness_mean']:.2f}, speedup "
                f"{c['speedup']:.2f}×, accuracy {c['accuracy']:.3f} (serial "
                f"{c['serial_accuracy']:.3f}){held}")

    threads = cells[0]["threads"]
    columns = list(dict.fromkeys(c["column"] for c in cells))
    problems = {c["column"]: c["problem"] for c in cells}
    lines = ["| | " + " | ".join(HEADINGS.get(c, f"Yours ({problems[c]})") for c in columns)
             + " |", "|---|" + "---|" * len(columns)]
    for row, label in (("sync", f"Sync (locked, k = {threads})"),
                       ("async", f"Async (lock-free, k = {threads})")):
        lines.append(f"| {label} | " + " | ".join(cell(row, c) for c in columns) + " |")
    return "\n".join(lines) + "\n"
