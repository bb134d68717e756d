"""Summary metrics: what summary.json reports of a trace."""

from simulator.engine import simulate
from simulator.metrics import summarize
from simulator.problems import make_problem
from tests.conftest import scenario


def _summary(*overrides: str) -> tuple[dict, object]:
    s = scenario(*overrides)
    problem = make_problem(s.problem)
    trace = simulate(s, problem)
    return summarize(trace, problem, s), trace


def test_dead_threads_are_a_list_even_when_as_many_as_the_rows():
    """18 dead threads in an 18-row run are thread ids, not a per-update series."""
    summary, trace = _summary("problem.dim=10", "run.threads=18", "run.updates=1000",
                              "inject.deaths=[{device=0, at=12500}]")
    assert len(trace) == 18 and trace["extra_dead_threads"].size == 18
    assert summary["dead_threads"] == list(range(18))


def test_threads_is_the_run_thread_count_not_the_trace_highest_id():
    """One update among four threads has one thread's row; the summary still says 4,
    and serial (one thread whatever run.threads says) says 1."""
    summary, trace = _summary("problem.dim=10", "run.threads=4", "run.updates=1")
    assert len(trace) == 1 and summary["threads"] == 4
    summary, _ = _summary("problem.dim=10", "run.threads=4", "run.updates=1",
                          "run.protocol=serial")
    assert summary["threads"] == 1
