"""Vehicle-side trigger rules and segment selection (the fleet's upload filter).

A car cannot upload everything it records. It evaluates cheap rules per frame (hard braking,
low time-to-collision, lane changes, near collisions, changes of its degradation state, and
difficult conditions) and uploads only time windows around frames where a rule fired. Rules
and windows are data in ``resources/triggers.yaml``; its ``version`` is stamped into every log
so a dataset can tell which filter produced it.

Besides the built-in rules (each a named evaluator below), a config may declare *condition
rules* (``kind: condition``): any name, a ``when`` mapping of frame conditions (weather,
lighting, road type → accepted values) and optional numeric ``bounds`` on the frame's CAN
signals (``speed_mps: {min: 20}``). The car checks them per frame with plain comparisons — no
query parser on the car — which is how a trigger proposal from the cloud (``curation.
trigger_proposals``) becomes a rule a car can run once it arrives as a signed OTA target.
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
    # Set for a ``kind: condition`` rule: what must hold at a frame for it to fire.
    condition: ConditionSpec | None = None


# Frame conditions a condition rule may test (per episode on the car, per log in the index)
# and the numeric frame signals it may bound; both are scene-index columns of the same name.
CONDITION_FIELDS: tuple[str, ...] = ("lighting", "weather", "road_type")
BOUND_FIELDS: tuple[str, ...] = ("speed_mps", "accel_mps2", "steering_rad", "brake")
CONDITION_KIND = "condition"


@dataclass(frozen=True)
class ConditionSpec:
    """A condition rule's test: every ``when`` field in its accepted values and every bounded
    signal within ``[min, max]`` (either side may be open)."""

    when: Mapping[str, frozenset[str]]
    bounds: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def holds(self, frame: Frame, ctx: FrameContext) -> bool:
        """Whether the condition holds at ``frame`` (conditions from ``ctx``)."""
        for name, accepted in self.when.items():
            if getattr(ctx, name) not in accepted:
                return False
        for name, (low, high) in self.bounds.items():
            value = float(getattr(frame, name))
            if (low is not None and value < low) or (high is not None and value > high):
                return False
        return True


def _parse_condition(name: str, spec: Any) -> ConditionSpec:
    """A ``kind: condition`` rule's ``when``/``bounds``; every mistake is an error naming it."""
    when_raw = spec.raw("when", None)
    if not isinstance(when_raw, Mapping) or not when_raw:
        raise ValueError(f"condition rule {name!r} needs a non-empty `when` mapping")
    when: dict[str, frozenset[str]] = {}
    for key, values in when_raw.items():
        if key not in CONDITION_FIELDS:
            raise ValueError(
                f"condition rule {name!r}: unknown condition {key!r}; "
                f"known: {list(CONDITION_FIELDS)}"
            )
        listed = [values] if isinstance(values, str) else values
        if (
            not isinstance(listed, list | tuple)
            or not listed
            or not all(isinstance(v, str) and v for v in listed)
        ):
            raise ValueError(
                f"condition rule {name!r}: `when.{key}` must be a value or a non-empty list of them"
            )
        when[key] = frozenset(listed)
    bounds_raw = spec.raw("bounds", None) or {}
    if not isinstance(bounds_raw, Mapping):
        raise ValueError(f"condition rule {name!r}: `bounds` must be a mapping")
    bounds = {key: _parse_bound(name, key, value) for key, value in bounds_raw.items()}
    return ConditionSpec(when=when, bounds=bounds)


