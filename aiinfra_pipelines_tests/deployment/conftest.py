"""Shared, session-scoped deployment fixtures: real fleet frames, a trained network, its ONNX."""

from __future__ import annotations

import copy
import os

import pandas as pd
import pytest

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

# The budget section the plain-function tests gate with: explicit here, so an operator editing
# gates.yaml cannot change what these tests prove.
QUANTIZATION_BUDGETS: dict = {
    "min_slice_frames": 20,
    "budgets": {
        "occupancy_accuracy": 0.015,
        "occupancy_f1": 0.03,
        "lead_gap_mae_m": 0.75,
        "occupancy_agreement": 0.03,
        "lead_gap_diff_m": 1.0,
    },
    "slice_overrides": {},
    "max_fp32_nodes": 4,
}
OUTLIER_PRODUCER = "/features/features.1/features.1.0/Conv"
OUTLIER_CONSUMER = "/features/features.2/features.2.0/Conv"


@pytest.fixture(scope="session")
def fleet() -> pd.DataFrame:
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    return fleet_frames(4, 2, 0)


@pytest.fixture(scope="session")
def split(fleet):
    from aiinfra_pipelines_tests.support.trained_networks import split_logs

    return split_logs(fleet)


@pytest.fixture(scope="session")
def calibration(split):
    """256 real training frames covering every condition (what calibration_set provides)."""
    from aiinfra_pipelines_tests.support.trained_networks import labelled, sample

    return labelled(sample(split[0], 256))


@pytest.fixture(scope="session")
def held_out(split):
    from aiinfra_pipelines_tests.support.trained_networks import labelled

    return labelled(split[1])


@pytest.fixture(scope="session")
def network(split):
    from aiinfra_pipelines_tests.support.trained_networks import labelled, train_network

    return train_network(labelled(split[0]), epochs=4)


@pytest.fixture(scope="session")
def exported(network, calibration):
    from aiinfra_pipelines.deployment.export import export_checked_onnx

    return export_checked_onnx(network, calibration.head(32).inputs(), tolerance=1e-4, opset=17)


@pytest.fixture(scope="session")
def outlier_network(network):
    """The trained network with one activation channel scaled x1000 and compensated downstream.

    In FP32 nothing changes (ReLU is positively homogeneous, the next conv has no bias); in INT8
    the per-tensor activation scale of that tensor grows 1000-fold and every other channel of it
    rounds to zero — the textbook outlier channel that must fall back to FP32.
    """
    import torch

    net = copy.deepcopy(network)
    factor = 1000.0
    with torch.no_grad():
        norm = net.features[1][1]
        norm.weight[0] *= factor
        norm.bias[0] *= factor
        net.features[2][0].weight[:, 0] /= factor
    return net.eval()


@pytest.fixture(scope="session")
def outlier_onnx(outlier_network, calibration) -> bytes:
    from aiinfra_pipelines.deployment.export import export_checked_onnx

    # The compensation is exact in real numbers; float32 rounding of the x1000 path allows 1e-3.
    return export_checked_onnx(
        outlier_network, calibration.head(32).inputs(), tolerance=1e-3, opset=17
    ).onnx_bytes


@pytest.fixture(scope="session")
def settings():
    from aiinfra_pipelines.deployment.settings import DeploymentSettings

    return DeploymentSettings.load()
