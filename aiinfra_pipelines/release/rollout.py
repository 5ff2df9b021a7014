"""Staged rollout: the state machine that widens, holds or rolls back a candidate engine.

One JSON document per candidate, ``release/rollout/<model_version>.json`` on ``main``, is the
record of truth (``docs/loop.md``); ``release/rollout/current.json`` names the rollout the fleet
follows. Statuses::

    shadow ──(shadow passed)──► in_progress ──(stage healthy)──► in_progress (next stage) …
                                   │   ▲                              │
                                   │   └──────(approval)─── awaiting_approval (next stage
                                   │                              │    needs a person)
                                   └──(breach / operator)──► rolled_back ◄──┘
    awaiting_approval ──(approval of the 100 % stage)──► completed ──(operator)──► rolled_back
    in_progress / awaiting_approval ──(a newer release gated against it starts)──► superseded

A stage is judged only on telemetry *published since it began* and only once the candidate
cohort (vehicles running the candidate engine) and the control cohort (vehicles running
production) both have their minimum sample; then every budget from ``gates.yaml`` is checked
and any breach rolls back. Each decision records the telemetry commit it used, and a
decision on the telemetry commit already decided is a no-op: the same telemetry never advances
a rollout twice. Entering a stage at or above ``approval_required_from_percent`` (and always
the 100 % stage) waits for a recorded approval; telemetry keeps being watched while it waits,
so a breach still rolls back.

One rollout widens at a time, with one exception: a newer candidate whose offline and
simulation gates were judged *against the release rolling out* (that release was its
reference, ``release.reference``) has shown itself at least as good as it, so it may take the
fleet over instead of waiting for days of approvals: the older rollout is ``superseded`` (its
cars return to production until the newer canary reaches them) and the newer one starts its
first stage. A candidate gated against anything else still waits.

Everything here is pure (dicts in, dicts out, ``at`` passed in) except the small lake readers
at the bottom; the ``rollout`` asset applies the side effects (production pointer, registry).
"""

from __future__ import annotations

import copy
import io
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, ensure_run_branch, publish_run_branch

from .shadow import psi

ROLLOUT_PREFIX = "release/rollout/"
CURRENT_ROLLOUT_KEY = f"{ROLLOUT_PREFIX}current.json"
# Where the operations layer publishes validated telemetry on main (one Parquet per batch),
# and the commit metadata kind of those publishes. Defined here, by the consumer, because the
# operations layer comes after release and imports it from here.
PUBLISHED_TELEMETRY_PREFIX = "telemetry/records/"
TELEMETRY_COMMIT_KIND = "telemetry"

SHADOW, IN_PROGRESS, AWAITING_APPROVAL = "shadow", "in_progress", "awaiting_approval"
COMPLETED, ROLLED_BACK, SUPERSEDED = "completed", "rolled_back", "superseded"
STATUSES = (SHADOW, IN_PROGRESS, AWAITING_APPROVAL, COMPLETED, ROLLED_BACK, SUPERSEDED)
ACTIVE_STATUSES = (IN_PROGRESS, AWAITING_APPROVAL)
SHADOW_STAGE = "shadow"

# Budgeted metrics and the direction that is worse for the candidate.
INCREASE_IS_WORSE = (
    "collision_rate_per_1k_frames",
    "near_miss_rate_per_1k_frames",
    "fallback_rate",
    "latency_p95_ms",
)
BUDGET_METRICS = (*INCREASE_IS_WORSE, "confidence_mean_drop")

Action = Literal[
    "none", "wait", "start", "advance", "await_approval", "hold", "complete", "rollback"
]


class RolloutError(ValueError):
    """A rollout request that cannot be honoured as asked (the message says why)."""


def rollout_state_key(model_version: str) -> str:
    return f"{ROLLOUT_PREFIX}{model_version}.json"


# ---------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Stage:
    name: str
    percent: float
    min_candidate_frames: int
    min_candidate_vehicles: int


