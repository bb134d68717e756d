"""The Sync/Async × Sparse/Dense table of the AsynGrad talk, filled with measured numbers, and
a second table for the model-parallel protocols (:func:`pipeline_table`).

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

__all__ = ["COLUMNS", "PIPELINE_ROWS", "paper_table", "pipeline_markdown", "pipeline_table",
           "table_markdown"]

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


#: The model-parallel table's rows: label and settings, on the mlp's two stages. The first is
#: the baseline: synchronous model parallelism (one sample in the pipeline: every gradient
#: is serial SGD's).
PIPELINE_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("synchronous pipeline (amp, 1 sample in flight)", ("run.protocol=amp",
                                                         "amp.max_active=1")),
    ("amp (4 in flight)", ("run.protocol=amp", "amp.max_active=4")),
    ("local (4 in flight)", ("run.protocol=local", "local.max_active=4")),
    ("block_admm", ("run.protocol=block_admm",)),
)
#: An mlp whose two stages are about the same size (220 and 210 parameters), so a pipeline can
#: keep both busy.
_STAGED = ("problem.name=mlp", "problem.dim=10", "problem.hidden=20", "problem.classes=10",
           "run.threads=2", "run.blocks=2", "metrics.curve_points=10")


def pipeline_table(updates: int = 20_000, seed: int = 0,
                   progress: Any = None) -> list[dict[str, Any]]:
    """One row per model-parallel protocol on the ``mlp`` (``updates`` stage updates each):
    its speed-up in simulated time over the synchronous pipeline, training and held-out
    accuracy, final suboptimality, and per stage the mean staleness, the median ‖δ‖/‖g‖
    on the stage's parameters and the share of time at work."""
    base = [*_STAGED, f"run.updates={updates}", f"run.seed={seed}"]
    problem = make_problem(load_scenario(None, base).problem)
    cells: list[dict[str, Any]] = []
    for label, settings in PIPELINE_ROWS:
        s = _run(load_scenario(None, [*base, *settings]), problem)
        if progress:
            progress(1)
        span = s["time"]["span_ns"]
        cells.append({
            "protocol": label, "speedup": (cells[0]["span_ns"] / span if cells else 1.0),
            "span_ns": span, "accuracy": s["accuracy"], "held_out_accuracy": s["held_out"],
            "suboptimality": s["loss"]["final_suboptimality"],
            **{f"stage{st['stage']}_{key}": value for st in s["stages"]
               for key, value in (("staleness", st["staleness_mean"]),
                                  ("relative_error_p50", st["relative_error"]["p50"]),
                                  ("utilisation", st["utilisation"]))}})
    return cells


def pipeline_markdown(cells: list[dict[str, Any]]) -> str:
    """The model-parallel table as Markdown, a row per protocol."""
    lines = ["| mlp 10-20-10, 2 stages | speed-up | accuracy (held out) | f − f* | stage 0: "
             "staleness, median ‖δ‖/‖g‖, at work | stage 1: staleness, median ‖δ‖/‖g‖, at "
             "work |",
             "|---|---:|---|---:|---|---|"]
    for c in cells:
        held = "" if c["held_out_accuracy"] is None else f" ({c['held_out_accuracy']:.3f})"
        stages = [f"{c[f'stage{i}_staleness']:.2f}, {c[f'stage{i}_relative_error_p50']:.2g}, "
                  f"{c[f'stage{i}_utilisation']:.0%}" for i in (0, 1)]
        lines.append(f"| {c['protocol']} | {c['speedup']:.2f}× | {c['accuracy']:.3f}{held} | "
                     f"{c['suboptimality']:.3g} | {stages[0]} | {stages[1]} |")
    return "\n".join(lines) + "\n"
