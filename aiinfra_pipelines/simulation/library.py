"""The scenario library: every regression scenario ever defined, versioned, never silently shrunk.

``simulation/scenarios/library.json`` on ``main`` holds one entry per scenario (its definition,
``version``, provenance, when it was added, the ``seeds`` every engine drives it with — a pure
function of its content, :func:`.scenarios.scenario_seeds`) plus the regression record:
``first_failed_by`` — the model version first seen failing it — and ``first_fixed_by`` — the
first version confirmed better on it after that, with that version's engine
(``fixed_engine_sha256``): later candidates are held to its outcomes on the same seeds. A new
library version is the previous one plus new scenarios and revised definitions; a scenario
whose source disappeared (a deleted YAML file) stays, marked ``orphaned``.
:func:`assert_never_dropped` guards every write, so no code path can publish a library that
lost a scenario.

Scenarios map to shards by hashing their id: adding scenarios never moves existing ones, so a
shard's cached work stays on its shard as the library grows.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.statistics.paired import sign_test_p

from .gate_comparison import ScenarioComparison
from .gate_verdicts import FAILED, paired_counts
from .scenarios import Scenario, scenario_seeds

LIBRARY_KEY = "simulation/scenarios/library.json"
LIBRARY_FORMAT = 1
RECORD_FIELDS = (
    "first_failed_by",
    "first_fixed_by",
    "fixed_engine_sha256",
    "fixed_confirmation",
    "last_result",
)


class LibraryError(ValueError):
    """A library write would lose scenarios, or the stored library is unusable."""


@dataclass
class LibraryChange:
    """What one rebuild changed (for asset metadata and the library's history)."""

    added: list[str] = field(default_factory=list)
    revised: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.revised or self.orphaned)


# ------------------------------------------------------------------------------------ shards
def shard_keys(shards: int) -> list[str]:
    """Partition keys ``shard-00``, ``shard-01``, ... (zero-padded so they sort)."""
    width = max(2, len(str(shards - 1)))
    return [f"shard-{index:0{width}d}" for index in range(shards)]


def shard_of(scenario_id: str, shards: int) -> int:
    """The shard a scenario belongs to: a stable hash of its id (never Python's ``hash``)."""
    digest = hashlib.sha256(scenario_id.encode()).hexdigest()
    return int(digest[:8], 16) % shards


def shard_index(shard_key: str, shards: int) -> int:
    keys = shard_keys(shards)
    if shard_key not in keys:
        raise LibraryError(f"unknown shard {shard_key!r}; this deployment has {keys}")
    return keys.index(shard_key)


def scenarios_of_shard(library: Mapping[str, Any], shard_key: str, shards: int) -> list[Scenario]:
    index = shard_index(shard_key, shards)
    return [
        Scenario.from_dict(entry)
        for entry in library["scenarios"]
        if shard_of(entry["id"], shards) == index
    ]


# ---------------------------------------------------------------------------------- building
def empty_library() -> dict[str, Any]:
    return {"format": LIBRARY_FORMAT, "library_version": 0, "scenarios": [], "history": []}


def merge_library(
    previous: Mapping[str, Any] | None,
    scenarios: Sequence[Scenario],
    *,
    built_from: Mapping[str, str],
    seed_count: int = 0,
) -> tuple[dict[str, Any], LibraryChange]:
    """The next library: ``previous`` plus ``scenarios`` (new ids added, changed definitions
    revised with their records kept), every earlier scenario retained; each entry records its
    first ``seed_count`` seeds (the gate's last stage; 0 records none).

    The version number moves only when the scenario set changed; ``built_from`` (lake commit,
    candidate it was refreshed for) is recorded either way.
    """
    library = copy.deepcopy(dict(previous)) if previous else empty_library()
    entries = {entry["id"]: entry for entry in library["scenarios"]}
    incoming = {scenario.id: scenario for scenario in scenarios}
    if len(incoming) != len(scenarios):
        raise LibraryError("duplicate scenario ids in one library build")
    change = LibraryChange()
    next_version = int(library["library_version"]) + 1
    for _, scenario in sorted(incoming.items()):  # in id order
        _merge_scenario(entries, scenario, next_version, change)
    for scenario_id, entry in sorted(entries.items()):
        if scenario_id not in incoming and not entry.get("orphaned"):
            entry["orphaned"] = True  # its source is gone; it stays in the library
            change.orphaned.append(scenario_id)
    if change.changed:
        library["library_version"] = next_version
        library["history"] = [
            *library.get("history", []),
            {
                "library_version": next_version,
                "added": change.added,
                "revised": change.revised,
                "orphaned": change.orphaned,
                **dict(built_from),
            },
        ]
    if seed_count:
        for entry in entries.values():
            entry["seeds"] = scenario_seeds(Scenario.from_dict(entry), seed_count)
    library["scenarios"] = [entries[key] for key in sorted(entries)]
    library["built_from"] = dict(built_from)
    assert_never_dropped(previous, library)
    return library, change


