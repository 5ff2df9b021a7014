"""``resources/vehicle.yaml`` → ``outbox``: priority classes, budget, window, parts, cache cap."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

CONFIG_FILE = "vehicle.yaml"


@dataclass(frozen=True)
class PriorityClass:
    name: str
    rank: int  # 0 = most urgent
    rules: frozenset[str]
    ignores_budget: bool
    needs_window: bool
    evictable: bool


@dataclass(frozen=True)
class OutboxSettings:
    classes: tuple[PriorityClass, ...]
    daily_budget_bytes: int
    part_bytes: int
    cache_cap_bytes: int
    version: str = ""
    # The class index records and pull notices travel in (small, and what the platform needs
    # to decide what to pull: no upload window).
    index_record_class: str = ""

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> OutboxSettings:
        """From ``vehicle.yaml`` (or the given mapping); errors name the file and key."""
        config = settings_section(CONFIG_FILE, "", config).values
        section = config.get("outbox")
        if not isinstance(section, Mapping):
            raise KeyError(f"{CONFIG_FILE} has no outbox section")
        classes = []
        seen: set[str] = set()
        for rank, entry in enumerate(section.get("classes") or []):
            rules = frozenset(str(rule) for rule in entry.get("rules") or [])
            if rules & seen:
                raise ValueError(
                    f"{CONFIG_FILE} outbox.classes: rule(s) {sorted(rules & seen)} are in two "
                    "classes"
                )
            seen |= rules
            classes.append(
                PriorityClass(
                    name=str(entry["name"]),
                    rank=rank,
                    rules=rules,
                    ignores_budget=bool(entry.get("ignores_budget", False)),
                    needs_window=bool(entry.get("needs_window", False)),
                    evictable=bool(entry.get("evictable", True)),
                )
            )
        if not classes:
            raise ValueError(f"{CONFIG_FILE} outbox.classes is empty")
        settings = cls(
            classes=tuple(classes),
            daily_budget_bytes=int(section["daily_budget_bytes"]),
            part_bytes=int(section["part_bytes"]),
            cache_cap_bytes=int(section["cache_cap_bytes"]),
            version=str(config.get("version", "")),
            index_record_class=str(section.get("index_record_class", classes[0].name)),
        )
        settings.class_named(settings.index_record_class)  # a typo fails here, not mid-drain
        for key in ("daily_budget_bytes", "part_bytes", "cache_cap_bytes"):
            if getattr(settings, key) <= 0:
                raise ValueError(f"{CONFIG_FILE} outbox.{key} must be positive")
        return settings

    def class_named(self, name: str) -> PriorityClass:
        for priority in self.classes:
            if priority.name == name:
                return priority
        raise KeyError(f"no outbox priority class {name!r}")

    def class_of(self, rules: Iterable[str]) -> PriorityClass:
        """The most urgent class of any of ``rules``; a log no listed rule fired in (uploaded
        on request, say) takes the least urgent class."""
        fired = set(rules)
        for priority in self.classes:
            if priority.rules & fired:
                return priority
        return self.classes[-1]

    @property
    def classified_rules(self) -> frozenset[str]:
        return frozenset().union(*(priority.rules for priority in self.classes))
