"""A user's PyTorch model as a problem: any ``nn.Module``, a loss function and data.

The parameters are one flat float64 vector w: the module's parameters in ``named_parameters()``
order, each flattened. f_j(w) is the loss of minibatch j (``batch`` rows of a seeded shuffle;
with ``batch = 1`` sample j is row j) plus (λ/2)‖w‖², and f(w) = (1/m) Σ_j f_j(w) over the m
minibatches, so E_j ∇f_j = ∇f as Theorem 1 needs (with equal batches f is the loss of all rows).
Every derivative is of one function, the loss of a ``torch.func.functional_call`` at w:
gradients by reverse-mode autograd, Hessian-vector products by autograd of the gradient's dot
product with v (reverse over reverse), so the simulator, the real workers and the checks
differentiate the same thing.

The module runs in evaluation mode (dropout and batch-norm statistics off): a gradient is then a
function of w and the minibatch alone, as ∇f_z(w) is in the theorem. ``loss_fn(output, target)``
must return the mean over the batch's rows (``reduction="mean"``, PyTorch's default); this is
checked on the first rows. Floating data and the module are taken to float64.

A scenario names a factory (``problem.name = "torch"``, ``problem.model =
"package.module:function"`` or ``"path/to/file.py:function"``); the factory takes no arguments
and returns ``(model, loss_fn, X, y)``, ``(model, loss_fn, dataset)``, ``(model, loss_fn)``
where ``problem.data`` names a data file (``simulator.problems.files``), or a dict with keys
``model``, ``loss`` and ``X``/``y`` or ``data`` (optionally ``convex``: True where the user
knows f is convex). It is called with torch's generator seeded from ``problem.seed``, so the
module's initial parameters, w_0, are the same in every process.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import itertools
import math
import random
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import ScenarioError
from simulator.problems.base import (
    OPTIMUM_VERSION,
    Gradient,
    LocalOptimumProblem,
    Problem,
    holdout_split,
)

__all__ = ["SplitError", "TorchProblem", "from_spec", "load_factory"]

BATCHES = 0xBA7C  # the minibatch shuffle's random stream, apart from the holdout split's
CHUNK = 4096  # rows per forward pass when the whole data set is evaluated


def _tensor(data: Any, what: str) -> Any:
    """``data`` as a tensor: floating values in float64 (refused where NaN or inf), integers in
    int64, booleans as 0/1 int64."""
    import torch

    t = torch.as_tensor(np.asarray(data.detach().cpu() if isinstance(data, torch.Tensor)
                                   else data))
    if t.dtype.is_floating_point:
        t = t.to(torch.float64)
        bad = (~torch.isfinite(t)).reshape(len(t), -1).any(dim=1) if t.ndim else None
        if bad is not None and bool(bad.any()):
            raise ValueError(f"{what} has NaN or inf values (first in row "
                             f"{int(bad.nonzero()[0])})")
    elif t.dtype.is_complex:
        raise ValueError(f"{what} is complex; real values are needed")
    else:
        t = t.to(torch.int64)
    if t.ndim == 0:
        raise ValueError(f"{what} is a scalar; one row per sample is needed")
    return t.contiguous()


def _stack(dataset: Any) -> tuple[Any, Any]:
    """The rows of a map-style dataset (``len`` and ``dataset[i] -> (x, y)``) as two tensors."""
    import torch

    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ValueError(f"the data is a {type(dataset).__name__}: a map-style dataset "
                         "(len and dataset[i] -> (x, y)) or tensors X, y are needed")
    rows = [dataset[i] for i in range(len(dataset))]
    if not rows:
        raise ValueError("the dataset is empty")
    if not all(isinstance(row, (tuple, list)) and len(row) == 2 for row in rows):
        raise ValueError("each dataset item must be a pair (x, y)")
    return (torch.stack([torch.as_tensor(x) for x, _ in rows]),
            torch.stack([torch.as_tensor(y) for _, y in rows]))


class TorchProblem(LocalOptimumProblem):
    """A PyTorch module, a loss and data as a finite-sum problem (module docstring).

    ``TorchProblem(model, loss_fn, X, y)``, or ``TorchProblem(model, loss_fn, dataset)``.
    ``l2`` adds (λ/2)‖w‖²; ``batch`` rows make one sample (a minibatch); ``holdout`` keeps that
    share of the rows out of training (a split seeded by ``seed``, which also shuffles the
    minibatches), or ``held`` gives held-out ``(X, y)``; ``convex`` says f is convex (then
    w* is found by Newton-CG and the checks read c and q at w*), else it is treated as a
    nonconvex network (w* a local minimum from w_0, the checks report convexity as not shown).
    ``split_at`` cuts an ``nn.Sequential`` into stages for the model-parallel protocols: the
    names of the children where the stages after the first start (``stages``).

    Raises:
        ValueError: data that does not fit the model (lengths, NaN, a loss that is not a
            scalar mean over rows), in one sentence; :class:`SplitError` for a
            ``split_at`` that does not cut the model into stages.
    """

    name = "torch"

    def __init__(self, model: Any, loss_fn: Callable[[Any, Any], Any], X: Any,
                 y: Any = None, *, l2: float = 0.0, batch: int = 1, holdout: float = 0.0,
                 seed: int = 0, convex: bool = False,
                 held: tuple[Any, Any] | None = None, label: str = "",
                 split_at: Sequence[str] = ()) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"the model is a {type(model).__name__}, not a torch.nn.Module")
        if not callable(loss_fn):
            raise ValueError(f"the loss function is a {type(loss_fn).__name__}, not callable")
        if batch < 1:
            raise ValueError(f"batch is {batch}; at least 1 row per sample is needed")
        if y is None:
            X, y = _stack(X)
        X, y = _tensor(X, "X"), _tensor(y, "y")
        if len(X) != len(y):
            raise ValueError(f"X has {len(X)} rows and y has {len(y)}")
        train, held_rows = holdout_split(len(X), holdout, seed)
        if train.size == 0:
            raise ValueError(f"holdout {holdout} leaves no training rows of {len(X)}")
        if held is None and held_rows.size:
            held = (X[held_rows], y[held_rows])
        elif held is not None:
            held = (_tensor(held[0], "the held-out X"), _tensor(held[1], "the held-out y"))
        X, y = X[train], y[train]
        n = len(X)
        if batch > 1:
            order = torch.as_tensor(np.random.default_rng([seed, BATCHES]).permutation(n))
            X, y = X[order].contiguous(), y[order].contiguous()
        self.X, self.y, self.held, self.rows = X, y, held, n
        self.l2, self.batch, self.convex, self.label = float(l2), batch, convex, label
        self.loss_fn = loss_fn
        self.module = copy.deepcopy(model).to(torch.float64).eval()
        params = [(k, p) for k, p in self.module.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients")
        self._names = [k for k, _ in params]
        self._shapes = [tuple(p.shape) for _, p in params]
        self._sizes = [p.numel() for _, p in params]
        # Parameters shared under two names (tied weights) need functional_call to tie them;
        # without any, not asking saves a tenth of a small model's update.
        self._tied = len(list(self.module.named_parameters(remove_duplicate=False))) > len(
            list(self.module.named_parameters()))
        self._w0 = torch.cat([p.detach().reshape(-1) for _, p in params]).numpy().copy()
        super().__init__(sum(self._sizes), math.ceil(n / batch))
        self._on: dict[tuple[str, Any], tuple[Any, Any, Any]] = {}
        # Made here, not on first use: a slice first taken inside a torch.func transform
        # would be kept at that transform's level and fail every later call.
        self._parts = self._split()
        self._check_loss()
        if isinstance(split_at, str):
            raise SplitError(f"is the string {split_at!r}: a list of child names is needed")
        self.seed, self.split_at = seed, tuple(split_at)
        self._cut = _Stages(self, self.split_at) if self.split_at else None
        self.spec_key = self._content_key()
        self.caches_optimum = self.spec_key is not None  # (LocalOptimumProblem: by default)

    # -- the one function every derivative comes from --------------------------------------

    def _params(self, flat: Any) -> dict[str, Any]:
        # One split, not a slice per parameter: its backward writes the gradient in one pass
        # (slices' would each add a zero vector of size d).
        return {name: part.view(shape) for name, shape, part in
                zip(self._names, self._shapes, flat.split(self._sizes), strict=True)}

    def _data_loss(self, flat: Any, x: Any, y: Any, module: Any = None) -> Any:
        out = torch_func().functional_call(module if module is not None else self.module,
                                           self._params(flat), (x,), tie_weights=self._tied)
        return self.loss_fn(out, y)

    def _full(self, flat: Any) -> Any:
        """f's data term: the weighted losses of the training rows (``_split``)."""
        return sum(weight * self._data_loss(flat, x, y) for x, y, weight in self._parts)

    def _split(self) -> list[tuple[Any, Any, float]]:
        """Slices of the training rows, each with its weight, whose weighted mean losses sum
        to (1/m) Σ_j f_j's data term: rows of full batches weigh 1/(m·batch) each, a shorter
        last batch 1/m as a whole."""
        n, b, m = self.rows, self.batch, self.n_samples
        body = n if n % b == 0 else (m - 1) * b
        parts = [(self.X[a:min(a + CHUNK, body)], self.y[a:min(a + CHUNK, body)],
                  (min(a + CHUNK, body) - a) / (m * b)) for a in range(0, body, CHUNK)]
        if body < n:
            parts.append((self.X[body:], self.y[body:], 1.0 / m))
        return parts

    def _batch(self, idx: int) -> tuple[Any, Any]:
        a = idx * self.batch
        return self.X[a:a + self.batch], self.y[a:a + self.batch]

    def _check_loss(self) -> None:
        """The loss of two rows must be a scalar, the mean of theirs (reduction='mean')."""
        import torch

        flat = torch.from_numpy(self._w0)
        with torch.no_grad():
            both = self._data_loss(flat, self.X[:2], self.y[:2])
            if not isinstance(both, torch.Tensor) or both.ndim != 0:
                raise ValueError("the loss function must return a scalar tensor, got "
                                 f"{getattr(both, 'shape', type(both).__name__)}")
            if self.rows < 2:
                return
            each = [float(self._data_loss(flat, self.X[i:i + 1], self.y[i:i + 1]))
                    for i in range(2)]
        mean = (each[0] + each[1]) / 2
        if not math.isclose(float(both), mean, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"the loss of rows 0 and 1 is {float(both):.6g}, not the mean "
                             f"of theirs ({mean:.6g}): the loss must average over the batch "
                             "(reduction='mean')")

    def _content_key(self) -> str | None:
        """The optimum cache's key: a hash of everything w* depends on (the data, the module's
        whole state, the source of its classes and of the loss, with a loss's closure or
        partial arguments, λ, the batches, torch's and scipy's versions); None (nothing
        cached) where a source cannot be read."""
        import inspect

        import scipy
        import torch

        digest = hashlib.sha256()
        for part in (self.X, self.y, *(v.detach().cpu() for v in
                                       self.module.state_dict().values())):
            digest.update(part.numpy().tobytes())
        loss = self.loss_fn
        try:
            sources = [inspect.getsource(cls) for cls in
                       sorted({type(m) for m in self.module.modules()}, key=repr)]
            target = getattr(loss, "func", loss)
            sources.append(inspect.getsource(target if inspect.isroutine(target)
                                             else type(target)))
        except (OSError, TypeError):
            return None
        closure = [cell.cell_contents for cell in getattr(loss, "__closure__", None) or ()]
        extra = (getattr(loss, "args", ()), getattr(loss, "keywords", {}),
                 getattr(loss, "__defaults__", None), closure,
                 {k: v for k, v in vars(loss).items() if not k.startswith("_")}
                 if hasattr(loss, "__dict__") and not inspect.isroutine(loss) else {})
        digest.update(repr((sources, repr(self.module), extra, self.l2, self.batch,
                            self.convex, OPTIMUM_VERSION, torch.__version__,
                            scipy.__version__)).encode())
        return digest.hexdigest()[:24]

    # -- the Problem interface ---------------------------------------------------------------

    def initial(self) -> np.ndarray:
        return self._w0.copy()

    # The l2 term (λ/2)‖w‖² is added outside autograd: λw in one pass over the gradient.

    def loss(self, w: np.ndarray, idx: int) -> float:
        import torch

        with torch.no_grad():
            data = float(self._data_loss(_flat(w), *self._batch(idx)))
        return data + 0.5 * self.l2 * float(w @ w)

    def grad(self, w: np.ndarray, idx: int) -> Gradient:
        return self._with_l2(_derivative(self._data_loss, w, *self._batch(idx))[1], w), None

    def full_loss(self, w: np.ndarray) -> float:
        import torch

        with torch.no_grad():
            data = float(self._full(_flat(w)))
        return data + 0.5 * self.l2 * float(w @ w)

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self.full_loss_and_grad(w)[1]

    def full_loss_and_grad(self, w: np.ndarray) -> tuple[float, np.ndarray]:
        """f(w) and ∇f(w) from one forward and one backward pass (L-BFGS asks for both)."""
        data, grad = _derivative(self._full, w)
        return data + 0.5 * self.l2 * float(w @ w), self._with_l2(grad, w)

    def hessp(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²f(w)v by reverse over reverse: ∇(∇f(w)·v). (``torch.func.jvp`` of
        ``torch.func.grad``, forward over reverse, fails inside torch for tied weights.)"""
        import torch

        flat = _flat(w).requires_grad_()
        (g,) = torch.autograd.grad(self._full(flat), flat, create_graph=True)
        (hv,) = torch.autograd.grad(g, flat, grad_outputs=_flat(v))
        return self._with_l2(hv.detach().numpy(), v)

    def _with_l2(self, g: np.ndarray, w: np.ndarray) -> np.ndarray:
        """g + λw, in place: one pass, on torch's threads (a BLAS daxpy here spun its own
        threads and took 0.1–2 ms for d = 112,510 on a loaded 2-core machine)."""
        if self.l2:
            _flat(g).add_(_flat(w), alpha=self.l2)
        return g

    def _solve(self) -> np.ndarray:
        # A convex problem: Newton-CG to the global minimum; a network: L-BFGS from w_0.
        return Problem._solve(self) if self.convex else super()._solve()

    # -- model-parallel stages (``split_at``) --------------------------------------------------

    def stages(self) -> list[slice] | None:
        return None if self._cut is None else list(self._cut.slices)

    def stage_width(self, stage: int) -> int:
        assert self._cut is not None
        return self._cut.widths[stage]

    def forward(self, stage: int, theta: np.ndarray, a: np.ndarray | None,
                idx: int) -> tuple[np.ndarray, Any]:
        """The stage's children run at ``theta`` on a copy of its input (the batch's rows for
        the first stage; a copy, so that an in-place first child writes into neither the
        message nor the data), without autograd: its output, and its input as the cache."""
        import torch

        assert self._cut is not None
        with torch.no_grad():
            out = self._cut.run(stage, _flat(theta), self._input(stage, a, idx))
        # (the last stage's output goes to the loss alone, and may be a tuple)
        return out.numpy() if isinstance(out, torch.Tensor) else np.empty(0), a

    def backward(self, stage: int, theta: np.ndarray, cache: Any, up: np.ndarray | None,
                 idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The stage's children run again at ``theta`` on a copy of its input (``cache``;
        the gradient taken with respect to the input, a leaf, through the copy, which an
        in-place first child may change) and differentiated by reverse-mode autograd: from
        the loss of its output for the last stage, from ``up`` for the others; λθ added."""
        import torch

        assert self._cut is not None
        flat = _flat(theta).requires_grad_()
        x = self._input(stage, cache, idx)
        if stage:
            x.requires_grad_()
        out = self._cut.run(stage, flat, x.clone() if stage else x)
        if up is None:
            value, grad_out = self.loss_fn(out, self._batch(idx)[1]), None
        else:
            value, grad_out = out, torch.as_tensor(up)
        grads = torch.autograd.grad(value, [flat, x] if stage else [flat], grad_out,
                                    allow_unused=True)
        g = (grads[0] if grads[0] is not None else torch.zeros_like(flat)).numpy()
        back = None
        if stage:
            back = (grads[1] if grads[1] is not None else torch.zeros_like(x)).numpy()
        return self._with_l2(g, theta), back

    def local_head(self, stage: int) -> np.ndarray:
        """The auxiliary head of ``local``: the last stage's children re-initialised by their
        own ``reset_parameters`` (torch's default initialisation) under torch's generator
        seeded from ``seed`` (a parameter no module re-initialises starts at zero). A head
        at zero would stall a head of several layers (no gradient reaches its first), and
        one equal to w_0's last stage would take the last stage's own steps."""
        assert self._cut is not None and stage == len(self._cut.slices) - 2
        return self._cut.fresh_last(self.seed)

    def _input(self, stage: int, a: Any, idx: int) -> Any:
        """A copy of the stage's input: the batch's rows, or the activation ``a``."""
        import torch

        return (self._batch(idx)[0] if stage == 0 else torch.as_tensor(a)).clone()

    def torch_loss(self, w: Any, idx: int) -> Any:
        module, X, y = self._device(w)
        a = idx * self.batch
        loss = self._data_loss(w, X[a:a + self.batch], y[a:a + self.batch], module)
        return loss + 0.5 * self.l2 * (w @ w) if self.l2 else loss

    def _device(self, w: Any) -> tuple[Any, Any, Any]:
        """The module and the training data on ``w``'s device, floating parts in ``w``'s
        dtype, copied there once."""
        key = (str(w.device), w.dtype)
        if key not in self._on:
            def move(t: Any) -> Any:
                return t.to(w.device, w.dtype if t.dtype.is_floating_point else None)
            self._on[key] = (copy.deepcopy(self.module).to(w.device, w.dtype),
                             move(self.X), move(self.y))
        return self._on[key]

    def _outputs(self, w: np.ndarray, X: Any) -> Any:
        import torch

        flat = _flat(w)
        with torch.no_grad():
            return torch.cat([torch_func().functional_call(self.module, self._params(flat),
                                                           (X[a:a + CHUNK],),
                                                           tie_weights=self._tied)
                              for a in range(0, len(X), CHUNK)])

    def _accuracy(self, w: np.ndarray, X: Any, y: Any) -> float | None:
        """The share of targets classified right, where they are classes: integer targets
        (one per row, or one per position of a row: a tagger's tokens) and one output per
        class (argmax), or one output per row and targets 0/1 or ±1 (the class its sign
        gives, 0 counted positive)."""
        import torch

        out = self._outputs(w, X)
        if (out.ndim == y.ndim + 1 and out.shape[:-1] == y.shape and out.shape[-1] >= 2
                and not y.dtype.is_floating_point):  # a class per row, or per position
            guess = out.argmax(dim=-1)
        elif y.ndim != 1 or out.numel() != len(y):
            return None
        elif bool(((y == 0) | (y == 1)).all()):
            guess = (out.reshape(-1) >= 0).to(y.dtype)
        elif bool(((y == -1) | (y == 1)).all()):
            guess = torch.where(out.reshape(-1) >= 0, 1, -1).to(y.dtype)
        else:
            return None
        return float((guess == y).to(torch.float64).mean())

    def accuracy(self, w: np.ndarray) -> float | None:
        return self._accuracy(w, self.X, self.y)

    def held_out_accuracy(self, w: np.ndarray) -> float | None:
        return None if self.held is None else self._accuracy(w, *self.held)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "rows": self.rows, "batch": self.batch,
                "model": self.label or type(self.module).__name__}

    def fingerprint(self) -> str:
        """A hash of the training data and w_0: a factory that draws from anything but the
        seeded generators builds another problem in each process, and this tells."""
        digest = hashlib.sha256()
        for part in (self.X.numpy(), self.y.numpy(), self._w0):
            digest.update(part.tobytes())
        return digest.hexdigest()[:24]

    def recorded(self, spec: Any) -> Any:
        """The ``[problem]`` a run on this problem records, from the scenario's ``spec``: the
        spec itself where it names this problem's factory; else one naming this problem as
        built in Python, which no later command can rebuild (a replay of the run refuses it
        in one line, instead of rebuilding the scenario's other problem)."""
        if spec.name == "torch" and spec.model == self.label and (
                tuple(spec.split_at) == self.split_at):
            return spec
        defaults = {item.name: item.default for item in dataclasses.fields(spec)}
        unset = {k: defaults[k] for k in ("data", "target", "dim", "n_samples", "density",
                                          "hidden", "classes", "length", "holdout")}
        return dataclasses.replace(spec, name="torch", batch=self.batch, l2=self.l2,
                                   split_at=self.split_at,
                                   model=self.label or f"<built in Python: "
                                   f"{type(self.module).__name__}>", **unset)


