"""The scenario reference, ``docs/scenario.md``: one table per TOML table, one line per key.

Generated from the specs alone: it walks :class:`~simulator.scenario.Scenario`'s fields and
the dataclasses nested in them, and reads each key's type from its annotation, its default
from the field and its description, allowed values and range from the field's metadata
(:func:`simulator.keys.key`). A spec moved, added or renamed shows up without a change here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from simulator.scenario import Scenario, is_table, plain, toml_value

__all__ = ["Row", "Section", "reference", "sections"]

_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean"}

_PREAMBLE = """\
# Scenario reference

<!-- Generated from the scenario specs by `asyngrad scenario --reference > docs/scenario.md`;
     edit the specs' key(...) declarations, not this file. -->

Every key of a scenario file, one line each: its type, its default, the values or range the
validation allows, and what it is. Every key has a default, so a file sets only the keys it
changes; `asyngrad scenario [FILE] [--set key=value ...]` prints the fully resolved scenario.
Integers are 64-bit; times and durations are in nanoseconds. What the keys do in a run:
[semantics.md](semantics.md); a bad value is refused with one line naming the key and value.
"""


@dataclass(frozen=True)
class Row:
    """One key: its name, TOML type, default, allowed values or range, and description."""

    key: str
    type: str
    default: str
    allowed: str
    doc: str


@dataclass(frozen=True)
class Section:
    """One TOML table (``[run]``, ``[[devices]]``, ...), or an inline table's keys."""

    title: str
    intro: str
    spec: type
    rows: tuple[Row, ...]


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """The annotation's core type (``X | None``: X), and whether it is a tuple of those."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0], True
    return tp, False


def _is_spec(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_section(tp: Any) -> bool:
    """A spec written as a table of its own; a duration, by the rule the TOML writer
    follows, is written inline."""
    return _is_spec(tp) and is_table({f.name: None for f in dataclasses.fields(tp)})


def _default(item: dataclasses.Field[Any]) -> Any:
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type_name(core: Any, array: bool) -> str:
    name = core.__name__.lower() if _is_spec(core) else _TYPES.get(core, str(core))
    return f"array of {name}" if array else name


def _allowed(item: dataclasses.Field[Any]) -> str:
    choices = item.metadata.get("choices", ())
    if choices:
        return ", ".join(_code(toml_value(c)) for c in choices)
    return _code(item.metadata.get("bounds", ""))


def _row(item: dataclasses.Field[Any], core: Any, array: bool, shown: str | None) -> Row:
    default = _default(item)
    if shown is not None:  # a table whose keys another section lists
        text = ("unset" if default is None else _count(default) if array
                else "the keys' defaults")
        return Row(item.name, "array of tables" if array else "table", text,
                   f"the keys of {shown}", item.metadata.get("doc", ""))
    text = "unset" if default is None else _code(toml_value(plain(default)))
    return Row(item.name, _type_name(core, array), text, _allowed(item),
               item.metadata.get("doc", ""))


def _count(entries: tuple[Any, ...]) -> str:
    return "none" if not entries else f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"


def _sentence(doc: str) -> str:
    return f"{doc[:1].upper()}{doc[1:]}." if doc else ""


def _title(item: dataclasses.Field[Any], core: type, array: bool, path: str) -> str:
    """The heading of ``core``'s section, met first as ``item`` of the table at ``path``."""
    if not _is_section(core):
        return f"`{core.__name__}` (an inline table)"
    where = f"{path}.{item.name}" if path else item.name
    return f"`[[{where}]]`" if array else f"`[{where}]`"


def _intro(item: dataclasses.Field[Any], core: type, array: bool) -> str:
    if not _is_section(core):
        return (f"The keys of a {core.__name__.lower()}, written inline, e.g. "
                f"`{item.name} = {toml_value(plain(_default(item)))}`.")
    return _array_intro(item) if array else _sentence(item.metadata.get("doc", ""))


def _walk(spec: type, path: str, title: str, intro: str, shown: dict[type, str],
          out: list[Section]) -> None:
    """Append ``spec``'s section to ``out``, then the sections of the specs nested in it:
    each spec's keys are listed once, where it is first met; a table met again points there."""
    shown[spec] = title
    hints = typing.get_type_hints(spec)
    rows: list[Row] = []
    nested: list[tuple[dataclasses.Field[Any], type, bool]] = []
    for item in dataclasses.fields(spec):
        core, array = _unwrap(hints[item.name])
        first = _is_spec(core) and core not in shown
        if first:
            nested.append((item, core, array))
            shown[core] = _title(item, core, array, path)
        if not _is_section(core):
            rows.append(_row(item, core, array, None))
        elif not first:
            rows.append(_row(item, core, array, shown[core]))
    out.append(Section(title, intro, spec, tuple(rows)))
    for item, core, array in nested:
        where = f"{path}.{item.name}" if path else item.name
        _walk(core, where if _is_section(core) else "", shown[core],
              _intro(item, core, array), shown, out)


def _array_intro(item: dataclasses.Field[Any]) -> str:
    """An array of tables: what it is and how many it has by default."""
    default = _default(item)
    count = f"{_count(default)}, with the defaults below" if default else "none"
    if any(plain(entry) != _plain_defaults(type(entry)) for entry in default):
        count = f"`{toml_value(plain(default))}`"
    return f"{_sentence(item.metadata.get('doc', ''))} Default: {count}."


def _plain_defaults(spec: type) -> dict[str, Any]:
    """A spec's keys at their defaults as plain data (without building one: a spec's
    defaults need not make a valid one, as a death names no thread or device)."""
    return {f.name: plain(_default(f)) for f in dataclasses.fields(spec)
            if _default(f) is not None}


def sections(root: type = Scenario) -> list[Section]:
    """The reference's sections, in the order a resolved scenario file shows its tables."""
    out: list[Section] = []
    _walk(root, "", "Top level", "", {}, out)
    return out


def _table(section: Section) -> list[str]:
    """The section's heading, introduction and table (none for a table of tables alone)."""
    if not (section.rows or section.intro):
        return []
    lines = [f"## {section.title}", ""]
    if section.intro:
        lines += [section.intro, ""]
    if not section.rows:
        return lines
    lines += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    lines += [f"| `{r.key}` | {r.type} | {_cell(r.default)} | {_cell(r.allowed)} | "
              f"{_cell(r.doc)} |" for r in section.rows]
    return [*lines, ""]


def reference(root: type = Scenario) -> str:
    """The text of ``docs/scenario.md`` (deterministic: it depends on the specs alone)."""
    lines = [_PREAMBLE]
    for section in sections(root):
        lines += _table(section)
    return "\n".join(lines).rstrip("\n") + "\n"
