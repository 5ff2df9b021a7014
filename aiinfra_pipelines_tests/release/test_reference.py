"""The reference release: what a new candidate starts from and is gated against."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aiinfra_pipelines.lake.layout import (
    CURRENT_ROLLOUT_KEY,
    PRODUCTION_POINTER_KEY,
    candidate_manifest_key,
    rollout_state_key,
)
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_with_run_branch
from aiinfra_pipelines.release.reference import reference_release
from aiinfra_pipelines.release.rollout import new_rollout_state
from aiinfra_pipelines.release.rollout_state import IN_PROGRESS, ROLLED_BACK

PRODUCTION = {
    "version": "1",
    "onnx_key": "candidates/1/int8.onnx",
    "engine_sha256": "b" * 64,
    "commit": "m0",
    "model_uri": "models:/m-1",
}


def _bytes(document: dict) -> bytes:
    return json.dumps(document).encode()


def _rollout(lake: LocalLake, version: str, status: str) -> None:
    manifest = {
        "model_version": version,
        "ship": {"key": f"candidates/{version}/int8.onnx", "sha256": "c" * 64},
        "model_uri": f"models:/m-{version}",
    }
    state = new_rollout_state(
        version,
        "c" * 64,
        engine_key=manifest["ship"]["key"],
        model_uri=manifest["model_uri"],
        production=PRODUCTION,
        production_engine_sha256=PRODUCTION["engine_sha256"],
        shadow={"passed": True},
        at="2026-12-03T00:00:00+00:00",
    )
    state = replace(state, status=status)
    publish_with_run_branch(
        lake,
        f"run-{version}-{status}",
        {
            candidate_manifest_key(version): _bytes(manifest),
            rollout_state_key(version): _bytes(state.to_json()),
            CURRENT_ROLLOUT_KEY: _bytes({"model_version": version}),
        },
        f"rollout {version} {status}",
        {},
    )


@pytest.fixture
def lake(tmp_path) -> LocalLake:
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    return lake


def test_no_release_yet_means_no_reference(lake: LocalLake) -> None:
    assert reference_release(lake) is None


def test_production_is_the_reference_when_nothing_rolls_out(lake: LocalLake) -> None:
    publish_with_run_branch(lake, "run-p", {PRODUCTION_POINTER_KEY: _bytes(PRODUCTION)}, "p", {})
    reference = reference_release(lake)
    assert reference["version"] == "1" and reference["source"] == "production"


def test_the_release_rolling_out_is_the_reference_but_never_its_own(lake: LocalLake) -> None:
    publish_with_run_branch(lake, "run-p", {PRODUCTION_POINTER_KEY: _bytes(PRODUCTION)}, "p", {})
    _rollout(lake, "2", IN_PROGRESS)
    reference = reference_release(lake)
    assert reference["version"] == "2" and reference["source"] == "rollout"
    assert reference["model_uri"] == "models:/m-2"
    assert reference["onnx_key"] == "candidates/2/int8.onnx"
    # Re-judging version 2 itself compares it with production, not with itself.
    assert reference_release(lake, excluding="2")["version"] == "1"


def test_a_rolled_back_release_is_no_reference(lake: LocalLake) -> None:
    _rollout(lake, "2", ROLLED_BACK)
    assert reference_release(lake) is None
