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
# # Scenarios: what lock-free training does to the gradients
#
# 1. Build a scenario, run it, look at the thread timeline.
# 2. The Sync/Async × Sparse/Dense table of the AsynGrad talk, measured.
# 3. Gradient error against the number of threads, dense vs sparse.
# 4. Gradient error against the write/compute time ratio: a sweep of one parameter.

# %% tags=["parameters"]
UPDATES = 4000
THREADS = (1, 2, 4, 8, 16, 32)
RATIOS = (0.05, 0.1, 0.2, 0.4, 0.8)

# %%
import io

import numpy as np
from IPython.display import Image, Markdown, display
from matplotlib.figure import Figure

from simulator import load_scenario, simulate
from simulator.metrics import error_mask, relative_error
from simulator.plots import timeline_figure
from simulator.table import paper_table, table_markdown


def show(figure: Figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    display(Image(data=buffer.getvalue()))


DENSE = ["problem.name=logistic", "problem.dim=100"]
SPARSE = ["problem.name=sparse_logistic", "problem.dim=1000", "problem.density=0.01",
          "problem.n_samples=2000"]

# %% [markdown]
# ## 1. One scenario: dense logistic regression, 8 lock-free threads, 4 blocks

# %%
scenario = load_scenario(None, [*DENSE, "run.threads=8", "run.blocks=4",
                                f"run.updates={UPDATES}"])
trace = simulate(scenario)
print(f"error rate {error_mask(trace).mean():.3f}, mean staleness "
      f"{trace['staleness'].mean():.2f}, torn reads {int(trace['torn'].sum())}, lost blocks "
      f"{int(trace['lost_blocks'].sum())}")
show(timeline_figure(trace))

# %% [markdown]
# ## 2. The table

# %%
cells = paper_table(updates=UPDATES, threads=8)
display(Markdown(table_markdown(cells)))

# %% [markdown]
# ## 3. Error against the number of threads

# %%
def error_stats(overrides: list[str]) -> tuple[float, float]:
    t = simulate(load_scenario(None, [*overrides, f"run.updates={UPDATES}"]))
    relative = relative_error(t)
    return float(error_mask(t).mean()), float(np.median(relative))


by_threads = {name: [error_stats([*base, f"run.threads={k}"]) for k in THREADS]
              for name, base in (("dense", DENSE), ("sparse", SPARSE))}
fig = Figure(figsize=(10, 3.8), layout="constrained")
rate_ax, size_ax = fig.subplots(1, 2)
for name, stats in by_threads.items():
    rate_ax.plot(THREADS, [s[0] for s in stats], marker="o", label=name)
    size_ax.semilogy(THREADS, [max(s[1], 1e-18) for s in stats], marker="o", label=name)
for ax, label in ((rate_ax, "gradient error rate"), (size_ax, "median ‖δ‖/‖g‖")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threads k")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
show(fig)

# %% [markdown]
# ## 4. Error against the write/compute time ratio (8 threads, dense)

# %%
by_ratio = [error_stats([*DENSE, "run.threads=8",
                         f"timing.write.mean={6000 * r}", f"timing.read.mean={6000 * r}"])
            for r in RATIOS]
fig = Figure(figsize=(5.5, 3.8), layout="constrained")
ax = fig.subplots()
ax.semilogx(RATIOS, [s[1] for s in by_ratio], marker="o")
ax.set_xlabel("write (and read) time / gradient time")
ax.set_ylabel("median ‖δ‖/‖g‖")
ax.grid(True, which="both", alpha=0.3)
show(fig)

# %% [markdown]
# ## Conclusion

# %%
dense8 = next(c for c in cells if c["row"] == "async" and c["column"] == "dense")
sparse8 = next(c for c in cells if c["row"] == "async" and c["column"] == "sparse")
k_max = THREADS[-1]
display(Markdown(
    f"With 8 lock-free threads, {dense8['error_rate']:.0%} of the dense model's updates carry a "
    f"gradient error (median ‖δ‖/‖g‖ {dense8['relative_error_p50']:.2g}) against "
    f"{sparse8['error_rate']:.0%} of the sparse model's (median "
    f"{sparse8['relative_error_p50']:.2g}); both run {dense8['speedup']:.1f}× and "
    f"{sparse8['speedup']:.1f}× faster than serial in simulated time and end at training "
    f"accuracy {dense8['accuracy']:.3f} and {sparse8['accuracy']:.3f} (serial "
    f"{dense8['serial_accuracy']:.3f}, {sparse8['serial_accuracy']:.3f}). At k = {k_max} the "
    f"dense error rate is {by_threads['dense'][-1][0]:.0%}, the sparse one "
    f"{by_threads['sparse'][-1][0]:.0%}. The median relative error grows from "
    f"{by_ratio[0][1]:.2g} to {by_ratio[-1][1]:.2g} as writes go from {RATIOS[0]} to "
    f"{RATIOS[-1]} of the gradient time."))
