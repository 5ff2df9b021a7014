"""A library of scenarios whose episodes are dice rolls, to measure the gate against noise.

Each scenario has a chance that an episode fails (some at-fault collisions, some other broken
criteria). An engine "of the same quality" rolls the same dice on its own seeds; a regressed
engine rolls worse dice on some scenarios. The shard's procedure is followed: every scenario
runs ``seeds`` episodes per engine, a verdict that would fail the gate runs ``confirm`` more for
both, and the gate judges the pooled episodes. Used by ``test_gate.py`` (the A/A run on
independent seeds) and ``benchmarks/gate_noise.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.gate_comparison import GateResult, compare_outcomes
from aiinfra_pipelines.simulation.gate_scenarios import needs_confirmation

SLICES = [
    f"{light}/{weather}/highway"
    for light in ("day", "night")
    for weather in ("clear", "rain", "fog")
]


@dataclass(frozen=True)
class ScenarioOdds:
    scenario_id: str
    slice: str
    fail: float  # chance an episode fails
    at_fault: float  # chance a failed episode is an at-fault collision (else hard brakes)


def demo_like_library(rng: np.random.Generator, scenarios: int = 60) -> list[ScenarioOdds]:
    """Mostly easy scenarios, a quarter borderline, a fifth hard: the spread of pass rates the
    demo's regression reports show (most scenarios pass every seed, a dozen sit near 2 of 3)."""
    library = []
    for index in range(scenarios):
        draw = rng.random()
        if draw < 0.55:
            fail = 0.03
        elif draw < 0.80:
            fail = float(rng.uniform(0.1, 0.4))
        else:
            fail = float(rng.uniform(0.4, 0.8))
        library.append(ScenarioOdds(f"s{index:03d}", SLICES[index % len(SLICES)], fail, 0.5))
    return library


def regressed(
    library: Sequence[ScenarioOdds], rng: np.random.Generator, scenarios: int, fail: float
) -> list[ScenarioOdds]:
    """The same library where ``scenarios`` of the easy ones now fail at ``fail`` (collisions)."""
    easy = [i for i, odds in enumerate(library) if odds.fail < 0.1]
    broken = set(rng.choice(easy, size=scenarios, replace=False).tolist())
    return [
        replace(odds, fail=fail, at_fault=1.0) if i in broken else odds
        for i, odds in enumerate(library)
    ]


def _episode(rng: np.random.Generator, odds: ScenarioOdds, seed: int) -> dict[str, Any]:
    episode = {
        "collision": False,
        "collision_step": None,
        "min_ttc_s": 3.0,
        "hard_brakes": 0,
        "progress_m": 200.0,
        "duration_s": 8.0,
        "seed": seed,
    }
    if rng.random() < odds.fail:
        if rng.random() < odds.at_fault:
            episode.update(
                collision=True,
                collision_step=40,
                at_fault_collision=True,
                collision_type="active_front",
                min_ttc_s=0.0,
            )
        else:
            episode["hard_brakes"] = 9
    return episode


def _episodes(rng, odds: ScenarioOdds, count: int, first_seed: int) -> list[dict[str, Any]]:
    return [_episode(rng, odds, first_seed + i) for i in range(count)]


def run_gate(
    rng: np.random.Generator,
    production: Sequence[ScenarioOdds],
    candidate: Sequence[ScenarioOdds],
    gates: Mapping[str, Any],
    *,
    seeds: int = 3,
    confirm: int = 6,
) -> GateResult:
    """Both engines on their own seeds, failing verdicts confirmed, then the gate."""
    rows = [
        {
            "scenario_id": prod.scenario_id,
            "slice": prod.slice,
            "kind": "base",
            "road_type": "highway",
            "candidate": _episodes(rng, cand, seeds, 0),
            "production": _episodes(rng, prod, seeds, 0),
        }
        for prod, cand in zip(production, candidate, strict=True)
    ]
    if confirm:
        comparisons = compare_outcomes(rows, {}, gates)
        odds = {p.scenario_id: (p, c) for p, c in zip(production, candidate, strict=True)}
        for row, comparison in zip(
            sorted(rows, key=lambda r: r["scenario_id"]), comparisons, strict=True
        ):
            if needs_confirmation(comparison, gates):
                prod, cand = odds[row["scenario_id"]]
                row["candidate"] += _episodes(rng, cand, confirm, seeds)
                row["production"] += _episodes(rng, prod, confirm, seeds)
    return evaluate_gate(rows, {}, gates)


def certify_rate(
    seed: int,
    trials: int,
    gates: Mapping[str, Any],
    *,
    regression: tuple[int, float] | None = None,
    scenarios: int = 60,
) -> float:
    """Share of ``trials`` the gate certifies: candidate = production's odds (an A/A run on
    independent seeds), or with ``regression`` = (scenarios broken, their fail chance)."""
    rng = np.random.default_rng(seed)
    certified = 0
    for _ in range(trials):
        library = demo_like_library(rng, scenarios)
        candidate = regressed(library, rng, *regression) if regression else library
        certified += run_gate(rng, library, candidate, gates).passed
    return certified / trials
