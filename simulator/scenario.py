"""Scenarios: frozen, validated dataclasses read from TOML, with ``key=value`` overrides.

Every field has a default, so ``Scenario()`` is a complete scenario (the embedded default: dense
logistic regression, 8 lock-free threads, load_store writes). Files and overrides are merged
over the defaults field by field; every value is type-checked and validated on creation, and a
bad one raises :class:`ScenarioError` naming its full dotted field and the value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.distributions import Duration
from simulator.errors import ScenarioError

__all__ = ["DeviceSpec", "MetricsSpec", "ProblemSpec", "RunSpec", "Scenario", "TimingSpec",
           "load_scenario", "scenario_from_dict", "scenario_to_dict", "scenario_to_toml",
           "with_overrides"]

PROTOCOLS = ("serial", "locked", "lockfree")
WRITE_MODES = ("load_store", "atomic_add")
# Real data that a package ships, and the problem each serves.
REAL_DATA = {"breast_cancer": "logistic", "digits": "mlp"}
DATA_SOURCES = ("synthetic", *REAL_DATA)


def _check(ok: bool, name: str, value: Any, reason: str) -> None:
    if not ok:
        raise ScenarioError(name, value, reason)


@dataclass(frozen=True)
class ProblemSpec:
    """Which problem to train and how to generate its data (``seed`` is the data seed).

    ``dim`` is the number of features (for ``mlp``, its input size; the parameter count is
    hidden·(dim + 1) + classes·(hidden + 1)); ``density`` serves ``sparse_logistic``;
    ``hidden`` and ``classes`` serve ``mlp``."""

    name: str = "logistic"
    data: str = "synthetic"
    dim: int = 100
    n_samples: int = 1000
    l2: float = 0.01
    density: float = 0.01
    hidden: int = 32
    classes: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.data in DATA_SOURCES, "data", self.data,
               f"must be one of {', '.join(DATA_SOURCES)}")
        _check(self.data == "synthetic" or REAL_DATA[self.data] == self.name, "data",
               self.data, f"serves the {REAL_DATA.get(self.data)} problem, not {self.name}")
        _check(self.dim >= 1, "dim", self.dim, "must be >= 1")
        _check(self.n_samples >= 1, "n_samples", self.n_samples, "must be >= 1")
        _check(math.isfinite(self.l2) and self.l2 >= 0, "l2", self.l2, "must be >= 0")
        _check(0 < self.density <= 1, "density", self.density, "must be in (0, 1]")
        _check(self.hidden >= 1, "hidden", self.hidden, "must be >= 1 (mlp hidden units)")
        _check(self.classes >= 2, "classes", self.classes, "must be >= 2 (mlp classes)")
        _check(self.seed >= 0, "seed", self.seed, "must be >= 0")


@dataclass(frozen=True)
class TimingSpec:
    """Durations of one whole-vector read, one gradient, one whole-vector write (ns).

    A block's read or write takes a draw times the fraction of coordinates it moves.
    """

    read: Duration = Duration("lognormal", 2000.0, 0.3)
    grad: Duration = Duration("lognormal", 6000.0, 0.3)
    write: Duration = Duration("lognormal", 2000.0, 0.3)


@dataclass(frozen=True)
class DeviceSpec:
    """A virtual device: ``speed`` divides durations; ``cores`` = 0 means one per thread;
    ``bus`` > 0 caps concurrent block transfers; ``timing`` overrides the scenario's."""

    name: str = "cpu"
    speed: float = 1.0
    cores: int = 0
    bus: int = 0
    timing: TimingSpec | None = None

    def __post_init__(self) -> None:
        _check(math.isfinite(self.speed) and self.speed > 0, "speed", self.speed, "must be > 0")
        _check(self.cores >= 0, "cores", self.cores, "must be >= 0 (0: one core per thread)")
        _check(self.bus >= 0, "bus", self.bus, "must be >= 0 (0: unlimited)")


@dataclass(frozen=True)
class RunSpec:
    """How to train: protocol, threads, total updates T, learning rate, blocks, write mode."""

    protocol: str = "lockfree"
    threads: int = 8
    updates: int = 5000
    lr: float = 0.02
    blocks: int = 1
    write_mode: str = "load_store"
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.protocol in PROTOCOLS, "protocol", self.protocol,
               f"must be one of {', '.join(PROTOCOLS)}")
        _check(self.threads >= 1, "threads", self.threads, "must be >= 1")
        _check(self.updates >= 1, "updates", self.updates, "must be >= 1")
        _check(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "must be > 0")
        _check(self.blocks >= 1, "blocks", self.blocks, "must be >= 1")
        _check(self.write_mode in WRITE_MODES, "write_mode", self.write_mode,
               f"must be one of {', '.join(WRITE_MODES)}")
        _check(self.seed >= 0, "seed", self.seed, "must be >= 0")


@dataclass(frozen=True)
class MetricsSpec:
    """Exact serialized-view metrics (cost: one extra gradient per measured update).

    ``exact`` switches them on; ``every`` measures every n-th update; ``curve_points`` is the
    number of full-loss evaluations along the run (0: only the final loss).
    """

    exact: bool = True
    every: int = 1
    curve_points: int = 100

    def __post_init__(self) -> None:
        _check(self.every >= 1, "every", self.every, "must be >= 1")
        _check(self.curve_points >= 0, "curve_points", self.curve_points, "must be >= 0")


