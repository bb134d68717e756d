"""Keys of older scenario files, moved to where they live now.

Scenario files written before the hardware models had their own tables (``asyngrad
calibrate`` wrote them) kept those models' values among ``[timing]``'s keys
(``convoy_*``, ``*_common``, ``common_ns``, ``*_under_*``, ``write_shared``,
``write_sweep_*``), in ``[run]`` (``read_view``) and in each device (``quantum``,
``slicing``, ``preempt``, ``migrate``, ``slow_factor``, ``slow_ns``, ``fast_ns``).
``upgrade`` moves each value that had an effect into its ``[hardware.*]`` table and drops
those that had none (a zero weight, a factor of 1), so an old file runs as it always did
and resolves to the new layout. Overrides (``--set timing.convoy_join=0.5``) go through the
same map.
"""

from __future__ import annotations

import copy
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["upgrade", "upgrade_device"]

_PHASES = ("read", "grad", "write", "idle")
_LOSSES = ("lost_leader", "lost_joiner", "lost_pairs", "lost_within", "lost_spread")
_CONVOY = ("join", "rest", *_LOSSES, "end_gap", "end_catch_up")
_UNDER = tuple(f"{p}_under_{q}" for p in _PHASES for q in _PHASES[:3])
_SLICES = ("quantum", "slicing", "preempt", "migrate")
_EPISODES = {"slow_factor": "factor", "slow_ns": "slow_ns", "fast_ns": "fast_ns"}
# Every key of [timing] that moved.
_TIMING = ({f"convoy_{name}" for name in _CONVOY} | {f"{p}_common" for p in _PHASES}
           | {"common_ns", "write_shared", "write_sweep_lead", "write_sweep_tail"} | set(_UNDER))


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a scenario's plain tables) with every moved key in its new place; ``data``
    itself is left as it is. Data without old keys comes back as it is.

    A device's own ``[timing]`` replaced the scenario's whole timing, the models' values
    included; the hardware tables of a device replace only the same tables of the scenario.
    So a device whose old timing switched off a model the scenario's switched on gets that
    model's neutral table (zero slowdowns and weights, a factor of 1, no store window)."""
    if not _has_old_keys(data):
        return data
    data = copy.deepcopy(data)
    sweep = _read_view(data.get("run"))
    _move_timing(data, sweep)
    if sweep:
        _hardware(data, "sweeping_reads")
    devices = data.get("devices")
    for i, device in enumerate(devices if isinstance(devices, list) else []):
        if isinstance(device, dict):
            if _move_timing(device, sweep, f"devices.{i}.timing"):
                _neutral(device, data.get("hardware", {}))
            _move_device(device, f"devices.{i}")
    return data


def _read_view(run: Any) -> bool:
    """Whether the old ``run.read_view`` asked for reads that see writes in flight."""
    view = run.pop("read_view", "end") if isinstance(run, dict) else "end"
    if view not in ("end", "sweep"):
        raise ScenarioError("run.read_view", view, "must be one of end, sweep "
                            "(sweep: [hardware.sweeping_reads] now)")
    return view == "sweep"


def upgrade_device(device: dict[str, Any], sweep: bool = False) -> dict[str, Any]:
    """A device's plain table (its ``timing`` among them) with its old keys moved into its
    hardware tables, as ``asyngrad calibrate`` fits them; ``sweep``: reads see the writes in
    flight, so its store window is kept."""
    device = copy.deepcopy(device)
    _move_timing(device, sweep, "devices.timing")
    _move_device(device)
    return device


def _has_old_keys(data: dict[str, Any]) -> bool:
    devices = [d for d in data.get("devices", []) if isinstance(d, dict)]
    return ((isinstance(data.get("run"), dict) and "read_view" in data["run"])
            or any(_old_timing(t) for t in (data, *devices))
            or any((set(_SLICES) | _EPISODES.keys()) & d.keys() for d in devices))


def _old_timing(owner: dict[str, Any]) -> bool:
    timing = owner.get("timing")
    return isinstance(timing, dict) and bool(_TIMING & timing.keys())


def _hardware(owner: dict[str, Any], table: str) -> dict[str, Any]:
    """``owner``'s ``[hardware.<table>]`` (made empty when missing)."""
    hardware = owner.setdefault("hardware", {})
    return hardware.setdefault(table, {})  # type: ignore[no-any-return]


Moved = dict[str, tuple[str, Any]]  # new key → (old key, value)