class SplitError(ValueError):
    """A ``split_at`` that does not cut the model into stages (``problem.split_at``)."""


HEAD = 0x4EAD  # the auxiliary head's initialisation stream (``local``)


class _Stages:
    """An ``nn.Sequential`` cut before the children ``split_at`` names: each stage is a
    ``Sequential`` of its children (the model's own modules), its parameters a contiguous
    slice of w (``named_parameters`` follows the children's order).

    Raises:
        SplitError: a model that is not an ``nn.Sequential`` running its children in order
            (a subclass with a ``forward`` of its own, or hooks on the model); a name that
            is not a child, is the first or comes out of order; a parameter on the
            ``Sequential`` itself; a stage with no parameter to train; a parameter two
            stages share (a module used in both); a stage before the last whose output is
            not one tensor.
    """

    def __init__(self, problem: TorchProblem, split_at: tuple[str, ...]) -> None:
        import torch

        model = problem.module
        if not isinstance(model, torch.nn.Sequential):
            raise SplitError(f"cuts an nn.Sequential (its forward runs its children in "
                             f"order); the model is a {type(model).__name__}")
        if type(model).forward is not torch.nn.Sequential.forward:
            raise SplitError(f"cuts an nn.Sequential whose forward runs its children in "
                             f"order; {type(model).__name__} has a forward of its own")
        if model._forward_hooks or model._forward_pre_hooks:
            raise SplitError("cuts the model's children apart: the hooks on the model itself "
                             "would not run")
        # Every child as the forward runs it, a module used twice under each of its names
        # (``named_children`` lists a module once).
        children = list(model._modules)
        for name in split_at:
            if name not in children:
                raise SplitError(f"names {name!r}, not a child of the model (its children: "
                                 f"{', '.join(children)})")
        starts = [children.index(name) for name in split_at]
        if starts[0] == 0:
            raise SplitError(f"names {split_at[0]!r}, the model's first child: name the "
                             "children where the stages after the first start")
        if starts != sorted(set(starts)):
            raise SplitError("must name children in their order in the model, each once")
        cuts = [0, *starts, len(children)]
        groups = [children[a:b] for a, b in itertools.pairwise(cuts)]
        self.modules = [torch.nn.Sequential(OrderedDict((c, model.get_submodule(c))
                                                        for c in group)) for group in groups]
        owner = {c: s for s, group in enumerate(groups) for c in group}
        by_param: dict[int, int] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            child = name.split(".", 1)[0]
            if child not in owner:
                raise SplitError(f"cannot place the model's own parameter {name!r} (on the "
                                 "Sequential itself, not a child) in a stage")
            if by_param.setdefault(id(p), owner[child]) != owner[child]:
                raise SplitError(f"cuts through a parameter two stages share ({name}, tied "
                                 f"weights or a module used in both): each stage's "
                                 f"parameters must be its own")
        # The vector's parameters, in order, by stage: each stage's a contiguous run.
        of_stage = [owner[name.split(".", 1)[0]] for name in problem._names]
        if of_stage != sorted(of_stage):
            raise SplitError("leaves a stage's parameters apart in w (registered out of the "
                             "children's order)")
        for s, group in enumerate(groups):
            if s not in of_stage:
                raise SplitError(f"leaves stage {s} ({', '.join(group)}) with no parameter "
                                 "to train: cut where every stage has some")
        self.names = [[n for n, o in zip(problem._names, of_stage, strict=True) if o == s]
                      for s in range(len(groups))]
        self.shapes = [[problem._shapes[problem._names.index(n)] for n in names]
                       for names in self.names]
        self.sizes = [[problem._sizes[problem._names.index(n)] for n in names]
                      for names in self.names]
        bounds = np.cumsum([0, *(sum(sizes) for sizes in self.sizes)]).tolist()
        self.slices = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.tied = problem._tied
        self.widths = self._widths(problem, groups)

    def run(self, stage: int, theta: Any, x: Any) -> Any:
        """Stage ``stage``'s children at the flat parameters ``theta`` on ``x``."""
        params = {name: part.view(shape) for name, shape, part in
                  zip(self.names[stage], self.shapes[stage],
                      theta.split(self.sizes[stage]), strict=True)}
        return torch_func().functional_call(self.modules[stage], params, (x,),
                                            tie_weights=self.tied)

    def _widths(self, problem: TorchProblem, groups: list[list[str]]) -> list[int]:
        """Coordinates of each stage's output for the first sample, from w_0 (the last
        stage's, which goes to the loss, 0); every stage before the last must pass one
        tensor on."""
        import torch

        widths, x = [], problem._batch(0)[0].clone()
        with torch.no_grad():
            for s, part in enumerate(self.slices[:-1]):
                x = self.run(s, _flat(problem._w0[part]), x)
                if not isinstance(x, torch.Tensor):
                    raise SplitError(f"stage {s} ({', '.join(groups[s])}) returns a "
                                     f"{type(x).__name__}: a stage must pass one tensor on")
                widths.append(int(x.numel()))
        return [*widths, 0]

    def fresh_last(self, seed: int) -> np.ndarray:
        """The last stage's parameters re-initialised (``TorchProblem.local_head``)."""
        import torch

        head = copy.deepcopy(self.modules[-1])
        reset: set[int] = set()
        with torch.random.fork_rng(devices=[]):
            # (the CPU generator alone: fork_rng restores no other device's)
            torch.default_generator.manual_seed(
                int(np.random.default_rng([seed, HEAD]).integers(2 ** 62)))
            for module in head.modules():
                reset_parameters = getattr(module, "reset_parameters", None)
                if callable(reset_parameters):
                    reset_parameters()
                    reset.update(id(p) for p in module.parameters(recurse=False))
        values = [p.detach().reshape(-1) if id(p) in reset else torch.zeros(p.numel())
                  for p in (head.get_parameter(name) for name in self.names[-1])]
        return torch.cat(values).to(torch.float64).numpy().copy()


