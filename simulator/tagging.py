"""Sequence tagging: the data and the objective shared by the paper's taggers.

A sample is a sequence of L tokens from a vocabulary of V with one tag (of K) per token,
drawn from a sticky hidden Markov model (:func:`hmm_sequences`); a held-out set of a quarter
as many sequences comes from the same HMM on its own stream. A :class:`TaggingProblem`
computes the mean per-token loss of some sequences and its gradient in one vectorised pass
(``_objective``), so the per-sample and the full objective are the same code, plus
(λ/2)‖w‖².
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Self

import numpy as np

from simulator.problems import HELD_OUT, Gradient, LocalOptimumProblem

__all__ = ["HELD_OUT", "TaggingProblem", "hmm_sequences"]



def hmm_sequences(vocab: int, n_samples: int, length: int, classes: int,
                  seed: int | list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, tags), each (n_samples, length), from a sticky HMM: a tag stays with
    probability 0.8; it emits one of its own tokens with probability 0.7, else any token
    uniformly (the ambiguous part, which only the context can resolve)."""
    rng = np.random.default_rng(seed)
    own = np.array_split(np.arange(vocab), classes)
    tags = np.zeros((n_samples, length), dtype=np.int64)
    tokens = np.zeros((n_samples, length), dtype=np.int64)
    tags[:, 0] = rng.integers(0, classes, n_samples)
    for t in range(1, length):
        stay = rng.random(n_samples) < 0.8
        tags[:, t] = np.where(stay, tags[:, t - 1], rng.integers(0, classes, n_samples))
    mine = rng.random((n_samples, length)) < 0.7
    uniform = rng.integers(0, vocab, (n_samples, length))
    for tag, words in enumerate(own):
        pick = words[rng.integers(0, len(words), (n_samples, length))] if len(words) \
            else uniform
        tokens = np.where((tags == tag) & mine, pick, tokens)
    return np.where(mine, tokens, uniform), tags



class TaggingProblem(LocalOptimumProblem):
    """Tokens and tags (N, L); parameters cut into the blocks ``_sizes`` lists."""

    SOLVER_ITERATIONS = 200

    def __init__(self, tokens: np.ndarray, tags: np.ndarray, vocab: int, hidden: int,
                 classes: int, l2: float, seed: int) -> None:
        self.tokens, self.tags = tokens.astype(np.int64), tags.astype(np.int64)
        self.vocab, self.hidden, self.classes = vocab, hidden, classes
        self.l2, self.seed = l2, seed
        self.held_out: Self | None = None
        self._cuts = np.cumsum([0, *self._sizes()]).tolist()
        super().__init__(self._cuts[-1], tokens.shape[0])

    @classmethod
    def synthetic(cls, vocab: int, n_samples: int, length: int, classes: int, hidden: int,
                  l2: float, seed: int) -> Self:
        """Sequences from :func:`hmm_sequences`, and the held-out set."""
        tokens, tags = hmm_sequences(vocab, n_samples, length, classes, seed)
        problem = cls(tokens, tags, vocab, hidden, classes, l2, seed)
        held = hmm_sequences(vocab, max(1, n_samples // 4), length, classes, [seed, HELD_OUT])
        problem.held_out = cls(*held, vocab, hidden, classes, l2, seed)
        return problem

    @abstractmethod
    def _sizes(self) -> list[int]:
        """The sizes of the parameter blocks, in the order they are packed in w."""

    @abstractmethod
    def _objective(self, w: np.ndarray, rows: slice,
                   backward: bool) -> tuple[float, np.ndarray | None]:
        """Mean over ``rows`` of the per-sequence losses (no l2 term), and its gradient when
        ``backward``."""

    def loss(self, w: np.ndarray, idx: int) -> float:
        value, _ = self._objective(w, slice(idx, idx + 1), False)
        return value + 0.5 * self.l2 * float(w @ w)

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        return self._gradient(w, slice(idx, idx + 1)), None

    def full_loss(self, w: np.ndarray) -> float:
        value, _ = self._objective(w, slice(None), False)
        return value + 0.5 * self.l2 * float(w @ w)

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self._gradient(w, slice(None))

    def _gradient(self, w: np.ndarray, rows: slice) -> np.ndarray:
        _, grad = self._objective(w, rows, True)
        assert grad is not None
        grad += self.l2 * w
        return grad

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        return None if self.held_out is None else self.held_out.accuracy(w)
