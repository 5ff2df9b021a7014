"""Data-driven trigger proposals: where the model is weak, ask the fleet for more of it.

Offline evaluation names the weakest slices (lighting × weather × road type) and mining names
badcase clusters (slices where a large share of the indexed frames are badcases). For each
targeted slice this proposes a car-side *condition rule* (``fleet.triggers``, ``kind:
condition``) that keeps every frame the slice's conditions hold on, and writes it twice: as
the rule the car runs and as a scene-query expression (``curation.query``) that names the same
frames in the index. The proposal is the current trigger config plus those rules, under the
next version; a person approves it and the release layer ships it as a signed OTA target.

Expected yield, from the scene index with ``query_frame``: the frames (and segments) of the
slice that the current config kept, per driven hour; and what the new rule is expected to keep.
The index holds only what the cars kept, so the slice's exposure (how long the fleet drove in
it) is estimated from the *duty cycle* of the current condition rule covering it: a rule that
fires once per ``cooldown_s`` and keeps ``pre_s + post_s`` around each firing keeps that share
of the time its condition holds. With no condition rule covering a slice (its frames came from
event rules alone) the exposure is unknown and the estimate is a lower bound, and says so.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml, settings_section
from aiinfra_pipelines.fleet.triggers import (
    CONDITION_FIELDS,
    CONDITION_KIND,
    TRIGGERS_CONFIG_FILE,
    ConditionSpec,
    TriggerConfig,
    TriggerRule,
    condition_of,
)

from .query import query_frame
from .query_parser import parse_query

PROPOSALS_SECTION = "proposals"
# A slice name is ``lighting/weather/road_type`` (ingest.tables.slice_name).
SLICE_FIELDS: tuple[str, str, str] = ("lighting", "weather", "road_type")
_BARE_VALUE = re.compile(r"[A-Za-z0-9_.\-/+]+\Z")
_VERSION = re.compile(r"^(.*?)(\d+)$")


class TriggerProposalError(ValueError):
    """A proposal cannot be made from these inputs (bad slice name, bad settings, ...)."""


@dataclass(frozen=True)
class ProposalSettings:
    """``triggers.yaml`` ``proposals``: what counts as weak, and the proposed rules' window."""

    metric_below: float | None  # None: the worst_k slices whatever their metric
    worst_k: int
    badcase_rate_above: float
    min_lift: float  # a cluster's rate over the fleet-wide badcase rate, at least
    min_badcases: int
    max_rules: int
    pre_s: float
    post_s: float
    cooldown_s: float

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> ProposalSettings:
        """From ``resources/triggers.yaml`` (or ``config``, the whole file)."""
        section = settings_section(TRIGGERS_CONFIG_FILE, PROPOSALS_SECTION, config)
        rule = section.section("rule")
        settings = cls(
            metric_below=(
                None if section.raw("metric_below") is None else section.float("metric_below")
            ),
            worst_k=section.int("worst_k"),
            badcase_rate_above=section.float("badcase_rate_above"),
            min_lift=section.float("min_lift"),
            min_badcases=section.int("min_badcases"),
            max_rules=section.int("max_rules"),
            pre_s=rule.float("pre_s"),
            post_s=rule.float("post_s"),
            cooldown_s=rule.float("cooldown_s"),
        )
        if settings.worst_k < 0 or settings.max_rules < 1 or settings.min_badcases < 1:
            raise TriggerProposalError(
                "triggers.yaml proposals: worst_k must be >= 0, max_rules and min_badcases >= 1"
            )
        if min(settings.pre_s, settings.post_s, settings.cooldown_s) < 0:
            raise TriggerProposalError("triggers.yaml proposals.rule: windows must be >= 0")
        return settings


# ------------------------------------------------------------------------------ what is weak
def weak_slices(
    slice_metric: Mapping[str, float | None], settings: ProposalSettings
) -> list[tuple[str, float]]:
    """The ``worst_k`` lowest slices (below ``metric_below`` when it is set), worst first.

    ``None`` (a slice too small to measure) is not evidence of weakness and is skipped.
    """
    limit = settings.metric_below
    measured = [(name, float(v)) for name, v in slice_metric.items() if v is not None]
    below = sorted((i for i in measured if limit is None or i[1] < limit), key=_by_value)
    return below[: settings.worst_k]


