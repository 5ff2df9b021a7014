"""Gathering a regression report's evidence stage by stage: the sequential plan, executed.

Every scenario of a shard runs the first stage of its seeds with every planner; then, as long
as some scenario's verdict is in doubt (:func:`.gate_evidence.next_request`), those scenarios
run their next stage with the candidate and the references in doubt. Episodes come from an
:class:`EpisodeSource` — the shard's simulator and outcome cache (:mod:`.regression`), or a
table of simulated outcomes in the calibration (:mod:`.calibration`) — so both follow exactly
this procedure. Each stage is scheduled for every open scenario at once, so the simulator
can spread it over its worker processes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .gate_comparison import compare_outcomes
from .gate_evidence import next_request
from .gate_settings import EvidencePlan
from .roles import ROLE_CANDIDATE, ROLE_FIXER, ROLES
from .scenarios import Scenario, scenario_seeds


class EpisodeSource(Protocol):
    """Where episodes come from: ``schedule`` what is needed, ``run`` it, read ``episodes``."""

    def schedule(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> None: ...

    def run(self) -> None: ...

    def episodes(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> list[dict]: ...


@dataclass
class ScenarioEvidence:
    """One scenario's evidence so far: the seeds each role drove (a prefix of the scenario's
    seed sequence) and, where a fix binds it, which version fixed it."""

    scenario: Scenario
    seeds: list[int]  # the scenario's seed sequence up to the plan's last stage
    driven: dict[str, int] = field(default_factory=dict)  # role -> seeds driven
    fixer_version: str | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        return (*ROLES, ROLE_FIXER) if self.fixer_version else ROLES

    def extend(self, source: EpisodeSource, roles: Sequence[str], count: int) -> None:
        for role in roles:
            already = self.driven.get(role, 0)
            if count > already:
                source.schedule(self.scenario, role, self.seeds[already:count])
                self.driven[role] = count

    def row(self, source: EpisodeSource) -> dict[str, Any]:
        """The outcome row the gate reads (every role's episodes in seed order)."""
        s = self.scenario
        row: dict[str, Any] = {
            "scenario_id": s.id,
            "scenario_version": s.version,
            "slice": s.slice,
            "kind": s.kind,
            "road_type": s.road_type,
            "seeds": self.seeds[: self.driven[ROLE_CANDIDATE]],
        }
        for role in self.roles:
            row[role] = source.episodes(s, role, self.seeds[: self.driven[role]])
        if self.fixer_version:
            row["fixer_version"] = self.fixer_version
        return row


def collect_evidence(
    scenarios: Sequence[Scenario],
    plan: EvidencePlan,
    source: EpisodeSource,
    *,
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any],
    production_version: str | None,
    first_release: bool,
    fixers: Mapping[str, str] | None = None,
    on_stage: Callable[[int, list[str]], None] | None = None,
) -> list[ScenarioEvidence]:
    """Drive every scenario through the plan; ``fixers`` maps a scenario id to the version
    whose confirmed fix binds it (that version's engine is the ``fixer`` role there).
    ``on_stage(stage, scenario ids)`` is told before each stage after the first."""
    fixers = fixers or {}
    evidence = [
        ScenarioEvidence(s, scenario_seeds(s, plan.max_seeds), fixer_version=fixers.get(s.id))
        for s in scenarios
    ]
    for item in evidence:
        item.extend(source, item.roles, plan.first_stage)
    source.run()
    open_items = list(evidence)
    while open_items:
        comparisons = compare_outcomes(
            [item.row(source) for item in open_items],
            records,
            gates,
            production_version,
            first_release=first_release,
        )
        by_id = {item.scenario.id: item for item in open_items}
        next_items = []
        for comparison in comparisons:
            stage, roles = next_request(comparison, plan)
            if stage:
                by_id[comparison.scenario_id].extend(source, roles, stage)
                next_items.append(by_id[comparison.scenario_id])
        if next_items and on_stage is not None:
            on_stage(
                max(item.driven[ROLE_CANDIDATE] for item in next_items),
                [item.scenario.id for item in next_items],
            )
        if next_items:
            source.run()
        open_items = next_items
    return evidence
