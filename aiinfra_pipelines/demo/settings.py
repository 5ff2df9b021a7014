"""``resources/demo.yaml``: the demo fleet, its cycles and time limits, and its overlays.

Read once into typed values at the start of ``run_demo`` so a typo in the file stops the demo
before a daemon starts or a car drives, with the key named, rather than cycles later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.config import settings_section

DEMO_CONFIG = "demo.yaml"


@dataclass(frozen=True)
class DemoSettings:
    """The demo's defaults (``run_demo`` arguments override the fleet and time values)."""

    vehicles: int
    episodes: int
    seed: int
    faulty_logs: int
    cycles: int
    timeout_s: int
    settle_s: float
    daemon_restarts: int
    # The drive after the last cycle that lands only telemetry (0 episodes: none).
    closing_episodes: int = 0
    closing_max_rounds: int = 0
    # Trigger proposals: approve them on the operator's behalf (recorded under this name).
    approve_trigger_proposals: bool = False
    trigger_approver: str = ""
    # File name → patch deep-merged into the demo's copy of resources/ (free-form YAML).
    overlays: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DemoSettings:
        demo = settings_section(DEMO_CONFIG, "", config)
        fleet = demo.section("fleet")
        closing = demo.section("closing_drive", {})
        closing_episodes = closing.int("episodes", 0)
        overlays = demo.section("overlays", {})
        proposals = demo.section("trigger_proposals", {})
        approve = proposals.bool("approve", False)
        if approve and not proposals.str("approver").strip():
            raise ValueError("demo.yaml trigger_proposals.approve needs an approver's name")
        return cls(
            vehicles=fleet.int("vehicles"),
            episodes=fleet.int("episodes"),
            seed=fleet.int("seed"),
            faulty_logs=fleet.int("faulty_logs"),
            cycles=demo.int("cycles"),
            timeout_s=demo.int("timeout_s"),
            settle_s=demo.float("settle_s"),
            daemon_restarts=demo.int("daemon_restarts"),
            closing_episodes=closing_episodes,
            closing_max_rounds=closing.int("max_rounds") if closing_episodes > 0 else 0,
            overlays=dict(overlays.values),
            approve_trigger_proposals=approve,
            trigger_approver=proposals.str("approver") if approve else "",
        )
