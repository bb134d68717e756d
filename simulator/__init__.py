"""asyngrad-lab simulator: deterministic discrete-event simulation of asynchronous SGD."""

from simulator.engine import Engine, simulate
from simulator.errors import AsyngradError, ScenarioError, SimulationError, TraceError
from simulator.problems import Problem, TorchProblem, make_problem
from simulator.scenario import Scenario, load_scenario, scenario_from_dict, scenario_to_toml
from simulator.trace import Trace

__all__ = ["AsyngradError", "Engine", "Problem", "Scenario", "ScenarioError",
           "SimulationError", "TorchProblem", "Trace", "TraceError", "load_scenario",
           "make_problem", "scenario_from_dict", "scenario_to_toml", "simulate"]
