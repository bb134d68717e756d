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
# # Every protocol, real and simulated, side by side
#
# The asynchronous-SGD literature compares lock-free training with synchronous minibatch SGD
# (the baseline), delayed SGD in a fixed order (Langford et al. 2009), staleness-aware
# learning rates (Zhang et al. 2016), delay compensation (Zheng et al. 2017), asynchronous
# consensus ADMM (Boyd et al. 2011; Zhang & Kwok 2014) and stochastic block ADMM (the model's
# two halves joined by auxiliary variables); the parameter-server systems (DistBelief's
# Downpour and Sandblaster, Project Adam) put the vector on a server instead. This notebook
# trains one problem with each of them on real worker processes sharing one vector (block
# ADMM: one process per half of the features), and on a real parameter server over
# torch.distributed (a plain server, one that applies DC-ASGD's compensation with each push's
# exact staleness, a lock-free server, backup workers, a pool of two servers, consensus ADMM
# with z on the server, Sandblaster L-BFGS with the server its coordinator), and simulates
# each with the scenario the real run recorded:
#
# 1. suboptimality against wall-clock time: which protocol gets furthest per second on this
#    machine;
# 2. suboptimality against gradients computed, real and simulated: what each protocol does
#    with the same work, and whether the simulation follows the hardware;
# 3. per protocol: gradients per second, staleness and the gradient error of the real run.
#
# The conclusion at the end is computed from this run's numbers.

# %% tags=["parameters"]
UPDATES = 8_000      # gradients per run
WORKERS = 2          # real worker processes (and simulated threads)
DIM = 100            # dense logistic regression
PROTOCOLS = ("serial", "lockfree", "minibatch", "roundrobin", "staleness_lr", "dcasgd", "admm",
             "block_admm")
# on the parameter server (--backend ps): name -> scenario settings
SERVER = {"ps": [], "ps dcasgd rule": ["paramserver.rule=dcasgd"],
          "ps lock-free": ["paramserver.lock_free=true"],
          "ps backup workers": ["paramserver.fraction=0.5"],
          "ps pool of 2": ["paramserver.servers=2", "run.blocks=2"],
          "ps admm": ["run.protocol=admm"],
          "ps sandblaster": ["run.protocol=sandblaster", "run.lr=1.0"]}
LOCAL_STEPS = 10     # gradients per ADMM push (its local solve)

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from realrun.ps import run_ps
from realrun.runner import run_real
from simulator import load_scenario, make_problem
from simulator.engine import simulate

SETTINGS = [f"problem.dim={DIM}", f"run.updates={UPDATES}", "dcasgd.lam=0.5",
            f"admm.local_steps={LOCAL_STEPS}"]
problem = make_problem(load_scenario(None, SETTINGS).problem)
f_star = problem.optimum()[1]
# Sandblaster's rounds: each hands out sandblaster.units work units covering every sample once
UNITS = load_scenario(None, SETTINGS).sandblaster.units
ROUNDS = UPDATES // problem.n_samples

# %% [markdown]
# ## The runs
#
# Each protocol runs for real (float64; measure mode rebuilds the serialized view for exact
# gradient errors at every 10th completion), then the simulator runs the scenario the real run
# recorded (`RealRun.scenario`: the protocol, its worker count, its split of the updates).
# ADMM makes `UPDATES / LOCAL_STEPS` pushes, the same gradients (`work` counts them); a push is
# not a gradient step, so measure mode gives its exact loss curve and no gradient error.
# Sandblaster makes `UPDATES / n` rounds of full-gradient L-BFGS, each of `sandblaster.units`
# work units of n / units gradients, at its natural step (`run.lr = 1`); no gradient error
# either. Block ADMM's rows are each one stage's update of a sample (a gradient of half the
# coordinates; its two processes need `run.threads = run.blocks = 2`), its error measured on
# the stage against f's exact gradient. The server runs measure mode too (its own vector is
# the serialized view; a lock-free server's and a pool's view is rebuilt from the pushes it
# applied).

# %%
runs, work = {}, {}
for protocol in PROTOCOLS:
    workers = 1 if protocol == "serial" else WORKERS
    admm = protocol == "admm"
    work[protocol] = LOCAL_STEPS if admm else 1  # gradients per trace row
    stages = ["run.threads=2", "run.blocks=2"] if protocol == "block_admm" else []
    scenario = load_scenario(None, [*SETTINGS, f"run.protocol={protocol}", *stages,
                                    f"run.updates={UPDATES // work[protocol]}"])
    real = run_real(scenario, workers, protocol, dtype="float64", problem=problem,
                    measure_every=10)
    assert real.failure is None, real.failure
    runs[protocol] = (real, simulate(real.scenario, problem=problem))
    print(f"{protocol:>14}: {len(real.trace) * work[protocol]:,} gradients in "
          f"{real.seconds:.2f} s")
for name, settings in SERVER.items():
    work[name] = (LOCAL_STEPS if "run.protocol=admm" in settings
                  else problem.n_samples / UNITS if "run.protocol=sandblaster" in settings
                  else 1)
    rows = ROUNDS * UNITS if "run.protocol=sandblaster" in settings else UPDATES // work[name]
    scenario = load_scenario(None, [*SETTINGS, "run.protocol=paramserver", *settings,
                                    f"run.updates={rows}"])
    real = run_ps(scenario, WORKERS, "float64", problem=problem, measure=True)
    assert real.failure is None, real.failure
    runs[name] = (real, simulate(real.scenario, problem=problem))
    print(f"{name:>14}: {len(real.trace) * work[name]:,.0f} gradients in {real.seconds:.2f} s")

