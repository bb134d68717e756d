"""Factories for ``problem.model`` in the tests: torch twins of built-in problems, and models
and data that must be refused."""

import numpy as np
import torch

from simulator.problems import LogisticProblem, MLPProblem


def _logistic_loss(out, y):
    return torch.nn.functional.softplus(-y * out[:, 0]).mean()


def logistic_numpy():
    return LogisticProblem.synthetic(12, 90, 0.01, seed=3)


def logistic():
    """The synthetic logistic problem as a bias-free linear module starting at w = 0."""
    ref = logistic_numpy()
    model = torch.nn.Linear(ref.dim, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    return {"model": model, "loss": _logistic_loss, "X": ref.X, "y": ref.y, "convex": True}


def mlp_numpy():
    return MLPProblem.synthetic(6, 70, classes=3, hidden=5, l2=0.01, seed=1)


def mlp():
    """The synthetic tanh MLP with the numpy problem's w_0: its parameters in the same order
    (W1, b1, W2, b2)."""
    ref = mlp_numpy()
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.tensor(ref.initial()), model.parameters())
    return model, torch.nn.functional.cross_entropy, ref.X, ref.y


def net():
    """A small network initialised from torch's generator (seeded by problem.seed)."""
    X = torch.randn(40, 4)
    y = (X[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    return model, torch.nn.functional.cross_entropy, torch.utils.data.TensorDataset(X, y)


def tied():
    """Two layers sharing one weight matrix (tied weights): one parameter, used twice."""
    X = torch.randn(30, 4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(4, 4, bias=False))
    model[2].weight = model[0].weight
    return model, torch.nn.functional.mse_loss, X, torch.sin(X)


def summed():
    model, _, data = net()
    return model, lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="sum"), data


def with_nan():
    X = np.ones((5, 4))
    X[3, 1] = np.nan
    return torch.nn.Linear(4, 2), torch.nn.functional.cross_entropy, X, np.zeros(5, dtype=int)


def short_labels():
    return torch.nn.Linear(4, 2), torch.nn.functional.cross_entropy, np.ones((5, 4)), [0, 1]


def not_a_model():
    return "model", torch.nn.functional.cross_entropy, np.ones((5, 4)), np.zeros(5)


def fails():
    raise RuntimeError("no data here")


not_callable = 3


def numpy_drawn():
    """Data drawn from numpy's and random's global generators (problem.seed seeds them)."""
    import random

    X = np.random.standard_normal((20, 3))
    y = np.array([random.randint(0, 1) for _ in range(20)])
    return torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, X, y


def smoothed(amount):
    """A factory whose loss's constant lives in a partial: cross-entropy with label
    smoothing."""
    import functools

    def make():
        model, _, data = net()
        return model, functools.partial(torch.nn.functional.cross_entropy,
                                        label_smoothing=amount), data
    return make


smooth_1 = smoothed(0.1)
smooth_3 = smoothed(0.3)


def with_held():
    model, loss, data = net()
    X, y = data.tensors
    return {"model": model, "loss": loss, "X": X, "y": y, "held": (X[:5], y[:5])}


def exits():
    raise SystemExit(3)


def per_process():
    """Data that differs in every process: drawn from a generator seeded by the process id,
    which no problem.seed reaches."""
    import os

    X = torch.as_tensor(np.random.default_rng(os.getpid()).standard_normal((20, 3)))
    return torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, X, (X[:, 0] > 0).long()


def convnet_sequential():
    """A small convolutional network on 120 of scikit-learn's 8x8 digits as one
    ``nn.Sequential`` (split into stages by ``problem.split_at``): conv 1->4, ReLU, pool,
    flatten, linear 64->12, ReLU, linear 12->10, log-softmax; the mean NLL."""
    from sklearn.datasets import load_digits

    data = load_digits()
    X = (data.images[:120] / 16.0)[:, None, :, :]
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, kernel_size=3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 12), torch.nn.ReLU(),
        torch.nn.Linear(12, 10), torch.nn.LogSoftmax(dim=1))
    return model, torch.nn.functional.nll_loss, X, data.target[:120]


def recurrent_sequential():
    """An ``nn.LSTM`` inside an ``nn.Sequential``: its output is a tuple, no stage's."""
    X = torch.randn(20, 5, 3)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LSTM(4, 4, batch_first=True))
    return model, lambda out, y: ((out[0][:, -1, 0] - y) ** 2).mean(), X, torch.randn(20)


class _First(torch.nn.Module):
    """The first item of a tuple (an ``nn.LSTM``'s output sequence)."""

    def forward(self, x):
        return x[0][:, -1, :]


def recurrent_middle():
    """An ``nn.LSTM`` between two layers, its tuple taken apart by the next child: cut after
    it, a stage would pass a tuple on."""
    X = torch.randn(20, 5, 3)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LSTM(4, 4, batch_first=True),
                                _First(), torch.nn.Linear(4, 1))
    return model, lambda out, y: ((out[:, 0] - y) ** 2).mean(), X, torch.randn(20)


def reused_activation():
    """One Tanh object after each of two layers (a module used twice)."""
    act = torch.nn.Tanh()
    X = torch.randn(30, 5)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), act, torch.nn.Linear(6, 6), act,
                                torch.nn.Linear(6, 3))
    return model, torch.nn.functional.cross_entropy, X, (X[:, 0] > 0).long()


def reused_linear():
    """One Linear layer used twice, in what would be two stages."""
    layer = torch.nn.Linear(6, 6)
    X = torch.randn(30, 6)
    model = torch.nn.Sequential(layer, torch.nn.Tanh(), torch.nn.Identity(), layer)
    return model, torch.nn.functional.mse_loss, X, torch.sin(X)


def inplace_sequential():
    """A ReLU that works in place, where a stage may start."""
    X = torch.randn(30, 5)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(inplace=True),
                                torch.nn.Linear(6, 3))
    return model, torch.nn.functional.cross_entropy, X, (X[:, 1] > 0).long()


class Residual(torch.nn.Sequential):
    """A Sequential whose forward adds its input back: not its children in order."""

    def forward(self, x):
        return super().forward(x) + x[:, :3]


def residual_sequential():
    X = torch.randn(30, 5)
    model = Residual(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    return model, torch.nn.functional.mse_loss, X, torch.zeros(30, 3)


def scaled_sequential():
    """A parameter registered on the Sequential itself."""
    X = torch.randn(30, 5)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(1)))
    return model, torch.nn.functional.cross_entropy, X, (X[:, 0] > 0).long()
