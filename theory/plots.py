"""The figure of a theorem check: mean suboptimality with its confidence band against ε."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = ["check_figure"]


def check_figure(result: dict[str, Any]) -> Figure:
    """Mean f(w_t) − f* over seeds with its 95% band and one-sided upper bound, the ε line,
    the (q/2)·bound envelope of Theorem 1's recursion, and t of (10)."""
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
    floor = np.finfo(np.float64).tiny
    ax.fill_between(x, np.maximum(mean - half, floor), mean + half, alpha=0.25,
                    label="95% confidence band")
    ax.semilogy(x, np.maximum(mean, floor), label=f"mean over {result['seeds']} seeds")
    ax.semilogy(x, np.asarray(v["upper"]), linestyle=":", label="one-sided 95% upper bound")
    if v["envelope"] is not None:
        ax.semilogy(x, v["envelope"], linestyle="--", label="(q/2)·recursion bound")
    ax.axhline(eps, color="black", linewidth=1, label=f"ε = {eps:g}")
    last = result["rounds"][-1]
    if last.get("updates") is not None and last["updates"] <= x[-1]:
        ax.axvline(last["updates"], color="grey", linestyle="-.", label="t of (10)")
    if v["reached_eps_at"] is not None:
        ax.axvline(v["reached_eps_at"], color="#8172B3", linestyle=":", label="mean reaches ε")
    ax.set_xlabel("updates")
    ax.set_ylabel("f(w_t) − f*")
    ax.set_title(f"Theorem 1 check: {result['scenario']} (γ = {last.get('gamma', 0):.3g})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