def _by_value(item: tuple[str, float]) -> tuple[float, str]:
    return item[1], item[0]


def badcase_clusters(
    index: pd.DataFrame, badcases: pd.DataFrame, settings: ProposalSettings
) -> pd.DataFrame:
    """Per slice: indexed frames, badcase frames and their rate, for the clusters only.

    A cluster is a slice with at least ``min_badcases`` badcase frames making up at least
    ``badcase_rate_above`` of its indexed frames and at least ``min_lift`` times the rate over
    all slices; highest rate first. The lift matters when the mining engine flags nearly
    everything (model zero, before the first release, marks every frame low-confidence):
    every slice then sits at 100 % and none of them is a cluster worth a trigger.
    """
    columns = ["slice", "frames", "badcases", "badcase_rate", "lift"]
    if index.empty or badcases.empty or "slice" not in badcases:
        return pd.DataFrame(columns=columns)
    frames = index.groupby("slice").size().rename("frames")
    keys = ["log_id", "frame_index"]
    found = badcases.drop_duplicates(keys) if set(keys) <= set(badcases) else badcases
    counts = found.groupby("slice").size().rename("badcases")
    table = pd.concat([frames, counts], axis=1).fillna(0).astype(int)
    table = table[table["frames"] > 0].reset_index(names="slice")
    table["badcase_rate"] = table["badcases"] / table["frames"]
    overall_rate = table["badcases"].sum() / max(int(table["frames"].sum()), 1)
    table["lift"] = table["badcase_rate"] / overall_rate if overall_rate > 0 else 0.0
    clusters = table[
        (table["badcases"] >= settings.min_badcases)
        & (table["badcase_rate"] >= settings.badcase_rate_above)
        & (table["lift"] >= settings.min_lift)
    ]
    return clusters.sort_values(["badcase_rate", "slice"], ascending=[False, True])[
        columns
    ].reset_index(drop=True)


# ------------------------------------------------------------------------------- the rules
def slice_conditions(slice_name: str) -> dict[str, str]:
    """``night/fog/merge`` → ``{lighting: night, weather: fog, road_type: merge}``."""
    parts = slice_name.split("/")
    if len(parts) != len(SLICE_FIELDS) or not all(parts):
        raise TriggerProposalError(
            f"slice {slice_name!r} is not lighting/weather/road_type (e.g. night/fog/merge)"
        )
    return dict(zip(SLICE_FIELDS, parts, strict=True))


def _literal(value: str) -> str:
    return value if _BARE_VALUE.match(value) else '"' + value.replace('"', "") + '"'


def condition_expression(spec: ConditionSpec) -> str:
    """The scene-query expression selecting the frames ``spec`` fires on.

    The same fields (``weather``, ``lighting``, ``road_type``, ``speed_mps``...) are scene
    index columns, so the car's rule and the query agree by construction.
    """
    terms = []
    for name in (f for f in CONDITION_FIELDS if f in spec.when):
        values = sorted(spec.when[name])
        alternatives = [f"{name}={_literal(v)}" for v in values]
        terms.append(alternatives[0] if len(values) == 1 else f"({' OR '.join(alternatives)})")
    for name, (low, high) in sorted(spec.bounds.items()):
        terms += [f"{name}>={low!r}"] if low is not None else []
        terms += [f"{name}<={high!r}"] if high is not None else []
    expression = " AND ".join(terms)
    parse_query(expression)  # a rule the language cannot express is a bug here, not later
    return expression


def rule_name(slice_name: str) -> str:
    """``night/fog/merge`` → ``slice_night_fog_merge`` (a valid YAML key and event name)."""
    return "slice_" + re.sub(r"[^A-Za-z0-9]+", "_", slice_name).strip("_").lower()


def rule_document(slice_name: str, settings: ProposalSettings) -> dict[str, Any]:
    """The ``kind: condition`` rule (as triggers.yaml writes it) keeping ``slice_name``."""
    return {
        "kind": CONDITION_KIND,
        "when": {name: [value] for name, value in slice_conditions(slice_name).items()},
        "pre_s": settings.pre_s,
        "post_s": settings.post_s,
        "cooldown_s": settings.cooldown_s,
    }


