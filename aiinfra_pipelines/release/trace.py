"""Trace: from a car, a model version or an engine hash back to the data that made it.

Answers, from ``main`` alone: which model runs there (for a VIN: production, or the rollout's
candidate when the VIN is in its cohort), which dataset commit trained it, which raw-log
commits fed that dataset (the dataset manifest's ``source_commits``) and which reports
certified it (the certificate, with its signature checked when a trusted key is available).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.fleet.vehicles import is_valid_vin
from aiinfra_pipelines.lake.layout import (
    CANDIDATES_PREFIX,
    DATASETS_PREFIX,
    MAIN_BRANCH,
    PRODUCTION_POINTER_KEY,
    candidate_certificate_key,
    candidate_manifest_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION

from .certificate import CertificateError, verify_certificate
from .cohorts import CANDIDATE_STATUSES, in_cohort
from .ota import read_rollout_state

_HEX = re.compile(r"^[0-9a-f]{8,64}$")
MIN_SHA_PREFIX = 8


class TraceNotFound(LookupError):
    """Nothing on ``main`` matches the query."""


@dataclass
class Lineage:
    """One model version, from its engines back to its raw-log commits."""

    model_version: str
    manifest: dict[str, Any] | None
    dataset_version: str | None
    dataset_commit: str | None
    source_commits: list[str] | None
    dataset_note: str
    certificate: dict[str, Any] | None
    certificate_status: str
    roles: list[str] = field(default_factory=list)
    matched_engines: list[str] = field(default_factory=list)

    @property
    def reports(self) -> dict[str, dict[str, Any]]:
        return dict((self.certificate or {}).get("reports") or {})

    @property
    def engine(self) -> dict[str, Any]:
        if self.certificate:
            return dict(self.certificate["engine"])
        return dict((self.manifest or {}).get("ship") or {})


@dataclass
class VehicleAssignment:
    vin: str
    vehicle_model: str | None
    channel: str  # production | candidate | bootstrap
    model_version: str
    reason: str


@dataclass
class TraceResult:
    query: str
    kind: str  # vin | model_version | engine_sha256
    lineages: list[Lineage]
    vehicle: VehicleAssignment | None = None


# ------------------------------------------------------------------------------- reading
def _manifests(lake: VersionedLake, ref: str) -> dict[str, dict[str, Any]]:
    found = {}
    for stat in lake.list_objects(ref, CANDIDATES_PREFIX):
        parts = stat.key[len(CANDIDATES_PREFIX) :].split("/")
        if len(parts) == 2 and parts[1] == "manifest.json":
            found[parts[0]] = lake.get_json(ref, stat.key)
    return found


def _roles(lake: VersionedLake, ref: str, model_version: str) -> list[str]:
    roles = []
    pointer = lake.get_json_or_none(ref, PRODUCTION_POINTER_KEY)
    if pointer and str(pointer.get("version")) == model_version:
        roles.append("production")
    state = read_rollout_state(lake, ref)
    if state and state.model_version == model_version:
        roles.append(f"rollout {state.status} at {state.cohort_percent}% (stage {state.stage})")
    return roles


def _dataset(
    lake: VersionedLake, ref: str, version: str | None, commit: str | None
) -> tuple[list[str] | None, str]:
    if not version or not commit:
        return None, "the manifest names no dataset version/commit"
    key = f"{DATASETS_PREFIX}training/{version}/manifest.json"
    try:
        if not lake.object_exists(commit, key):
            return None, f"{key} is not at dataset commit {commit[:12]}"
        manifest = lake.get_json(commit, key)
    except LookupError:
        return None, f"dataset commit {commit[:12]} is not in the lake"
    counts = manifest.get("log_counts") or {}
    summary = ", ".join(f"{split}: {n} logs" for split, n in sorted(counts.items()))
    source_commits = [str(commit) for commit in manifest.get("source_commits", [])]
    return source_commits, f"{manifest.get('frames')} frames ({summary})"


def lineage(
    lake: VersionedLake,
    model_version: str,
    public_keys: Iterable[Ed25519PublicKey] | None = None,
    ref: str = MAIN_BRANCH,
    manifest: dict[str, Any] | None = None,
) -> Lineage:
    """Everything ``main`` says about where ``model_version`` came from."""
    model_version = str(model_version)
    manifest = manifest or lake.get_json_or_none(ref, candidate_manifest_key(model_version))
    certificate: dict[str, Any] | None = None
    keys = list(public_keys or [])
    if not lake.object_exists(ref, candidate_certificate_key(model_version)):
        status = "not certified"
    elif keys:
        try:
            certificate = verify_certificate(lake, model_version, keys, ref)
            status = f"valid (signed by key {certificate['key_id'][:16]})"
        except CertificateError as error:
            status = f"INVALID: {error}"
            certificate = (
                lake.get_json_or_none(ref, candidate_certificate_key(model_version)) or {}
            ).get("certificate")
    else:
        certificate = lake.get_json(ref, candidate_certificate_key(model_version)).get(
            "certificate"
        )
        status = "present, signature not checked (no trusted public key available)"
    source = manifest or certificate or {}
    dataset_version = source.get("dataset_version")
    dataset_commit = source.get("dataset_commit")
    source_commits, note = _dataset(lake, ref, dataset_version, dataset_commit)
    return Lineage(
        model_version=model_version,
        manifest=manifest,
        dataset_version=dataset_version,
        dataset_commit=dataset_commit,
        source_commits=source_commits,
        dataset_note=note,
        certificate=certificate,
        certificate_status=status,
        roles=_roles(lake, ref, model_version),
    )


# ------------------------------------------------------------------------------- matching
def _vehicle_model_of(vin: str) -> str | None:
    models = settings_section("fleet.yaml", "fleet").sections("vehicle_models")
    return next((m.str("name") for m in models if vin.startswith(m.str("wmi"))), None)


def vehicle_assignment(lake: VersionedLake, vin: str, ref: str = MAIN_BRANCH) -> VehicleAssignment:
    """Which engine a VIN runs: the candidate inside a live rollout's cohort, else production.

    The cohort rule is the vehicle's own (``cohorts.in_cohort`` on the VIN, as the OTA client
    decides), so the answer is what the car installs.
    """
    vin = vin.upper()
    model = _vehicle_model_of(vin)
    pointer = lake.get_json_or_none(ref, PRODUCTION_POINTER_KEY)
    state = read_rollout_state(lake, ref)
    if state and state.status in CANDIDATE_STATUSES:
        percent = state.cohort_percent
        if in_cohort(vin, percent, state.cohort_salt):
            return VehicleAssignment(
                vin,
                model,
                "candidate",
                state.model_version,
                f"in the {percent:g}% cohort of rollout {state.model_version} "
                f"({state.status}, stage {state.stage})",
            )
        outside = f"outside the {percent:g}% cohort of rollout {state.model_version}; "
    else:
        outside = ""
    if pointer is None:
        return VehicleAssignment(
            vin,
            model,
            "bootstrap",
            BOOTSTRAP_VERSION,
            outside + "nothing released yet: model zero (untrained bootstrap engine)",
        )
    return VehicleAssignment(
        vin, model, "production", str(pointer["version"]), outside + "production engine"
    )


def _engine_matches(manifest: dict[str, Any], prefix: str) -> list[str]:
    matches = []
    ship = manifest.get("ship") or {}
    if str(ship.get("sha256", "")).startswith(prefix):
        matches.append(f"shipped engine ({ship.get('precision')}, {ship.get('target')})")
    for name, engine in sorted((manifest.get("engines") or {}).items()):
        shipped = engine.get("key") == ship.get("key")
        if str(engine.get("sha256", "")).startswith(prefix) and not shipped:
            matches.append(f"{name} engine")
    onnx = manifest.get("onnx") or {}
    if str(onnx.get("sha256", "")).startswith(prefix) and not any(
        e.get("key") == onnx.get("key") for e in (manifest.get("engines") or {}).values()
    ):
        matches.append("exported ONNX")
    return matches


def trace(
    lake: VersionedLake,
    query: str,
    public_keys: Iterable[Ed25519PublicKey] | None = None,
    ref: str = MAIN_BRANCH,
) -> TraceResult:
    """Trace a VIN, a model version or an engine SHA-256 (full or a prefix of at least 8).

    Raises ``TraceNotFound`` with the reason when nothing on ``ref`` matches.
    """
    query = query.strip()
    keys = list(public_keys or [])
    if is_valid_vin(query.upper()):
        assignment = vehicle_assignment(lake, query, ref)
        lineages = (
            []
            if assignment.channel == "bootstrap"
            else [lineage(lake, assignment.model_version, keys, ref)]
        )
        return TraceResult(query, "vin", lineages, assignment)
    if lake.object_exists(ref, candidate_manifest_key(query)) or lake.object_exists(
        ref, candidate_certificate_key(query)
    ):
        return TraceResult(query, "model_version", [lineage(lake, query, keys, ref)])
    manifests = _manifests(lake, ref)
    prefix = query.lower()
    if _HEX.match(prefix):
        lineages = []
        for version, manifest in sorted(manifests.items()):
            matched = _engine_matches(manifest, prefix)
            if matched:
                found = lineage(lake, version, keys, ref, manifest=manifest)
                found.matched_engines = matched
                lineages.append(found)
        if lineages:
            return TraceResult(query, "engine_sha256", lineages)
    raise TraceNotFound(
        f"nothing on {ref} matches {query!r}: not a valid VIN, not a model version with a "
        f"candidate manifest, and no engine sha256 (or prefix of ≥{MIN_SHA_PREFIX} hex "
        f"characters) among {len(manifests)} candidate(s)"
    )


# ------------------------------------------------------------------------------ rendering
# rich is imported inside each helper so that importing this module (the CLI does it for
# every command) stays cheap.
def _folding(header: str) -> Any:
    """A column whose hashes wrap rather than being cut off on a narrow tty."""
    from rich.table import Column

    return Column(header, overflow="fold")


def _vehicle_line(vehicle: VehicleAssignment) -> str:
    """The one-line answer to "what does this VIN run, and why"."""
    from rich.markup import escape

    return (
        f"[bold]VIN[/] {vehicle.vin} ({vehicle.vehicle_model or 'unknown vehicle model'}) "
        f"runs [bold cyan]{vehicle.channel}[/] model version "
        f"[bold]{vehicle.model_version}[/]: {escape(vehicle.reason)}"
    )


def _lineage_table(found: Lineage) -> Any:
    """Engine, ONNX, training run, dataset and certificate of one model version."""
    from rich.markup import escape
    from rich.table import Table

    title = f"model version {found.model_version}"
    if found.roles:
        title += f" — {', '.join(found.roles)}"
    table = Table(_folding(""), _folding(""), title=title, show_header=False)
    manifest = found.manifest or {}
    source = manifest or found.certificate or {}
    if found.matched_engines:
        table.add_row("matched", ", ".join(found.matched_engines))
    engine = found.engine
    table.add_row(
        "engine",
        f"{engine.get('sha256', '?')} ({engine.get('precision')}, {engine.get('target')})",
    )
    table.add_row("onnx", str((source.get("onnx") or {}).get("sha256", "?")))
    table.add_row("mlflow run", str(source.get("mlflow_run_id")))
    table.add_row("code version", str(source.get("code_version")))
    table.add_row("dataset", f"{found.dataset_version} at commit {found.dataset_commit}")
    table.add_row("dataset content", escape(found.dataset_note))
    table.add_row("certificate", escape(found.certificate_status))
    if found.certificate:
        table.add_row("certified at", str(found.certificate.get("issued_at")))
        rules = found.certificate.get("gates") or {}
        table.add_row(
            "gate rules",
            f"gates.yaml {rules.get('gates_version', '?')} sha256 "
            f"{rules.get('gates_sha256', 'not recorded (certified before rules were hashed)')}",
        )
        for section, figures in sorted((rules.get("calibration") or {}).items()):
            table.add_row(f"calibration ({section})", escape(_calibration_text(figures)))
    return table


def _calibration_text(figures: Any) -> str:
    """The error rates a gate configuration states, as one line."""
    measured = (figures or {}).get("measured") if isinstance(figures, dict) else None
    shown = measured if isinstance(measured, dict) else figures
    if not isinstance(shown, dict):
        return str(shown)
    return ", ".join(f"{k} {v}" for k, v in shown.items() if not isinstance(v, dict | list))


def _commits_table(found: Lineage) -> Any:
    """The raw log commits behind the dataset, or why they are unknown."""
    from rich.markup import escape
    from rich.table import Table

    commits = Table(
        _folding("raw log commit"), title=f"raw log commits that fed {found.dataset_version}"
    )
    for commit in found.source_commits or []:
        commits.add_row(commit)
    if found.source_commits is None:
        commits.add_row(f"unknown: {escape(found.dataset_note)}")
    return commits


def _reports_table(found: Lineage) -> Any:
    """The gate reports the certificate rests on, one row per gate."""
    from rich.markup import escape
    from rich.table import Table

    reports = Table(
        "gate",
        "verdict",
        _folding("sha256"),
        _folding("report"),
        _folding("judged under gates"),
        title="reports that certified it",
    )
    for gate, entry in sorted(found.reports.items()):
        reports.add_row(
            gate,
            "pass" if entry.get("passed") else "FAIL",
            str(entry.get("sha256")),
            escape(str(entry.get("key"))),
            str(entry.get("gates_sha256") or "not recorded"),
        )
    if not found.reports:
        reports.add_row("—", "not certified", "", "", "")
    return reports


def render_trace(result: TraceResult, console: Any) -> None:
    """Rich output for ``aiinfra trace``."""
    if result.vehicle is not None:
        console.print(_vehicle_line(result.vehicle))
    for found in result.lineages:
        console.print(_lineage_table(found))
        console.print(_commits_table(found))
        console.print(_reports_table(found))