@dataclass(frozen=True)
class RolloutSettings:
    """``gates.yaml`` → ``release.rollout`` (validated: increasing stages ending at 100 %)."""

    stages: tuple[Stage, ...]
    min_control_frames: int
    approval_required_from_percent: float
    budgets: dict[str, float]
    version: str = ""

    def needs_approval(self, stage_index: int) -> bool:
        """Entering this stage needs a person; the 100 % stage always does."""
        percent = self.stages[stage_index].percent
        return percent >= 100.0 or percent >= self.approval_required_from_percent

    @classmethod
    def from_gates(cls, gates: Mapping[str, Any] | None = None) -> RolloutSettings:
        gates = gates if gates is not None else load_resource_yaml("gates.yaml")
        section = (gates.get("release") or {}).get("rollout") or gates.get("rollout")
        if not section:
            raise KeyError("gates.yaml has no release.rollout section (staged rollout settings)")
        stages = tuple(
            Stage(
                name=str(stage["name"]),
                percent=float(stage["percent"]),
                min_candidate_frames=int(stage.get("min_candidate_frames", 0)),
                min_candidate_vehicles=int(stage.get("min_candidate_vehicles", 0)),
            )
            for stage in section["stages"]
        )
        percents = [stage.percent for stage in stages]
        if not stages or percents[-1] != 100.0:
            raise ValueError(f"rollout stages must end at 100 %, got {percents}")
        if any(b <= a for a, b in itertools.pairwise(percents)) or percents[0] <= 0:
            raise ValueError(f"rollout stage percents must increase within (0, 100]: {percents}")
        budgets = {str(k): float(v) for k, v in section["budgets"].items()}
        unknown = sorted(set(budgets) - set(BUDGET_METRICS))
        if unknown:
            raise ValueError(f"unknown rollout budget(s) {unknown}; known: {list(BUDGET_METRICS)}")
        return cls(
            stages=stages,
            min_control_frames=int(section["min_control_frames"]),
            approval_required_from_percent=float(section["approval_required_from_percent"]),
            budgets=budgets,
            version=str(gates.get("version", "")),
        )


# ---------------------------------------------------------------------------- cohort metrics
@dataclass(frozen=True)
class CohortMetrics:
    """One cohort's telemetry over a stage window (rates per 1000 frames, shares per frame)."""

    vehicles: int
    records: int
    frames: int
    collisions: int
    near_misses: int
    fallback_frames: int
    collision_rate_per_1k_frames: float
    near_miss_rate_per_1k_frames: float
    fallback_rate: float
    latency_p95_ms: float
    confidence_mean: float
    confidence_histogram: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cohort_metrics(records: pd.DataFrame) -> CohortMetrics:
    """Aggregate telemetry records (the operations layer's schema) of one cohort.

    Latency is the frame-weighted mean of the vehicles' own p95 (percentiles cannot be merged
    exactly; this is the p95 a typical frame's vehicle saw). Confidence comes from the merged
    histograms, valued at the bin centres.
    """
    if records.empty:
        return CohortMetrics(0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, [])
    frames = int(records["frames"].sum())
    per_1k = 1000.0 / frames if frames else 0.0
    histogram = np.sum(
        np.stack([np.asarray(h, dtype=np.int64) for h in records["confidence_histogram"]]), axis=0
    )
    centres = (np.arange(len(histogram)) + 0.5) / len(histogram)
    weights = records["frames"].to_numpy(dtype=float)
    return CohortMetrics(
        vehicles=int(records["vehicle_pseudonym"].nunique()),
        records=len(records),
        frames=frames,
        collisions=int(records["collisions"].sum()),
        near_misses=int(records["near_misses"].sum()),
        fallback_frames=int(records["fallback_frames"].sum()),
        collision_rate_per_1k_frames=float(records["collisions"].sum() * per_1k),
        near_miss_rate_per_1k_frames=float(records["near_misses"].sum() * per_1k),
        fallback_rate=float(records["fallback_frames"].sum() / frames) if frames else 0.0,
        latency_p95_ms=(
            float(np.average(records["latency_ms_p95"].to_numpy(float), weights=weights))
            if frames
            else 0.0
        ),
        confidence_mean=(
            float(np.sum(histogram * centres) / histogram.sum()) if histogram.sum() else 0.0
        ),
        confidence_histogram=[int(count) for count in histogram],
    )


