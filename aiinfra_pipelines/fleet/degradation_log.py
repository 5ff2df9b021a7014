"""The car's degradation transitions, as its logs and its trigger filter see them.

The closed loop reports each transition of the degradation state machine with the policy step
it happened at (:attr:`EpisodeMetrics.degradation_transitions`); the fleet records one frame
per step. So a transition's log time is its step's frame time, the state at each frame follows
from the transitions before it (the ``degradation`` trigger fires where it changes), and a
segment's log carries the transitions within its time span, as it carries its triggers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiinfra_pipelines.logs.model import DegradationEvent, Frame
from aiinfra_pipelines.vehicle.degradation import STATE_LEVELS


def frame_levels(transitions: Sequence[Mapping[str, Any]], frame_count: int) -> list[int]:
    """The degradation level (``STATE_LEVELS``; 0 nominal) at each of ``frame_count`` frames."""
    levels = [0] * frame_count
    for transition in sorted(transitions, key=lambda t: int(t["step"])):
        step = int(transition["step"])
        level = STATE_LEVELS[str(transition["to_state"])]
        levels[step:] = [level] * max(frame_count - step, 0)
    return levels


def log_events(
    transitions: Sequence[Mapping[str, Any]], frames: Sequence[Frame]
) -> list[DegradationEvent]:
    """Each transition as a log event at its step's frame time (time order)."""
    return [
        DegradationEvent(
            timestamp_ns=int(frames[int(t["step"])].timestamp_ns),
            from_state=str(t["from_state"]),
            to_state=str(t["to_state"]),
            cause=str(t["cause"]),
            detail=str(t.get("detail", "")),
        )
        for t in sorted(transitions, key=lambda t: int(t["step"]))
    ]


def events_between(
    events: Sequence[DegradationEvent], start_ns: int, end_ns: int
) -> list[DegradationEvent]:
    """The events with ``start_ns <= timestamp <= end_ns`` (the ones a segment's log carries)."""
    return [event for event in events if start_ns <= event.timestamp_ns <= end_ns]