def duty_cycle(rule: TriggerRule) -> float:
    """Share of the time its condition holds that a condition rule keeps (1: all of it)."""
    window = rule.pre_s + rule.post_s
    if rule.cooldown_s <= 0 or window >= rule.cooldown_s:
        return 1.0
    return window / rule.cooldown_s


def covers(spec: ConditionSpec, conditions: Mapping[str, str]) -> bool:
    """Whether ``spec`` fires wherever ``conditions`` hold (bounds aside: an upper bound)."""
    return all(conditions.get(name) in accepted for name, accepted in spec.when.items())


# ------------------------------------------------------------------------------ the yield
@dataclass(frozen=True)
class ExpectedYield:
    """What a rule's slice yields now and what it is expected to yield with the rule."""

    driven_hours: float
    index_frames: int  # every indexed frame of the base config version
    kept_frames: int  # of those, the slice's (the rule's expression matches them)
    kept_segments: int
    expected_frames: float
    expected_segments: float
    frames_per_hour: float
    expected_frames_per_hour: float
    segments_per_hour: float
    expected_segments_per_hour: float
    share: float  # of the kept frames, the slice's share
    expected_share: float
    duty_before: float | None  # None: no condition rule covered the slice
    duty_expected: float
    basis: str


DrivenHours = float | Mapping[str, float]


def driven_hours_by_branch(telemetry: pd.DataFrame, frame_rate_hz: float) -> dict[str, float]:
    """Hours driven per upload batch (ingest branch) from published fleet telemetry.

    A car's telemetry counts every frame it drove (kept or not), one per planner step; its
    ``batch_id`` is the ingest branch its logs landed on, the scene index's ``source_branch``.
    """
    if frame_rate_hz <= 0:
        raise TriggerProposalError(f"frame_rate_hz must be > 0, got {frame_rate_hz}")
    if telemetry.empty:
        return {}
    frames = telemetry.groupby("batch_id")["frames"].sum()
    return {str(branch): float(n) / frame_rate_hz / 3600.0 for branch, n in frames.items()}


def hours_of(rows: pd.DataFrame, driven_hours: DrivenHours) -> float:
    """The driven hours behind ``rows``: a number as given, or the sum over the upload batches
    (``source_branch``) the rows came from when given per batch."""
    if not isinstance(driven_hours, Mapping):
        return float(driven_hours)
    branches = set(rows["source_branch"]) if "source_branch" in rows else set()
    return float(sum(driven_hours.get(branch, 0.0) for branch in branches))


def rows_of_version(index: pd.DataFrame, version: str) -> pd.DataFrame:
    """The index rows kept by trigger config ``version`` (all rows if none carry it)."""
    versions = index.get("trigger_config_version")
    if versions is not None and (versions == version).any():
        return index[versions == version]
    return index


def expected_yield(
    index: pd.DataFrame,
    expression: str,
    rule: TriggerRule,
    current: TriggerConfig,
    driven_hours: DrivenHours,
) -> ExpectedYield:
    """The slice's yield under ``current`` (measured on ``index``) and with ``rule`` added.

    ``index``: scene-index rows (index-only rows count: they were kept), narrowed to those
    ``current`` kept; ``driven_hours``: the hours of driving behind them (fleet telemetry),
    a number or hours per upload batch.
    """
    if rule.condition is None:
        raise TriggerProposalError(f"rule {rule.name!r} is not a condition rule")
    rows = rows_of_version(index, current.version)
    hours = hours_of(rows, driven_hours)
    if hours <= 0:
        raise TriggerProposalError(
            f"no driven hours behind the {current.version} data (got {driven_hours!r})"
        )
    matched = query_frame(rows, expression, include_index_only=True).rows if len(rows) else rows
    kept = len(matched)
    segments = int(matched["log_id"].nunique()) if kept else 0
    covering = [
        duty_cycle(r)
        for r in current.rules.values()
        if (spec := condition_of(r)) is not None and covers(spec, _when_values(rule.condition))
    ]
    duty_before = max(covering) if covering else None
    duty_new = duty_cycle(rule)
    if duty_before is None:
        exposure, basis = float(kept), "lower bound: no condition rule covered the slice"
    else:
        exposure, basis = kept / duty_before, f"exposure from duty cycle {duty_before:.2f}"
    expected = max(float(kept), exposure * max(duty_new, duty_before or 0.0))
    added = expected - kept
    total = len(rows)
    expected_segments = segments * expected / kept if kept else 0.0
    return ExpectedYield(
        driven_hours=round(hours, 4),
        index_frames=total,
        kept_frames=kept,
        kept_segments=segments,
        expected_frames=round(expected, 1),
        expected_segments=round(expected_segments, 1),
        frames_per_hour=round(kept / hours, 2),
        expected_frames_per_hour=round(expected / hours, 2),
        segments_per_hour=round(segments / hours, 2),
        expected_segments_per_hour=round(expected_segments / hours, 2),
        share=round(kept / total, 4) if total else 0.0,
        expected_share=round(expected / (total + added), 4) if total + added else 0.0,
        duty_before=duty_before,
        duty_expected=duty_new,
        basis=basis,
    )