@dataclass(frozen=True)
class Breach:
    metric: str
    candidate: float
    control: float
    budget: float

    @property
    def message(self) -> str:
        if self.metric == "confidence_mean_drop":
            return (
                f"mean confidence {self.candidate:.3f} vs control {self.control:.3f}: drop "
                f"{self.control - self.candidate:.3f} > budget {self.budget}"
            )
        return (
            f"{self.metric} {self.candidate:.4g} vs control {self.control:.4g}: increase "
            f"{self.candidate - self.control:.4g} > budget {self.budget}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message}


def compare_cohorts(
    candidate: CohortMetrics, control: CohortMetrics, budgets: Mapping[str, float]
) -> list[Breach]:
    """Every budget the candidate cohort exceeds against the control cohort."""
    breaches = []
    for metric, budget in budgets.items():
        if metric == "confidence_mean_drop":
            if control.confidence_mean - candidate.confidence_mean > budget:
                breaches.append(
                    Breach(metric, candidate.confidence_mean, control.confidence_mean, budget)
                )
            continue
        ours, theirs = getattr(candidate, metric), getattr(control, metric)
        if ours - theirs > budget:
            breaches.append(Breach(metric, float(ours), float(theirs), budget))
    return breaches


def confidence_psi(candidate: CohortMetrics, control: CohortMetrics) -> float | None:
    """PSI of the two cohorts' confidence histograms (reported, not gated); None if empty."""
    if not candidate.confidence_histogram or not control.confidence_histogram:
        return None
    if sum(candidate.confidence_histogram) == 0 or sum(control.confidence_histogram) == 0:
        return None
    return psi(np.asarray(control.confidence_histogram), np.asarray(candidate.confidence_histogram))


# -------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Decision:
    """What one rollout evaluation decided, and on which evidence."""

    action: Action
    reason: str
    telemetry_commit: str | None = None
    candidate: CohortMetrics | None = None
    control: CohortMetrics | None = None
    breaches: tuple[Breach, ...] = ()

    @property
    def changed_state(self) -> bool:
        return self.action != "none"

    def as_dict(self) -> dict[str, Any]:
        psi_value = (
            confidence_psi(self.candidate, self.control)
            if self.candidate is not None and self.control is not None
            else None
        )
        return {
            "action": self.action,
            "reason": self.reason,
            "telemetry_commit": self.telemetry_commit,
            "candidate": self.candidate.as_dict() if self.candidate else None,
            "control": self.control.as_dict() if self.control else None,
            "confidence_psi": psi_value,
            "breaches": [breach.as_dict() for breach in self.breaches],
        }


def new_rollout_state(
    model_version: str,
    engine_sha256: str,
    *,
    engine_key: str,
    model_uri: str,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    shadow: Mapping[str, Any],
    at: str,
    run_id: str = "",
) -> dict[str, Any]:
    """The state a certified candidate enters rollout with: ``shadow``, nothing installed.

    ``production`` is the production pointer at this moment (``None`` before the first release,
    when the fleet runs the bootstrap engine whose hash is ``production_engine_sha256``).
    """
    state: dict[str, Any] = {
        "model_version": str(model_version),
        "engine_sha256": engine_sha256,
        "engine_key": engine_key,
        "model_uri": model_uri,
        "stage_index": -1,
        "stage": SHADOW_STAGE,
        "cohort_percent": 0.0,
        "status": SHADOW,
        "history": [],
        "approval": None,
        "previous_production": None,
        "previous_production_pointer": None,
        "production_engine_sha256": production_engine_sha256,
        # Per rollout, so every candidate gets its own canary; derived (not random) so a re-run
        # of shadow for the same engine keeps the same cohorts.
        "cohort_salt": f"rollout-{model_version}-{engine_sha256[:16]}",
        "shadow": dict(shadow),
        "stage_started_telemetry_commit": None,
        "last_telemetry_commit": None,
    }
    _set_previous_production(state, production, production_engine_sha256)
    _record(state, "shadow", at, run_id, reason=_shadow_reason(shadow))
    return state


def refresh_shadow(
    state: Mapping[str, Any],
    shadow: Mapping[str, Any],
    *,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    at: str,
    run_id: str = "",
) -> dict[str, Any]:
    """A re-run of shadow for a candidate still in shadow: new verdict, history kept."""
    if state["status"] != SHADOW:
        raise RolloutError(
            f"rollout of model version {state['model_version']} is {state['status']}; shadow "
            "can only be refreshed before the first stage"
        )
    new = copy.deepcopy(dict(state))
    new["shadow"] = dict(shadow)
    _set_previous_production(new, production, production_engine_sha256)
    _record(new, "shadow", at, run_id, reason=_shadow_reason(shadow))
    return new


def _shadow_reason(shadow: Mapping[str, Any]) -> str:
    if shadow.get("passed"):
        return (
            f"shadow passed on {shadow.get('frames')} frames, decision agreement "
            f"{float(shadow.get('decision_agreement', 0.0)):.1%}"
        )
    return "shadow did not pass: " + "; ".join(shadow.get("reasons") or ["no report"])


def _set_previous_production(
    state: dict[str, Any], production: Mapping[str, Any] | None, engine_sha256: str
) -> None:
    state["previous_production"] = str(production["version"]) if production else None
    state["previous_production_pointer"] = dict(production) if production else None
    state["production_engine_sha256"] = engine_sha256


def _record(
    state: dict[str, Any],
    event: str,
    at: str,
    run_id: str,
    *,
    reason: str = "",
    decision: Decision | None = None,
    **extra: Any,
) -> None:
    entry = {
        "event": event,
        "at": at,
        "stage_index": state["stage_index"],
        "stage": state["stage"],
        "cohort_percent": state["cohort_percent"],
        "status": state["status"],
        "reason": reason,
        "dagster_run_id": run_id,
        **extra,
    }
    if decision is not None:
        entry["decision"] = decision.as_dict()
    state["history"].append(entry)


def _enter_stage(
    state: dict[str, Any], settings: RolloutSettings, index: int, telemetry_commit: str | None
) -> None:
    stage = settings.stages[index]
    state["stage_index"] = index
    state["stage"] = stage.name
    state["cohort_percent"] = stage.percent
    state["status"] = COMPLETED if stage.percent >= 100.0 else IN_PROGRESS
    state["stage_started_telemetry_commit"] = telemetry_commit
    state["last_telemetry_commit"] = telemetry_commit


def _check_state(state: Mapping[str, Any]) -> None:
    if state.get("status") not in STATUSES:
        raise RolloutError(f"rollout state has unknown status {state.get('status')!r}")


def may_supersede(
    model_version: str, active_rollout: str | None, gated_against: str | None
) -> bool:
    """Whether a candidate may take the fleet over from ``active_rollout``: it is newer and
    its gates were judged against that very release (``gated_against``)."""
    return (
        active_rollout is not None
        and gated_against is not None
        and str(gated_against) == str(active_rollout)
        and version_order(model_version) > version_order(active_rollout)
    )


def start_rollout(
    state: Mapping[str, Any],
    settings: RolloutSettings,
    *,
    telemetry_commit: str | None,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    active_rollout: str | None,
    at: str,
    run_id: str = "",
    gated_against: str | None = None,
) -> tuple[dict[str, Any], Decision]:
    """Leave shadow for the first stage (or wait for approval if even that needs a person).

    Refused (``none``) while another rollout is active, unless this candidate was gated
    against that rollout's release (:func:`may_supersede`): then it starts, and the caller
    marks the older rollout with :func:`supersede_rollout` in the same published act. The
    production pointer is captured again here, since production may have changed while the
    candidate sat in shadow. Telemetry published before this moment never counts for the new
    stage.
    """
    _check_state(state)
    if state["status"] != SHADOW:
        return dict(state), Decision("none", f"rollout is {state['status']}, not in shadow")
    if not (state.get("shadow") or {}).get("passed"):
        return dict(state), Decision("none", _shadow_reason(state.get("shadow") or {}))
    version = str(state["model_version"])
    superseding = may_supersede(version, active_rollout, gated_against)
    if active_rollout and active_rollout != version and not superseding:
        gated = f"gated against {gated_against}" if gated_against else "gates' reference unknown"
        return dict(state), Decision(
            "none",
            f"rollout of model version {active_rollout} is active; waiting for it to end "
            f"({gated}, so it cannot supersede it)",
        )
    new = copy.deepcopy(dict(state))
    _set_previous_production(new, production, production_engine_sha256)
    new["last_telemetry_commit"] = telemetry_commit
    new["stage_started_telemetry_commit"] = telemetry_commit
    new["supersedes"] = active_rollout if superseding else None
    takeover = (
        f"; supersedes the rollout of model version {active_rollout}, its gates' reference"
        if superseding
        else ""
    )
    if settings.needs_approval(0):
        new["status"] = AWAITING_APPROVAL
        decision = Decision(
            "await_approval",
            f"stage {settings.stages[0].name} needs approval{takeover}",
            telemetry_commit,
        )
        _record(new, "awaiting_approval", at, run_id, reason=decision.reason)
        return new, decision
    _enter_stage(new, settings, 0, telemetry_commit)
    stage = settings.stages[0]
    decision = Decision(
        "start",
        f"shadow passed; {stage.name} cohort {stage.percent:g} %{takeover}",
        telemetry_commit,
    )
    _record(new, "stage_started", at, run_id, reason=decision.reason)
    return new, decision


def supersede_rollout(
    state: Mapping[str, Any], *, by_version: str, at: str, run_id: str = ""
) -> dict[str, Any]:
    """The older rollout's state once ``by_version`` (gated against it) took the fleet over:
    no cohort any more, history kept; never production, so nothing to restore."""
    _check_state(state)
    if state["status"] not in ACTIVE_STATUSES:
        raise RolloutError(
            f"rollout of model version {state['model_version']} is {state['status']}; only an "
            "active rollout can be superseded"
        )
    new = copy.deepcopy(dict(state))
    was = new["status"]
    new["status"] = SUPERSEDED
    new["cohort_percent"] = 0.0
    new["superseded_by"] = str(by_version)
    _record(
        new,
        "superseded",
        at,
        run_id,
        reason=f"model version {by_version}, gated against this release, started its rollout",
        superseded_from=was,
    )
    return new


PRE_RELEASE_ENGINE_SHA = ""  # what telemetry reports for the stack that predates any engine


def control_mask(state: Mapping[str, Any], engine_sha256: pd.Series) -> pd.Series:
    """Records of the control cohort: the cars running what production is.

    Before the first release no car runs an engine at all — the fleet drives the previous
    stack (the rule planner on its own sensors), whose telemetry carries no engine hash. Model
    zero is production only on paper (mining's engine), so the cars without an engine are the
    control then; afterwards it is the production engine's hash.
    """
    if state.get("previous_production") is None:
        return engine_sha256.isin([state["production_engine_sha256"], PRE_RELEASE_ENGINE_SHA])
    return engine_sha256 == state["production_engine_sha256"]


def evaluate_stage(
    state: Mapping[str, Any],
    settings: RolloutSettings,
    *,
    telemetry_commit: str | None,
    records: pd.DataFrame,
    at: str,
    run_id: str = "",
) -> tuple[dict[str, Any], Decision]:
    """Judge the current stage on ``records``, the telemetry published since it began.

    ``records`` are split by the engine each vehicle actually ran: the candidate engine →
    candidate cohort, the production engine recorded in the state → control (see
    :func:`control_mask`); others (vehicles not yet updated) are ignored.
    """
    _check_state(state)
    if state["status"] not in ACTIVE_STATUSES:
        return dict(state), Decision("none", f"rollout is {state['status']}: nothing to evaluate")
    if telemetry_commit is None:
        return dict(state), Decision("none", "no telemetry on main yet")
    if telemetry_commit == state.get("last_telemetry_commit"):
        return dict(state), Decision(
            "none",
            f"no fresh telemetry: {telemetry_commit[:12]} was already decided on",
            telemetry_commit,
        )
    new = copy.deepcopy(dict(state))
    new["last_telemetry_commit"] = telemetry_commit
    engine = records["engine_sha256"] if not records.empty else pd.Series(dtype=str)
    candidate = cohort_metrics(records[engine == state["engine_sha256"]])
    control = cohort_metrics(records[control_mask(state, engine)])
    stage = settings.stages[new["stage_index"]] if new["stage_index"] >= 0 else None
    short = []
    if stage is not None and candidate.frames < stage.min_candidate_frames:
        short.append(
            f"candidate cohort has {candidate.frames} frames (needs {stage.min_candidate_frames})"
        )
    if stage is not None and candidate.vehicles < stage.min_candidate_vehicles:
        short.append(
            f"candidate cohort has {candidate.vehicles} vehicles (needs "
            f"{stage.min_candidate_vehicles})"
        )
    if control.frames < settings.min_control_frames:
        short.append(
            f"control cohort has {control.frames} frames (needs {settings.min_control_frames})"
        )
    if stage is None or candidate.frames == 0:
        short.append("no telemetry from the candidate engine yet")
    if short:
        decision = Decision(
            "wait", "; ".join(dict.fromkeys(short)), telemetry_commit, candidate, control
        )
        _record(new, "waiting", at, run_id, reason=decision.reason, decision=decision)
        return new, decision
    breaches = tuple(compare_cohorts(candidate, control, settings.budgets))
    if breaches:
        decision = Decision(
            "rollback",
            "telemetry breach: " + "; ".join(b.message for b in breaches),
            telemetry_commit,
            candidate,
            control,
            breaches,
        )
        _roll_back_in_place(new, decision.reason, at, run_id, decision)
        return new, decision
    if new["status"] == AWAITING_APPROVAL:
        decision = Decision(
            "hold",
            "stage healthy; waiting for approval of the next stage",
            telemetry_commit,
            candidate,
            control,
        )
        _record(new, "healthy", at, run_id, reason=decision.reason, decision=decision)
        return new, decision
    following = new["stage_index"] + 1
    if settings.needs_approval(following):
        new["status"] = AWAITING_APPROVAL
        decision = Decision(
            "await_approval",
            f"stage {stage.name} healthy; {settings.stages[following].name} "
            f"({settings.stages[following].percent:g} %) needs a recorded approval",
            telemetry_commit,
            candidate,
            control,
        )
        _record(new, "awaiting_approval", at, run_id, reason=decision.reason, decision=decision)
        return new, decision
    _enter_stage(new, settings, following, telemetry_commit)
    decision = Decision(
        "advance",
        f"stage {stage.name} healthy; {new['stage']} cohort {new['cohort_percent']:g} %",
        telemetry_commit,
        candidate,
        control,
    )
    _record(new, "stage_started", at, run_id, reason=decision.reason, decision=decision)
    return new, decision


def approve_next_stage(
    state: Mapping[str, Any],
    settings: RolloutSettings,
    *,
    approver: str,
    telemetry_commit: str | None,
    at: str,
    run_id: str = "",
) -> tuple[dict[str, Any], Decision]:
    """Record a person's approval and enter the stage that was waiting for it.

    Only an ``awaiting_approval`` rollout can be approved (an approval given early is refused,
    not kept for later); approving the 100 % stage completes the rollout. Repeating the same
    approval after it took effect changes nothing.
    """
    _check_state(state)
    approver = approver.strip()
    if not approver:
        raise RolloutError("an approval needs the approver's name")
    if state["status"] == COMPLETED and (state.get("approval") or {}).get("approver") == approver:
        return dict(state), Decision("none", f"already approved by {approver} and completed")
    if state["status"] != AWAITING_APPROVAL:
        raise RolloutError(
            f"rollout of model version {state['model_version']} is {state['status']} at stage "
            f"{state['stage']}; an approval is only accepted while awaiting_approval"
        )
    new = copy.deepcopy(dict(state))
    following = new["stage_index"] + 1
    _enter_stage(new, settings, following, telemetry_commit)
    new["approval"] = {"approver": approver, "at": at, "stage": new["stage"]}
    action: Action = "complete" if new["status"] == COMPLETED else "advance"
    decision = Decision(
        action,
        f"approved by {approver}: {new['stage']} cohort {new['cohort_percent']:g} %",
        telemetry_commit,
    )
    _record(new, "approved", at, run_id, reason=decision.reason, approver=approver)
    if action == "complete":
        _record(
            new,
            "completed",
            at,
            run_id,
            reason=f"model version {new['model_version']} is production on the whole fleet",
        )
    return new, decision


def _roll_back_in_place(
    state: dict[str, Any], reason: str, at: str, run_id: str, decision: Decision | None
) -> None:
    was = state["status"]
    state["status"] = ROLLED_BACK
    state["cohort_percent"] = 0.0
    _record(
        state,
        "rolled_back",
        at,
        run_id,
        reason=reason,
        decision=decision,
        rolled_back_from=was,
        restored_production=state.get("previous_production"),
    )


def roll_back(
    state: Mapping[str, Any], *, reason: str, at: str, run_id: str = ""
) -> tuple[dict[str, Any], Decision]:
    """An operator's rollback (any status but ``rolled_back``), recorded with its reason."""
    _check_state(state)
    if not reason.strip():
        raise RolloutError("a rollback needs a reason")
    if state["status"] == ROLLED_BACK:
        return dict(state), Decision("none", "already rolled back")
    new = copy.deepcopy(dict(state))
    decision = Decision("rollback", f"operator rollback: {reason.strip()}")
    _roll_back_in_place(new, decision.reason, at, run_id, decision)
    return new, decision


def was_production(state: Mapping[str, Any]) -> bool:
    """Whether this rollout had made its candidate production (a rollback must restore)."""
    return any(entry.get("event") == "completed" for entry in state.get("history", []))


def production_pointer(manifest: Mapping[str, Any], commit: str) -> dict[str, Any]:
    """The ``release/production.json`` document for a candidate manifest (docs/loop.md)."""
    ship = manifest["ship"]
    return {
        "version": str(manifest["model_version"]),
        "onnx_key": str(ship["key"]),
        "engine_sha256": str(ship["sha256"]),
        "commit": commit,
        "model_uri": str(manifest.get("model_uri") or ""),
    }


# ---------------------------------------------------------------------- telemetry on the lake
@dataclass(frozen=True)
class TelemetryPublish:
    """One merge into main that published (or re-published) a telemetry batch."""

    commit: str
    batch_id: str
    records_key: str


def telemetry_history_scan() -> int:
    return int(load_resource_yaml("operations.yaml")["telemetry"]["history_scan_commits"])


def telemetry_publishes(
    lake: VersionedLake, since_commit: str | None = None, limit: int | None = None
) -> list[TelemetryPublish]:
    """Telemetry publishes on main newer than ``since_commit``, newest first (merges only).

    ``since_commit`` is itself a telemetry publish (a merge on main's first-parent line), so
    the log walk stops exactly there. The walk covers at most the configured number of commits.
    """
    found: list[TelemetryPublish] = []
    for commit in lake.log(MAIN_BRANCH, limit=telemetry_history_scan(), stop_at=since_commit):
        if len(commit.parents) != 2 or commit.metadata.get("kind") != TELEMETRY_COMMIT_KIND:
            continue
        found.append(
            TelemetryPublish(
                commit=commit.id,
                batch_id=commit.metadata.get("batch_id", ""),
                records_key=commit.metadata.get("records_key", ""),
            )
        )
        if limit is not None and len(found) >= limit:
            break
    return found


def latest_telemetry_commit(lake: VersionedLake) -> str | None:
    """The newest telemetry publish on main: the identity of "the telemetry we have now"."""
    publishes = telemetry_publishes(lake, limit=1)
    return publishes[0].commit if publishes else None


def _read_parquet(lake: VersionedLake, ref: str, key: str) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(lake.get_object(ref, key)))