def _move_timing(owner: dict[str, Any], sweep: bool, where: str = "timing") -> bool:
    """Move the old keys of ``owner``'s ``[timing]`` into its hardware tables; whether it
    had any."""
    if not _old_timing(owner):
        return False
    timing = owner["timing"]
    old = {name: timing.pop(name) for name in list(timing) if name in _TIMING}
    weights = {p: (f"{p}_common", old[f"{p}_common"]) for p in _PHASES if f"{p}_common" in old}
    coupled = any(v for _, v in weights.values())
    if coupled:  # (the old default correlation time was 0: one must be given)
        weights["ns"] = ("common_ns", old.get("common_ns", 0.0))
    under = {name: (name, old[name]) for name in _UNDER if name in old}
    shared = {"factor": ("write_shared", old["write_shared"])} if "write_shared" in old else {}
    window = {new: (f"write_sweep_{new}", old[f"write_sweep_{new}"])
              for new in ("lead", "tail") if f"write_sweep_{new}" in old}
    tables = [*_meetings(old), ("common", weights, coupled),
              ("interference", under, any(v for _, v in under.values())),
              ("shared_lines", shared, bool(shared) and shared["factor"][1] != 1.0),
              ("sweeping_reads", window, sweep)]
    _place(owner, tables, where)
    return True


def _meetings(old: dict[str, Any]) -> list[tuple[str, Moved, bool]]:
    """Convoys when ``convoy_join`` > 0; else writes that pass each other when they lose
    anything (``convoy_lost_leader`` + ``convoy_lost_joiner`` > 0); else neither."""
    given = {name: (f"convoy_{name}", old[f"convoy_{name}"]) for name in _CONVOY
             if f"convoy_{name}" in old}
    value = {name: v for name, (_, v) in given.items()}
    if value.get("join", 0.0) > 0:
        return [("convoys", given, True)]
    losses = {k: v for k, v in given.items() if k in _LOSSES}
    rest = {k: v for k, v in given.items() if k not in _LOSSES and k != "join"}
    lossy = value.get("lost_leader", 0.0) + value.get("lost_joiner", 0.0) > 0
    return [("passing", losses, lossy), ("convoys", rest, False)]


def _place(owner: dict[str, Any], tables: list[tuple[str, Moved, bool]], where: str) -> None:
    """Check each table's moved values as its spec does (naming the old key), and put the
    tables that are on in ``owner``'s hardware."""
    from simulator.scenario.files import spec_from_dict
    from simulator.scenario.hardware import HardwareSpec

    for table, moved, on in tables:
        values = {new: value for new, (_, value) in moved.items()}
        spec = HardwareSpec.__dataclass_fields__[table].type
        try:
            spec_from_dict(_spec_class(spec), values)
        except ScenarioError as err:
            old = moved.get(err.field, (err.field, None))[0]
            raise ScenarioError(f"{where}.{old}", err.value, err.reason) from None
        if on:
            _hardware(owner, table).update(values)


def _spec_class(annotation: Any) -> type:
    """The spec class of a ``HardwareSpec`` field's annotation (``XSpec | None``)."""
    from simulator.scenario import hardware

    name = str(annotation).split("|")[0].strip()
    return getattr(hardware, name)  # type: ignore[no-any-return]


def _neutral(device: dict[str, Any], scenario: dict[str, Any]) -> None:
    """The neutral table of each model the scenario switches on and the device's old timing
    did not."""
    neutral = {"common": {"read": 0.0}, "interference": {}, "shared_lines": {"factor": 1.0}}
    own = device.get("hardware", {})
    for table, values in neutral.items():
        if table in scenario and table not in own:
            _hardware(device, table).update(values)


def _move_device(device: dict[str, Any], where: str = "devices") -> None:
    """A device's time slices (``quantum`` > 0) and speed episodes (``slow_factor`` > 1)."""
    slices = {name: (name, device.pop(name)) for name in _SLICES if name in device}
    sliced = slices.get("quantum", ("quantum", 0))[1] > 0
    if not sliced:
        slices.pop("quantum", None)
    episodes = {new: (old, device.pop(old)) for old, new in _EPISODES.items() if old in device}
    slow = episodes.get("factor", ("slow_factor", 1.0))[1] > 1
    if not slow:
        episodes = {k: v for k, v in episodes.items() if k == "factor"}
    if not sliced:
        for name in ("preempt", "migrate"):
            if slices.get(name, (name, 0))[1]:
                raise ScenarioError(f"{where}.{name}", slices[name][1],
                                    "needs time slices (quantum > 0)")
    _place(device, [("time_slices", slices, sliced), ("episodes", episodes, slow)], where)
