"""Scenarios: frozen, validated dataclasses read from TOML, with ``key=value`` overrides.

* ``specs``: one spec per TOML table ([problem], [run], [timing], [[devices]], ...);
* ``hardware``: the opt-in ``[hardware.*]`` tables;
* ``files``: plain data, TOML files and overrides, and back;
* ``legacy``: keys of older files, moved to where they live now;
* ``base``: the allowed values of keys and the checks every spec shares.
"""

from simulator.errors import ScenarioError
from simulator.scenario.base import (
                                     DATA_SOURCES,
                                     EVEN_SPLIT_PROTOCOLS,
                                     LR_SCHEDULES,
                                     MAX_THREADS,
                                     PHASES,
                                     PLACEMENTS,
                                     PROTOCOLS,
                                     REAL_DATA,
                                     REAL_SHAPES,
                                     SERVER_RULES,
                                     SLICINGS,
                                     SPLITS,
                                     WRITE_MODES,
)
from simulator.scenario.files import (
                                     apply_override,
                                     is_table,
                                     load_scenario,
                                     plain,
                                     scenario_from_dict,
                                     scenario_to_dict,
                                     scenario_to_toml,
                                     spec_from_dict,
                                     toml_value,
                                     with_overrides,
)
from simulator.scenario.hardware import (
                                     CommonSpec,
                                     ConvoySpec,
                                     EpisodeSpec,
                                     HardwareSpec,
                                     InterferenceSpec,
                                     PassingSpec,
                                     SharedLinesSpec,
                                     SweepingReadsSpec,
                                     TimeSliceSpec,
)
from simulator.scenario.legacy import upgrade_device
from simulator.scenario.specs import (
                                     ADMMSpec,
                                     BlockADMMSpec,
                                     DCASGDSpec,
                                     DeathSpec,
                                     DeviceSpec,
                                     InjectSpec,
                                     MetricsSpec,
                                     ParamServerSpec,
                                     PauseSpec,
                                     PipelineSpec,
                                     ProblemSpec,
                                     RunSpec,
                                     SandblasterSpec,
                                     Scenario,
                                     StragglerSpec,
                                     TimingSpec,
)

__all__ = ["DATA_SOURCES", "EVEN_SPLIT_PROTOCOLS", "LR_SCHEDULES", "MAX_THREADS", "PHASES",
           "PLACEMENTS", "PROTOCOLS", "REAL_DATA", "REAL_SHAPES", "SERVER_RULES", "SLICINGS",
           "SPLITS",
           "WRITE_MODES", "ADMMSpec", "BlockADMMSpec", "CommonSpec", "ConvoySpec", "DCASGDSpec",
           "DeathSpec",
           "DeviceSpec", "EpisodeSpec", "HardwareSpec", "InjectSpec", "InterferenceSpec",
           "MetricsSpec", "ParamServerSpec", "PassingSpec", "PauseSpec", "PipelineSpec",
           "ProblemSpec",
           "RunSpec", "SandblasterSpec", "Scenario", "ScenarioError", "SharedLinesSpec",
           "StragglerSpec",
           "SweepingReadsSpec", "TimeSliceSpec", "TimingSpec", "apply_override", "is_table",
           "load_scenario", "plain", "scenario_from_dict", "scenario_to_dict",
           "scenario_to_toml", "spec_from_dict", "toml_value", "upgrade_device",
           "with_overrides"]