def telemetry_since(lake: VersionedLake, since_commit: str | None) -> pd.DataFrame:
    """Telemetry records published after ``since_commit`` (all of it when ``None``).

    A batch re-published inside the window counts once (its newest publish), minus the records
    it already held at ``since_commit``: only telemetry new to the window counts.
    """
    tables = []
    seen_batches: set[str] = set()
    for publish in telemetry_publishes(lake, since_commit):
        if publish.records_key in seen_batches or not publish.records_key:
            continue
        seen_batches.add(publish.records_key)
        if not lake.object_exists(publish.commit, publish.records_key):
            continue
        table = _read_parquet(lake, publish.commit, publish.records_key)
        if since_commit and lake.object_exists(since_commit, publish.records_key):
            before = _read_parquet(lake, since_commit, publish.records_key)
            table = table[~table["record_id"].isin(set(before["record_id"]))]
        tables.append(table)
    if not tables:
        return pd.DataFrame()
    return pd.concat(tables, ignore_index=True).drop_duplicates("record_id", keep="first")


# --------------------------------------------------------------------------- state on the lake
def read_state(lake: VersionedLake, model_version: str, ref: str = MAIN_BRANCH) -> dict | None:
    key = rollout_state_key(model_version)
    return lake.get_json(ref, key) if lake.object_exists(ref, key) else None


