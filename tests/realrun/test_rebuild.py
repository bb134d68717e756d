"""The measure-mode rebuild against hand-made records with a store the hardware lost."""

import numpy as np

from realrun.rebuild import quiet_reads, rebuild
from simulator.problems import make_problem
from simulator.scenario import ProblemSpec

LR = 0.1


def test_quiet_reads_are_those_no_write_overlaps():
    # Rows: (read start, read end, write start, write end).
    times = np.array([[0, 10, 20, 30],     # row 0: write 20–30
                      [25, 28, 40, 50],    # read inside row 0's write: not quiet
                      [31, 35, 60, 70],    # between writes: quiet
                      [45, 65, 80, 90],    # spans row 1's write end and row 2's start
                      [72, 79, 95, 99]])   # quiet
    assert quiet_reads(*times.T).tolist() == [0, 2, 4]


def _records(lost: bool):
    """One worker, three sequential updates of a quadratic: each step computed at what its
    read saw. With ``lost``, the hardware lost update 0's store: reads 1 and 2 never see it."""
    problem = make_problem(ProblemSpec(name="quadratic", dim=3, n_samples=5, seed=1))
    w_real, steps, reads = problem.initial().copy(), [], []
    w_rebuilt = w_real.copy()
    for i, sample in enumerate((0, 1, 2)):
        reads.append(w_real.copy())
        g, _ = problem.grad(w_real.copy(), sample)
        steps.append(LR * g)
        if not (lost and i == 0):
            w_real -= LR * g
        w_rebuilt -= LR * g
    times = np.array([[100 * i, 100 * i + 10, 100 * i + 50, 100 * i + 60] for i in range(3)])
    return problem, np.array(steps), np.array(reads), times, w_real, w_rebuilt


def _errors(problem, steps, times, reads):
    built = rebuild(problem, LR, [0, problem.dim], "float64", 1, times[:, 3:4].copy(),
                    [steps], np.zeros(3, dtype=np.int64), np.arange(3), np.arange(3),
                    times[:, 3], None if reads is None else [reads], times, curve_points=3)
    measured, _, g_norm, delta_norm, _ = (np.array(c) for c in zip(*built.measurements,
                                                                       strict=True))
    assert measured.all()
    return (delta_norm > 1e-9 * g_norm).tolist(), built


def test_a_lost_store_is_one_error_when_reads_follow_the_real_vector():
    problem, steps, reads, times, w_real, w_rebuilt = _records(lost=True)
    # Lossless view: update 1 and every later one read a vector the view never had.
    lossless, built = _errors(problem, steps, times, None)
    assert lossless == [False, True, True] and built.quiet_reads == 0
    # Following the memory: read 1 (quiet) reveals the loss, completion 2 carries it, and
    # update 2, computed at the real vector, is exact again.
    memory, built = _errors(problem, steps, times, reads)
    assert memory == [False, True, False] and built.quiet_reads == 3
    assert np.array_equal(built.w_final, w_rebuilt)  # every step applied: the lossless w_T
    assert not np.allclose(w_real, w_rebuilt)


def test_without_losses_both_views_agree_to_the_bit():
    problem, steps, reads, times, _, _ = _records(lost=False)
    (a, built_a), (b, built_b) = (_errors(problem, steps, times, r) for r in (None, reads))
    assert a == b == [False, False, False]
    assert built_a.measurements == built_b.measurements