def _merge_scenario(
    entries: dict[str, dict[str, Any]], scenario: Scenario, next_version: int, change: LibraryChange
) -> None:
    """Add a new scenario, revise a changed one (its records kept) or bring an orphan back."""
    entry = entries.get(scenario.id)
    if entry is None:
        entries[scenario.id] = {
            **scenario.to_dict(),
            "added_in": next_version,
            "orphaned": False,
            "revisions": [],
            **dict.fromkeys(RECORD_FIELDS),
        }
        change.added.append(scenario.id)
    elif entry["version"] != scenario.version:
        kept = {k: entry.get(k) for k in (*RECORD_FIELDS, "added_in")}
        revisions = [
            *entry.get("revisions", []),
            {"version": entry["version"], "replaced_in": next_version},
        ]
        entries[scenario.id] = {
            **scenario.to_dict(),
            **kept,
            "orphaned": False,
            "revisions": revisions,
        }
        change.revised.append(scenario.id)
    elif entry.get("orphaned"):
        entry["orphaned"] = False
        change.revised.append(scenario.id)


def assert_never_dropped(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> None:
    """Raise :class:`LibraryError` if ``current`` lacks any scenario of ``previous``."""
    if not previous:
        return
    before = {entry["id"] for entry in previous["scenarios"]}
    after = {entry["id"] for entry in current["scenarios"]}
    lost = sorted(before - after)
    if lost:
        raise LibraryError(
            f"refusing to write a scenario library that drops {len(lost)} scenario(s): {lost}"
        )
    if int(current["library_version"]) < int(previous["library_version"]):
        raise LibraryError(
            f"library version would go back from {previous['library_version']} "
            f"to {current['library_version']}"
        )


def library_ids(library: Mapping[str, Any]) -> list[str]:
    return [entry["id"] for entry in library["scenarios"]]


def records_by_id(library: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["id"]: {k: entry.get(k) for k in RECORD_FIELDS} for entry in library["scenarios"]}


# ---------------------------------------------------------------------------------- records
def fix_confirmation(comparison: ScenarioComparison, alpha: float) -> dict[str, Any] | None:
    """The evidence that the candidate fixed this scenario, or ``None``: it passes the scenario
    by its pass rate, production does not, and the candidate failed on fewer paired seeds than
    production beyond chance (one-sided exact McNemar at ``alpha``)."""
    candidate, production = comparison.candidate_verdict, comparison.production_verdict
    if not candidate.passed or production.passed:
        return None
    counts = paired_counts(candidate, production, FAILED)
    p_value = sign_test_p(counts.better, counts.worse)
    if p_value > alpha:
        return None
    return {**counts.to_dict(), "p_value": p_value, "alpha": alpha}


def record_results(
    library: Mapping[str, Any],
    comparisons: Iterable[ScenarioComparison],
    *,
    candidate_version: str,
    production_version: str,
    candidate_accepted: bool,
    candidate_engine_sha256: str,
    fix_alpha: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The library with first-failed / first-fixed records updated from one regression run.

    Production is the older engine, so its failures are recorded first: a scenario production
    fails is failed by production's version. A fix is recorded only when confirmed
    (:func:`fix_confirmation` at ``fix_alpha``) and the candidate passed the whole gate
    (``candidate_accepted``): a refused model's lucky passes must not bind every later one.
    The record keeps the fixer's engine (``candidate_engine_sha256``) and the evidence, so a
    later candidate is held to the fixer's outcomes on the same seeds, paired. A record, once
    set, is never overwritten (it is "first"). Returns the new library and the record changes.
    """
    updated = copy.deepcopy(dict(library))
    entries = {entry["id"]: entry for entry in updated["scenarios"]}
    changes = []
    for comparison in comparisons:
        entry = entries.get(comparison.scenario_id)
        if entry is None:
            raise LibraryError(
                f"regression result for {comparison.scenario_id!r}, which the library lacks"
            )
        before = (entry.get("first_failed_by"), entry.get("first_fixed_by"))
        if entry.get("first_failed_by") is None:
            if not comparison.production_verdict.passed:
                entry["first_failed_by"] = production_version
            elif not comparison.candidate_verdict.passed:
                entry["first_failed_by"] = candidate_version
        confirmation = fix_confirmation(comparison, fix_alpha)
        if (
            entry.get("first_failed_by") is not None
            and entry.get("first_fixed_by") is None
            and confirmation is not None
            and candidate_accepted
            and entry["first_failed_by"] != candidate_version
        ):
            entry["first_fixed_by"] = candidate_version
            entry["fixed_engine_sha256"] = candidate_engine_sha256
            entry["fixed_confirmation"] = confirmation
        entry["last_result"] = {
            "model_version": candidate_version,
            "passed": comparison.candidate_verdict.passed,
            "status": comparison.status,
        }
        after = (entry.get("first_failed_by"), entry.get("first_fixed_by"))
        if after != before:
            changes.append(
                {
                    "scenario_id": comparison.scenario_id,
                    "first_failed_by": after[0],
                    "first_fixed_by": after[1],
                }
            )
    return updated, changes