def _when_values(spec: ConditionSpec) -> dict[str, str]:
    """A slice's conditions from a rule built for one slice (one value per field)."""
    return {name: next(iter(values)) for name, values in spec.when.items() if len(values) == 1}


# ----------------------------------------------------------------------------- the proposal
@dataclass(frozen=True)
class ProposedRule:
    name: str
    slice: str
    reason: str
    expression: str
    rule: dict[str, Any]
    expected_yield: ExpectedYield


@dataclass(frozen=True)
class TriggerProposal:
    """The next trigger config version: the document cars would load, and why."""

    version: str
    base_version: str
    config: dict[str, Any]
    rules: tuple[ProposedRule, ...]

    def to_document(self) -> dict[str, Any]:
        """JSON-ready: version, base version, the config document and every rule's yield."""
        return {
            "version": self.version,
            "base_version": self.base_version,
            "config": self.config,
            "rules": [asdict(rule) for rule in self.rules],
        }

    def yield_table(self) -> pd.DataFrame:
        """One row per proposed rule: slice, reason, expression and the yield figures."""
        return pd.DataFrame(
            [
                {"rule": r.name, "slice": r.slice, "reason": r.reason, "expression": r.expression}
                | asdict(r.expected_yield)
                for r in self.rules
            ]
        )


def next_version(base: str, existing: Iterable[str] = ()) -> str:
    """``triggers-2`` → ``triggers-3``, past every version in ``existing`` (never reused)."""
    match = _VERSION.match(base)
    if match is None:
        raise TriggerProposalError(f"trigger config version {base!r} does not end in a number")
    prefix, number = match.group(1), int(match.group(2))
    for version in existing:
        other = _VERSION.match(version)
        if other is not None and other.group(1) == prefix:
            number = max(number, int(other.group(2)))
    return f"{prefix}{number + 1}"


