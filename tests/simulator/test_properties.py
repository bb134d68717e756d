"""Properties over random small scenarios (hypothesis)."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import Engine
from simulator.metrics import error_mask
from simulator.replay import replay
from tests.conftest import scenario

DISTS = ["{dist='constant', mean=%d}", "{dist='exponential', mean=%d}",
         "{dist='lognormal', mean=%d, cv=0.8}", "{dist='uniform', low=0, high=%d}"]


@st.composite
def scenarios(draw):
    problem = draw(st.sampled_from(["quadratic", "logistic", "sparse_logistic"]))
    dim = draw(st.integers(2, 12)) if problem != "sparse_logistic" else draw(st.integers(8, 40))
    overrides = [
        f"problem.name={problem}", f"problem.dim={dim}", "problem.n_samples=30",
        "problem.density=0.15", f"problem.seed={draw(st.integers(0, 5))}",
        f"run.protocol={draw(st.sampled_from(['serial', 'locked', 'lockfree']))}",
        f"run.threads={draw(st.integers(1, 5))}",
        f"run.updates={draw(st.integers(1, 40))}",
        f"run.blocks={draw(st.integers(1, min(dim, 4)))}",
        f"run.write_mode={draw(st.sampled_from(['load_store', 'atomic_add']))}",
        f"run.seed={draw(st.integers(0, 1000))}",
        f"run.lr={draw(st.sampled_from([0.01, 0.1, 0.5]))}",
        f"devices.0.cores={draw(st.integers(0, 3))}",
        f"devices.0.bus={draw(st.integers(0, 2))}",
    ]
    for op in ("read", "grad", "write"):
        template = draw(st.sampled_from(DISTS))
        overrides.append(f"timing.{op}={template % draw(st.integers(1, 3000))}")
    return scenario(*overrides)


def _run_with_snapshots(s):
    engine = Engine(s)
    snapshots = [engine.mem.w.copy()]
    complete = engine.view.complete

    def record(t, w, samples, time, *rest):
        snapshots.append(w.copy())
        return complete(t, w, samples, time, *rest)

    engine.view.complete = record
    return engine.run(), snapshots


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_serialized_view_telescopes(s):
    """Σ lr·s_t = w_0 − w_T, the last snapshot is the final vector, ‖s_t‖ is recorded."""
    trace, snaps = _run_with_snapshots(s)
    lr = s.run.lr
    steps = [(a - b) / lr for a, b in itertools.pairwise(snaps)]
    assert np.allclose(lr * np.sum(steps, axis=0), snaps[0] - snaps[-1], atol=1e-12)
    assert np.array_equal(snaps[-1], trace["w_final"])
    recorded = trace["s_norm"]
    assert np.array_equal(recorded, [np.linalg.norm(step) for step in steps])


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_staleness_and_overwrite_bounds(s):
    """0 ≤ staleness ≤ T−1; lost stores balance overwrites; atomic_add and locked lose none."""
    trace, _ = _run_with_snapshots(s)
    assert len(trace) == s.run.updates
    assert trace["staleness"].min() >= 0 and trace["staleness"].max() <= len(trace) - 1
    assert trace["lost_blocks"].sum() == trace["overwrote"].sum()
    assert np.all(trace["read_overwrites"] <= np.diff(trace["op_offsets"]))
    if s.run.write_mode == "atomic_add" or s.run.protocol != "lockfree" or s.run.threads == 1:
        assert trace["lost_blocks"].sum() == 0
    if s.run.protocol != "lockfree" or s.run.threads == 1:
        assert trace["staleness"].max() == 0 and not error_mask(trace).any()
        assert not trace["torn"].any()


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_replay_reproduces_any_trace(s):
    """Replaying any trace with its own scenario reproduces every array."""
    trace, _ = _run_with_snapshots(s)
    _, _, again = replay(trace)
    for name, array in trace.arrays.items():
        assert np.array_equal(again[name], array, equal_nan=array.dtype.kind == "f"), name


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_lookahead_changes_nothing(s):
    """Applying uninterruptible actions at once gives the same trace as one event per action."""
    from simulator.engine import simulate
    fast, slow = simulate(s), simulate(s, lookahead=False)
    for name, array in slow.arrays.items():
        assert np.array_equal(fast[name], array, equal_nan=array.dtype.kind == "f"), name
