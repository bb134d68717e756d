"""Model-parallel real runs: two stage processes (``amp``, ``local``, ``block_admm``;
realrun/pipeline.py) against one process doing both stages (``--mode serial``: the whole
gradient of each sample), measured side by side in one run, on mlps of three sizes.

Throughput is samples per second over each run's span (its first read's start to its last
write's end, from the same ``monotonic_ns`` stamps on both sides; a stage row is half a
sample's work), the median over ``--repeats`` runs; the ratio is the pipeline's over the
serial process's. Also each stage's median forward, backward and write, and the time from a
stage's send to the next stage's forward start (a message's way through a pipe and the
wake-up of the stage waiting for it). ``block_admm``'s stages pass no message: each of its
rows is a stage's update of a sample of its own, two rows a sample's worth.

    python bench/pipeline.py              # three sizes, 3 repeats
    python bench/pipeline.py --quick      # fewer samples, 1 repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# Run as `python bench/pipeline.py`, this file's folder comes first on sys.path; drop it so the
# bench's own names never shadow the project's packages.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import numpy as np

from realrun.pipeline import run_pipeline
from realrun.runner import run_real
from simulator.problems import make_problem
from simulator.scenario import load_scenario
from simulator.trace import Trace

SIZES = {"small (d=6, h=5)": ("problem.dim=6", "problem.hidden=5", "problem.classes=3"),
         "default (d=100, h=32)": ("problem.dim=100", "problem.hidden=32"),
         "wide (d=256, h=512)": ("problem.dim=256", "problem.hidden=512")}


def _span_s(trace: Trace) -> float:
    return float(trace["write_end"].max() - trace["read_start"].min()) * 1e-9


def _flight_us(trace: Trace) -> float:
    """Median time from stage 0's forward end (its send) to stage 1's forward start of the
    same sample (rows in each stage's order)."""
    rows = [np.argsort(np.where(trace["thread"] == s, trace["thread_seq"], -1))[
        -int((trace["thread"] == s).sum()):] for s in (0, 1)]
    return float(np.median(trace["read_start"][rows[1]] - trace["read_end"][rows[0]])) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    samples, repeats = (1000, 1) if args.quick else (4000, args.repeats)
    print(f"{'mlp':24} {'run':12} {'samples/s':>10} {'× serial':>9} {'stale 0/1':>10} "
          f"{'fwd/bwd µs stage 0':>19} {'stage 1':>12} {'send→fwd µs':>12}")
    for name, size in SIZES.items():
        base = ("problem.name=mlp", "problem.n_samples=1000", "run.threads=2", "run.blocks=2",
                "run.lr=0.02", *size)
        problem = make_problem(load_scenario(None, list(base)).problem)
        problem.optimum()
        rates: dict[str, list[float]] = {}
        details: dict[str, tuple[str, ...]] = {}
        for _ in range(repeats):
            serial = run_real(load_scenario(None, [*base, "run.threads=1", "run.blocks=1",
                                                   f"run.updates={samples}"]),
                              1, "serial", problem=problem)
            rates.setdefault("serial", []).append(samples / _span_s(serial.trace))
            details["serial"] = ("", "", "", "")
            for protocol, active in (("amp", 1), ("amp", 4), ("local", 1), ("local", 4),
                                     ("block_admm", 0)):
                run = run_pipeline(load_scenario(None, [
                    *base, f"run.protocol={protocol}", f"run.updates={2 * samples}",
                    *([f"{protocol}.max_active={active}"] if active else [])]),
                    problem=problem)
                t = run.trace
                label = f"{protocol} ×{active}" if active else protocol
                rates.setdefault(label, []).append(samples / _span_s(t))
                per = [t["thread"] == s for s in (0, 1)]
                phases = ["/".join(f"{np.median(v[m]) / 1e3:.0f}" for v in (
                    t["read_end"] - t["read_start"], t["grad_ns"])) for m in per]
                details[label] = ("/".join(f"{t['staleness'][m].mean():.1f}" for m in per),
                                  *phases, f"{_flight_us(t):.0f}" if active else "—")
        serial_rate = statistics.median(rates["serial"])
        for label, values in rates.items():
            rate = statistics.median(values)
            stale, first, second, flight = details[label]
            print(f"{name:24} {label:12} {rate:10.4g} {rate / serial_rate:9.2f} {stale:>10} "
                  f"{first:>19} {second:>12} {flight:>12}")


if __name__ == "__main__":
    main()
