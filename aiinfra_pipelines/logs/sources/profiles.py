"""Source profiles: which topic plays which role in a car's recording (resources/sources/).

A real fleet records on its own topic names and message schemas (ROS 2 CDR, Foxglove protobuf,
JSON). A profile maps the roles ingestion needs — front camera, calibration, GNSS, pose,
vehicle status, events, and the sensors that only flow through (LiDAR, IMU, transforms) — to
topics with their encoding and schema, so one reader serves every layout. A role may list
several candidates (``candidates``: the generic ROS names and Autoware's, say); matching
resolves each role to the first candidate the file carries and hands back a concrete profile,
so everything downstream reads one ``RoleSpec.topic`` per role. The profile also says where each
vehicle signal comes from (``signals``, :mod:`.signals`; raw CAN through its ``can`` table,
:mod:`.can`) and how metadata a recorder never writes is derived (``metadata.derived``,
:mod:`.metadata`). A profile is chosen by name (an upload's or ``aiinfra logs inspect
--source``) or by matching the file's channels; a file no profile fits is refused with what
each profile found missing, naming every topic that was looked at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml, resources_dir
from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import SIMULATED_PROFILE
from aiinfra_pipelines.logs.sources.can import CanSignal, parse_can_table
from aiinfra_pipelines.logs.sources.metadata import MetadataRule, parse_metadata_rules
from aiinfra_pipelines.logs.sources.signals import SignalSpec, default_signals, parse_signals

SOURCES_DIR = "sources"
# Encodings a role may declare: MCAP message encoding on the channel.
ENCODINGS = frozenset({"cdr", "protobuf", "json"})
# The roles a frame is rebuilt from; every profile must declare them (required or not).
FRAME_ROLES: tuple[str, ...] = ("front_camera", "gnss", "pose", "vehicle_status")
CALIBRATION_SUFFIX = "_calibration"
# Role keys a candidate inherits from its role when it does not set them itself.
_INHERITED = ("encoding", "schema")


@dataclass(frozen=True)
class RoleSpec:
    """One role's channel: topic, MCAP message encoding, schema name, and alignment window."""

    role: str
    topic: str
    encoding: str
    schema: str
    required: bool = False
    # Largest |sample time - frame time| for a sample to belong to a camera frame.
    max_age_s: float = 0.05
    # Every schema the role may carry (``schema`` first): a camera recorded raw or as JPEG.
    alternatives: tuple[str, ...] = ()

    @property
    def schemas(self) -> tuple[str, ...]:
        """Accepted schema names; empty: any (a JSON channel is matched by its keys)."""
        return (self.schema, *self.alternatives) if self.schema else ()

    def accepts(self, encoding: str, schema: str) -> bool:
        return encoding == self.encoding and (not self.schemas or schema in self.schemas)

    def describe(self) -> str:
        return f"{self.encoding} {' or '.join(self.schemas) or 'any schema'}"


