"""Scenario keys: a field's default with its description, allowed values and range."""

import dataclasses

import pytest

from simulator.keys import key


@dataclasses.dataclass(frozen=True)
class _Inner:
    size: int = key(1, "a size", bounds=">= 1")


@dataclasses.dataclass(frozen=True)
class _Outer:
    mode: str = key("a", "a mode", choices=("a", "b"))
    inner: _Inner = key(_Inner, "a nested table")


def test_key_keeps_its_default_and_doc_in_the_field():
    """The default is the field's; description, choices and range are its metadata."""
    mode, inner = dataclasses.fields(_Outer)
    assert (mode.default, dict(mode.metadata)) == (
        "a", {"doc": "a mode", "choices": ("a", "b"), "bounds": ""})
    assert inner.metadata["doc"] == "a nested table"


def test_a_dataclass_default_is_a_fresh_instance():
    """A spec class as the default makes each instance's own default table."""
    assert _Outer().inner == _Inner() and _Outer().inner is not _Outer().inner


@pytest.mark.parametrize("doc", ["", "two\nlines"])
def test_key_needs_one_line_of_doc(doc):
    """An empty or multi-line description is refused where the field is declared."""
    with pytest.raises(ValueError, match="one non-empty line"):
        key(0, doc)
