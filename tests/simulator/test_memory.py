"""The shared vector's pieces: grains of a block write and their durations."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from simulator.memory import block_ops, grain_durations, grain_ops


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 40)), min_size=1, max_size=6))
def test_grain_durations_split_each_block_write_into_consecutive_integer_shares(blocks):
    block_ns = [ns for ns, _ in blocks]
    counts = [count for _, count in blocks]
    durations = grain_durations(block_ns, counts)
    assert len(durations) == sum(counts) and min(durations) >= 0
    at = 0
    for ns, count in blocks:
        shares = durations[at:at + count]
        assert sum(shares) == ns and max(shares) - min(shares) <= 1  # even, to the ns
        at += count


def test_grains_of_dense_and_sparse_blocks():
    dense = block_ops([0, 5, 10], None)
    pieces, counts = grain_ops(dense, 2)
    assert counts == [3, 3]
    assert [(p[0], p[1].start, p[1].stop) for p in pieces[:3]] == [(0, 0, 2), (0, 2, 4), (0, 4, 5)]
    sparse = block_ops([0, 5, 10], np.array([1, 3, 4, 7]))
    pieces, counts = grain_ops(sparse, 2)
    assert counts == [2, 1]
    assert [p[3].tolist() for p in pieces] == [[1, 3], [4], [7]]
