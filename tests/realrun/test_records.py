"""The workers' recorders: the C one and the Python one write the same rows, on the clock of
``time.monotonic_ns``, and refuse what does not fit."""

import time

import numpy as np
import pytest

from realrun.records import PyRecorder, compiled, recorder

KINDS = [False, pytest.param(True, marks=pytest.mark.skipif(
    not compiled(), reason="realrun._records not built (no C compiler at install)"))]


def buffers(quota, workers=2, blocks=1):
    """Flat int64 buffers as the parent allocates them (block stamps start at −1)."""
    return (np.zeros(quota * 4, np.int64), np.zeros(quota, np.int64),
            np.zeros(workers, np.int64), np.full(quota * blocks, -1, np.int64),
            np.full(quota * blocks, -1, np.int64))


def record_updates(record, quota, blocks, samples):
    """The worker's calls, in its order, with the clock read around each update."""
    bounds = []
    for i in range(quota):
        before = time.monotonic_ns()
        record.start()
        for b in range(blocks):
            record.copied(b)
        record.read_end()
        record.grad_end()
        for b in range(blocks):
            record.stored(b)
        record.written()
        record.done(samples[i])
        bounds.append((before, time.monotonic_ns()))
    return np.array(bounds)


@pytest.mark.parametrize("native", KINDS)
@pytest.mark.parametrize("blocks", [1, 3])
def test_rows_hold_ordered_stamps_on_the_monotonic_clock(native, blocks):
    quota, rank = 50, 1
    times, samples, progress, copy_end, store_end = buffers(quota, blocks=blocks)
    record = recorder(times, samples, progress, rank, copy_end, store_end, blocks,
                      native=native)
    assert isinstance(record, PyRecorder) != native
    picks = np.random.default_rng(0).integers(0, 1000, quota)
    bounds = record_updates(record, quota, blocks, picks.tolist())
    rows = times.reshape(quota, 4)
    assert np.all(np.diff(rows, axis=1) >= 0)  # read start ≤ read end ≤ grad end ≤ write end
    assert np.all(rows[1:, 0] >= rows[:-1, 3])
    assert np.all(rows[:, 0] >= bounds[:, 0]) and np.all(rows[:, 3] <= bounds[:, 1])
    copies, stores = copy_end.reshape(quota, blocks), store_end.reshape(quota, blocks)
    assert np.all(copies >= rows[:, [0]]) and np.all(copies <= rows[:, [1]])
    assert np.all(stores >= rows[:, [2]]) and np.all(stores <= rows[:, [3]])
    assert samples.tolist() == picks.tolist()
    assert progress.tolist() == [0, quota] and record.count == quota


@pytest.mark.parametrize("native", KINDS)
def test_progress_counts_an_update_only_when_it_is_done(native):
    times, samples, progress, copy_end, store_end = buffers(3)
    record = recorder(times, samples, progress, 0, copy_end, store_end, 1, native=native)
    record.start()
    record.read_end()
    record.grad_end()
    record.written()
    assert progress[0] == 0 and record.count == 0
    record.done(7)
    assert progress[0] == 1 and samples[0] == 7 and times[3] > 0


@pytest.mark.parametrize("native", KINDS)
def test_recording_past_the_quota_or_outside_the_blocks_is_refused(native):
    times, samples, progress, copy_end, store_end = buffers(2, blocks=2)
    record = recorder(times, samples, progress, 0, copy_end, store_end, 2, native=native)
    with pytest.raises(IndexError, match="block 2"):
        record.copied(2)
    record_updates(record, 2, 2, [0, 1])
    with pytest.raises(IndexError, match="all 2 updates recorded"):
        record.start()
    assert progress[0] == 2


@pytest.mark.skipif(not compiled(), reason="realrun._records not built")
def test_the_c_recorder_names_the_buffer_that_does_not_fit():
    times, samples, progress, copy_end, store_end = buffers(4)
    with pytest.raises(TypeError, match="times: must be an int64 buffer"):
        recorder(times.astype(np.float64), samples, progress, 0, copy_end, store_end, 1)
    with pytest.raises(ValueError, match="store_end: 4 items, needs at least 8"):
        recorder(times, samples, progress, 0, np.full(8, -1), store_end, 2)
    with pytest.raises(ValueError, match="progress: 2 items, needs at least 3"):
        recorder(times, samples, progress, 2, copy_end, store_end, 1)
    with pytest.raises(TypeError, match="store_end: must be a writable contiguous int64 "
                                        "buffer, not bytes"):
        recorder(times, samples, progress, 0, copy_end, store_end.tobytes(), 1)


def test_the_c_recorder_is_built_where_a_compiler_and_headers_are():
    """The extension is optional at install; where it could be built, it must have been."""
    import shutil
    import sysconfig
    from pathlib import Path

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("no Python headers here")
    assert compiled()
