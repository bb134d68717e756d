"""PyTorch's Hogwild MNIST network, shrunk to scikit-learn's 8x8 digits, as a ``torch`` problem.

The network of PyTorch's ``examples/mnist_hogwild`` (two convolutions with max-pooling, then two
linear layers, log-softmax and the negative log-likelihood) adapted to the 1,797 8x8 digits
scikit-learn ships (``sklearn.datasets.load_digits``, nothing downloaded): conv 1->8 (3x3,
padding 1), ReLU, 2x2 max-pool, conv 8->16 (3x3, padding 1), ReLU, 2x2 max-pool, flatten,
linear 64->32, ReLU, linear 32->10; 3,658 parameters. Pixels are scaled to [0, 1] and shaped
(N, 1, 8, 8). The initial parameters are PyTorch's default initialisation, drawn from torch's
generator, which the simulator seeds with ``problem.seed`` before calling :func:`make`.

Run from the repository root (``problem.model`` is a path relative to the working directory)::

    asyngrad simulate examples/digits_convnet.toml --out runs/convnet
    asyngrad real examples/digits_convnet.toml --out runs/convnet-real --workers 2

:func:`make_stages` returns the same network as an ``nn.Sequential`` (same layers, same
initial parameters), which ``problem.split_at`` cuts into model-parallel stages
(``examples/digits_pipeline.toml``)::

    asyngrad simulate examples/digits_pipeline.toml --out runs/pipeline
    asyngrad real examples/digits_pipeline.toml --out runs/pipeline-real
"""

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class DigitsConvNet(nn.Module):
    """conv(1->8) -> pool -> conv(8->16) -> pool -> fc(64->32) -> fc(32->10), log-probabilities
    out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (N, 8, 4, 4)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (N, 16, 2, 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 digits as (N, 1, 8, 8) pixels in [0, 1] and integer labels 0..9."""
    from sklearn.datasets import load_digits

    data = load_digits()
    X = (data.images / 16.0).astype(np.float64)[:, None, :, :]
    return X, data.target.astype(np.int64)


def make() -> tuple[nn.Module, object, np.ndarray, np.ndarray]:
    """The network (initialised from torch's seeded generator), the mean NLL loss and the
    digits: ``(model, loss_fn, X, y)``."""
    X, y = digits()
    return DigitsConvNet(), F.nll_loss, X, y


def make_stages() -> tuple[nn.Module, object, np.ndarray, np.ndarray]:
    """:func:`make`'s network written as an ``nn.Sequential`` with named children (its layers
    made in the same order, so from the same seed the same initial parameters), the loss and
    the digits. ``problem.split_at = ["fc1"]`` cuts it into the convolutions and the
    classifier."""
    X, y = digits()
    conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
    conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
    fc1, fc2 = nn.Linear(16 * 2 * 2, 32), nn.Linear(32, 10)
    model = nn.Sequential(OrderedDict([
        ("conv1", conv1), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", conv2), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", fc1), ("relu3", nn.ReLU()), ("fc2", fc2),
        ("log_softmax", nn.LogSoftmax(dim=1))]))
    return model, F.nll_loss, X, y
