"""The one exception family the toolkit reports to a user as a single line."""

from __future__ import annotations

from typing import Any

__all__ = ["AsyngradError", "ScenarioError", "SimulationError", "TraceError"]


class AsyngradError(Exception):
    """Base of every error the command line turns into one line and exit code 2."""


class ScenarioError(AsyngradError):
    """A configuration value is invalid; the message names the field and the value."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__(field, value, reason)  # rebuilt from its args: copies and pickles

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.reason}"

    def under(self, prefix: str) -> ScenarioError:
        """The same error with its field placed under ``prefix`` (e.g. ``timing.read``)."""
        return ScenarioError(f"{prefix}.{self.field}" if prefix else self.field,
                             self.value, self.reason)


class TraceError(AsyngradError):
    """A trace file is missing, corrupt or does not fit the scenario it is used with."""


class SimulationError(AsyngradError):
    """The engine reached a state it cannot continue from."""
