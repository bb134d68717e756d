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
# # Theorem 1 of AsynGrad, checked on simulated runs
#
# The theorem (Sun 2016): with c-strong convexity (4), q-smooth gradients (5), E‖s_t‖² ≤ κ² (6)
# and a bounded gradient error −E⟨δ_t, w_{t−1} − w*⟩ ≤ τ (7), the learning rate
# γ = (cε − 2τq)/(βqκ²) (9) reaches E[f(w_t) − f*] ≤ ε after t (10) updates, provided
# 2τq < cε. (The wording of (4)–(7) is reconstructed from (9)–(10).)
#
# 1. Measure the constants on a lock-free scenario and validate the bound by Monte Carlo.
# 2. Inject adversarial gradient errors of growing size and find where convergence stops,
#    against the theorem's limit τ < cε/(2q).

# %% tags=["parameters"]
EPS = 0.05          # target accuracy ε
SEEDS = 10          # Monte Carlo runs
SWEEP_SEEDS = 4     # runs per injected error size
POINTS = 7          # error sizes in the sweep
OVERRIDES = ["problem.name=quadratic", "problem.l2=0.5", "problem.dim=10",
             "problem.n_samples=200", "run.updates=2000", "run.write_mode=atomic_add"]

# %%
import io

from IPython.display import Image, Markdown, display

from simulator.scenario import load_scenario
from theory.check import check_theorem
from theory.injection import tau_sweep
from theory.plots import check_figure, tausweep_figure

scenario = load_scenario(None, OVERRIDES)


def show(figure) -> None:
    """Figures are plain matplotlib ``Figure`` objects: shown as PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    display(Image(data=buffer.getvalue()))

# %% [markdown]
# ## 1. Conditions and the Monte Carlo validation (lock-free, 8 threads, atomic adds)

# %%
result = check_theorem(scenario, EPS, SEEDS)
for name, condition in result["conditions"].items():
    print(name, {k: v for k, v in condition.items() if k != "source"})
last = result["rounds"][-1]
print(f"γ (9) = {last.get('gamma', float('nan')):.4g}, t (10) = {last.get('updates')}")
show(check_figure(result))

# %% [markdown]
# ## 2. Where does convergence stop? Adversarial error injection (serial, so the injected
# ## error is the only one)

# %%
serial = load_scenario(None, [*OVERRIDES, "run.protocol=serial"])
sweep = tau_sweep(serial, EPS, SWEEP_SEEDS, points=POINTS)
for point in sweep["points"]:
    print(f"b = {point['bound']:.3g}: τ = {point['tau']:.3g}, final f − f* = "
          f"{point['final_mean']:.3g}, reached ε: {point['reached_eps']}")
show(tausweep_figure(sweep))

# %% [markdown]
# ## Conclusion

# %%
v = result.get("validation")
check_text = (f"On the lock-free scenario the check says: {result['verdict']}." if v is None
              else f"On the lock-free scenario the mean suboptimality after t = "
              f"{last['ran_updates']:,} updates is {v['final_mean']:.3g} (95% upper bound "
              f"{v['final_upper']:.3g}) against ε = {EPS:g}; verdict: {result['verdict']}.")
if sweep.get("breaking_tau") is not None and sweep.get("last_reached") is not None:
    sweep_text = (f"With injected adversarial errors, convergence to ε stops between τ = "
                  f"{sweep['last_reached']['tau']:.3g} and {sweep['breaking_tau']:.3g}, while "
                  f"the theorem's limit is {sweep['tau_limit']:.3g}: the theorem is "
                  f"{sweep['last_reached']['tau'] / sweep['tau_limit']:.3g}–"
                  f"{sweep['conservatism']:.3g}× conservative here.")
else:
    sweep_text = f"The error-injection sweep says: {sweep['verdict']}."
display(Markdown(check_text + " " + sweep_text))
