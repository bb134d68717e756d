"""Summary metrics: what summary.json reports of a trace."""

import numpy as np

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


def test_the_error_rate_counts_only_updates_with_finite_norms():
    """A diverged run's inf and NaN norms are not "no error": the rate is over the measured
    updates with finite ‖δ‖ and ‖g‖, and None when there are none (as the quantiles)."""
    from simulator.metrics import error_mask, finite_mask

    summary, trace = _summary("problem.dim=10", "run.updates=100", "run.lr=1e300")
    finite = finite_mask(trace)
    assert 0 < finite.sum() < trace["measured"].sum()
    assert summary["gradient_error"]["rate"] == error_mask(trace)[finite].mean()
    measured = trace["measured"]
    trace.arrays["delta_norm"][measured] = np.where(np.arange(measured.sum()) % 2, np.inf,
                                                    np.nan)
    s = scenario("problem.dim=10", "run.updates=100", "run.lr=1e300")
    summary = summarize(trace, make_problem(s.problem), s)
    assert summary["gradient_error"]["rate"] is None
    assert summary["gradient_error"]["relative"]["p50"] is None


def test_the_error_histogram_title_gives_the_summary_rate():
    """errors.png's counts and rate are the summary's (over the updates with finite norms),
    and what it leaves out is counted in its title: before, a diverged run's title divided
    the drawable errors by every measured update (0.560 against the summary's 0.747)."""
    from simulator.metrics import error_mask, finite_mask
    from simulator.plots import error_histogram_figure

    summary, trace = _summary("problem.dim=10", "run.threads=2", "run.updates=400",
                              "run.lr=1e3")
    finite = finite_mask(trace)
    assert 0 < finite.sum() < trace["measured"].sum()  # a run that diverged
    title = error_histogram_figure(trace).axes[0].get_title()
    carried = int((error_mask(trace) & finite).sum())
    rate = summary["gradient_error"]["rate"]
    assert title.startswith(f"Gradient error: {carried} of {int(finite.sum())} measured "
                            f"updates (rate {rate:.3f},")
    assert f"{int(trace['measured'].sum() - finite.sum())} not finite left out" in title
