"""Access to the configuration under ``resources/``.

Thresholds, trigger rules and environment settings are data, not code: every module reads them
through this one loader so an operator can change a gate without touching Python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resources_dir() -> Path:
    """The configuration folder; ``AIINFRA_RESOURCES`` overrides it (tests, deployments)."""
    return Path(os.environ.get("AIINFRA_RESOURCES", PROJECT_ROOT / "resources"))


def dagster_home() -> Path:
    """``DAGSTER_HOME``, defaulting to the repository's ``dagster_home/``."""
    return Path(os.environ.get("DAGSTER_HOME", PROJECT_ROOT / "dagster_home"))


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime: float) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        loaded = yaml.safe_load(handle) or {}
    if not isinstance(loaded, dict):
        raise ValueError(
            f"{path}: expected a mapping at the top level, got {type(loaded).__name__}"
        )
    return loaded


def load_resource_yaml(relative_path: str) -> dict[str, Any]:
    """Load ``resources/<relative_path>`` as a mapping, with a clear error when it is missing."""
    path = resources_dir() / relative_path
    if not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    return _load_cached(str(path), path.stat().st_mtime)


# -- typed settings sections -------------------------------------------------------------------
#
# Every settings class is a frozen dataclass with ``load(cls, config=None)`` that reads its
# section through ``settings_section``: ``config`` (the whole file as a mapping, for tests)
# replaces reading the file, and a missing key or a value of the wrong type fails at load time
# with the file and the dotted key in the message, not later as a bare KeyError deep in a run.

_MISSING: Any = object()
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


class SettingsError(KeyError, ValueError):
    """A setting is missing or has the wrong type; the message names the file and the key.

    A ``KeyError`` (what a raw dict read raised) and a ``ValueError`` (what a bad value
    raised), so callers that caught either keep working.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Section:
    """One mapping of a settings file, with getters that validate and coerce its values.

    ``file`` is the file name under ``resources/`` and ``path`` the dotted key of this section
    (``""`` for the whole file): both only serve error messages.
    """

    file: str
    path: str
    values: Mapping[str, Any]

    def _key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, problem: str) -> SettingsError:
        """A ``SettingsError`` for ``key`` of this section (for checks beyond a type)."""
        return SettingsError(f"resources/{self.file}: {self._key(key)}: {problem}")

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        """The value as the YAML has it; required unless ``default`` is given."""
        if key in self.values:
            return self.values[key]
        if default is _MISSING:
            raise self.error(key, "missing (required)")
        return default

    def section(self, key: str, default: Mapping[str, Any] | None = None) -> Section:
        """The nested mapping ``key``; required unless ``default`` is given (also for ``null``)."""
        value = self.raw(key, _MISSING if default is None else default)
        if value is None and default is not None:
            value = default
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a mapping, got {value!r}")
        return Section(self.file, self._key(key), value)

    def int(self, key: str, default: Any = _MISSING) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected an int, got {value!r}")
        if isinstance(value, float):
            if value.is_integer():
                return int(value)
            raise self.error(key, f"expected an int, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise self.error(key, f"expected an int, got {value!r}") from None

    def float(self, key: str, default: Any = _MISSING) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise self.error(key, f"expected a number, got {value!r}") from None

    def str(self, key: str, default: Any = _MISSING) -> str:
        value = self.raw(key, default)
        if isinstance(value, Mapping | list | tuple | set) or value is None:
            raise self.error(key, f"expected a string, got {value!r}")
        return str(value)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise self.error(key, f"expected true or false, got {value!r}")

    def list(self, key: str, default: Any = _MISSING) -> list[Any]:
        """A YAML sequence (``null`` reads as empty)."""
        value = self.raw(key, default)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise self.error(key, f"expected a list, got {value!r}")
        return list(value)

    def sections(self, key: str, default: Any = _MISSING) -> list[Section]:
        """A YAML sequence of mappings (``null`` reads as empty), each one a ``Section``."""
        items = []
        for index, item in enumerate(self.list(key, default)):
            if not isinstance(item, Mapping):
                raise self.error(f"{key}[{index}]", f"expected a mapping, got {item!r}")
            items.append(Section(self.file, f"{self._key(key)}[{index}]", item))
        return items


def settings_section(file: str, path: str = "", config: Mapping[str, Any] | None = None) -> Section:
    """The section at dotted ``path`` of ``resources/<file>``, or of ``config`` when given.

    ``config`` stands for the whole file (a parsed copy tests edit); ``path=""`` is the file
    itself. A missing or non-mapping section is a ``SettingsError`` naming file and key.
    """
    source = load_resource_yaml(file) if config is None else config
    section = Section(file, "", source)
    for part in path.split(".") if path else ():
        section = section.section(part)
    return section
