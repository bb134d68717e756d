"""The shared parameter vector, split into B contiguous blocks, with an exact store history.

Every store gets a global sequence number and is remembered per block with the update that
made it and the coordinates it touched (``None``: the whole block). From that history the
memory answers, exactly and at coordinate granularity:

* which earlier stores a read-modify-write overwrote (lost updates under ``load_store``; a
  store covers a whole block, or one grain of it — a ``range`` of coordinates — when writes
  are swept grain by grain, ``run.store_grain``).

Read-overwrites and torn reads come from when copies and stores happened
(:func:`simulator.trace.read_report`): ``seq`` orders them.

History is trimmed below the oldest version an in-flight update still needs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["AtomicAdd", "Grain", "LoadStore", "Op", "SharedMemory", "WriteMode", "block_bounds",
           "block_ops", "grain_durations", "grain_ops"]

Index = slice | np.ndarray


# Coordinates a store or copy touched: None (the whole block), a sorted index array (sparse
# supports), or a range (one grain of a dense block).
Coords = np.ndarray | range | None

# One remembered store: (global sequence number, update id, coordinates). Plain tuples: one is
# made per block store, on the hot path.
_Store = tuple[int, int, Coords]


def block_bounds(dim: int, blocks: int) -> list[int]:
    """Start of each block and the end of the last: sizes differ by at most one."""
    return [(b * dim) // blocks for b in range(blocks + 1)]


# One block an update moves: block id, index into w, index into the gradient values, and the
# coordinates (None: the whole block, for dense gradients).
Op = tuple[int, Any, slice, np.ndarray | None]

# One read-modify-write of a swept write (``grain_ops``): an op, or a grain of one.
Grain = tuple[int, Any, slice, Coords]


def grain_ops(ops: list[Op], grain: int) -> tuple[list[Grain], list[int]]:
    """``ops`` cut into read-modify-writes of at most ``grain`` coordinates each, in order,
    and how many pieces each op gave. Dense blocks give contiguous grains (coordinates as a
    ``range``), sparse ones consecutive groups of their support."""
    pieces: list[Grain] = []
    counts: list[int] = []
    for block, index, vsel, coords in ops:
        before = len(pieces)
        if coords is None:
            for lo in range(index.start, index.stop, grain):
                hi = min(lo + grain, index.stop)
                pieces.append((block, slice(lo, hi), slice(lo, hi), range(lo, hi)))
        else:
            for lo in range(0, coords.size, grain):
                part = coords[lo: lo + grain]
                pieces.append((block, part, slice(vsel.start + lo, vsel.start + lo + part.size),
                               part))
        counts.append(len(pieces) - before)
    return pieces, counts


def grain_durations(block_ns: list[int], counts: list[int]) -> list[int]:
    """Each grain's share of its block's write duration: integer ns, consecutive, that add up
    to the block's (``counts``: the grains of each block, as :func:`grain_ops` gives them)."""
    durations: list[int] = []
    for ns, count in zip(block_ns, counts, strict=True):
        ends = [ns * (c + 1) // count for c in range(count)]
        durations.extend(end - start for start, end in zip([0, *ends], ends, strict=False))
    return durations


def block_ops(bounds: list[int], support: np.ndarray | None) -> list[Op]:
    """The blocks an update moves: all of them for a dense gradient (``support`` None), else
    those holding a coordinate of the sorted ``support`` (with the coordinates in each)."""
    if support is None:
        return [(b, slice(lo, hi), slice(lo, hi), None)
                for b, (lo, hi) in enumerate(itertools.pairwise(bounds))]
    cuts = np.searchsorted(support, bounds).tolist()
    return [(b, support[p0:p1], slice(p0, p1), support[p0:p1])
            for b, (p0, p1) in enumerate(itertools.pairwise(cuts)) if p1 > p0]


def _overlaps(a: Coords, b: Coords) -> bool:
    if a is None or b is None:
        return True
    if isinstance(a, range) and isinstance(b, range):
        return a.start < b.stop and b.start < a.stop
    if isinstance(a, range):
        a = np.arange(a.start, a.stop)
    if isinstance(b, range):
        b = np.arange(b.start, b.stop)
    return bool(np.intersect1d(a, b, assume_unique=True).size)


class SharedMemory:
    """The shared vector ``w`` and its per-block store history."""

    def __init__(self, w0: np.ndarray, blocks: int, bounds: list[int] | None = None) -> None:
        """``blocks`` of sizes that differ by at most one, or the blocks ``bounds`` gives
        (each block's start and the end of the last: a model's stages)."""
        self.w = np.array(w0, dtype=np.float64)
        self.bounds = block_bounds(self.w.size, blocks) if bounds is None else bounds
        self.seq = 0
        self.count = [0] * blocks  # stores each block has received: its version
        self._history: list[list[_Store]] = [[] for _ in range(blocks)]
        self._base = [0] * blocks  # version of the oldest store still in the history
        # Low-precision writes: rounds stored values in place (None: full float64).
        self.quantize: Callable[[np.ndarray], None] | None = None

    def _rounded(self, index: Index) -> None:
        assert self.quantize is not None
        if isinstance(index, slice):
            self.quantize(self.w[index])
        else:
            values = self.w[index]
            self.quantize(values)
            self.w[index] = values

    def _window(self, block: int, start: int, stop: int | None = None) -> list[_Store]:
        base = self._base[block]
        return self._history[block][start - base: None if stop is None else stop - base]

    def stores_since(self, block: int, version: int, coords: Coords) -> list[int]:
        """Updates whose stores to ``coords`` of ``block`` landed after ``version``."""
        window = self._window(block, version)
        if coords is None:
            return [store[1] for store in window]
        return [store[1] for store in window if _overlaps(store[2], coords)]

    def copy(self, index: Index, out: np.ndarray) -> None:
        """Copy a block's coordinates into ``out`` (the end of a block read)."""
        out[index] = self.w[index]

    def copy_run(self, ops: list[Any], out: np.ndarray) -> None:
        """Copy consecutive blocks that nothing can interleave with (one numpy copy for the
        contiguous span of dense blocks)."""
        if ops[0][3] is not None:
            for op in ops:
                self.copy(op[1], out)
            return
        span = slice(ops[0][1].start, ops[-1][1].stop)
        out[span] = self.w[span]

    def write_run(self, ops: Sequence[Any], step: np.ndarray, uid: int, atomic: bool) -> None:
        """Write consecutive blocks that nothing can interleave with: no store in between, so
        no update is lost, and dense blocks update their contiguous span in one operation
        (elementwise the same arithmetic as block by block)."""
        if ops[0][3] is not None and not isinstance(ops[0][3], range):
            for block, index, vsel, coords in ops:
                if atomic:
                    self.add(block, index, coords, -step[vsel], uid)
                else:
                    self.store(block, index, coords, self.load(index), step[vsel], uid,
                               self.count[block])
            return
        span = slice(ops[0][1].start, ops[-1][1].stop)  # dense blocks, or grains of them
        if atomic:
            self.w[span] += -step[span]
        else:
            np.subtract(self.w[span], step[span], out=self.w[span])
        if self.quantize is not None:
            self._rounded(span)
        for block, index, _, coords in ops:
            self._record(block, index, coords, uid)

    def load(self, index: Index) -> np.ndarray:
        """The current values (the load of a read-modify-write)."""
        return self.w[index].copy()

    def store(self, block: int, index: Index, coords: Coords, loaded: np.ndarray,
              step: np.ndarray, uid: int, loaded_at: int) -> list[int]:
        """Store ``loaded − step``, ending a read-modify-write whose load saw version
        ``loaded_at``. Returns the updates whose stores in between are overwritten (lost)."""
        lost = ([u for u in self.stores_since(block, loaded_at, coords) if u != uid]
                if self.count[block] != loaded_at else [])
        if coords is None:
            np.subtract(loaded, step, out=self.w[index])
        else:
            self.w[index] = loaded - step
        if self.quantize is not None:
            self._rounded(index)
        self._record(block, index, coords, uid)
        return lost

    def add(self, block: int, index: Index, coords: Coords, delta: np.ndarray,
            uid: int) -> None:
        """Atomically add ``delta``: no store is ever lost."""
        self.w[index] += delta
        if self.quantize is not None:
            self._rounded(index)
        self._record(block, index, coords, uid)

    def _record(self, block: int, index: Index, coords: Coords, uid: int) -> None:
        self.seq += 1
        self.count[block] += 1
        self._history[block].append((self.seq, uid, coords))

    def trim(self, keep: list[int]) -> None:
        """Forget stores below ``keep[b]`` for each block (no in-flight update needs them)."""
        for block, version in enumerate(keep):
            drop = version - self._base[block]
            if drop > 0:
                del self._history[block][:drop]
                self._base[block] = version


class WriteMode:
    """How one block (or grain) write lands: ``begin`` when it starts, ``end`` when its time
    has passed. ``runs``: whether consecutive writes that nothing can interleave with may
    land as one (``SharedMemory.write_run``). ``leads``: whether a write begins only
    ``lead`` ns into its time (a server's shard loaded once it has arrived)."""

    runs = True
    leads = False

    def begin(self, u: Any, block: int, index: slice, now: int, duration: int) -> Any:
        """A write of ``block`` starts at ``now`` for ``duration`` ns: what ``end`` needs."""
        return None

    def end(self, u: Any, block: int, index: slice, coords: Coords, begun: Any,
            step: np.ndarray) -> None:
        """The write ends: it stores the block's part of ``step``."""
        raise NotImplementedError

    def lost_of(self, block: int) -> dict[int, np.ndarray] | None:
        """The coordinates each write of ``block`` in flight has lost so far (uid → mask),
        for a read that sees part of them; None: writes lose no coordinates."""
        return None

    def lead(self, u: Any, i: int) -> int:
        """With ``leads``: the ns of ``u``'s ``i``-th write that pass before it begins."""
        return 0


class LoadStore(WriteMode):
    """``load_store``: load, wait, store ``loaded − step``, overwriting any store that
    landed in between (a lost update, counted in ``lost`` by uid and in the writer's
    ``overwrote``)."""

    def __init__(self, memory: SharedMemory, lost: list[int]) -> None:
        self.memory, self.lost = memory, lost

    def begin(self, u: Any, block: int, index: slice, now: int,
              duration: int) -> tuple[int, np.ndarray]:
        return self.memory.count[block], self.memory.load(index)

    def end(self, u: Any, block: int, index: slice, coords: Coords,
            begun: tuple[int, np.ndarray], step: np.ndarray) -> None:
        loaded_at, loaded = begun
        lost = self.memory.store(block, index, coords, loaded, step, u.uid, loaded_at)
        for victim in lost:
            self.lost[victim] += 1
        u.overwrote += len(lost)


class AtomicAdd(WriteMode):
    """``atomic_add``: add ``−step`` in one piece; no store is ever lost."""

    def __init__(self, memory: SharedMemory) -> None:
        self.memory = memory

    def end(self, u: Any, block: int, index: slice, coords: Coords, begun: Any,
            step: np.ndarray) -> None:
        self.memory.add(block, index, coords, -step, u.uid)