def read_current(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict | None:
    """The rollout the fleet follows (``current.json``'s state), or ``None``."""
    if not lake.object_exists(ref, CURRENT_ROLLOUT_KEY):
        return None
    return read_state(lake, str(lake.get_json(ref, CURRENT_ROLLOUT_KEY)["model_version"]), ref)


def list_states(lake: VersionedLake, ref: str = MAIN_BRANCH) -> list[dict]:
    """Every rollout state on ``ref`` (``current.json`` excluded), by model version."""
    states = [
        lake.get_json(ref, stat.key)
        for stat in lake.list_objects(ref, prefix=ROLLOUT_PREFIX)
        if stat.key.endswith(".json") and stat.key != CURRENT_ROLLOUT_KEY
    ]
    return sorted(states, key=lambda s: version_order(s["model_version"]))


def version_order(model_version: str) -> tuple[int, str]:
    """Sort key for registry versions ("2" < "10"), tolerant of non-numeric ids."""
    text = str(model_version)
    return (int(text), text) if text.isdigit() else (-1, text)


def active_rollout(states: Sequence[Mapping[str, Any]]) -> str | None:
    """The model version whose rollout is installed on part of the fleet, if any."""
    active = [s for s in states if s.get("status") in ACTIVE_STATUSES]
    return str(active[-1]["model_version"]) if active else None


def publish_changes(
    lake: VersionedLake,
    root_run_id: str,
    puts: Mapping[str, bytes],
    deletes: Sequence[str],
    message: str,
    metadata: dict[str, str],
) -> str:
    """``publish_objects`` that may also delete keys: one run-branch commit, one merge to main.

    A rollback of a completed first release must *remove* ``release/production.json`` (the
    fleet falls back to the bootstrap engine), in the same published act as the state change.
    """
    branch = ensure_run_branch(lake, root_run_id)
    for key, data in puts.items():
        lake.put_object(branch, key, data)
    for key in deletes:
        if lake.object_exists(branch, key):
            lake.delete_object(branch, key)
    lake.commit(branch, message, metadata, allow_empty=True)
    return publish_run_branch(lake, root_run_id, message, metadata)