def torch_func() -> Any:
    import torch.func

    return torch.func


def _derivative(function: Callable[..., Any], w: np.ndarray,
                *args: Any) -> tuple[float, np.ndarray]:
    """``function(flat, *args)`` at ``w`` and its gradient, by reverse-mode autograd: a leaf
    over w's memory, the module's parameters views of it (``functional_call``). 2x faster per
    update than ``torch.func.grad`` on small modules, and as close to a bare
    ``loss.backward()`` as swapping the parameters in allows."""
    import torch

    flat = _flat(w).requires_grad_()
    value = function(flat, *args)
    (grad,) = torch.autograd.grad(value, flat)
    return float(value.detach()), grad.numpy()


def _flat(w: np.ndarray) -> Any:
    """``w`` as a float64 tensor sharing its memory where it can (a read-only or non-contiguous
    array is copied)."""
    import torch

    if not (isinstance(w, np.ndarray) and w.dtype == np.float64 and w.flags.c_contiguous
            and w.flags.writeable):
        w = np.array(w, dtype=np.float64)
    return torch.from_numpy(w)


# -- the scenario's way in: problem.model names a factory -------------------------------------

def load_factory(text: str) -> Callable[[], Any]:
    """The function ``problem.model`` names: ``package.module:function`` on the import path,
    or ``path/to/file.py:function`` (relative to the working directory).

    Raises:
        ScenarioError: naming problem.model, where the module, file or function is missing
            or importing it fails.
    """
    if text.startswith("<built in Python"):
        raise ScenarioError("problem.model", text, "the run's problem was a TorchProblem made "
                            "in Python, which only that session can rebuild: pass it again "
                            "(simulate(scenario, problem=...)) or name a factory")
    target, sep, func = text.rpartition(":")
    if not sep or not target or not func.isidentifier():
        raise ScenarioError("problem.model", text, "must be 'package.module:function' or "
                            "'path/to/file.py:function'")
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target).expanduser()
            if not path.is_file():
                raise ScenarioError("problem.model", text, f"no file {path}")
            name = "asyngrad_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
            loader = importlib.util.spec_from_file_location(name, path)
            if loader is None or loader.loader is None:
                raise ScenarioError("problem.model", text, f"{path} cannot be loaded as Python")
            module = importlib.util.module_from_spec(loader)
            # Registered first, as an import does: dataclasses and pickling look it up there.
            sys.modules[name] = module
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ScenarioError:
        raise
    except ModuleNotFoundError as err:
        hint = (f" (a file in the working directory is named as {target.replace('.', '/')}.py:"
                f"{func})" if err.name == target else "")
        raise ScenarioError("problem.model", text,
                            f"no module named {err.name!r}{hint}") from None
    except (Exception, SystemExit) as err:  # the user's module failed while it was imported
        raise ScenarioError("problem.model", text,
                            f"importing it raised {type(err).__name__}: {err}") from None
    factory = getattr(module, func, None)
    if not callable(factory):
        raise ScenarioError("problem.model", text, f"{target} has no function {func!r}")
    return factory


