"""Vehicle-side trigger rules and segment selection (the fleet's upload filter).

A car cannot upload everything it records. It evaluates cheap rules per frame (hard braking,
low time-to-collision, lane changes, near collisions, changes of its degradation state, and
difficult conditions) and uploads only time windows around frames where a rule fired. Rules
and windows are data in ``resources/triggers.yaml``; its ``version`` is stamped into every log
so a dataset can tell which filter produced it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.logs.model import Frame, TriggerEvent

TRIGGERS_CONFIG_FILE = "triggers.yaml"
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class TriggerRule:
    """One rule: its threshold (if any), rule-specific parameters and its upload window."""

    name: str
    pre_s: float
    post_s: float
    cooldown_s: float = 0.0
    threshold: float | None = None
    params: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TriggerConfig:
    """The parsed ``triggers.yaml``: enabled rules plus segment shaping."""

    version: str
    rules: Mapping[str, TriggerRule]
    max_segment_s: float
    min_frames: int
    merge_gap_s: float = 0.0

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> TriggerConfig:
        """Parse ``config`` (a triggers.yaml mapping) or the deployed ``resources/triggers.yaml``.

        Unknown rule names are an error, not a silent no-op: a typo in the file must not
        disable a trigger unnoticed.
        """
        triggers = settings_section(TRIGGERS_CONFIG_FILE, "", config)
        declared = triggers.section("rules")
        rules: dict[str, TriggerRule] = {}
        for name in declared.values:
            if name not in RULE_EVALUATORS:
                raise ValueError(f"unknown trigger rule {name!r}; known: {sorted(RULE_EVALUATORS)}")
            spec = declared.section(name)
            if not spec.bool("enabled", True):
                continue
            threshold = spec.raw("threshold", None)
            rules[name] = TriggerRule(
                name=name,
                pre_s=spec.float("pre_s"),
                post_s=spec.float("post_s"),
                cooldown_s=spec.float("cooldown_s", 0.0),
                threshold=None if threshold is None else spec.float("threshold"),
                params={k: spec.float(k) for k in spec.values if k not in _RESERVED_KEYS},
            )
        segments = triggers.section("segments")
        return cls(
            version=triggers.str("version"),
            rules=rules,
            max_segment_s=segments.float("max_segment_s"),
            min_frames=segments.int("min_frames"),
            merge_gap_s=segments.float("merge_gap_s", 0.0),
        )


@dataclass(frozen=True)
class FrameContext:
    """Per-episode facts a rule needs beyond the frames themselves.

    ``crashed[i]`` is the simulator's collision flag; ``road_edges[i]`` names the road piece
    (highway-env lane graph edge) so a lane-index change caused by entering a new road piece
    (e.g. a roundabout ring) is not mistaken for a lane change. Both are optional: a real fleet
    has neither and the rules then rely on the frames alone. ``degradation_levels[i]`` is the
    car's degradation state at frame i (``vehicle.degradation.STATE_LEVELS``: 0 nominal);
    without it the ``degradation`` rule never fires.
    """

    weather: str
    lighting: str
    crashed: Sequence[bool] | None = None
    road_edges: Sequence[str] | None = None
    degradation_levels: Sequence[int] | None = None


_RESERVED_KEYS = {"enabled", "pre_s", "post_s", "cooldown_s", "threshold"}


# --- rule signals: (fired, value) for frame i ---------------------------------------------

Signal = tuple[bool, float]
Evaluator = Callable[[Sequence[Frame], int, TriggerRule, FrameContext], Signal]


def _hard_brake(frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext) -> Signal:
    accel = frames[i].accel_mps2
    return accel < _threshold(rule), accel


def _low_ttc(frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext) -> Signal:
    ttc = time_to_collision(frames[i], rule.params["vehicle_length_m"])
    return ttc < _threshold(rule), ttc


def _lane_change(frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext) -> Signal:
    if i == 0:
        return False, 0.0
    if ctx.road_edges is not None and ctx.road_edges[i] != ctx.road_edges[i - 1]:
        return False, 0.0
    delta = float(frames[i].lane_index - frames[i - 1].lane_index)
    return abs(delta) >= _threshold(rule), delta


def _near_collision(
    frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext
) -> Signal:
    gap = min_bumper_gap(frames[i], rule.params["vehicle_length_m"], rule.params["lateral_m"])
    crashed = bool(ctx.crashed[i]) if ctx.crashed is not None else False
    if crashed:
        return True, min(gap, 0.0)
    return gap < _threshold(rule), gap


def _degradation(frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext) -> Signal:
    """The degradation state changed at this frame (value: the new state's level), so every
    transition the car logs lands in an uploaded segment."""
    levels = ctx.degradation_levels
    if levels is None:
        return False, 0.0
    previous = levels[i - 1] if i > 0 else 0
    return levels[i] != previous, float(levels[i])


def _condition(attribute: str, value: str) -> Evaluator:
    def evaluate(frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext) -> Signal:
        return getattr(ctx, attribute) == value, 1.0

    return evaluate


RULE_EVALUATORS: dict[str, Evaluator] = {
    "hard_brake": _hard_brake,
    "low_ttc": _low_ttc,
    "lane_change": _lane_change,
    "near_collision": _near_collision,
    "degradation": _degradation,
    "night": _condition("lighting", "night"),
    "rain": _condition("weather", "rain"),
    "fog": _condition("weather", "fog"),
}


def _threshold(rule: TriggerRule) -> float:
    if rule.threshold is None:
        raise ValueError(f"trigger rule {rule.name!r} needs a threshold")
    return rule.threshold


def time_to_collision(frame: Frame, vehicle_length_m: float) -> float:
    """Seconds until ego reaches the nearest lead in its lane at current speeds (inf if never).

    Ground-truth ``vx`` is the lead's velocity relative to ego, so a negative ``vx`` closes in.
    """
    leads = [o for o in frame.others if o.lane_offset == 0 and o.x > 0.0]
    if not leads:
        return math.inf
    lead = min(leads, key=lambda o: o.x)
    gap = lead.x - vehicle_length_m
    if gap <= 0.0:
        return 0.0
    closing = -lead.vx
    return gap / closing if closing > 0.0 else math.inf


def min_bumper_gap(frame: Frame, vehicle_length_m: float, lateral_m: float) -> float:
    """Smallest longitudinal bumper gap to a laterally overlapping vehicle (inf if none)."""
    gaps = [abs(o.x) - vehicle_length_m for o in frame.others if abs(o.y) < lateral_m]
    return min(gaps, default=math.inf)


def evaluate_triggers(
    frames: Sequence[Frame], context: FrameContext, config: TriggerConfig
) -> list[TriggerEvent]:
    """Every rule firing over the drive, in time order, respecting each rule's cooldown."""
    events: list[TriggerEvent] = []
    last_fired: dict[str, int] = {}
    for i, frame in enumerate(frames):
        for name, rule in config.rules.items():
            fired, value = RULE_EVALUATORS[name](frames, i, rule, context)
            if not fired:
                continue
            previous = last_fired.get(name)
            cooldown_ns = round(rule.cooldown_s * NS_PER_S)
            if previous is not None and frame.timestamp_ns - previous < cooldown_ns:
                continue
            last_fired[name] = frame.timestamp_ns
            threshold = rule.threshold if rule.threshold is not None else 1.0
            events.append(TriggerEvent(frame.timestamp_ns, name, float(value), threshold))
    return events


def select_segments(
    frames: Sequence[Frame], events: Sequence[TriggerEvent], rules: TriggerConfig
) -> list[tuple[int, int]]:
    """Half-open frame ranges ``[start, end)`` to upload; empty when nothing fired.

    Each event opens its rule's ``[t - pre_s, t + post_s]`` window. Windows are widened to
    ``min_frames`` (a log needs a few frames to be useful), merged where they overlap, touch or
    lie within ``merge_gap_s``, and finally split into near-equal parts no longer than
    ``max_segment_s`` so one long drive never becomes one unbounded upload.
    """
    if not events or not frames:
        return []
    ts = np.asarray([f.timestamp_ns for f in frames], dtype=np.int64)
    n = len(frames)
    if n < rules.min_frames:
        return []
    windows = []
    for event in events:
        rule = rules.rules[event.rule]
        lo = int(np.searchsorted(ts, event.timestamp_ns - round(rule.pre_s * NS_PER_S), "left"))
        hi = int(np.searchsorted(ts, event.timestamp_ns + round(rule.post_s * NS_PER_S), "right"))
        windows.append(_widen(lo, hi, n, rules.min_frames))
    windows.sort()

    merged: list[list[int]] = []
    gap_ns = round(rules.merge_gap_s * NS_PER_S)
    for lo, hi in windows:
        if merged and (lo <= merged[-1][1] or ts[lo] - ts[merged[-1][1] - 1] <= gap_ns):
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])

    max_frames = _max_frames(ts, rules.max_segment_s)
    if max_frames < 2 * rules.min_frames:
        raise ValueError(
            f"max_segment_s={rules.max_segment_s} allows {max_frames} frames, fewer than twice "
            f"min_frames={rules.min_frames}: split segments could fall below min_frames"
        )
    segments: list[tuple[int, int]] = []
    for lo, hi in merged:
        parts = math.ceil((hi - lo) / max_frames)
        bounds = np.linspace(lo, hi, parts + 1).round().astype(int)
        segments.extend((int(a), int(b)) for a, b in itertools.pairwise(bounds))
    return segments


def _widen(lo: int, hi: int, n: int, min_frames: int) -> tuple[int, int]:
    """Grow ``[lo, hi)`` around its centre to at least ``min_frames`` within ``[0, n)``."""
    missing = min_frames - (hi - lo)
    if missing <= 0:
        return lo, hi
    lo = max(0, lo - (missing + 1) // 2)
    hi = min(n, lo + min_frames)
    return max(0, hi - min_frames), hi


def _max_frames(ts: np.ndarray, max_segment_s: float) -> int:
    """How many frames fit in ``max_segment_s`` at the recording's frame period."""
    period = int(np.median(np.diff(ts))) if ts.size > 1 else NS_PER_S
    return round(max_segment_s * NS_PER_S) // max(period, 1) + 1


def events_in(events: Sequence[TriggerEvent], start_ns: int, end_ns: int) -> list[TriggerEvent]:
    """Events with ``start_ns <= timestamp <= end_ns`` (the ones a segment's log carries)."""
    return [e for e in events if start_ns <= e.timestamp_ns <= end_ns]
