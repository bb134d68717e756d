"""Torch factories the benchmarks train (``problem.model = "bench/models.py:NAME"``)."""

import torch
from torch import nn


def digits_mlp() -> tuple[nn.Module, object, object, object]:
    """A 64-1,500-10 tanh MLP on scikit-learn's 8x8 digits: 112,510 parameters, the
    "100k-parameter MLP" of the torch rows in bench/README.md."""
    from sklearn.datasets import load_digits

    data = load_digits()
    X = torch.as_tensor(data.data / 16.0)
    model = nn.Sequential(nn.Linear(64, 1500), nn.Tanh(), nn.Linear(1500, 10))
    return model, nn.functional.cross_entropy, X, torch.as_tensor(data.target)
