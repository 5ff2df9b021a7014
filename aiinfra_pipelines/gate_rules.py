"""Which rules judged a candidate: the effective gate configuration, identified by its hash.

``gates.yaml`` is what a certificate means. Its ``version`` string is a name people give it;
the SHA-256 of the configuration as the gate read it — after the demo's or a test's overlays —
is what identifies it, so every report and certificate records that hash and the calibration
figures the configuration states (the error rates measured through the gate's code), and two
verdicts can be compared only when their hashes agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.lake.encoding import canonical_json

GATES_FILE = "gates.yaml"


@dataclass(frozen=True)
class GateRules:
    """The identity of a gate configuration and the error rates it states."""

    version: str
    sha256: str
    calibration: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gates_version": self.version,
            "gates_sha256": self.sha256,
            "calibration": self.calibration,
        }


def gates_sha256(gates: Mapping[str, Any]) -> str:
    """SHA-256 of a gate configuration's canonical JSON (key order and layout don't count)."""
    return hashlib.sha256(canonical_json(dict(gates))).hexdigest()


def gate_rules(gates: Mapping[str, Any] | None = None) -> GateRules:
    """The rules of ``gates`` (default: the effective ``gates.yaml``)."""
    gates = load_resource_yaml(GATES_FILE) if gates is None else gates
    calibration = {
        section: (gates.get(section) or {}).get("calibration")
        for section in ("simulation", "offline")
        if isinstance(gates.get(section), Mapping) and (gates[section] or {}).get("calibration")
    }
    return GateRules(
        version=str(gates.get("version", "")), sha256=gates_sha256(gates), calibration=calibration
    )
