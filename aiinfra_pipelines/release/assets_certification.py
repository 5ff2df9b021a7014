"""``certified_engine`` (group ``release``) and its blocking ``certificate_valid`` check.

A refusal is an asset *failure*, not a materialization with a failed check: a refused
candidate then has no ``certified_engine`` materialization at all, so nothing keyed on that
asset (shadow, rollout, sensors) can mistake it for certified. The refusal is recorded where
operators look — the step failure's description and metadata name every failed gate, and the
MLflow version is tagged ``certification=refused``. On success the blocking check re-reads the
certificate from ``main`` and verifies its signature and every hash before anything downstream
in the run may start.
"""

import dagster as dg

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of
from aiinfra_pipelines.training.resources import MlflowTracking

from .certificate import (
    CertificateError,
    CertificationOutcome,
    CertificationRefused,
    certify_candidate,
    latest_candidate,
    verify_certificate,
)
from .keys import ReleaseKeys
from .registry import ModelRegistry, record_certification, record_refusal

GROUP = "release"
CHECK_NAME = "certificate_valid"
# Upstream assets by key: the deployment and simulation layers publish the manifest and reports.
UPSTREAM = ["published_engine", "regression_report"]


class CertificationConfig(dg.Config):
    """Which candidate to certify; empty = the newest published one (``candidates/latest.json``)."""

    model_version: str = ""


def certify_or_fail(
    lake: VersionedLake,
    registry: ModelRegistry,
    model_version: str,
    release_keys: ReleaseKeys,
    *,
    root_run_id: str,
    issued_by: dict[str, str],
) -> CertificationOutcome:
    """Certify one version and record the verdict in MLflow, either way.

    A refusal becomes a ``dg.Failure`` (never retried: the gates will not change on a rerun)
    so that a refused candidate has no ``certified_engine`` materialization at all.
    """
    registry.version(model_version)  # unregistered → clear error before anything is written
    try:
        outcome = certify_candidate(
            lake,
            model_version,
            release_keys.certificate_signer(),
            root_run_id=root_run_id,
            issued_by=issued_by,
        )
    except CertificationRefused as refusal:
        record_refusal(registry, model_version, refusal.failed_gates, str(refusal))
        raise dg.Failure(
            description=str(refusal),
            metadata={
                "model_version": model_version,
                "failed_gates": dg.MetadataValue.json(refusal.failed_gates),
                "failures": dg.MetadataValue.json(
                    [{"gate": f.gate, "reason": f.reason} for f in refusal.failures]
                ),
            },
            allow_retries=False,
        ) from refusal
    record_certification(registry, outcome.certificate)
    return outcome


def certification_metadata(model_version: str, outcome: CertificationOutcome) -> dict[str, object]:
    """What an operator sees on the materialization: every hash the certificate pins."""
    body = outcome.certificate
    reports = "\n".join(
        f"| {gate} | {'pass' if entry['passed'] else 'FAIL'} | `{entry['sha256'][:16]}` |"
        for gate, entry in sorted(body["reports"].items())
    )
    return {
        "model_version": model_version,
        "certificate_key": outcome.certificate_key,
        "certificate_sha256": outcome.certificate_sha256,
        "engine_sha256": body["engine"]["sha256"],
        "onnx_sha256": body["onnx"]["sha256"],
        "dataset_commit": str(body.get("dataset_commit")),
        "key_id": body["key_id"],
        "issued_at": body["issued_at"],
        "reused_existing_certificate": outcome.reused,
        # Same engine, fresh sessions, same frames: bit-identical outputs (release.determinism).
        "determinism": dg.MetadataValue.json(body.get("determinism") or {}),
        "publish_commit": outcome.commit or "",
        "reports": dg.MetadataValue.md(
            "| gate | verdict | sha256 |\n| --- | --- | --- |\n" + reports
        ),
    }


@dg.asset(group_name=GROUP, kinds={"mlflow", "lakefs"}, deps=UPSTREAM)
def certified_engine(
    context: dg.AssetExecutionContext,
    config: CertificationConfig,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    release_keys: ReleaseKeys,
) -> dg.MaterializeResult:
    """The candidate's signed certificate: every gate re-verified from ``main`` for one version."""
    model_version = config.model_version or latest_candidate(lake)
    outcome = certify_or_fail(
        lake,
        ModelRegistry(mlflow_tracking.uri()),
        model_version,
        release_keys,
        root_run_id=root_run_id_of(context.run),
        issued_by={"dagster_run_id": context.run.run_id},
    )
    return dg.MaterializeResult(
        metadata=certification_metadata(model_version, outcome),
        data_version=dg.DataVersion(outcome.certificate_sha256),
    )


@dg.asset_check(asset=certified_engine, name=CHECK_NAME, blocking=True)
def certificate_valid(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, release_keys: ReleaseKeys
) -> dg.AssetCheckResult:
    """The certificate on ``main`` verifies: signature by the release key, every hash intact."""
    event = context.instance.get_latest_materialization_event(certified_engine.key)
    metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
    if "model_version" not in metadata:
        return dg.AssetCheckResult(
            passed=False, metadata={"error": "certified_engine has no materialization to check"}
        )
    model_version = str(metadata["model_version"].value)
    try:
        body = verify_certificate(lake, model_version, release_keys.certificate_public_key())
    except CertificateError as error:
        return dg.AssetCheckResult(
            passed=False, metadata={"model_version": model_version, "error": str(error)}
        )
    return dg.AssetCheckResult(
        passed=True,
        metadata={
            "model_version": model_version,
            "certificate_sha256": body["certificate_sha256"],
            "key_id": body["key_id"],
        },
    )
