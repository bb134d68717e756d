"""Scenarios from plain data, TOML files and ``key=value`` overrides, and back.

Files and overrides are merged over the defaults field by field; every value is type-checked
and validated on creation, and a bad one raises :class:`ScenarioError` naming its full dotted
field and the value. Keys of older scenario files are first moved to where they live now
(:mod:`simulator.scenario.legacy`).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from simulator.distributions import Duration
from simulator.errors import ScenarioError
from simulator.scenario.base import check
from simulator.scenario.legacy import upgrade
from simulator.scenario.specs import Scenario

T = typing.TypeVar("T")

__all__ = [
    "apply_override",
    "is_table",
    "load_scenario",
    "plain",
    "scenario_from_dict",
    "scenario_to_dict",
    "scenario_to_toml",
    "spec_from_dict",
    "toml_value",
    "with_overrides",
]


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
        check(isinstance(value, list | tuple), name, value, "must be a list")
        return tuple(_convert(item, v, None, f"{name}.{i}") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), name, value, "must be a table")
        return _build(tp, value, base, name)
    if tp is float:
        check(isinstance(value, int | float) and not isinstance(value, bool), name, value,
               "must be a number")
        return float(value)
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), name, value,
               "must be an integer")
        return value
    if tp is str and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # a column index, a label: `target = 3`, `--set name=2026`
    check(isinstance(value, tp), name, value, f"must be a {_describe(tp)}")
    return value


def _build(cls: Any, data: dict[str, Any], base: Any, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for given in data:
        check(given in names, f"{prefix}.{given}" if prefix else given, data[given],
               "unknown key")
    values = {}
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING
                else f.default_factory() for f in dataclasses.fields(cls)}
    for name in names:
        path = f"{prefix}.{name}" if prefix else name
        current = getattr(base, name) if base is not None else defaults[name]
        values[name] = (_convert(hints[name], data[name], current, path) if name in data
                        else current)
    try:
        return cls(**values)
    except ScenarioError as err:
        raise err.under(prefix) from None


def spec_from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build and validate one spec (``cls``) from plain data, missing fields taken from its
    defaults; errors name the field under ``prefix``.

    Raises:
        ScenarioError: an unknown key, a value of the wrong type, or an invalid value.
    """
    return typing.cast(T, _build(cls, data, None, prefix))


def scenario_from_dict(data: dict[str, Any]) -> Scenario:
    """Build and validate a scenario from plain data, missing fields taken from the defaults.

    Raises:
        ScenarioError: an unknown key, a value of the wrong type, or an invalid value.
    """
    return _build(Scenario, upgrade(data), Scenario(), "")


def plain(value: Any) -> Any:
    if isinstance(value, Duration):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain data that ``scenario_from_dict`` turns back into an equal scenario."""
    return typing.cast(dict[str, Any], plain(scenario))


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):  # plain repr: a numpy scalar's is not TOML
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"


def _toml_table(header: str, table: dict[str, Any], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not is_table(v)}
    if header and (scalars or header.startswith("[[")):  # (a table of tables: theirs alone)
        lines.append(f"\n{header}")
    lines.extend(f"{k} = {toml_value(v)}" for k, v in scalars.items())
    for entry, value in table.items():
        if isinstance(value, dict) and is_table(value) and value:  # (no table set: none)
            name = f"{header.strip('[]')}.{entry}" if header else entry
            _toml_table(f"[{name}]", value, lines)
        elif isinstance(value, list) and is_table(value):
            name = f"{header.strip('[]')}.{entry}" if header else entry
            for item in value:
                _toml_table(f"[[{name}]]", item, lines)


def is_table(value: Any) -> bool:
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
    check(bool(sep) and bool(key.strip()), "--set", text, "must look like key=value")
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
            check(part.isdigit() and int(part) < len(node), where, part,
                   f"must be an index below {len(node)}")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
            check(isinstance(node, dict | list), where, node, "is not a table")
    if isinstance(node, list):
        check(path[-1].isdigit() and int(path[-1]) < len(node), ".".join(path), path[-1],
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
        except UnicodeDecodeError:
            raise ScenarioError("scenario", str(path), "is not UTF-8 text (a scenario is a "
                                "TOML file)") from None
        except tomllib.TOMLDecodeError as err:
            raise ScenarioError("scenario", str(path), f"is not valid TOML ({err})") from None
    if any(o.split("=", 1)[0].startswith("devices.") for o in overrides):
        data.setdefault("devices", scenario_to_dict(Scenario())["devices"])
    for text in overrides:
        apply_override(data, text)
    return scenario_from_dict(data)
