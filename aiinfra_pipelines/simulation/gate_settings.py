"""The regression gate's statistical settings (``gates.yaml`` ``simulation:``), typed.

How much evidence a verdict gathers (``evidence``: seeds per scenario in stages, and when a
scenario runs its next stage) and the level of each test (``tests``); the pass criteria of an
episode stay mappings read by :mod:`.gate_verdicts`. Read once per gate evaluation, so a
misspelt key fails with the file and key named, not deep inside a test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

GATES_FILE = "gates.yaml"


class GateSettingsError(ValueError):
    """``gates.yaml`` ``simulation:`` is missing a setting or holds an impossible one."""


def _get(section: Mapping[str, Any], path: str) -> Any:
    node: Any = section
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise GateSettingsError(f"{GATES_FILE}: simulation.{path} is not set")
        node = node[part]
    return node


def _level(section: Mapping[str, Any], path: str) -> float:
    value = float(_get(section, path))
    if not 0.0 < value < 1.0:
        raise GateSettingsError(
            f"{GATES_FILE}: simulation.{path} = {value} is not a level in (0, 1)"
        )
    return value


@dataclass(frozen=True)
class EvidencePlan:
    """Seeds per scenario, in cumulative stages, and when a scenario runs the next one.

    Every scenario runs ``seed_stages[0]`` seeds with every engine. It runs the next stage
    only while a test that binds it is in doubt: the candidate was bad on more of the paired
    seeds than the reference, by at least ``continue_z[k]`` (the sign test's standardized
    excess) after stage ``k``. Stopping early is a futility stop only — a scenario is never
    refused before its last stage — so looking more than once never raises the level.
    """

    seed_stages: tuple[int, ...]
    continue_z: tuple[float, ...]

    def __post_init__(self) -> None:
        stages = self.seed_stages
        if not stages or stages[0] < 1 or any(b <= a for a, b in pairwise(stages)):
            raise GateSettingsError(
                f"{GATES_FILE}: simulation.evidence.seed_stages must increase from >= 1: {stages}"
            )
        if len(self.continue_z) != len(stages) - 1:
            raise GateSettingsError(
                f"{GATES_FILE}: simulation.evidence.continue_z needs one threshold per step "
                f"between stages ({len(stages) - 1}), got {list(self.continue_z)}"
            )

    @property
    def first_stage(self) -> int:
        return self.seed_stages[0]

    @property
    def max_seeds(self) -> int:
        return self.seed_stages[-1]

    def next_stage(self, seeds_run: int) -> int | None:
        """The seed count of the stage after ``seeds_run`` seeds (``None`` after the last)."""
        return next((n for n in self.seed_stages if n > seeds_run), None)

    def continue_threshold(self, seeds_run: int) -> float:
        """The sign-test z at or above which a scenario with ``seeds_run`` seeds goes on."""
        completed = [n for n in self.seed_stages if n <= seeds_run]
        return self.continue_z[max(len(completed) - 1, 0)]


@dataclass(frozen=True)
class GateLevels:
    """The level of every test of the regression gate (family-wise where a test is repeated)."""

    scenario_alpha: float  # Holm over every (scenario, reference) test of the library
    library_alpha: float  # at-fault rate over the whole library
    slice_alpha: float  # Bonferroni over the gated slices
    min_slice_scenarios: int
    fix_alpha: float  # a fix is recorded when the candidate is better at this level
    first_release_margin: float  # what perception may add to the oracle's at-fault rate
    first_release_alpha: float
    min_pass_rate: float  # the share of seeds an engine passes a scenario by (status only)


@dataclass(frozen=True)
class SimulationGate:
    """Everything the regression gate decides with, from ``gates.yaml`` ``simulation:``."""

    evidence: EvidencePlan
    levels: GateLevels

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> SimulationGate:
        evidence = EvidencePlan(
            seed_stages=tuple(int(n) for n in _sequence(section, "evidence.seed_stages")),
            continue_z=tuple(float(z) for z in _sequence(section, "evidence.continue_z")),
        )
        levels = GateLevels(
            scenario_alpha=_level(section, "tests.scenario.alpha"),
            library_alpha=_level(section, "tests.library_at_fault.alpha"),
            slice_alpha=_level(section, "tests.slice_at_fault.alpha"),
            min_slice_scenarios=int(_get(section, "tests.slice_at_fault.min_scenarios")),
            fix_alpha=_level(section, "tests.fix_confirmation.alpha"),
            first_release_margin=float(_get(section, "first_release.max_at_fault_increase")),
            first_release_alpha=_level(section, "first_release.alpha"),
            min_pass_rate=float(_get(section, "pass_rate.min_pass_rate")),
        )
        return cls(evidence=evidence, levels=levels)


def _sequence(section: Mapping[str, Any], path: str) -> Sequence[Any]:
    value = _get(section, path)
    if not isinstance(value, list | tuple):
        raise GateSettingsError(f"{GATES_FILE}: simulation.{path} must be a list, got {value!r}")
    return value