# %% [markdown]
# ## Suboptimality against wall time and against gradients computed

# %%
fig, (by_time, by_work) = plt.subplots(1, 2, figsize=(12, 4.5))
for (protocol, (real, sim)), color in zip(runs.items(), plt.cm.tab20.colors, strict=False):
    trace = real.trace
    gap = np.maximum(trace["curve_loss"] - f_star, 1e-12)
    later = trace["curve_time"] > 0  # (a log axis: the server's runs take 100× longer)
    by_time.plot(trace["curve_time"][later] / 1e6, gap[later], color=color, label=protocol)
    by_work.plot(trace["curve_n"] * work[protocol], gap, color=color, label=f"{protocol} (real)")
    by_work.plot(sim["curve_n"] * work[protocol], np.maximum(sim["curve_loss"] - f_star, 1e-12),
                 color=color,
                 linestyle="--", label=f"{protocol} (simulated)")
by_time.set(xlabel="wall time (ms)", ylabel="f(w) − f*", xscale="log", yscale="log",
            title=f"real workers (k = {WORKERS})")
by_work.set(xlabel="gradients computed", ylabel="f(w) − f*", yscale="log",
            title="real (solid) and simulated (dashed)")
by_time.legend(fontsize=7)
by_work.legend(fontsize=6, ncol=2)
fig.tight_layout()
plt.show()

# %% [markdown]
# Reading the curves: at a constant learning rate SGD settles at a noise floor that grows
# with the learning rate times the variance of the gradients it applies. A minibatch round
# applies the mean of k gradients, with 1/k of that variance, at the same learning rate per
# step, so it settles lower, while making k times fewer steps for the same gradients; the
# asynchronous protocols apply one gradient a step, as serial SGD does, plus what
# concurrency did to it. ADMM pushes the change of a local solve on one worker's half of the
# data, pulled towards the consensus by ρ: it moves z by 1/k of that change a push.
# Sandblaster's L-BFGS steps use the full gradient: no noise floor, but a step only every
# n gradients. Block ADMM trains each half of the model on its own, coupled through the
# auxiliary variables, and gets less far for the same work. The
# server's runs are slower per gradient: every pull and push is a message over loopback
# (a pool sends one per server), where the shared-memory workers copy memory.

# %% [markdown]
# ## Per protocol


# %%
def rate(trace, protocol) -> float:
    """Gradients per second over the real run's span."""
    span = (trace["write_end"].max() - trace["read_start"].min()) / 1e9
    return len(trace) * work[protocol] / span


rows = []
for protocol, (real, sim) in runs.items():
    t, s = real.trace, sim
    measured = t["measured"]
    errors = (float(np.mean(t["delta_norm"][measured] > 1e-9 * t["g_norm"][measured]))
              if measured.any() else float("nan"))  # (ADMM, Sandblaster: none measured)
    rows.append({"protocol": protocol, "gradients/s": rate(t, protocol),
                 "staleness (real)": float(t["staleness"].mean()),
                 "staleness (simulated)": float(s["staleness"].mean()),
                 "error rate (real)": errors,
                 "final f − f* (real)": float(t["curve_loss"][-1] - f_star),
                 "final f − f* (simulated)": float(s["curve_loss"][-1] - f_star)})
header = list(rows[0])
lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
for row in rows:
    lines.append("| " + " | ".join(f"{v:,.4g}" if isinstance(v, float) else str(v)
                                   for v in row.values()) + " |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Conclusion

# %%
by_name = {row["protocol"]: row for row in rows}
fastest = max(rows, key=lambda row: row["gradients/s"])
lowest = min(rows, key=lambda row: row["final f − f* (real)"])
free, sync = by_name["lockfree"], by_name["minibatch"]
closest = [row["protocol"] for row in rows
           if abs(np.log(max(row["final f − f* (real)"], 1e-12)
                         / max(row["final f − f* (simulated)"], 1e-12))) < np.log(2)]
text = (
    f"With {WORKERS} workers on this machine, lock-free training computed "
    f"{free['gradients/s']:,.0f} gradients per second against synchronous minibatch's "
    f"{sync['gradients/s']:,.0f} ({free['gradients/s'] / sync['gradients/s']:.2f}×); the "
    f"fastest protocol was {fastest['protocol']} and the lowest final suboptimality after "
    f"{UPDATES:,} gradients was {lowest['protocol']}'s ({lowest['final f − f* (real)']:.3g}). "
    f"Lock-free updates carried a gradient error on {free['error rate (real)']:.1%} of the "
    f"measured completions, with mean staleness {free['staleness (real)']:.2f} "
    f"(simulated: {free['staleness (simulated)']:.2f}). The simulation's final "
    f"suboptimality is within 2× of the real run's for {len(closest)} of {len(rows)} "
    f"protocols ({', '.join(closest) or 'none'})."
)
display(Markdown(text))
