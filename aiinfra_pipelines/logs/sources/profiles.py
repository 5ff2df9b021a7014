"""Source profiles: which topic plays which role in a car's recording (resources/sources/).

A real fleet records on its own topic names and message schemas (ROS 2 CDR, Foxglove protobuf,
JSON). A profile maps the roles ingestion needs — front camera, calibration, GNSS, pose,
vehicle status, events, and the sensors that only flow through (LiDAR, IMU, transforms) — to
topics with their encoding and schema, so one reader serves every layout. A profile is chosen
by name (an upload's or ``aiinfra logs inspect --source``) or by matching the file's channels;
a file no profile fits is refused with what each profile found missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml, resources_dir
from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import SIMULATED_PROFILE

SOURCES_DIR = "sources"
# Encodings a role may declare: MCAP message encoding on the channel.
ENCODINGS = frozenset({"cdr", "protobuf", "json"})
# The roles a frame is rebuilt from; every profile must declare them (required or not).
FRAME_ROLES: tuple[str, ...] = ("front_camera", "gnss", "pose", "vehicle_status")
CALIBRATION_SUFFIX = "_calibration"


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
        return (self.schema, *self.alternatives)

    def accepts(self, encoding: str, schema: str) -> bool:
        return encoding == self.encoding and schema in self.schemas


@dataclass(frozen=True)
class SourceProfile:
    """A recording layout: roles by name, and where the log's metadata record lives."""

    name: str
    roles: Mapping[str, RoleSpec]
    metadata_record: str = "drive_log"
    metadata_keys: Mapping[str, str] | None = None

    def role(self, name: str) -> RoleSpec | None:
        return self.roles.get(name)

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

    def missing(self, channels: Mapping[str, tuple[str, str]]) -> tuple[list[str], list[str]]:
        """(absent, mismatched): required roles whose topic is absent / carries another schema.

        ``channels`` maps topic -> (message encoding, schema name) as found in the file.
        Calibration roles are not matched on: a log without its calibration is still this
        profile's log, refused later for that reason (``missing_calibration``).
        """
        absent, mismatched = [], []
        for spec in self.required:
            if spec.role.endswith(CALIBRATION_SUFFIX):
                continue
            found = channels.get(spec.topic)
            if found is None:
                absent.append(f"{spec.role} ({spec.topic})")
            elif not spec.accepts(*found):
                mismatched.append(
                    f"{spec.role} ({spec.topic} carries {found[0]} {found[1]}, "
                    f"not {spec.encoding} {' or '.join(spec.schemas)})"
                )
        return absent, mismatched


def _role(name: str, raw: Mapping[str, Any], profile: str) -> RoleSpec:
    try:
        schemas = raw["schema"]
        names = [str(schemas)] if isinstance(schemas, str) else [str(s) for s in schemas]
        spec = RoleSpec(
            role=name,
            topic=str(raw["topic"]),
            encoding=str(raw["encoding"]),
            schema=names[0],
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
    return spec


def parse_profile(raw: Mapping[str, Any]) -> SourceProfile:
    """A profile from its YAML mapping; a clear ``ValueError`` for a malformed one."""
    name = str(raw.get("name") or "")
    if not name:
        raise ValueError("source profile without a name")
    roles = {role: _role(role, spec, name) for role, spec in (raw.get("roles") or {}).items()}
    absent = [role for role in FRAME_ROLES if role not in roles]
    if absent:
        raise ValueError(f"source profile {name} does not map frame role(s) {absent}")
    metadata = raw.get("metadata") or {}
    return SourceProfile(
        name=name,
        roles=roles,
        metadata_record=str(metadata.get("record", "drive_log")),
        metadata_keys=dict(metadata.get("keys") or {}),
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
    """The profile for a file with ``channels`` (topic -> (encoding, schema)).

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
            return profile
        findings.append(f"{profile.name} lacks {', '.join(absent + mismatched)}")
        if not absent:  # every topic is there, some carry another schema: schema drift
            wrong_schema.append(f"{profile.name}: {', '.join(mismatched)}")
    if wrong_schema:
        raise DriveLogError(errors.WRONG_SCHEMA, "; ".join(wrong_schema))
    raise DriveLogError(
        errors.UNKNOWN_SOURCE, "no source profile matches this file: " + "; ".join(findings)
    )
