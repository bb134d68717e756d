"""asyngrad-lab theory: convergence bounds for asynchronous SGD as pure functions."""

from theory.asyngrad import (
    Constants,
    InfeasibleError,
    contraction,
    error_budget,
    fixed_point,
    learning_rate,
    recursion_bound,
    tau_limit,
    updates,
)

__all__ = ["Constants", "InfeasibleError", "contraction", "error_budget", "fixed_point",
           "learning_rate", "recursion_bound", "tau_limit", "updates"]