@dataclass(frozen=True)
class SourceProfile:
    """A recording layout: roles by name, where its metadata lives, where its signals come from.

    ``roles`` holds one spec per role: the candidate a file resolved to (:meth:`resolve`), or
    the first candidate before resolution. ``candidates`` keeps every one, most preferred first.
    """

    name: str
    roles: Mapping[str, RoleSpec]
    metadata_record: str = "drive_log"
    metadata_keys: Mapping[str, str] | None = None
    candidates: Mapping[str, tuple[RoleSpec, ...]] = field(default_factory=dict)
    signals: Mapping[str, SignalSpec] = field(default_factory=default_signals)
    can: Mapping[str, CanSignal] = field(default_factory=dict)
    # Project metadata key -> how it is derived when the record lacks it (or there is none).
    metadata_derived: Mapping[str, MetadataRule] = field(default_factory=dict)

    def role(self, name: str) -> RoleSpec | None:
        return self.roles.get(name)

    def looked_at(self, role: str) -> list[str]:
        """Every topic the role may be recorded on, most preferred first."""
        return [spec.topic for spec in self.candidates.get(role, ())] or (
            [self.roles[role].topic] if role in self.roles else []
        )

    @property
    def required(self) -> list[RoleSpec]:
        return [spec for spec in self.roles.values() if spec.required]

    def metadata_records(self, records: Sequence[Any]) -> list[dict[str, str]]:
        """Every MCAP metadata record of this profile's name, keys renamed to the project's."""
        return [
            self.metadata_from_record(record.metadata)
            for record in records
            if record.name == self.metadata_record
        ]

    def metadata_from_record(self, record: Mapping[str, str]) -> dict[str, str]:
        """The record's keys renamed to the project's (``metadata.keys``: ours -> theirs)."""
        renames = {theirs: ours for ours, theirs in (self.metadata_keys or {}).items()}
        return {renames.get(key, key): value for key, value in record.items()}

    def _choose(
        self, role: str, channels: Mapping[str, tuple[str, str]]
    ) -> tuple[RoleSpec | None, RoleSpec | None]:
        """(the first candidate the file carries as declared, the first it carries otherwise)."""
        wrong = None
        for spec in self.candidates.get(role, (self.roles[role],)):
            found = channels.get(spec.topic)
            if found is None:
                continue
            if spec.accepts(*found):
                return spec, None
            wrong = wrong or spec
        return None, wrong

    def resolve(self, channels: Mapping[str, tuple[str, str]]) -> SourceProfile:
        """This profile with each role at the first candidate the file carries.

        A role the file does not carry keeps its first candidate (its topic has no messages,
        so it reads as absent, and a refusal can still name it).
        """
        roles = {}
        for role, default in self.roles.items():
            chosen, _wrong = self._choose(role, channels)
            roles[role] = chosen or self.candidates.get(role, (default,))[0]
        return dataclasses.replace(self, roles=roles)

    def missing(self, channels: Mapping[str, tuple[str, str]]) -> tuple[list[str], list[str]]:
        """(absent, mismatched): required roles on no candidate topic / roles on another schema.

        ``channels`` maps topic -> (message encoding, schema name) as found in the file. A role
        whose topic is there with another schema (and no candidate fits) is mismatched, required
        or not: a topic we read carrying something else is schema drift, never silently unknown.
        Calibration roles are not matched on: a log without its calibration is still this
        profile's log, refused later for that reason (``missing_calibration``).
        """
        absent, mismatched = [], []
        for role, spec in self.roles.items():
            if role.endswith(CALIBRATION_SUFFIX):
                continue
            chosen, wrong = self._choose(role, channels)
            if chosen is not None:
                continue
            if wrong is not None:
                found = channels[wrong.topic]
                mismatched.append(
                    f"{role} ({wrong.topic} carries {found[0]} {found[1]}, not {wrong.describe()})"
                )
            elif spec.required:
                absent.append(f"{role} (looked at {', '.join(self.looked_at(role))})")
        return absent, mismatched


def _role(name: str, raw: Mapping[str, Any], profile: str) -> tuple[RoleSpec, ...]:
    """A role's candidates: ``candidates: [...]`` under shared keys, or one ``topic``."""
    listed = raw.get("candidates")
    if listed is None:
        listed = [{"topic": raw.get("topic")}] if "topic" in raw else []
    if not listed:
        raise ValueError(f"source profile {profile}: role {name} lacks topic")
    return tuple(_candidate(name, {**raw, **entry}, profile) for entry in listed)


