"""The shared parameter vector, split into B contiguous blocks, with an exact store history.

Every store gets a global sequence number and is remembered per block with the update that
made it and the coordinates it touched (``None``: the whole block). From that history the
memory answers, exactly and at coordinate granularity:

* which earlier stores a read-modify-write overwrote (lost updates under ``load_store``);
* whether a block read saw stores that landed after the update's read began (read-overwrite);
* whether a multi-block read mixes versions that never coexisted (a torn read).

History is trimmed below the oldest version an in-flight update still needs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["BlockCopy", "SharedMemory", "block_bounds"]

Index = slice | np.ndarray


class _Store(NamedTuple):
    seq: int
    uid: int
    coords: np.ndarray | None


class BlockCopy(NamedTuple):
    """What a thread's copy of one block saw: the block, its coordinates, the block's version
    when the copy was taken, and the sequence number of the newest store the copy contains."""

    block: int
    coords: np.ndarray | None
    version: int
    newest: int


def block_bounds(dim: int, blocks: int) -> list[int]:
    """Start of each block and the end of the last: sizes differ by at most one."""
    return [(b * dim) // blocks for b in range(blocks + 1)]


def _overlaps(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return True
    return bool(np.intersect1d(a, b, assume_unique=True).size)


class SharedMemory:
    """The shared vector ``w`` and its per-block store history."""

    def __init__(self, w0: np.ndarray, blocks: int, track_coords: bool) -> None:
        self.w = np.array(w0, dtype=np.float64)
        self.bounds = block_bounds(self.w.size, blocks)
        self.seq = 0
        self._history: list[list[_Store]] = [[] for _ in range(blocks)]
        self._base = [0] * blocks
        self._block_newest = [0] * blocks
        self._coord_newest = np.zeros(self.w.size, dtype=np.int64) if track_coords else None

    def version(self, block: int) -> int:
        """Number of stores block ``block`` has received."""
        return self._base[block] + len(self._history[block])

    def _since(self, block: int, version: int) -> list[_Store]:
        return self._history[block][version - self._base[block]:]

    def stores_since(self, block: int, version: int, coords: np.ndarray | None) -> list[int]:
        """Updates whose stores to ``coords`` of ``block`` landed after ``version``."""
        return [s.uid for s in self._since(block, version) if _overlaps(s.coords, coords)]

    def copy(self, block: int, index: Index, coords: np.ndarray | None,
             out: np.ndarray) -> BlockCopy:
        """Copy the block's coordinates into ``out`` (the end of a block read)."""
        out[index] = self.w[index]
        if coords is None or self._coord_newest is None:
            newest = self._block_newest[block]
        else:
            newest = int(self._coord_newest[coords].max())
        return BlockCopy(block, coords, self.version(block), newest)

    def changed(self, copy: BlockCopy, since: int) -> bool:
        """Whether a store to the copy's coordinates landed after version ``since`` and before
        the copy was taken (the read took in a concurrent write: a read-overwrite)."""
        base = self._base[copy.block]
        window = self._history[copy.block][since - base: copy.version - base]
        return any(_overlaps(s.coords, copy.coords) for s in window)

    def torn(self, copies: list[BlockCopy]) -> bool:
        """Whether the copies mix versions that never coexisted in memory.

        Block copy b is valid from its newest contained store to the first later store to the
        same coordinates; the read is consistent iff those intervals share a point.
        """
        if len(copies) < 2:
            return False
        newest = max(c.newest for c in copies)
        for c in copies:
            later = [s.seq for s in self._since(c.block, c.version)
                     if _overlaps(s.coords, c.coords)]
            if later and later[0] < newest:
                return True
        return False

    def load(self, index: Index) -> np.ndarray:
        """The current values (the load of a read-modify-write)."""
        return self.w[index].copy()

    def store(self, block: int, index: Index, coords: np.ndarray | None, values: np.ndarray,
              uid: int, loaded_at: int) -> list[int]:
        """Store ``values`` (a read-modify-write whose load saw version ``loaded_at``).

        Returns the updates whose stores in between are overwritten (lost).
        """
        lost = [u for u in self.stores_since(block, loaded_at, coords) if u != uid]
        self.w[index] = values
        self._record(block, index, coords, uid)
        return lost

    def add(self, block: int, index: Index, coords: np.ndarray | None, delta: np.ndarray,
            uid: int) -> None:
        """Atomically add ``delta``: no store is ever lost."""
        self.w[index] += delta
        self._record(block, index, coords, uid)

    def _record(self, block: int, index: Index, coords: np.ndarray | None, uid: int) -> None:
        self.seq += 1
        self._history[block].append(_Store(self.seq, uid, coords))
        self._block_newest[block] = self.seq
        if self._coord_newest is not None:
            self._coord_newest[index] = self.seq

    def trim(self, keep: list[int]) -> None:
        """Forget stores below ``keep[b]`` for each block (no in-flight update needs them)."""
        for block, version in enumerate(keep):
            drop = version - self._base[block]
            if drop > 0:
                del self._history[block][:drop]
                self._base[block] = version
