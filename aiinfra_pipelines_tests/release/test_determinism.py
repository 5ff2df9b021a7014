"""Certification's determinism check on real engines: onnxruntime passes bit for bit, an engine
whose runtime adds noise (a real backend, registered like any plugin) is refused, naming why."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aiinfra_pipelines.deployment.backends import BACKENDS, EngineBackend, register_backend
from aiinfra_pipelines.lake.layout import candidate_certificate_key
from aiinfra_pipelines.perception.contract import (
    PerceptionSpec,
    images_to_input,
    perception_spec,
)
from aiinfra_pipelines.perception.engine import (
    OnnxRuntimeEngine,
    Predictions,
    outputs_to_predictions,
)
from aiinfra_pipelines.release.certificate import (
    CertificationRefused,
    certify_candidate,
    verify_certificate,
)
from aiinfra_pipelines.release.certificate_evidence import collect_evidence
from aiinfra_pipelines.release.determinism import (
    DeterminismSettings,
    check_engine,
    check_frames,
    outputs_sha256,
)
from aiinfra_pipelines_tests.support.release_lake import (
    SHIP_TARGET,
    onnx_pair,
    publish_candidate,
)

NOISY = "noisy-onnxruntime"
SETTINGS = DeterminismSettings.load()


class NoisyEngine:
    """onnxruntime plus a tiny unseeded perturbation of every output: what a runtime with
    racing reductions or GPU atomics looks like from outside (differences of ~1e-6)."""

    def __init__(self, onnx_bytes: bytes, spec: PerceptionSpec, **options) -> None:
        self.inner = OnnxRuntimeEngine(onnx_bytes, spec, **options)
        self.name, self.sha256, self.spec = self.inner.name, self.inner.sha256, spec
        self.rng = np.random.default_rng()  # fresh entropy: no two sessions agree

    def run_raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        occupancy, lead_gap = self.inner.run_raw(batch)
        jitter = self.rng.normal(0.0, 1e-6, size=occupancy.shape).astype(occupancy.dtype)
        return occupancy + jitter, lead_gap

    def infer(self, images: np.ndarray) -> Predictions:
        return outputs_to_predictions(*self.run_raw(images_to_input(images)), self.spec)


def _create_noisy(onnx_bytes, spec, *, precision, name, batch_size=1, intra_op_threads=0, **_):
    return NoisyEngine(
        onnx_bytes, spec, name=name, batch_size=batch_size, intra_op_threads=intra_op_threads
    )


@pytest.fixture
def noisy_backend() -> Iterator[DeterminismSettings]:
    register_backend(EngineBackend(NOISY, lambda: (True, "test backend"), _create_noisy))
    try:
        yield dataclasses.replace(SETTINGS, backend=NOISY)
    finally:
        BACKENDS.pop(NOISY, None)


def test_the_repository_settings_fix_threads_and_compare_several_runs():
    assert SETTINGS.runs >= 2 and SETTINGS.intra_op_threads >= 1 and SETTINGS.backend is None


def test_an_onnxruntime_engine_gives_bit_identical_outputs_in_fresh_sessions():
    _, shipped = onnx_pair(11)
    result = check_engine(shipped, perception_spec(), runtime_target=SHIP_TARGET)
    assert result.deterministic, result.reason
    assert (result.backend, result.runs, result.frames) == ("onnxruntime", 2, SETTINGS.frames)
    assert len(set(result.output_sha256)) == 1 and result.max_abs_difference == 0.0
    assert result.reason == ""
    # The frames are the same every time, and the digest sees a single flipped bit.
    frames = check_frames(perception_spec(), 2, SETTINGS.seed)
    assert np.array_equal(frames, check_frames(perception_spec(), 2, SETTINGS.seed))
    flipped = frames.copy()
    flipped[0, 0, 0, 0] ^= 1
    assert outputs_sha256([frames]) != outputs_sha256([flipped])


def test_a_noisy_engine_is_refused_with_the_reason(noisy_backend):
    _, shipped = onnx_pair(11)
    result = check_engine(
        shipped, perception_spec(), runtime_target=SHIP_TARGET, settings=noisy_backend
    )
    assert not result.deterministic and result.backend == NOISY
    assert len(set(result.output_sha256)) == SETTINGS.runs
    assert 0.0 < result.max_abs_difference < 1e-4
    assert result.reason.startswith("not deterministic: run(s) [1] of 2")
    assert "1 intra-op thread(s), sequential execution, fresh sessions" in result.reason


def test_an_engine_of_an_unknown_target_cannot_be_checked_and_is_refused():
    _, shipped = onnx_pair(11)
    result = check_engine(shipped, perception_spec(), runtime_target="toaster-npu")
    assert not result.deterministic and result.runs == 0
    assert "no deployment target has runtime_target 'toaster-npu'" in result.reason


def test_certification_records_the_check_and_refuses_a_nondeterministic_engine(
    local_lake, noisy_backend
):
    publish_candidate(local_lake, "7", seed=7)
    signer = Ed25519PrivateKey.generate()

    evidence = collect_evidence(local_lake, "7", determinism=noisy_backend)
    assert [failure.gate for failure in evidence.failures] == ["determinism"]
    with pytest.raises(CertificationRefused) as refused:
        certify_candidate(
            local_lake, "7", signer, root_run_id="certify-7", determinism=noisy_backend
        )
    assert refused.value.failed_gates == ["determinism"]
    assert "determinism: not deterministic" in str(refused.value)
    assert not local_lake.object_exists("main", candidate_certificate_key("7"))

    outcome = certify_candidate(local_lake, "7", signer, root_run_id="certify-7b")
    recorded = outcome.certificate["determinism"]
    assert recorded["deterministic"] is True and recorded["backend"] == "onnxruntime"
    assert recorded["runs"] == SETTINGS.runs and len(set(recorded["output_sha256"])) == 1
    assert verify_certificate(local_lake, "7", signer.public_key())["determinism"] == recorded
    # Certifying again finds the same evidence, determinism included: the certificate stands.
    assert certify_candidate(local_lake, "7", signer, root_run_id="certify-7c").reused
