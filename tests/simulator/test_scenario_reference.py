"""The scenario reference: generated from the specs, complete, and true to their validation."""

import dataclasses
import math
import re
from pathlib import Path

import pytest

from simulator import scenario
from simulator.distributions import Duration
from simulator.errors import ScenarioError
from simulator.keys import key
from simulator.scenario_reference import Row, reference, sections

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scenario.md"
SPECS = [section.spec for section in sections()]
FIELDS = [(spec, item) for spec in SPECS for item in dataclasses.fields(spec)]
CHOICES = [(s, f) for s, f in FIELDS if f.metadata.get("choices")]
BOUNDS = [(s, f) for s, f in FIELDS if f.metadata.get("bounds")]


def _ids(fields):
    return [f"{spec.__name__}.{item.name}" for spec, item in fields]

# Values other keys need for a probed value to be judged on its own (a real data set for a
# holdout, a pause that ends, one thread that dies).
CONTEXT = {
    (scenario.ProblemSpec, "holdout"): {"name": "logistic", "data": "breast_cancer"},
    (scenario.PauseSpec, "thread"): {"end": 1},
    (scenario.PauseSpec, "start"): {"end": 1},
    (scenario.DeathSpec, "at"): {"thread": 0},
}
_NUMBER = r"(-?\d+(?:\.\d+)?)"
_HALF = re.compile(rf"^(>=|>) {_NUMBER}$")
_INTERVAL = re.compile(rf"^([\[(]){_NUMBER}, {_NUMBER}([\])])$")


def _limits(bounds: str) -> list[tuple[float, bool, int]]:
    """(limit, inclusive, direction into the range) for each end a ``bounds`` text states."""
    if match := _HALF.match(bounds):
        return [(float(match[2]), match[1] == ">=", 1)]
    match = _INTERVAL.match(bounds)
    assert match, f"bounds {bounds!r} is neither '>= a', '> a' nor an interval"
    return [(float(match[2]), match[1] == "[", 1), (float(match[3]), match[4] == "]", -1)]


def _step(value: float, direction: int, integer: bool) -> float:
    return value + direction if integer else math.nextafter(value, direction * math.inf)


def _refused(spec, name, value):
    """The ScenarioError that building ``spec`` with ``name = value`` raises, or None."""
    try:
        spec(**{**CONTEXT.get((spec, name), {}), name: value})
    except ScenarioError as err:
        return err
    return None


def test_docs_scenario_md_is_the_generated_reference():
    """docs/scenario.md is exactly what the specs generate (`asyngrad scenario --reference`)."""
    assert DOCS.read_text() == reference()


def test_every_spec_is_in_the_reference():
    """Every spec dataclass of the scenario module, and durations, has a section."""
    specs = {value for value in vars(scenario).values()
             if isinstance(value, type) and dataclasses.is_dataclass(value)}
    assert specs | {Duration} <= set(SPECS)
    assert len(SPECS) == len(set(SPECS))


@pytest.mark.parametrize(("spec", "item"), FIELDS, ids=_ids(FIELDS))
def test_every_key_has_a_one_line_doc(spec, item):
    """Every field of every spec is declared with a non-empty one-line description."""
    doc = item.metadata.get("doc", "")
    assert doc.strip() and "\n" not in doc


def test_every_key_has_a_row_or_a_section():
    """Each key of a spec is a row of its section, in field order, or a table of its own."""
    found = sections()
    titles = {section.title.strip("`[]").rsplit(".", 1)[-1] for section in found}
    for section in found:
        names = [f.name for f in dataclasses.fields(section.spec)]
        keys = [row.key for row in section.rows]
        assert keys == [name for name in names if name in keys]
        assert set(names) - set(keys) <= titles, section.title


@pytest.mark.parametrize(("spec", "item"), CHOICES, ids=_ids(CHOICES))
def test_choices_are_what_validation_allows(spec, item):
    """A value outside a key's declared choices is refused, naming that key."""
    err = _refused(spec, item.name, "no-such-value")
    assert err is not None and err.field == item.name


@pytest.mark.parametrize(("spec", "item"), BOUNDS, ids=_ids(BOUNDS))
def test_bounds_are_what_validation_allows(spec, item):
    """At each end of a key's declared range, the value just inside is accepted and the one
    just outside refused, naming that key."""
    integer = spec.__dataclass_fields__[item.name].type in ("int", int)
    for limit, inclusive, inward in _limits(item.metadata["bounds"]):
        limit = int(limit) if integer else limit
        inside = limit if inclusive else _step(limit, inward, integer)
        outside = _step(limit, -inward, integer) if inclusive else limit
        assert _refused(spec, item.name, inside) is None, (item.name, inside)
        err = _refused(spec, item.name, outside)
        assert err is not None and err.field == item.name, (item.name, outside)


def test_reference_walks_nested_specs_generically():
    """A spec nested anywhere gets its own section, and one met again points to the first."""

    @dataclasses.dataclass(frozen=True)
    class Inner:
        size: int = key(1, "a size", bounds=">= 1")

    @dataclasses.dataclass(frozen=True)
    class Item:
        mode: str = key("a", "a mode", choices=("a", "b"))

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = key(Inner, "one inner table")
        items: tuple[Item, ...] = key((Item(), Item("b")), "some items")
        more: tuple[Inner, ...] = key((Inner(),), "more inner tables")

    found = sections(Outer)
    assert [s.title for s in found] == ["Top level", "`[inner]`", "`[[items]]`"]
    assert found[0].rows == (Row("more", "array of tables", "1 entry", "the keys of `[inner]`",
                                 "more inner tables"),)
    assert found[2].intro == 'Some items. Default: `[{ mode = "a" }, { mode = "b" }]`.'
    text = reference(Outer)
    assert "| `size` | integer | `1` | `>= 1` | a size |" in text
    assert '| `mode` | string | `"a"` | `"a"`, `"b"` | a mode |' in text


def test_a_table_of_tables_alone_has_no_empty_table():
    """A table whose keys are all tables shows its heading and introduction, no empty table;
    a nameless one with neither shows nothing."""

    @dataclasses.dataclass(frozen=True)
    class Leaf:
        join: float = key(0.0, "a factor", bounds=">= 0")

    @dataclasses.dataclass(frozen=True)
    class Branch:
        leaf: Leaf | None = key(None, "an optional leaf")

    @dataclasses.dataclass(frozen=True)
    class Root:
        branch: Branch = key(Branch, "a branch")

    text = reference(Root)
    assert "Top level" not in text and text.count("| key |") == 1
    assert "## `[branch]`\n\nA branch.\n\n## `[branch.leaf]`\n\nAn optional leaf.\n" in text