def _parse_bound(name: str, key: str, value: Any) -> tuple[float | None, float | None]:
    if key not in BOUND_FIELDS:
        raise ValueError(
            f"condition rule {name!r}: cannot bound {key!r}; known signals: {list(BOUND_FIELDS)}"
        )
    if not isinstance(value, Mapping) or not value or set(value) - {"min", "max"}:
        raise ValueError(f"condition rule {name!r}: `bounds.{key}` must be {{min: x, max: y}}")
    sides: list[float | None] = []
    for side in ("min", "max"):
        raw = value.get(side)
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int | float)):
            raise ValueError(f"condition rule {name!r}: `bounds.{key}.{side}` must be a number")
        sides.append(None if raw is None else float(raw))
    low, high = sides
    if low is not None and high is not None and low > high:
        raise ValueError(f"condition rule {name!r}: `bounds.{key}` has min {low} > max {high}")
    return low, high


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
        disable a trigger unnoticed. A ``kind: condition`` rule may have any name that is not a
        built-in rule's; a mapping shipped to the car over OTA loads the same way.
        """
        triggers = settings_section(TRIGGERS_CONFIG_FILE, "", config)
        declared = triggers.section("rules")
        rules: dict[str, TriggerRule] = {}
        for name in declared.values:
            spec = declared.section(name)
            _check_kind(name, spec)  # a typo is an error even in a disabled rule
            if spec.bool("enabled", True):
                rules[name] = _parse_rule(name, spec)
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
    road_type: str = ""  # the episode's road type, for condition rules that name one
    road_edges: Sequence[str] | None = None
    degradation_levels: Sequence[int] | None = None


_RESERVED_KEYS = {"enabled", "pre_s", "post_s", "cooldown_s", "threshold"}
_CONDITION_KEYS = {*_RESERVED_KEYS, "kind", "when", "bounds"}


def _check_kind(name: str, spec: Any) -> None:
    """A built-in rule's name, or ``kind: condition`` under a name of its own."""
    kind = spec.raw("kind", None)
    if kind is None and name not in RULE_EVALUATORS:
        raise ValueError(f"unknown trigger rule {name!r}; known: {sorted(RULE_EVALUATORS)}")
    if kind is not None and kind != CONDITION_KIND:
        raise ValueError(f"trigger rule {name!r}: unknown kind {kind!r}; known: {CONDITION_KIND!r}")
    if kind is not None and name in RULE_EVALUATORS:
        raise ValueError(f"condition rule {name!r} shadows the built-in rule of that name")


def _parse_rule(name: str, spec: Any) -> TriggerRule:
    """One declared rule: a built-in (by name) or a ``kind: condition`` rule."""
    if spec.raw("kind", None) is None:
        threshold = spec.raw("threshold", None)
        return TriggerRule(
            name=name,
            pre_s=spec.float("pre_s"),
            post_s=spec.float("post_s"),
            cooldown_s=spec.float("cooldown_s", 0.0),
            threshold=None if threshold is None else spec.float("threshold"),
            params={k: spec.float(k) for k in spec.values if k not in _RESERVED_KEYS},
        )
    unknown = sorted(set(spec.values) - _CONDITION_KEYS)
    if unknown:
        raise ValueError(f"condition rule {name!r}: unknown key(s) {unknown}")
    rule = TriggerRule(
        name=name,
        pre_s=spec.float("pre_s"),
        post_s=spec.float("post_s"),
        cooldown_s=spec.float("cooldown_s", 0.0),
        condition=_parse_condition(name, spec),
    )
    if min(rule.pre_s, rule.post_s, rule.cooldown_s) < 0:
        raise ValueError(f"condition rule {name!r}: pre_s, post_s and cooldown_s must be >= 0")
    return rule


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


def _condition_rule(
    frames: Sequence[Frame], i: int, rule: TriggerRule, ctx: FrameContext
) -> Signal:
    assert rule.condition is not None  # only condition rules are routed here
    return rule.condition.holds(frames[i], ctx), 1.0


def evaluator_for(rule: TriggerRule) -> Evaluator:
    """The function that evaluates ``rule`` at a frame."""
    return _condition_rule if rule.condition is not None else RULE_EVALUATORS[rule.name]


# The built-in condition rules as condition specs: what proposals compare new rules against.
BUILTIN_CONDITIONS: dict[str, ConditionSpec] = {
    "night": ConditionSpec(when={"lighting": frozenset({"night"})}),
    "rain": ConditionSpec(when={"weather": frozenset({"rain"})}),
    "fog": ConditionSpec(when={"weather": frozenset({"fog"})}),
}


def condition_of(rule: TriggerRule) -> ConditionSpec | None:
    """The frame condition under which ``rule`` fires on its own (None for event rules)."""
    return rule.condition if rule.condition is not None else BUILTIN_CONDITIONS.get(rule.name)


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
            fired, value = evaluator_for(rule)(frames, i, rule, context)
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