@dataclass(frozen=True)
class Scenario:
    """A complete simulation: problem, run, timing, metrics and devices."""

    name: str = "default"
    problem: ProblemSpec = field(default_factory=ProblemSpec)
    run: RunSpec = field(default_factory=RunSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    devices: tuple[DeviceSpec, ...] = (DeviceSpec(),)

    def __post_init__(self) -> None:
        _check(len(self.devices) >= 1, "devices", [], "needs at least one device")

    def device_of(self, thread: int) -> int:
        """Threads are placed on devices round-robin."""
        return thread % len(self.devices)

    def timing_of(self, device: int) -> TimingSpec:
        """The device's own timing, or the scenario's."""
        return self.devices[device].timing or self.timing


# ---------------------------------------------------------------------------------------------
# Building from plain data (TOML tables) with type checks; the inverse for writing.


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, base: Any, name: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and build it (merging over ``base``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return _convert(inner, value, base, name)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        _check(isinstance(value, list | tuple), name, value, "must be a list")
        default = typing.cast(Any, item)() if dataclasses.is_dataclass(item) else None
        return tuple(_convert(item, v, default, f"{name}.{i}") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), name, value, "must be a table")
        return _build(tp, value, base if base is not None else typing.cast(Any, tp)(), name)
    if tp is float:
        _check(isinstance(value, int | float) and not isinstance(value, bool), name, value,
               "must be a number")
        return float(value)
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), name, value,
               "must be an integer")
        return value
    _check(isinstance(value, tp), name, value, f"must be a {_describe(tp)}")
    return value


def _build(cls: Any, data: dict[str, Any], base: Any, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        _check(key in names, f"{prefix}.{key}" if prefix else key, data[key], "unknown key")
    values = {}
    for name in names:
        path = f"{prefix}.{name}" if prefix else name
        current = getattr(base, name)
        values[name] = (_convert(hints[name], data[name], current, path) if name in data
                        else current)
    try:
        return cls(**values)
    except ScenarioError as err:
        raise err.under(prefix) from None


def scenario_from_dict(data: dict[str, Any]) -> Scenario:
    """Build and validate a scenario from plain data, missing fields taken from the defaults.

    Raises:
        ScenarioError: an unknown key, a value of the wrong type, or an invalid value.
    """
    return _build(Scenario, data, Scenario(), "")


def _plain(value: Any) -> Any:
    if isinstance(value, Duration):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain data that ``scenario_from_dict`` turns back into an equal scenario."""
    return typing.cast(dict[str, Any], _plain(scenario))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"


def _toml_table(header: str, table: dict[str, Any], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v)}
    if header:
        lines.append(f"\n{header}")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
    for key, value in table.items():
        if isinstance(value, dict) and _is_table(value):
            name = f"{header.strip('[]')}.{key}" if header else key
            _toml_table(f"[{name}]", value, lines)
        elif isinstance(value, list) and _is_table(value):
            name = f"{header.strip('[]')}.{key}" if header else key
            for item in value:
                _toml_table(f"[[{name}]]", item, lines)


def _is_table(value: Any) -> bool:
    """Sections get headers; durations (which carry ``dist``) stay inline tables."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value)
    return isinstance(value, dict) and "dist" not in value


def scenario_to_toml(scenario: Scenario) -> str:
    """The fully resolved scenario as a TOML document."""
    lines: list[str] = ["# asyngrad-lab scenario (fully resolved)"]
    _toml_table("", scenario_to_dict(scenario), lines)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Files and overrides.


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    _check(bool(sep) and bool(key.strip()), "--set", text, "must look like key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def apply_override(data: dict[str, Any], text: str) -> None:
    """Set one dotted ``key=value`` in plain scenario data (list items by index)."""
    path, value = _parse_override(text)
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        where = ".".join(path[: depth + 1])
        if isinstance(node, list):
            _check(part.isdigit() and int(part) < len(node), where, part,
                   f"must be an index below {len(node)}")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
            _check(isinstance(node, dict | list), where, node, "is not a table")
    if isinstance(node, list):
        _check(path[-1].isdigit() and int(path[-1]) < len(node), ".".join(path), path[-1],
               f"must be an index below {len(node)}")
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value


def with_overrides(scenario: Scenario, overrides: list[str] | tuple[str, ...]) -> Scenario:
    """A copy of ``scenario`` with ``key=value`` overrides applied (and validated)."""
    data = scenario_to_dict(scenario)
    for text in overrides:
        apply_override(data, text)
    return scenario_from_dict(data)


def load_scenario(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                  ) -> Scenario:
    """Read a scenario file (``None``: the embedded default) and apply ``key=value`` overrides.

    Raises:
        ScenarioError: a missing or unparsable file, or any invalid field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as err:
            raise ScenarioError("scenario", str(path), err.strerror or "cannot be read") from None
        except tomllib.TOMLDecodeError as err:
            raise ScenarioError("scenario", str(path), f"is not valid TOML ({err})") from None
    if any(o.split("=", 1)[0].startswith("devices.") for o in overrides):
        data.setdefault("devices", scenario_to_dict(Scenario())["devices"])
    for text in overrides:
        apply_override(data, text)
    return scenario_from_dict(data)
