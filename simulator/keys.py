"""Scenario keys: a spec field's default together with its one-line description.

Each field of the scenario's frozen dataclasses is declared once, with :func:`key`; the
description (and, where the validation states one, the allowed values or range) lives in the
field's ``metadata``, from which ``docs/scenario.md`` is generated
(:mod:`simulator.scenario_reference`). The validation itself stays in each spec's
``__post_init__``; the tests check that what a key declares is what its validation refuses.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["key"]


def key(default: Any, doc: str, *, choices: tuple[str, ...] = (), bounds: str = "") -> Any:
    """A dataclass field with ``default`` and its description.

    ``default`` a dataclass *class* makes a fresh instance of it the default (a nested table);
    ``choices`` are the allowed values of a string key; ``bounds`` its range as the
    validation states it: ``>= a``, ``> a`` or an interval such as ``[0, 1)``.

    Raises:
        ValueError: an empty ``doc`` or one of more than one line.
    """
    if not doc or "\n" in doc:
        raise ValueError(f"doc(={doc!r}) must be one non-empty line.")
    metadata = {"doc": doc, "choices": choices, "bounds": bounds}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
