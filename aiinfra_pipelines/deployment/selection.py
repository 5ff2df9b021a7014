"""Which engine a candidate ships: the smallest one that holds every slice budget.

The compression report and the cycle's parity gate choose by the same rule, so the engine
certified is the one the report would pick among the engines the cycle built. Size is the
engine file's bytes (what the car downloads and maps into memory); a tie goes to the faster or,
without timings, the earlier precision in the target's list. The target names the precisions it
may run (deployment.yaml ``targets.<name>.ship_precisions``): a car whose compute budget cannot
carry FP32 leaves it out, and then no engine holding means no release.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SELECTION_RULE = "smallest engine (bytes) that holds every gated slice budget against FP32"


@dataclass(frozen=True)
class EngineOption:
    """One engine the candidate could ship, and whether it holds every slice budget."""

    name: str
    bytes: int
    holds: bool
    failures: Sequence[str] = field(default_factory=tuple)
    # Breaks ties between equal sizes (lower first): p99 latency where it is known.
    tie_break: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "bytes": self.bytes,
            "holds": self.holds,
            "failures": list(self.failures),
        }


def smallest_holding(options: Iterable[EngineOption]) -> str | None:
    """The name of the smallest option that holds every budget, or None when none does."""
    holding = [
        (option.bytes, option.tie_break, index, option) for index, option in enumerate(options)
    ]
    holding = [entry for entry in holding if entry[3].holds]
    if not holding:
        return None
    return min(holding, key=lambda entry: entry[:3])[3].name


def select_engine(
    options: Mapping[str, EngineOption], allowed: Sequence[str]
) -> tuple[str | None, dict[str, Any]]:
    """The engine to ship among those ``allowed``, and the record of how it was chosen.

    Options the target may not run are listed (so the record shows what was left out) but never
    chosen; allowed precisions without an engine (INT8 that could not be made) are named too.
    """
    eligible = [options[name] for name in allowed if name in options]
    choice = smallest_holding(eligible)
    return choice, {
        "rule": SELECTION_RULE,
        "allowed": list(allowed),
        "missing": [name for name in allowed if name not in options],
        "options": [options[name].to_dict() for name in options],
        "choice": choice,
    }


def rejections(selection: Mapping[str, Any]) -> list[str]:
    """Each allowed engine passed over in a :func:`select_engine` record, with its first breach
    (or that it was never built)."""
    reasons = [f"{name}: not built" for name in selection["missing"]]
    for option in selection["options"]:
        if not option["holds"] and option["engine"] in selection["allowed"]:
            reasons.append(f"{option['engine']}: {option['failures'][0]}")
    return reasons
