"""Certification: every gate re-verified from main, a signed certificate, MLflow lineage tags."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.layout import candidate_certificate_key
from aiinfra_pipelines.release.assets_certification import (
    CertificationConfig,
    certificate_valid,
    certified_engine,
)
from aiinfra_pipelines.release.certificate import (
    CertificateError,
    CertificationRefused,
    certify_candidate,
    verify_certificate,
)
from aiinfra_pipelines.release.certificate_evidence import collect_evidence
from aiinfra_pipelines.release.keys import ReleaseKeys
from aiinfra_pipelines.release.registry import CANDIDATE_ALIAS, ModelRegistry
from aiinfra_pipelines.training.resources import MlflowTracking
from aiinfra_pipelines_tests.support.release_lake import (
    ALL_GATES,
    mlflow_uri,
    publish,
    publish_candidate,
    publish_dataset,
    register_versions,
    report,
    sha,
    tamper,
)


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory) -> str:
    uri = mlflow_uri(tmp_path_factory.mktemp("mlflow"))
    register_versions(uri, 6)
    return uri


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory) -> ReleaseKeys:
    return ReleaseKeys(dev_keys_dir=str(tmp_path_factory.mktemp("keys")))


@pytest.fixture
def resources(local_lake, tracking_uri, release_keys, tmp_path) -> dict:
    return {
        "lake": local_lake,
        "mlflow_tracking": MlflowTracking(tracking_uri=tracking_uri),
        "release_keys": release_keys,
    }


def certify(instance, resources, model_version: str = "", raise_on_error: bool = True):
    return dg.materialize(
        [certified_engine, certificate_valid],
        instance=instance,
        resources=resources,
        run_config=dg.RunConfig(
            {"certified_engine": CertificationConfig(model_version=model_version)}
        ),
        raise_on_error=raise_on_error,
    )


def failure_description(result: dg.ExecuteInProcessResult) -> str:
    failure = result.failure_data_for_node("certified_engine")
    assert failure is not None, "certified_engine did not fail"
    return failure.user_failure_data.description


def test_all_pass_candidate_is_certified_signed_and_tagged(
    instance, resources, local_lake, tracking_uri, release_keys
):
    dataset_commit, _ = publish_dataset(local_lake, "dataset-v0001", ["c-ingest-1"])
    manifest = publish_candidate(local_lake, "1", seed=1, dataset_commit=dataset_commit)

    result = certify(instance, resources)  # empty version = candidates/latest.json

    assert result.success
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.check_name == "certificate_valid" and evaluation.passed
    body = verify_certificate(local_lake, "1", release_keys.certificate_public_key())
    assert body["model_version"] == "1" and body["dataset_commit"] == dataset_commit
    assert body["engine"]["sha256"] == manifest["ship"]["sha256"]
    assert body["onnx"]["sha256"] == manifest["onnx"]["sha256"]
    assert set(body["reports"]) == set(ALL_GATES)
    assert all(entry["passed"] for entry in body["reports"].values())
    # The rules that certified it: every report's and the certificate's gates.yaml hash.
    rules = gate_rules()
    assert body["gates"]["gates_sha256"] == rules.sha256
    assert body["gates"]["calibration"]["simulation"]["measured"]["aa_certified"] >= 0.95
    assert {entry["gates_sha256"] for entry in body["reports"].values()} == {rules.sha256}
    stored = local_lake.get_object("main", candidate_certificate_key("1"))
    assert body["certificate_sha256"] == sha(stored)

    registry = ModelRegistry(tracking_uri)
    tags = registry.version_tags("1")
    assert tags["certification"] == "passed"
    assert tags["certificate_sha256"] == sha(stored)
    assert tags["engine_sha256"] == manifest["ship"]["sha256"]
    assert (
        tags["report_regression_simulation_sha256"]
        == body["reports"]["regression_simulation"]["sha256"]
    )
    assert registry.get_alias(CANDIDATE_ALIAS) == "1"
    metadata = result.asset_materializations_for_node("certified_engine")[0].metadata
    assert metadata["reused_existing_certificate"].value is False

    # Re-running finds the same evidence: the certificate is kept, main does not move.
    head = local_lake.resolve_ref("main")
    again = certify(instance, resources, "1")
    assert again.success
    assert (
        again.asset_materializations_for_node("certified_engine")[0]
        .metadata["reused_existing_certificate"]
        .value
        is True
    )
    assert local_lake.resolve_ref("main") == head


def test_failed_regression_report_is_refused_naming_it(
    instance, resources, local_lake, tracking_uri
):
    publish_candidate(local_lake, "2", seed=2, failing=["regression_simulation"])

    result = certify(instance, resources, "2", raise_on_error=False)

    assert not result.success
    description = failure_description(result)
    assert "model version 2 refused: 1 gate(s) failed (regression_simulation)" in description
    assert "badcase-0007 collided" in description
    assert not local_lake.object_exists("main", candidate_certificate_key("2"))
    tags = ModelRegistry(tracking_uri).version_tags("2")
    assert tags["certification"] == "refused"
    assert tags["certification_failed_gates"] == "regression_simulation"
    assert not result.get_asset_check_evaluations()  # nothing to check: no certificate


def test_a_report_judged_under_other_gate_rules_is_refused_naming_it(local_lake):
    """Rules identified: a report that another gates.yaml judged cannot be vouched for under
    this one (nor one that names no rules, from before reports recorded them)."""
    publish_candidate(local_lake, "1", seed=1)
    other = report("regression_simulation", "1", True, gates_sha256="0" * 64)
    nameless = json.loads(report("offline_eval", "1", True))
    del nameless["gates_sha256"]
    publish(
        local_lake,
        {
            "candidates/1/reports/regression_simulation.json": other,
            "candidates/1/reports/offline_eval.json": json.dumps(nameless).encode(),
        },
        "reports judged under other rules",
    )
    evidence = collect_evidence(local_lake, "1")
    reasons: dict[str, list[str]] = {}
    for failure in evidence.failures:
        reasons.setdefault(failure.gate, []).append(failure.reason)
    assert any(
        r.startswith("judged under gate rules 000000000000")
        for r in reasons["regression_simulation"]
    )
    assert any("no gates_sha256" in r for r in reasons["offline_eval"])


def test_every_failed_gate_is_named_in_one_refusal(local_lake, release_keys):
    publish_candidate(
        local_lake,
        "3",
        seed=3,
        failing=["engine_benchmark", "regression_simulation"],
        missing=["offline_eval"],
        report_version_override={"engine_parity": "2"},
    )

    with pytest.raises(CertificationRefused) as refused:
        certify_candidate(
            local_lake, "3", release_keys.certificate_signer(), root_run_id="certify-3"
        )

    assert refused.value.failed_gates == sorted(ALL_GATES)
    message = str(refused.value)
    assert "4 gate(s) failed" in message
    assert "offline_eval: report missing (candidates/3/reports/offline_eval.json)" in message
    assert "engine_parity: report is for model version '2', not '3'" in message
    assert "engine_benchmark: reported passed=false" in message
    assert "regression_simulation: reported passed=false" in message
    assert not local_lake.object_exists("main", candidate_certificate_key("3"))


def test_report_changed_after_publication_and_swapped_engine_are_refused(local_lake):
    manifest = publish_candidate(local_lake, "4", seed=4)
    tamper(
        local_lake,
        manifest["reports"]["engine_parity"]["key"],
        json.dumps({"model_version": "4", "passed": True, "note": "rewritten"}).encode(),
    )
    tamper(local_lake, manifest["ship"]["key"], b"not the quantized engine")

    evidence = collect_evidence(local_lake, "4")

    assert not evidence.passed
    reasons = {failure.gate: failure.reason for failure in evidence.failures}
    assert set(reasons) == {"engine_parity", "artifacts"}
    assert "does not match the manifest" in reasons["engine_parity"]
    assert "engine candidates/4/int8.onnx has sha256" in reasons["artifacts"]


def test_tampered_report_breaks_the_certificate(instance, resources, local_lake, release_keys):
    manifest = publish_candidate(local_lake, "5", seed=5)
    assert certify(instance, resources, "5").success
    public_key = release_keys.certificate_public_key()
    assert verify_certificate(local_lake, "5", public_key)["model_version"] == "5"

    # The benchmark report is rewritten on main after certification (still says passed).
    key = manifest["reports"]["engine_benchmark"]["key"]
    forged = json.loads(local_lake.get_object("main", key))
    forged["p99_ms"] = 0.1
    tamper(local_lake, key, json.dumps(forged).encode())

    with pytest.raises(
        CertificateError, match=r"report engine_benchmark .* changed after certification \(tampered"
    ):
        verify_certificate(local_lake, "5", public_key)
    # Certifying again refuses too: the report no longer matches the manifest's hash.
    result = certify(instance, resources, "5", raise_on_error=False)
    assert "engine_benchmark" in failure_description(result)


def test_tampered_certificate_breaks_the_signature_check(local_lake, release_keys):
    publish_candidate(local_lake, "6", seed=6, failing=[])
    certify_candidate(local_lake, "6", release_keys.certificate_signer(), root_run_id="cert-6")
    public_key = release_keys.certificate_public_key()
    document = json.loads(local_lake.get_object("main", candidate_certificate_key("6")))

    forged = json.loads(json.dumps(document))
    forged["certificate"]["dataset_commit"] = "some-other-commit"
    tamper(local_lake, candidate_certificate_key("6"), json.dumps(forged).encode())
    with pytest.raises(CertificateError, match="bad signature"):
        verify_certificate(local_lake, "6", public_key)

    tamper(local_lake, candidate_certificate_key("6"), json.dumps(document).encode())
    assert verify_certificate(local_lake, "6", public_key)["model_version"] == "6"
    stranger = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(CertificateError, match="signed by unknown key"):
        verify_certificate(local_lake, "6", stranger)
    with pytest.raises(CertificateError, match="model version 7 is not certified"):
        verify_certificate(local_lake, "7", public_key)


def test_a_candidate_that_was_never_published_is_refused_on_every_gate(local_lake):
    evidence = collect_evidence(local_lake, "8")

    assert not evidence.passed
    assert {failure.gate for failure in evidence.failures} == {"artifacts", *ALL_GATES}
    assert "candidate manifest missing (candidates/8/manifest.json)" in str(
        CertificationRefused("8", evidence.failures)
    )