def car_document(config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trigger config as shipped to cars: triggers.yaml without the cloud-side sections."""
    document = copy.deepcopy(
        dict(config if config is not None else load_resource_yaml(TRIGGERS_CONFIG_FILE))
    )
    document.pop(PROPOSALS_SECTION, None)
    return document


def _targets(
    slice_metric: Mapping[str, float | None],
    clusters: pd.DataFrame,
    settings: ProposalSettings,
) -> list[tuple[str, str]]:
    """(slice, reason) to target: weak slices first, then badcase clusters, deduplicated."""
    targets: dict[str, str] = {}
    for name, value in weak_slices(slice_metric, settings):
        limit = settings.metric_below
        targets[name] = f"weak slice: metric {value:.3f}" + (
            f" < {limit}" if limit is not None else f" (worst {settings.worst_k})"
        )
    for row in clusters.itertuples():
        targets.setdefault(
            str(row.slice),
            f"badcase cluster: {row.badcases} of {row.frames} frames "
            f"({row.badcase_rate:.1%} >= {settings.badcase_rate_above:.0%}, "
            f"{row.lift:.1f}x the fleet's rate)",
        )
    return list(targets.items())[: settings.max_rules]


def propose_trigger_config(
    current: Mapping[str, Any],
    index: pd.DataFrame,
    slice_metric: Mapping[str, float | None],
    *,
    driven_hours: DrivenHours,
    badcases: pd.DataFrame | None = None,
    existing_versions: Sequence[str] = (),
    settings: ProposalSettings | None = None,
) -> TriggerProposal | None:
    """The next trigger config version targeting the weak slices and badcase clusters.

    ``current``: the config document cars run now (triggers.yaml's, or the last shipped one);
    ``index``: the scene index (index-only rows included); ``slice_metric``: slice → offline
    metric (higher is better); ``existing_versions``: versions already proposed (never reused).
    ``None`` when nothing is weak, or every weak slice already has a rule of its own.
    """
    settings = settings or ProposalSettings.load()
    base = TriggerConfig.load(config=current)
    found = badcases if badcases is not None else pd.DataFrame()
    clusters = badcase_clusters(index, found, settings)
    document = car_document(current)
    proposed: list[ProposedRule] = []
    for slice_name, reason in _targets(slice_metric, clusters, settings):
        name = rule_name(slice_name)
        if name in document.get("rules", {}):
            continue  # the fleet already runs a rule for it
        spec = rule_document(slice_name, settings)
        document.setdefault("rules", {})[name] = spec
        rule = TriggerConfig.load(config=document).rules[name]
        assert rule.condition is not None  # built as a condition rule just above
        expression = condition_expression(rule.condition)
        estimate = expected_yield(index, expression, rule, base, driven_hours)
        proposed.append(ProposedRule(name, slice_name, reason, expression, spec, estimate))
    if not proposed:
        return None
    version = next_version(base.version, existing_versions)
    document["version"] = version
    TriggerConfig.load(config=document)  # what we propose, a car must be able to load
    return TriggerProposal(version, base.version, document, tuple(proposed))


# --------------------------------------------------------------------- the measured change
def dominant_version_by_branch(index: pd.DataFrame) -> dict[str, str]:
    """``source_branch`` → the trigger config version most of its frames carry.

    An upload batch's driven hours belong to the config the cars drove it under. A batch can
    also hold older segments (a pull answered from a car's cache was recorded under the config
    of its day), and counting the batch's hours for their version too would halve that
    version's yield per hour; its frames still count, its hours do not.
    """
    if "source_branch" not in index or index.empty:
        return {}
    counts = index.groupby(["source_branch", "trigger_config_version"]).size()
    counts = counts.sort_values(ascending=False, kind="stable").reset_index()
    first = counts.drop_duplicates("source_branch", keep="first")
    return dict(zip(first["source_branch"], first["trigger_config_version"], strict=True))


def slice_yield_by_version(
    index: pd.DataFrame, slice_name: str, driven_hours: DrivenHours | None = None
) -> pd.DataFrame:
    """Per trigger config version: frames kept, the slice's frames, its share of the kept
    frames and (with ``driven_hours``) its frames per driven hour — how a shipped config
    changed what the fleet collects of the slice it targeted.
    """
    columns = [
        "trigger_config_version",
        "frames",
        "slice_frames",
        "share",
        "driven_hours",
        "slice_frames_per_hour",
    ]
    if index.empty or "trigger_config_version" not in index:
        return pd.DataFrame(columns=columns)
    expression = condition_expression(
        ConditionSpec(when={k: frozenset({v}) for k, v in slice_conditions(slice_name).items()})
    )
    rows = []
    drove_under = dominant_version_by_branch(index)
    for version, group in index.groupby("trigger_config_version", sort=True):
        matched = query_frame(group, expression, include_index_only=True).matched
        hours = 0.0
        if driven_hours is not None:
            driven = group["source_branch"].map(drove_under) == version if drove_under else True
            hours = hours_of(group[driven], driven_hours)
        rows.append(
            {
                "trigger_config_version": str(version),
                "frames": len(group),
                "slice_frames": matched,
                "share": round(matched / len(group), 4),
                "driven_hours": round(hours, 4),
                "slice_frames_per_hour": round(matched / hours, 2) if hours > 0 else None,
            }
        )
    return pd.DataFrame(rows, columns=columns)
