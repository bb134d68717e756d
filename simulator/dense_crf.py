"""A linear-chain CRF with dense, embedding-based features: the paper's dense CRF.

Each token is embedded (size H); its tag scores are s_t = W·e(token_t) + b; tag transitions
score A[y_{t−1}, y_t] and the first tag π[y_1]. f_i = −log p(y | x)/L + (λ/2)‖w‖² with
log p(y | x) = score(x, y) − log Z(x), Z by the exact forward algorithm (in log space).
The gradient of log Z comes from the forward-backward marginals; decoding is Viterbi. Both
are vectorised over sequences in numpy; the torch twin checks the gradient.

The embeddings and W enter as a product, so f is nonconvex (w = 0 is a saddle): w_0 is seeded
and ``optimum()`` is a local estimate by L-BFGS. Data and held-out set: those of
:mod:`simulator.tagging`, as for the LSTM tagger.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simulator.tagging import TaggingProblem

__all__ = ["DenseCRFProblem"]


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    """log Σ exp(a) along ``axis`` of finite scores (scipy's takes most of a small CRF's
    gradient time in its input checks)."""
    top = a.max(axis=axis, keepdims=True)
    return np.squeeze(top + np.log(np.exp(a - top).sum(axis=axis, keepdims=True)), axis=axis)


class DenseCRFProblem(TaggingProblem):
    """w = (embeddings V×H, emission weights K×H, emission biases K, transitions K×K,
    start scores K)."""

    name = "dense_crf"

    def _sizes(self) -> list[int]:
        k = self.classes
        return [self.vocab * self.hidden, k * self.hidden, k, k * k, k]

    def _unpack(self, w: np.ndarray) -> tuple[np.ndarray, ...]:
        k, c = self.classes, self._cuts
        return (w[c[0]:c[1]].reshape(self.vocab, self.hidden),
                w[c[1]:c[2]].reshape(k, self.hidden), w[c[2]:c[3]],
                w[c[3]:c[4]].reshape(k, k), w[c[4]:c[5]])

    def initial(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1])
        w = np.zeros(self.dim)
        emb, weights, _, _, _ = self._unpack(w)
        emb[:] = rng.standard_normal(emb.shape)
        weights[:] = rng.standard_normal(weights.shape) / math.sqrt(self.hidden)
        return w

    def _scores(self, w: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
        emb, weights, bias, _, _ = self._unpack(w)
        return emb[self.tokens[rows]] @ weights.T + bias  # (N, L, K)

    def _objective(self, w: np.ndarray, rows: slice,
                   backward: bool) -> tuple[float, np.ndarray | None]:
        """Mean over ``rows`` of −log p(y|x)/L (no l2 term), and its gradient."""
        emb, weights, _, trans, start = self._unpack(w)
        tokens, tags = self.tokens[rows], self.tags[rows]
        s = self._scores(w, rows)
        n, length, k = s.shape
        # Forward (log alpha) and backward (log beta) recursions.
        alpha = np.zeros((n, length, k))
        alpha[:, 0] = start + s[:, 0]
        for t in range(1, length):
            alpha[:, t] = _logsumexp(alpha[:, t - 1, :, None] + trans, axis=1) \
                + s[:, t]
        log_z = _logsumexp(alpha[:, -1], axis=1)
        seq = np.arange(n)
        gold = start[tags[:, 0]] + s[seq[:, None], np.arange(length), tags].sum(axis=1)
        if length > 1:
            gold = gold + trans[tags[:, :-1], tags[:, 1:]].sum(axis=1)
        value = float(((log_z - gold) / length).mean())
        if not backward:
            return value, None
        beta = np.zeros((n, length, k))
        for t in range(length - 2, -1, -1):
            beta[:, t] = _logsumexp(trans + (s[:, t + 1] + beta[:, t + 1])[:, None], axis=2)
        marginal = np.exp(alpha + beta - log_z[:, None, None])  # P(y_t = k | x)
        scale = 1.0 / (n * length)
        ds = marginal.copy()
        np.put_along_axis(ds, tags[:, :, None],
                          np.take_along_axis(ds, tags[:, :, None], axis=2) - 1.0, axis=2)
        ds *= scale
        grad = np.zeros(self.dim)
        g_emb, g_w, g_b, g_trans, g_start = self._unpack(grad)
        x = emb[tokens]  # (N, L, H)
        g_w += np.einsum("ntk,nth->kh", ds, x)
        g_b += ds.sum(axis=(0, 1))
        np.add.at(g_emb, tokens.ravel(), (ds @ weights).reshape(-1, self.hidden))
        g_start += scale * (marginal[:, 0].sum(axis=0) - np.bincount(tags[:, 0], minlength=k))
        if length > 1:
            # P(y_{t−1} = i, y_t = j | x) for t = 1..L−1.
            pair = (alpha[:, :-1, :, None] + trans + (s[:, 1:] + beta[:, 1:])[:, :, None, :]
                    - log_z[:, None, None, None])
            expected = np.exp(pair).sum(axis=(0, 1))
            observed = np.zeros((k, k))
            np.add.at(observed, (tags[:, :-1].ravel(), tags[:, 1:].ravel()), 1.0)
            g_trans += scale * (expected - observed)
        return value, grad

    def decode(self, w: np.ndarray) -> np.ndarray:
        """Viterbi: the most likely tag sequence of every sequence, (N, L)."""
        _, _, _, trans, start = self._unpack(w)
        s = self._scores(w, slice(None))
        n, length, _ = s.shape
        best = start + s[:, 0]
        back = np.zeros((n, length, self.classes), dtype=np.int64)
        for t in range(1, length):
            candidates = best[:, :, None] + trans  # (N, from, to)
            back[:, t] = candidates.argmax(axis=1)
            best = candidates.max(axis=1) + s[:, t]
        path = np.zeros((n, length), dtype=np.int64)
        path[:, -1] = best.argmax(axis=1)
        for t in range(length - 1, 0, -1):
            path[:, t - 1] = back[np.arange(n), t, path[:, t]]
        return path

    def accuracy(self, w: np.ndarray) -> float | None:
        """Per-token accuracy of the Viterbi tags."""
        return float(np.mean(self.decode(w) == self.tags))

    def torch_loss(self, w: Any, idx: int) -> Any:
        import torch

        k, c = self.classes, self._cuts
        emb = w[c[0]:c[1]].reshape(self.vocab, self.hidden)
        weights, bias = w[c[1]:c[2]].reshape(k, self.hidden), w[c[2]:c[3]]
        trans, start = w[c[3]:c[4]].reshape(k, k), w[c[4]:c[5]]
        tokens = torch.as_tensor(self.tokens[idx], device=w.device)
        tags = [int(t) for t in self.tags[idx]]
        s = emb[tokens] @ weights.T + bias
        alpha = start + s[0]
        gold = start[tags[0]] + s[0, tags[0]]
        for t in range(1, len(tags)):
            alpha = torch.logsumexp(alpha[:, None] + trans, dim=0) + s[t]
            gold = gold + trans[tags[t - 1], tags[t]] + s[t, tags[t]]
        log_z = torch.logsumexp(alpha, dim=0)
        return (log_z - gold) / len(tags) + 0.5 * self.l2 * (w @ w)
