# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Simulation vs hardware: calibrate, replay, predict, compare
#
# 1. Train the default dense logistic problem with real lock-free worker processes at the
#    calibration worker count (float64, measure mode, so real gradient errors are exact).
# 2. Replay the real trace in the simulator (trace-driven: recorded samples and durations).
# 3. Calibrate the simulator's timing model on the real run (one timing for all workers,
#    threads sharing the machine's cores), with calibrate's defaults otherwise.
# 4. Predict another worker count with the calibrated simulator, run it for real, compare.
#
# The conclusion at the end is computed from the numbers of this run.

# %% tags=["parameters"]
UPDATES = 20_000     # per run
CALIBRATE_AT = 2     # worker count of the calibration run
PREDICT = 3          # worker count to predict (3 processes on a 2-core machine oversubscribe)
CORES = 2            # cores of this machine, shared by simulated threads
OUT = "runs/notebook03"

# %%
import json
import shutil
from pathlib import Path

from IPython.display import Image, Markdown, display

from simulator.cli import main
from simulator.fidelity.report import targets_table

out = Path(OUT)
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)


def run(*args: str) -> None:
    assert main([*args, "--quiet"]) == 0, args


def real(workers: int) -> Path:
    where = out / f"real-k{workers}"
    run("real", "--out", str(where), "--workers", str(workers), "--mode", "lockfree",
        "--dtype", "float64", "--measure", "--set", f"run.updates={UPDATES}")
    return where


# %% [markdown]
# ## 1–2. A real run, and its trace-driven replay

# %%
measured = real(CALIBRATE_AT)
replayed = out / "replay"
run("replay", str(measured), "--out", str(replayed))
run("compare", str(measured), str(replayed), "--out", str(out / "compare-replay"))
replay_report = json.loads((out / "compare-replay" / "compare.json").read_text())
print(json.dumps(replay_report["staleness"], indent=1))
display(Image(filename=str(out / "compare-replay" / "compare.png")))

# %% [markdown]
# ## 3. Calibrate

# %%
calibrated = out / "calibrated.toml"
# Threads beyond the cores run in per-core time slices of this machine's measured OS slice.
# By default calibrate also measures this machine's load balancer (the run was made here) and
# fits common factors to the workers' rhythm where they kept one (`--migrate 0` and
# `--common off` leave them out).
run("calibrate", str(measured), "--out", str(calibrated), "--pool", "--cores", str(CORES),
    "--quantum", "auto")
print("\n".join(line for line in calibrated.read_text().splitlines()
                if line.startswith("#   ")))

# %% [markdown]
# ## 4. Predict another worker count, and measure it

# %%
predicted = out / f"predicted-k{PREDICT}"
run("simulate", str(calibrated), "--out", str(predicted), "--set", f"run.threads={PREDICT}")
actual = real(PREDICT)
run("compare", str(actual), str(predicted), "--out", str(out / "compare-prediction"))
report = json.loads((out / "compare-prediction" / "compare.json").read_text())
display(Image(filename=str(out / "compare-prediction" / "compare.png")))

# %%
print(targets_table(report["targets"]))  # the four fidelity targets, as compare prints them

# %% [markdown]
# ## Conclusion

# %%
st, ge, lo = report["staleness"], report["gradient_error"], report["loss"]
met = [row["metric"] for row in report["targets"] if row["met"]]
missed = [row["metric"] for row in report["targets"] if not row["met"]]
replay_gap = replay_report["staleness"]["relative_mean_gap"]
text = (
    f"The replay of the real k = {CALIBRATE_AT} run reproduces its mean staleness to "
    f"{replay_gap:.1%}. Calibrated at k = {CALIBRATE_AT}, the simulator predicts k = {PREDICT} "
    f"with mean staleness {st['mean_b']:.3g} against {st['mean_a']:.3g} measured (gap "
    f"{st['relative_mean_gap']:.0%}, KS distance {st['ks_distance']:.3f}), gradient error rate "
    f"{ge['b']['rate']:.3f} against {ge['a']['rate']:.3f}, and final suboptimality "
    f"{lo['final_b']:.3g} against {lo['final_a']:.3g}. "
    f"Targets met: {', '.join(met) or 'none'}. Missed: {', '.join(missed) or 'none'}."
)
ra, rb = report["rhythm"]["a"], report["rhythm"]["b"]
if ra["coupling"] is not None and rb["coupling"] is not None:
    text += (
        f" Of the staleness, the part that independent phases would give is "
        f"{ra['independent_staleness']:.3g} measured and {rb['independent_staleness']:.3g} "
        f"simulated; the measured staleness is {ra['coupling']:.3f} of its value and the "
        f"simulated {rb['coupling']:.3f}"
        + (" (the real workers kept a common rhythm that the prediction lacks; the "
           "calibration's `common factors` and `rhythm` lines above say what was fitted to "
           f"the k = {CALIBRATE_AT} run's)."
           if ra["coupling"] < 0.95 <= rb["coupling"] else ".")
    )
display(Markdown(text))
