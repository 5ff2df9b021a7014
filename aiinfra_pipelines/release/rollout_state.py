"""The rollout state document as a value: ``release/rollout/<model_version>.json``.

The JSON on the lake is the record of truth (``docs/loop.md``) and older states must keep
loading, so :class:`RolloutState` maps field for field onto today's keys: ``from_json`` reads
any state the dict-based code wrote, ``to_json`` writes the same keys back. The state machine
(``rollout.py``) never mutates a state; each transition returns a new one, which is why the
dataclass is frozen and the history is a tuple.

History entries stay plain JSON objects: they are an append-only log whose fields depend on
the event (``decision``, ``approver``, ``rolled_back_from`` …), read back only by people and
reports, so a class per event would add names without adding checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SHADOW, IN_PROGRESS, AWAITING_APPROVAL = "shadow", "in_progress", "awaiting_approval"
COMPLETED, ROLLED_BACK, SUPERSEDED = "completed", "rolled_back", "superseded"
STATUSES = (SHADOW, IN_PROGRESS, AWAITING_APPROVAL, COMPLETED, ROLLED_BACK, SUPERSEDED)
ACTIVE_STATUSES = (IN_PROGRESS, AWAITING_APPROVAL)
SHADOW_STAGE = "shadow"


class RolloutError(ValueError):
    """A rollout request that cannot be honoured as asked (the message says why)."""


@dataclass(frozen=True)
class Approval:
    """A person's recorded approval of the stage it let the rollout enter."""

    approver: str
    at: str
    stage: str

    def to_json(self) -> dict[str, str]:
        return {"approver": self.approver, "at": self.at, "stage": self.stage}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Approval | None:
        if not data:
            return None
        return cls(str(data["approver"]), str(data["at"]), str(data.get("stage", "")))


@dataclass(frozen=True)
class RolloutState:
    """One candidate's rollout: where it stands, what it replaces, and how it got there.

    ``previous_production_pointer`` is the production pointer captured when the rollout
    started, kept whole so a rollback of a completed release can restore it byte for byte.
    ``supersedes``/``superseded_by`` are only written when set, as the dict code did.
    """

    model_version: str
    engine_sha256: str
    engine_key: str
    model_uri: str
    cohort_salt: str
    production_engine_sha256: str
    stage_index: int = -1
    stage: str = SHADOW_STAGE
    cohort_percent: float = 0.0
    status: str = SHADOW
    history: tuple[dict[str, Any], ...] = ()
    approval: Approval | None = None
    previous_production: str | None = None
    previous_production_pointer: dict[str, Any] | None = None
    shadow: dict[str, Any] = field(default_factory=dict)
    stage_started_telemetry_commit: str | None = None
    last_telemetry_commit: str | None = None
    supersedes: str | None = None
    superseded_by: str | None = None

    @property
    def is_active(self) -> bool:
        """Installed on part of the fleet and still being judged."""
        return self.status in ACTIVE_STATUSES

    @property
    def shadow_passed(self) -> bool:
        return bool(self.shadow.get("passed"))

    @property
    def was_production(self) -> bool:
        """Whether this rollout had made its candidate production (a rollback must restore)."""
        return any(entry.get("event") == "completed" for entry in self.history)

    def last_decision(self) -> dict[str, Any] | None:
        """The newest history entry's decision that judged telemetry (``None``: none yet)."""
        for entry in reversed(self.history):
            decision = entry.get("decision")
            if decision and decision.get("telemetry_commit"):
                return dict(decision)
        return None

    @property
    def last_event(self) -> dict[str, Any]:
        """The newest history entry (``{}`` for a state without history)."""
        return self.history[-1] if self.history else {}

    def check_status(self) -> None:
        """Refuse to act on a state whose status this code does not know (hand-edited JSON)."""
        if self.status not in STATUSES:
            raise RolloutError(f"rollout state has unknown status {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        """The on-lake document: the same keys the dict-based code wrote."""
        data: dict[str, Any] = {
            "model_version": self.model_version,
            "engine_sha256": self.engine_sha256,
            "engine_key": self.engine_key,
            "model_uri": self.model_uri,
            "stage_index": self.stage_index,
            "stage": self.stage,
            "cohort_percent": self.cohort_percent,
            "status": self.status,
            "history": [dict(entry) for entry in self.history],
            "approval": self.approval.to_json() if self.approval else None,
            "previous_production": self.previous_production,
            "previous_production_pointer": (
                dict(self.previous_production_pointer)
                if self.previous_production_pointer is not None
                else None
            ),
            "production_engine_sha256": self.production_engine_sha256,
            "cohort_salt": self.cohort_salt,
            "shadow": dict(self.shadow),
            "stage_started_telemetry_commit": self.stage_started_telemetry_commit,
            "last_telemetry_commit": self.last_telemetry_commit,
        }
        if self.supersedes is not None or self.status != SHADOW:
            data["supersedes"] = self.supersedes
        if self.superseded_by is not None:
            data["superseded_by"] = self.superseded_by
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutState:
        """A state as stored on the lake (any version this project wrote)."""
        pointer = data.get("previous_production_pointer")
        superseded_by = data.get("superseded_by")
        return cls(
            model_version=str(data["model_version"]),
            engine_sha256=str(data["engine_sha256"]),
            engine_key=str(data.get("engine_key", "")),
            model_uri=str(data.get("model_uri") or ""),
            cohort_salt=str(data.get("cohort_salt", "")),
            production_engine_sha256=str(data.get("production_engine_sha256", "")),
            stage_index=int(data.get("stage_index", -1)),
            stage=str(data.get("stage", SHADOW_STAGE)),
            cohort_percent=float(data.get("cohort_percent") or 0.0),
            status=str(data.get("status")),
            history=tuple(dict(entry) for entry in data.get("history") or ()),
            approval=Approval.from_json(data.get("approval")),
            previous_production=_optional_str(data.get("previous_production")),
            previous_production_pointer=dict(pointer) if pointer is not None else None,
            shadow=dict(data.get("shadow") or {}),
            stage_started_telemetry_commit=data.get("stage_started_telemetry_commit"),
            last_telemetry_commit=data.get("last_telemetry_commit"),
            supersedes=_optional_str(data.get("supersedes")),
            superseded_by=_optional_str(superseded_by),
        )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)
