"""Sequence labelling with an LSTM over embeddings: the main model of the AsynGrad paper.

A sample is a sequence of L tokens from a vocabulary of V with one tag (of K) per token. The
model embeds each token (embedding size H), runs a one-layer left-to-right LSTM with H units,
and predicts each position's tag from its hidden state; f_i is the mean cross-entropy over
the sequence's positions plus (λ/2)‖w‖². Gradients are exact backpropagation through time,
written in numpy and vectorised over sequences, so the per-sample gradient and the full
gradient are the same code; the torch twin checks them.

The data come from the hidden Markov model of :mod:`simulator.tagging`: tags follow a sticky
Markov chain, and each tag emits tokens mostly from its own part of the vocabulary, with
shared ambiguous tokens. Telling the tag of an ambiguous token needs the context, which the
LSTM can learn.

Nonconvex: ``optimum()`` is a local estimate (L-BFGS from the seeded w_0, at most
``SOLVER_ITERATIONS`` steps), and suboptimality is measured against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.tagging import TaggingProblem

__all__ = ["LSTMTaggerProblem"]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class LSTMTaggerProblem(TaggingProblem):
    """w = (embeddings V×H, input weights 4H×H, recurrent weights 4H×H, gate biases 4H,
    output weights K×H, output biases K), gates in the order input, forget, cell, output."""

    name = "lstm_tagger"

    def _sizes(self) -> list[int]:
        h = self.hidden
        return [self.vocab * h, 4 * h * h, 4 * h * h, 4 * h, self.classes * h, self.classes]

    def _unpack(self, w: np.ndarray) -> tuple[np.ndarray, ...]:
        h, c = self.hidden, self._cuts
        return (w[c[0]:c[1]].reshape(self.vocab, h), w[c[1]:c[2]].reshape(4 * h, h),
                w[c[2]:c[3]].reshape(4 * h, h), w[c[3]:c[4]],
                w[c[4]:c[5]].reshape(self.classes, h), w[c[5]:c[6]])

    def initial(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1])
        w = np.zeros(self.dim)
        emb, wx, wh, b, wo, _ = self._unpack(w)
        scale = 1.0 / math.sqrt(self.hidden)
        emb[:] = rng.standard_normal(emb.shape) * scale
        wx[:] = rng.standard_normal(wx.shape) * scale
        wh[:] = rng.standard_normal(wh.shape) * scale
        b[self.hidden: 2 * self.hidden] = 1.0  # forget-gate bias: remember by default
        wo[:] = rng.standard_normal(wo.shape) * scale
        return w

    def _lstm(self, emb: np.ndarray, wx: np.ndarray, wh: np.ndarray, b: np.ndarray,
              tokens: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[Any],
                                           list[np.ndarray]]:
        """The LSTM over ``tokens`` (N, L): hidden states h_0..h_L and cells c_0..c_L (h_0 =
        c_0 = 0), each step's gates and embedded inputs."""
        n, length = tokens.shape
        h = self.hidden
        hs, cs = [np.zeros((n, h))], [np.zeros((n, h))]
        gates, xs = [], []
        for t in range(length):
            x = emb[tokens[:, t]]
            a = x @ wx.T + hs[-1] @ wh.T + b
            i, f = _sigmoid(a[:, :h]), _sigmoid(a[:, h:2 * h])
            g, o = np.tanh(a[:, 2 * h:3 * h]), _sigmoid(a[:, 3 * h:])
            c = f * cs[-1] + i * g
            hs.append(o * np.tanh(c))
            cs.append(c)
            gates.append((i, f, g, o))
            xs.append(x)
        return hs, cs, gates, xs

    def _bptt(self, run: tuple[list[np.ndarray], list[np.ndarray], list[Any],
                               list[np.ndarray]], tokens: np.ndarray, wx: np.ndarray,
              wh: np.ndarray, grads: tuple[np.ndarray, ...],
              dh_out: Callable[[int, np.ndarray], np.ndarray]) -> None:
        """Backpropagation through time of the LSTM ``run`` (:meth:`_lstm`) into ``grads`` =
        (embeddings, input weights, recurrent weights, biases), with ``dh_out(t, h_t)`` the
        gradient reaching h_t from above (called for t = L−1 … 0)."""
        hs, cs, gates, xs = run
        g_emb, g_wx, g_wh, g_b = grads
        n, h = hs[0].shape
        dh_next, dc_next = np.zeros((n, h)), np.zeros((n, h))
        for t in reversed(range(len(gates))):
            i, f, g, o = gates[t]
            h_t, c_t, c_prev, h_prev = hs[t + 1], cs[t + 1], cs[t], hs[t]
            dh = dh_out(t, h_t) + dh_next
            tanh_c = np.tanh(c_t)
            dc = dh * o * (1.0 - tanh_c * tanh_c) + dc_next
            da = np.concatenate([dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f),
                                 dc * i * (1.0 - g * g), dh * tanh_c * o * (1.0 - o)], axis=1)
            g_wx += da.T @ xs[t]
            g_wh += da.T @ h_prev
            g_b += da.sum(axis=0)
            np.add.at(g_emb, tokens[:, t], da @ wx)
            dh_next, dc_next = da @ wh, dc * f

    def _run(self, w: np.ndarray, rows: np.ndarray | slice,
             backward: bool) -> tuple[float, np.ndarray | None, np.ndarray]:
        """Mean over ``rows`` of the per-sequence losses (without the l2 term), its gradient
        when ``backward``, and the logits (N, L, K)."""
        emb, wx, wh, b, wo, bo = self._unpack(w)
        tokens, tags = self.tokens[rows], self.tags[rows]
        n, length = tokens.shape
        run = self._lstm(emb, wx, wh, b, tokens)
        logits = np.zeros((n, length, self.classes))
        for t in range(length):
            logits[:, t] = run[0][t + 1] @ wo.T + bo
        top = logits.max(axis=2, keepdims=True)
        shifted = np.exp(logits - top)
        total = shifted.sum(axis=2, keepdims=True)
        logp = logits - top - np.log(total)
        picked = np.take_along_axis(logp, tags[:, :, None], axis=2)[:, :, 0]
        value = float(-picked.mean(axis=1).mean())
        if not backward:
            return value, None, logits
        grad = np.zeros(self.dim)
        g_emb, g_wx, g_wh, g_b, g_wo, g_bo = self._unpack(grad)
        dz = shifted / total
        np.put_along_axis(dz, tags[:, :, None],
                          np.take_along_axis(dz, tags[:, :, None], axis=2) - 1.0, axis=2)
        dz /= n * length  # mean over positions, then over sequences

        def dh_out(t: int, h_t: np.ndarray) -> np.ndarray:
            nonlocal g_wo, g_bo
            g_wo += dz[:, t].T @ h_t
            g_bo += dz[:, t].sum(axis=0)
            return dz[:, t] @ wo

        self._bptt(run, tokens, wx, wh, (g_emb, g_wx, g_wh, g_b), dh_out)
        return value, grad, logits

    def stages(self) -> list[slice] | None:
        """Two stages: the embeddings and the LSTM, then the output layer."""
        c = self._cuts
        return [slice(c[0], c[4]), slice(c[4], c[6])]

    def stage_width(self, stage: int) -> int:
        return self.tokens.shape[1] * self.hidden  # the hidden states of a sequence

    def forward(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
                idx: int) -> tuple[np.ndarray, Any]:
        return self._pass(stage, theta, a, idx)[0], a  # (the cache: the stage's input)

    def _pass(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
              idx: int) -> tuple[np.ndarray, Any]:
        """The stage's forward pass: its activation and what differentiating it needs (the
        LSTM's run and the tokens; the input and the logits)."""
        h, c, classes = self.hidden, self._cuts, self.classes
        if stage == 0:
            tokens = self.tokens[idx:idx + 1]
            run = self._lstm(theta[c[0]:c[1]].reshape(self.vocab, h),
                             theta[c[1]:c[2]].reshape(4 * h, h),
                             theta[c[2]:c[3]].reshape(4 * h, h), theta[c[3]:c[4]], tokens)
            return np.concatenate(run[0][1:]), (run, tokens)  # (L, H): h_1 … h_L
        assert a is not None
        logits = a @ theta[:classes * h].reshape(classes, h).T + theta[classes * h:]
        return logits, (a, logits)

    def backward(self, stage: int, theta: np.ndarray, cache: Any, up: np.ndarray | None,
                 idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        h, c, classes = self.hidden, self._cuts, self.classes
        g = np.zeros_like(theta)
        if stage == 0:
            assert up is not None
            run, tokens = self._pass(0, theta, None, idx)[1]  # recomputed at θ now
            self._bptt(run, tokens, theta[c[1]:c[2]].reshape(4 * h, h),
                       theta[c[2]:c[3]].reshape(4 * h, h),
                       (g[c[0]:c[1]].reshape(self.vocab, h), g[c[1]:c[2]].reshape(4 * h, h),
                        g[c[2]:c[3]].reshape(4 * h, h), g[c[3]:c[4]]),
                       lambda t, _: up[t:t + 1])
            back = None
        else:
            a, logits = self._pass(1, theta, cache, idx)[1]
            dz = np.exp(logits - logits.max(axis=1, keepdims=True))
            dz /= dz.sum(axis=1, keepdims=True)
            dz[np.arange(len(dz)), self.tags[idx]] -= 1.0
            dz /= len(dz)  # the mean over positions
            wo = theta[:classes * h].reshape(classes, h)
            g[:classes * h] = (dz.T @ a).ravel()
            g[classes * h:] = dz.sum(axis=0)
            back = dz @ wo
        g += self.l2 * theta
        return g, back

    def _objective(self, w: np.ndarray, rows: slice,
                   backward: bool) -> tuple[float, np.ndarray | None]:
        value, grad, _ = self._run(w, rows, backward)
        return value, grad

    def accuracy(self, w: np.ndarray) -> float | None:
        """Per-token tagging accuracy over all sequences."""
        _, _, logits = self._run(w, slice(None), False)
        return float(np.mean(logits.argmax(axis=2) == self.tags))

    def torch_loss(self, w: Any, idx: int) -> Any:
        import torch

        h, c = self.hidden, self._cuts
        emb = w[c[0]:c[1]].reshape(self.vocab, h)
        wx, wh = w[c[1]:c[2]].reshape(4 * h, h), w[c[2]:c[3]].reshape(4 * h, h)
        b, wo, bo = w[c[3]:c[4]], w[c[4]:c[5]].reshape(self.classes, h), w[c[5]:c[6]]
        state = torch.zeros(h, dtype=w.dtype, device=w.device)
        cell = torch.zeros(h, dtype=w.dtype, device=w.device)
        total = torch.zeros((), dtype=w.dtype, device=w.device)
        length = self.tokens.shape[1]
        for t in range(length):
            a = wx @ emb[int(self.tokens[idx, t])] + wh @ state + b
            i, f = torch.sigmoid(a[:h]), torch.sigmoid(a[h:2 * h])
            g, o = torch.tanh(a[2 * h:3 * h]), torch.sigmoid(a[3 * h:])
            cell = f * cell + i * g
            state = o * torch.tanh(cell)
            z = wo @ state + bo
            total = total + torch.logsumexp(z, 0) - z[int(self.tags[idx, t])]
        return total / length + 0.5 * self.l2 * (w @ w)
