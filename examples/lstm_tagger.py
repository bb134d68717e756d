"""The built-in ``lstm_tagger`` problem as a PyTorch ``nn.LSTM`` tagger: a ``torch`` problem.

Same data and same function as the numpy problem of :mod:`simulator.lstm_tagger`: the
sequences and tags of ``LSTMTaggerProblem.synthetic`` with the sizes below (a sample is one
sequence, so the scenario keeps ``batch = 1`` and ``holdout = 0``), and a module made of an
embedding (V x H), a one-layer ``nn.LSTM`` (H -> H, ``batch_first``) and a linear output
(H -> K), whose parameters are set from the numpy problem's w_0. The loss is the mean
cross-entropy over a sequence's positions, averaged over the rows of a batch, as the numpy f_i.

The parameter vectors differ in one block. The numpy vector is (embeddings, input weights
4H x H, recurrent weights 4H x H, gate biases 4H, output weights K x H, output biases K), gates
in the order input, forget, cell, output, which is ``nn.LSTM``'s order (i, f, g, o) too. But
``nn.LSTM`` adds two biases, ``bias_ih_l0 + bias_hh_l0``: the numpy gate biases go in
``bias_ih_l0`` and ``bias_hh_l0`` starts at zero. ``bias_hh_l0`` is then redundant (only the
sum enters the loss), and the torch vector is 4H longer than the numpy one, with
``bias_hh_l0`` right after ``bias_ih_l0`` (:func:`torch_vector`, :func:`numpy_vector`). While
``bias_hh_l0`` is zero the torch f_i, l2 term included, is the numpy f_i; its gradient is the
numpy gradient on the shared coordinates, and ``bias_hh_l0``'s is ``bias_ih_l0``'s data part.
Under training ``bias_hh_l0`` moves off zero, so the two l2 terms part ways there.

Its accuracy is per token, as the numpy problem's: a row of tags per sample, one class per
position. (Setting ``model.lstm.bias_hh_l0.requires_grad_(False)`` would leave that bias out of
w, which holds only parameters that require gradients: a vector as long as the numpy one.)

Run from the repository root (``problem.model`` is a path relative to the working directory)::

    asyngrad simulate examples/lstm_tagger.toml --out runs/lstm-tagger
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from simulator.lstm_tagger import LSTMTaggerProblem

VOCAB, SEQUENCES, LENGTH, TAGS, HIDDEN, SEED = 30, 200, 6, 3, 8, 0


def numpy_problem(l2: float = 0.0) -> LSTMTaggerProblem:
    """The built-in problem this example re-expresses (``problem.name = "lstm_tagger"`` with
    dim = VOCAB, n_samples = SEQUENCES, length = LENGTH, classes = TAGS, hidden = HIDDEN,
    seed = SEED)."""
    return LSTMTaggerProblem.synthetic(VOCAB, SEQUENCES, LENGTH, TAGS, HIDDEN, l2, SEED)


class LSTMTagger(nn.Module):
    """Embedding, one-layer LSTM, linear output: tokens (N, L) in, logits (N, L, K) out."""

    def __init__(self, vocab: int, hidden: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embed(tokens))
        return self.out(states)


def sequence_loss(logits: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all positions of the batch: with sequences of one length, the
    mean over the rows of each sequence's mean, as the numpy problem averages."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tags.reshape(-1))


def _bias_cut(hidden: int) -> int:
    """Where the gate biases end in the numpy vector (and ``bias_hh_l0`` starts in torch's)."""
    return VOCAB * hidden + 2 * 4 * hidden * hidden + 4 * hidden


def torch_vector(w: np.ndarray, hidden: int = HIDDEN) -> np.ndarray:
    """The torch parameter vector of numpy parameters ``w``: ``bias_hh_l0 = 0`` inserted."""
    cut = _bias_cut(hidden)
    return np.concatenate([w[:cut], np.zeros(4 * hidden), w[cut:]])


def numpy_vector(v: np.ndarray, hidden: int = HIDDEN) -> np.ndarray:
    """The numpy parameters of the same function as torch's ``v``: the two biases summed."""
    cut, gates = _bias_cut(hidden), 4 * hidden
    w = np.concatenate([v[:cut], v[cut + gates:]])
    w[cut - gates:cut] += v[cut:cut + gates]
    return w


def make() -> dict:
    """The tagger at the numpy problem's w_0, the loss, its sequences and tags, and its
    held-out sequences."""
    ref = numpy_problem()
    model = LSTMTagger(VOCAB, HIDDEN, TAGS).double()
    with torch.no_grad():
        nn.utils.vector_to_parameters(torch.from_numpy(torch_vector(ref.initial())),
                                      model.parameters())
    held = ref.held_out
    return {"model": model, "loss": sequence_loss, "X": ref.tokens, "y": ref.tags,
            "held": (held.tokens, held.tags)}