def _unpack(made: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """(model, loss, X, y, options) from what a factory returned."""
    if isinstance(made, Mapping):
        extra = set(made) - {"model", "loss", "X", "y", "data", "convex", "held"}
        if extra or not {"model", "loss"} <= set(made):
            raise ValueError("the factory's dict must have keys model, loss and X, y or data "
                             f"(convex, held optional); it has {', '.join(sorted(made))}")
        options = {k: made[k] for k in ("convex", "held") if k in made}
        if "data" in made:
            return made["model"], made["loss"], made["data"], None, options
        return made["model"], made["loss"], made.get("X"), made.get("y"), options
    if isinstance(made, (tuple, list)) and len(made) in (2, 3, 4):
        model, loss, *data = made
        return (model, loss, data[0] if data else None, data[1] if len(data) == 2 else None,
                {})
    raise ValueError(f"the factory returned a {type(made).__name__}: (model, loss_fn, X, y), "
                     "(model, loss_fn, dataset), (model, loss_fn) with problem.data a file, "
                     "or a dict is needed")


def _file_data(spec: Any, X: Any, y: Any) -> tuple[Any, Any]:
    """The data: the factory's, or the file ``problem.data`` names (never both)."""
    from simulator.problems.files import read_data
    from simulator.scenario.base import is_file

    if not is_file(spec.data):
        if X is None:
            raise ValueError("the factory returned no data: return (model, loss_fn, X, y) or "
                             "(model, loss_fn, dataset), or set problem.data to a data file")
        return X, y
    if X is not None:
        raise ValueError(f"the factory returned data and problem.data names {spec.data}: "
                         "return (model, loss_fn) to train on the file")
    X, y = read_data(spec.data, spec.target)
    return (X.toarray() if hasattr(X, "toarray") else X), y


# One build at a time in a process: the generators are process-wide, and worker threads
# (``--launch threads``) build their problems at once.
_BUILDING = threading.Lock()


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's, numpy's global and ``random``'s generators seeded with ``seed`` inside, and
    restored after: a factory that draws from any of them builds the same problem in every
    process."""
    import torch

    state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state[0])
            random.setstate(state[1])


def from_spec(spec: Any) -> TorchProblem:
    """The problem a ``ProblemSpec`` with ``name = "torch"`` describes: its factory called with
    torch's, numpy's and ``random``'s generators seeded from ``spec.seed`` (and restored
    after), one build at a time.

    Raises:
        ScenarioError: naming problem.model, for a factory that cannot be found, raises, or
            returns what is not a model, a loss and data that fit it; naming
            problem.split_at, for stages that cannot be cut (:class:`SplitError`).
    """
    factory = load_factory(spec.model)
    try:
        with _BUILDING, _seeded(spec.seed):
            made = factory()
            model, loss, X, y, options = _unpack(made)
            X, y = _file_data(spec, X, y)
            if "held" in options and spec.holdout:
                raise ValueError("the factory returned held-out data and problem.holdout "
                                 f"is {spec.holdout}: the rows held out would never be "
                                 "scored (set one or the other)")
            return TorchProblem(model, loss, X, y, l2=spec.l2, batch=spec.batch,
                                holdout=spec.holdout, seed=spec.seed, label=spec.model,
                                split_at=spec.split_at, **options)
    except ScenarioError:
        raise
    except SplitError as err:
        raise ScenarioError("problem.split_at", list(spec.split_at), str(err)) from None
    except ValueError as err:
        raise ScenarioError("problem.model", spec.model, str(err)) from None
    except (Exception, SystemExit) as err:  # the user's code failed: one line
        raise ScenarioError("problem.model", spec.model,
                            f"raised {type(err).__name__}: {err}") from None
