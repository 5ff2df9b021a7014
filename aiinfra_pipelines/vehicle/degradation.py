"""The car's degradation state machine: when to stop trusting the main model, and for how long.

A planner that falls back frame by frame drives in jerks: one dim frame slows the car, the next
bright one speeds it up again, and an engine that keeps failing is retried forever. So the
runtime judges every frame's health and keeps a state with hysteresis and a timeout:

* ``nominal`` — the main model drives. A frame is *faulty* when the engine raised
  (``engine_error``), its input frame is older than ``max_sensor_age_ms`` (``stale_sensor``),
  inference took longer than ``latency_budget_ms`` (``latency_over_budget``) or its confidence
  is below ``min_confidence`` (``low_confidence``). ``enter_after_frames[cause]`` consecutive
  frames with one cause enter ``degraded``.
* ``degraded`` — the conservative fallback drives (slow down, keep the lane). It returns to
  ``nominal`` after ``recover_after_frames`` consecutive clean frames. A fault still present
  after ``degraded_timeout_s`` in this state escalates to ``minimal_risk`` (an engine that
  flickers between faulty and clean never recovers, so it must not stay here forever).
* ``minimal_risk`` — the minimal-risk manoeuvre: slow to a stop in the lane. Only
  ``minimal_risk_recover_after_frames`` consecutive clean frames (a longer period) end it.

The machine is strict: only the four transitions in :data:`ALLOWED_TRANSITIONS` exist, time
never goes backwards, and every transition is a :class:`Transition` record (time, from, to,
cause, detail) that the car logs and sends home with its telemetry. Pure Python, no simulator:
the same code runs in a car and in the simulated fleet. Numbers come from vehicle.yaml
``degradation`` (:class:`~aiinfra_pipelines.vehicle.degradation_settings.DegradationSettings`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from aiinfra_pipelines.vehicle.degradation_settings import (
    ENGINE_ERROR,
    FAULT_CAUSES,
    LATENCY_OVER_BUDGET,
    LOW_CONFIDENCE,
    STALE_SENSOR,
    DegradationSettings,
)

NOMINAL = "nominal"
DEGRADED = "degraded"
MINIMAL_RISK = "minimal_risk"
STATES: tuple[str, ...] = (NOMINAL, DEGRADED, MINIMAL_RISK)
# How far from nominal each state is (what a trigger or a dashboard plots).
STATE_LEVELS: dict[str, int] = {state: level for level, state in enumerate(STATES)}

# Causes of transitions that no frame fault explains: the degraded timeout ran out, or enough
# clean frames went by.
DEGRADED_TIMEOUT = "degraded_timeout"
RECOVERED = "recovered"
TRANSITION_CAUSES: tuple[str, ...] = (*FAULT_CAUSES, DEGRADED_TIMEOUT, RECOVERED)
ALLOWED_TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {
        (NOMINAL, DEGRADED),
        (DEGRADED, NOMINAL),
        (DEGRADED, MINIMAL_RISK),
        (MINIMAL_RISK, NOMINAL),
    }
)
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DEGRADED",
    "DEGRADED_TIMEOUT",
    "ENGINE_ERROR",
    "FAULT_CAUSES",
    "LATENCY_OVER_BUDGET",
    "LOW_CONFIDENCE",
    "MINIMAL_RISK",
    "NOMINAL",
    "RECOVERED",
    "STALE_SENSOR",
    "STATES",
    "STATE_LEVELS",
    "TRANSITION_CAUSES",
    "DegradationMonitor",
    "DegradationStatus",
    "FrameHealth",
    "Transition",
]


@dataclass(frozen=True)
class FrameHealth:
    """What the runtime knows about one perceived frame when it judges it.

    ``timestamp_ns`` is when the frame is judged (the runtime's clock). ``confidence`` is the
    engine's, ``None`` when it produced nothing; ``engine_error`` says why not. ``latency_ms``
    and ``sensor_timestamp_ns`` (when the camera took the frame) are ``None`` when not measured:
    an unmeasured quantity is not a fault.
    """

    timestamp_ns: int
    confidence: float | None
    engine_error: str | None = None
    latency_ms: float | None = None
    sensor_timestamp_ns: int | None = None


@dataclass(frozen=True)
class Transition:
    """One state change: when, from which state to which, why (a :data:`TRANSITION_CAUSES`
    entry) and the numbers behind it."""

    timestamp_ns: int
    from_state: str
    to_state: str
    cause: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DegradationStatus:
    """The machine after one frame: its state, the cause that put it there (``""`` when
    nominal), this frame's faults, and the transition this frame caused (if any)."""

    state: str
    cause: str
    faults: tuple[str, ...]
    transition: Transition | None = None


@dataclass
class _Counters:
    streaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_CAUSES, 0))
    clean: int = 0