def _candidate(name: str, raw: Mapping[str, Any], profile: str) -> RoleSpec:
    try:
        schemas = raw.get("schema") or []
        names = [str(schemas)] if isinstance(schemas, str) else [str(s) for s in schemas]
        spec = RoleSpec(
            role=name,
            topic=str(raw["topic"]),
            encoding=str(raw["encoding"]),
            schema=names[0] if names else "",
            required=bool(raw.get("required", False)),
            max_age_s=float(raw.get("max_age_s", 0.05)),
            alternatives=tuple(names[1:]),
        )
    except KeyError as exc:
        raise ValueError(f"source profile {profile}: role {name} lacks {exc.args[0]}") from exc
    if spec.encoding not in ENCODINGS:
        raise ValueError(
            f"source profile {profile}: role {name} encoding {spec.encoding!r} is not one of "
            f"{sorted(ENCODINGS)}"
        )
    if not spec.schemas and spec.encoding != "json":
        # Only JSON identifies itself by content; CDR and protobuf need their schema to decode.
        raise ValueError(f"source profile {profile}: role {name} lacks schema")
    return spec


def parse_profile(raw: Mapping[str, Any]) -> SourceProfile:
    """A profile from its YAML mapping; a clear ``ValueError`` for a malformed one."""
    name = str(raw.get("name") or "")
    if not name:
        raise ValueError("source profile without a name")
    candidates = {role: _role(role, spec, name) for role, spec in (raw.get("roles") or {}).items()}
    absent = [role for role in FRAME_ROLES if role not in candidates]
    if absent:
        raise ValueError(f"source profile {name} does not map frame role(s) {absent}")
    metadata = raw.get("metadata") or {}
    can = parse_can_table(raw.get("can"), name)
    return SourceProfile(
        name=name,
        roles={role: specs[0] for role, specs in candidates.items()},
        metadata_record=str(metadata.get("record", "drive_log")),
        metadata_keys=dict(metadata.get("keys") or {}),
        candidates=candidates,
        signals=parse_signals(raw.get("signals"), list(candidates), can, name),
        can=can,
        metadata_derived=parse_metadata_rules(metadata.get("derived"), name),
    )


def load_profiles() -> dict[str, SourceProfile]:
    """Every ``resources/sources/*.yaml`` profile by name (the simulated fleet's first).

    Read on every validated log, so the YAML goes through the config loader's cache.
    """
    folder = resources_dir() / SOURCES_DIR
    profiles: dict[str, SourceProfile] = {}
    paths = sorted(folder.glob("*.yaml"), key=lambda p: (p.stem != SIMULATED_PROFILE, p.stem))
    for path in paths:
        profile = parse_profile(load_resource_yaml(f"{SOURCES_DIR}/{path.name}"))
        if profile.name in profiles:
            raise ValueError(f"two source profiles are named {profile.name} ({path})")
        profiles[profile.name] = profile
    if not profiles:
        raise FileNotFoundError(f"no source profiles in {folder}")
    return profiles


def match_profile(
    channels: Mapping[str, tuple[str, str]],
    name: str | None = None,
    profiles: Mapping[str, SourceProfile] | None = None,
) -> SourceProfile:
    """The profile for a file with ``channels`` (topic -> (encoding, schema)), resolved to it.

    Named: that profile, refused (``unknown_source``) when the file lacks what it requires.
    Unnamed: the first profile (simulated, then by name) whose required roles are all there.
    """
    known = dict(profiles or load_profiles())
    if name is not None:
        if name not in known:
            raise DriveLogError(
                errors.UNKNOWN_SOURCE, f"no source profile {name!r}; known: {sorted(known)}"
            )
        candidates = {name: known[name]}
    else:
        candidates = known
    findings, wrong_schema = [], []
    for profile in candidates.values():
        absent, mismatched = profile.missing(channels)
        if not absent and not mismatched:
            return profile.resolve(channels)
        findings.append(f"{profile.name} lacks {', '.join(absent + mismatched)}")
        if not absent:  # every topic is there, some carry another schema: schema drift
            wrong_schema.append(f"{profile.name}: {', '.join(mismatched)}")
    if wrong_schema:
        raise DriveLogError(errors.WRONG_SCHEMA, "; ".join(wrong_schema))
    raise DriveLogError(
        errors.UNKNOWN_SOURCE, "no source profile matches this file: " + "; ".join(findings)
    )
