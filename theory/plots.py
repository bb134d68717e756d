"""Figures of the theory checks: a theorem check (mean suboptimality with its confidence band
against ε) and an error-injection sweep (final suboptimality against the injected τ)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = ["check_figure", "regret_figure", "tausweep_figure"]


def _log_floor(*curves: Any) -> float:
    """The bottom of a log axis: a decade below the smallest positive value of ``curves``
    (a confidence band's lower edge is clipped there: with few seeds it reaches zero or
    below, which a log axis would draw at 1e-308, flattening every curve into one line)."""
    values = np.concatenate([np.ravel(np.asarray(c, dtype=np.float64)) for c in curves])
    positive = values[np.isfinite(values) & (values > 0)]
    return float(positive.min()) / 10 if positive.size else 1e-300


def check_figure(result: dict[str, Any]) -> Figure:
    """Mean f(w_t) − f* over seeds with its 95% band and one-sided upper bound, the ε line,
    the (q/2)·bound envelope of Theorem 1's recursion, and t of (10), for the runs shown: the
    last round that ran them (its γ is in the title, and whether the constants re-measured in
    them leave the theorem a γ at all)."""
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    v, eps = result.get("validation"), result["eps"]
    if v is None:
        ax.text(0.5, 0.5, result["verdict"], ha="center", va="center", wrap=True,
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    x = np.asarray(v["checkpoints"])
    mean, half = np.asarray(v["mean"]), np.asarray(v["half_width"])
    floor = _log_floor(mean, v["upper"], [eps], v["envelope"] or [])
    ax.fill_between(x, np.maximum(mean - half, floor), mean + half, alpha=0.25,
                    label="95% confidence band (clipped at the axis)")
    ax.semilogy(x, np.maximum(mean, floor), label=f"mean over {result['seeds']} seeds")
    ax.semilogy(x, np.asarray(v["upper"]), linestyle=":", label="one-sided 95% upper bound")
    if v["envelope"] is not None:
        ax.semilogy(x, v["envelope"], linestyle="--", label="(q/2)·recursion bound")
    ax.axhline(eps, color="black", linewidth=1, label=f"ε = {eps:g}")
    hogwild = result.get("bound") == "hogwild"
    bound, count = (("Hogwild! Prop. 4.1", "k of (4.2)") if hogwild
                    else ("Theorem 1", "t of (10)"))
    shown = next(e for e in reversed(result["rounds"]) if "validation" in e)
    if shown["updates"] <= x[-1]:
        ax.axvline(shown["updates"], color="grey", linestyle="-.", label=count)
    if v["reached_eps_at"] is not None:
        ax.axvline(v["reached_eps_at"], color="#8172B3", linestyle=":", label="mean reaches ε")
    ax.set_xlabel("updates")
    ax.set_ylabel("f(w_t) − f*")
    title = f"{bound} check: {result['scenario']}, runs at γ = {shown['gamma']:.3g}"
    if "infeasible" in result["rounds"][-1]:  # the constants re-measured in these runs
        title += ("\nre-measured constants: no k by (4.2)" if hogwild else
                  "\nre-measured constants: no γ by (9) (2τq ≥ cε)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=floor)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def tausweep_figure(result: dict[str, Any]) -> Figure:
    """Final mean suboptimality (with its one-sided 95% upper bound) against the measured τ
    of each injected error, the ε line, the theorem's limit cε/(2q) and where convergence
    stopped."""
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    eps = result["eps"]
    points = [p for p in result["points"] if p["tau"] is not None]  # (diverged: in the verdict)
    if not points:
        ax.text(0.5, 0.5, result["verdict"], ha="center", va="center", wrap=True,
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    floor = np.finfo(np.float64).tiny
    tau = np.array([p["tau"] for p in points])
    mean = np.maximum([p["final_mean"] for p in points], floor)
    upper = np.maximum([p["final_upper"] for p in points], floor)
    reached = np.array([p["reached_eps"] for p in points])
    ax.loglog(tau, mean, color="#4C72B0", label=f"mean over {result['seeds']} seeds")
    ax.loglog(tau, upper, ":", color="#4C72B0", label="one-sided 95% upper bound")
    ax.scatter(tau[reached], mean[reached], color="#55A868", zorder=3, label="reached ε")
    ax.scatter(tau[~reached], mean[~reached], color="#C44E52", marker="x", zorder=3,
               label="missed ε")
    ax.axhline(eps, color="black", linewidth=1, label=f"ε = {eps:g}")
    ax.axvline(result["tau_limit"], color="grey", linestyle="--",
               label=f"theorem's limit cε/(2q) = {result['tau_limit']:.3g}")
    if result.get("breaking_tau") is not None:
        ax.axvline(result["breaking_tau"], color="#C44E52", linestyle=":",
                   label=f"empirical break ({result['conservatism']:.3g}× the limit)")
    ax.set_xlabel("τ measured in the runs (−E⟨δ, w − w*⟩, worst window, 95% upper bound)")
    ax.set_ylabel("final f(w) − f*")
    ax.set_title(f"Adversarial error injection: {result['scenario']} "
                 f"(γ = {result['gamma']:.3g}, {result['ran_updates']:,} updates)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def regret_figure(result: dict[str, Any]) -> Figure:
    """Delayed SGD (Langford et al. 2009): per theorem, the mean expected regret over seeds
    against the horizon t, its 95% band and one-sided upper bound, and the theorem's bound
    evaluated with the L and F of the same runs."""
    theorems = result.get("theorems", {})
    fig = Figure(figsize=(5.2 * max(len(theorems), 1), 4.6), layout="constrained")
    if not theorems:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, result["verdict"], ha="center", va="center", wrap=True,
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    for i, (name, e) in enumerate(theorems.items()):
        ax = fig.add_subplot(1, len(theorems), i + 1)
        x = np.asarray(e["checkpoints"])[1:]
        mean, half = np.asarray(e["mean"])[1:], np.asarray(e["half_width"])[1:]
        floor = _log_floor(mean, np.asarray(e["upper"])[1:], np.asarray(e["bound"])[1:])
        ax.fill_between(x, np.maximum(mean - half, floor), mean + half, alpha=0.25,
                        label="95% confidence band")
        ax.loglog(x, np.maximum(mean, floor), label=f"mean regret, {result['seeds']} seeds")
        ax.loglog(x, np.maximum(np.asarray(e["upper"])[1:], floor), ":",
                  label="one-sided 95% upper bound")
        ax.loglog(x, np.asarray(e["bound"])[1:], "--", color="#C44E52",
                  label=f"bound (L = {e['L']:.3g}, F = {e['F']:.3g})")
        if e.get("corollary") is not None:
            ax.axhline(e["corollary"], color="grey", linestyle="-.", linewidth=1,
                       label="4FL√(τT) at T")
        ax.set_ylim(bottom=floor)
        theorem = ("Theorem 1: η = σ/√(t−τ)" if name == "1_convex"
                   else "Theorem 2: η = 1/(λ(t−τ))")
        ax.set_title(f"{theorem}, τ = {result['tau']}", fontsize=10)
        ax.set_xlabel("t (updates)")
        ax.set_ylabel("Σ E[f(x_t)] − f*  (expected regret)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Delayed SGD (Langford et al. 2009): {result['scenario']}", fontsize=11)
    return fig