class DegradationMonitor:
    """The state machine; feed it every frame with :meth:`update`, in time order."""

    def __init__(self, settings: DegradationSettings | None = None) -> None:
        self.settings = settings or DegradationSettings.load()
        self.reset()

    def reset(self) -> None:
        """Back to ``nominal`` with no history (a new drive)."""
        self.state = NOMINAL
        self.cause = ""
        self.transitions: list[Transition] = []
        self._counters = _Counters()
        self._entered_ns: int | None = None  # when the current non-nominal state began
        self._last_ns: int | None = None

    def faults(self, health: FrameHealth) -> dict[str, str]:
        """This frame's faults, cause -> the measurement that makes it one (cause order)."""
        s = self.settings
        found: dict[str, str] = {}
        if health.engine_error is not None or health.confidence is None:
            found[ENGINE_ERROR] = health.engine_error or "the engine returned no output"
        if health.sensor_timestamp_ns is not None:
            age_ms = (health.timestamp_ns - health.sensor_timestamp_ns) / NS_PER_MS
            if age_ms > s.max_sensor_age_ms:
                found[STALE_SENSOR] = f"frame {age_ms:.0f} ms old > {s.max_sensor_age_ms:g} ms"
        if health.latency_ms is not None and health.latency_ms > s.latency_budget_ms:
            found[LATENCY_OVER_BUDGET] = (
                f"perception {health.latency_ms:.1f} ms > budget {s.latency_budget_ms:g} ms"
            )
        if health.confidence is not None and health.confidence < s.min_confidence:
            found[LOW_CONFIDENCE] = f"confidence {health.confidence:.3f} < {s.min_confidence:g}"
        return {cause: found[cause] for cause in FAULT_CAUSES if cause in found}

    def update(self, health: FrameHealth) -> DegradationStatus:
        """Judge one frame and move the machine; returns where it stands afterwards."""
        now = int(health.timestamp_ns)
        if self._last_ns is not None and now < self._last_ns:
            raise ValueError(
                f"degradation monitor: time went backwards ({now} ns after {self._last_ns} ns)"
            )
        self._last_ns = now
        faults = self.faults(health)
        counters = self._counters
        for cause in FAULT_CAUSES:
            counters.streaks[cause] = counters.streaks[cause] + 1 if cause in faults else 0
        counters.clean = 0 if faults else counters.clean + 1
        transition = self._step(now, faults)
        return DegradationStatus(self.state, self.cause, tuple(faults), transition)

    def _step(self, now: int, faults: dict[str, str]) -> Transition | None:
        s, counters = self.settings, self._counters
        if self.state == NOMINAL:
            due = [c for c in faults if counters.streaks[c] >= s.enter_after_frames[c]]
            if due:
                cause = due[0]
                frames = counters.streaks[cause]
                return self._move(now, DEGRADED, cause, f"{faults[cause]} ({frames} frame(s))")
        elif self.state == DEGRADED:
            if counters.clean >= s.recover_after_frames:
                return self._move(now, NOMINAL, RECOVERED, f"{counters.clean} clean frames")
            assert self._entered_ns is not None
            degraded_s = (now - self._entered_ns) / NS_PER_S
            if faults and degraded_s >= s.degraded_timeout_s:
                still = "; ".join(faults.values())
                return self._move(
                    now,
                    MINIMAL_RISK,
                    DEGRADED_TIMEOUT,
                    f"degraded for {degraded_s:.1f} s >= {s.degraded_timeout_s:g} s; {still}",
                )
        elif counters.clean >= s.minimal_risk_recover_after_frames:
            return self._move(now, NOMINAL, RECOVERED, f"{counters.clean} clean frames")
        return None

    def _move(self, now: int, to_state: str, cause: str, detail: str) -> Transition:
        if (self.state, to_state) not in ALLOWED_TRANSITIONS:
            raise RuntimeError(f"degradation monitor: no transition {self.state} -> {to_state}")
        transition = Transition(now, self.state, to_state, cause, detail)
        self.transitions.append(transition)
        if to_state == NOMINAL:
            self.cause, self._entered_ns = "", None
        else:
            # A timeout keeps naming the fault that started it all: what the planner reports.
            self.cause = cause if to_state == DEGRADED else self.cause
            self._entered_ns = now
        self.state = to_state
        return transition
