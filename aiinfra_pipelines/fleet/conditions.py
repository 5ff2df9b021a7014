"""Driving conditions of one episode and the seeded plan that assigns them across a fleet.

The category vocabularies below are the metadata schema (log validation accepts exactly these),
so they are code; the *mix* of conditions a fleet drives is configuration (``conditions:`` in
fleet.yaml).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config

WEATHERS: tuple[str, ...] = ("clear", "rain", "fog")
LIGHTINGS: tuple[str, ...] = ("day", "night")
ROAD_TYPES: tuple[str, ...] = ("highway", "merge", "roundabout", "intersection")

STRATEGY_STRATIFIED = "stratified"
STRATEGY_RANDOM = "random"


@dataclass(frozen=True)
class Conditions:
    """What an episode looks like: the scenario slice its logs belong to."""

    road_type: str
    weather: str
    lighting: str
    city: str

    def __post_init__(self) -> None:
        _check(self.road_type, ROAD_TYPES, "road_type")
        _check(self.weather, WEATHERS, "weather")
        _check(self.lighting, LIGHTINGS, "lighting")


def _check(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {allowed}")


def plan_conditions(
    cities: list[str],
    episodes: int,
    seed: int,
    config: FleetConfig | None = None,
) -> list[list[Conditions]]:
    """Conditions for every ``(vehicle, episode)``: ``plan[vehicle_index][episode_index]``.

    ``cities`` holds each vehicle's home city. With the ``stratified`` strategy road types go
    round-robin over the fleet's episodes and every (weather, lighting) combination appears once
    per cycle in a seeded order, so even a 4-vehicle demo covers every road type, night, rain
    and fog. ``random`` draws each category independently with the configured weights, which is
    what a large fleet's natural mix looks like.
    """
    section = fleet_config(config)["conditions"]
    road_types = list(section["road_types"])
    weather_w = {str(k): float(v) for k, v in section["weather"].items()}
    lighting_w = {str(k): float(v) for k, v in section["lighting"].items()}
    strategy = section["strategy"]
    rng = np.random.default_rng(np.random.SeedSequence([seed, len(cities), episodes]))

    total = len(cities) * episodes
    if strategy == STRATEGY_STRATIFIED:
        combos = list(itertools.product(weather_w, lighting_w))
        slots: list[tuple[str, str]] = []
        while len(slots) < total:
            order = rng.permutation(len(combos))
            slots.extend(combos[i] for i in order)
        draws = [(road_types[k % len(road_types)], *slots[k]) for k in range(total)]
    elif strategy == STRATEGY_RANDOM:
        draws = [
            (
                str(rng.choice(road_types)),
                _weighted(rng, weather_w),
                _weighted(rng, lighting_w),
            )
            for _ in range(total)
        ]
    else:
        raise ValueError(f"unknown conditions strategy {strategy!r}")

    plan: list[list[Conditions]] = []
    for vehicle_index, city in enumerate(cities):
        row = []
        for episode_index in range(episodes):
            road, weather, lighting = draws[vehicle_index * episodes + episode_index]
            row.append(Conditions(road, weather, lighting, city))
        plan.append(row)
    return plan


def _weighted(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.asarray([weights[n] for n in names], dtype=float)
    return str(names[int(rng.choice(len(names), p=p / p.sum()))])
