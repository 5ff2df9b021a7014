"""Lake states for the release tests: candidates, reports, datasets, pointers, rollout states.

Everything is written the way the neighbouring layers publish it (``publish_objects`` onto
``main``, formats from ``docs/loop.md``), with real ONNX engines exported from a small
PerceptionNet, so certification, OTA and trace run against what they will meet in the loop.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from aiinfra_pipelines.datasets.manifest import build_manifest
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.layout import PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects

MANIFEST_GATES = ("offline_eval", "engine_parity", "engine_benchmark")
REGRESSION_GATE = "regression_simulation"
ALL_GATES = (*MANIFEST_GATES, REGRESSION_GATE)
SHIP_TARGET = "cpu-onnxruntime"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def as_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


@cache
def onnx_pair(seed: int) -> tuple[bytes, bytes]:
    """(fp32 ONNX, shipped engine) of a seeded PerceptionNet: two real, distinct ONNX files."""
    from aiinfra_pipelines.perception.contract import perception_spec
    from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx

    net = bootstrap_network(perception_spec(), seed=seed)
    return export_onnx(net), export_onnx(net, opset=16)


def publish(lake: VersionedLake, objects: dict[str, bytes], message: str) -> str:
    return publish_objects(lake, f"test-{uuid.uuid4().hex[:12]}", objects, message, {})


def publish_dataset(
    lake: VersionedLake, version: str, source_commits: list[str]
) -> tuple[str, dict[str, Any]]:
    """A training dataset manifest (the real ``build_manifest``) published and tagged."""
    frames = pd.DataFrame(
        {
            "log_id": ["log-a", "log-a", "log-b", "log-c"],
            "slice": ["day/clear/highway"] * 4,
            "split": ["train", "train", "train", "val"],
        }
    )
    manifest = build_manifest(
        frames, source_commits=source_commits, label_qc={"mean_agreement": 0.98}, version=version
    )
    commit = publish(
        lake,
        {f"datasets/training/{version}/manifest.json": as_bytes(manifest)},
        f"dataset {version}",
    )
    lake.create_tag(version, commit)
    return commit, manifest


def report(gate: str, model_version: str, passed: bool, **extra: Any) -> bytes:
    """A gate report as the gate publishes it, judged under the gate rules in force."""
    return as_bytes(
        {
            "gate": gate,
            "model_version": model_version,
            "passed": passed,
            "gates_sha256": gate_rules().sha256,
            **extra,
        }
    )


def publish_candidate(
    lake: VersionedLake,
    model_version: str,
    *,
    seed: int,
    dataset_version: str = "dataset-v0001",
    dataset_commit: str = "",
    failing: Iterable[str] = (),
    missing: Iterable[str] = (),
    report_version_override: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What ``published_engine`` and ``regression_report`` put on ``main`` for a candidate."""
    failing, missing = set(failing), set(missing)
    overrides = report_version_override or {}
    fp32, engine = onnx_pair(seed)
    base = f"candidates/{model_version}"
    objects = {f"{base}/fp32.onnx": fp32, f"{base}/int8.onnx": engine}
    reports: dict[str, dict[str, Any]] = {}
    for gate in MANIFEST_GATES:
        data = report(
            gate,
            overrides.get(gate, model_version),
            gate not in failing,
            failures=[f"{gate} budget exceeded"] if gate in failing else [],
        )
        key = f"{base}/reports/{gate}.json"
        reports[gate] = {"key": key, "sha256": sha(data), "passed": gate not in failing}
        if gate not in missing:
            objects[key] = data
    manifest = {
        "model_version": model_version,
        "registered_model": "perception",
        "mlflow_run_id": f"run-{model_version}",
        "model_uri": f"runs:/run-{model_version}/model",
        "dataset_version": dataset_version,
        "dataset_commit": dataset_commit,
        "code_version": "0123abcd",
        "onnx": {"key": f"{base}/fp32.onnx", "sha256": sha(fp32)},
        "engines": {
            "fp32": {"key": f"{base}/fp32.onnx", "sha256": sha(fp32), "bytes": len(fp32)},
            "int8": {"key": f"{base}/int8.onnx", "sha256": sha(engine), "bytes": len(engine)},
        },
        "ship": {
            "precision": "int8",
            "key": f"{base}/int8.onnx",
            "sha256": sha(engine),
            "target": SHIP_TARGET,
        },
        "reports": reports,
    }
    objects[f"{base}/manifest.json"] = as_bytes(manifest)
    objects["candidates/latest.json"] = as_bytes({"model_version": model_version})
    publish(lake, objects, f"candidate {model_version}")
    if REGRESSION_GATE not in missing:
        regression = report(
            REGRESSION_GATE,
            overrides.get(REGRESSION_GATE, model_version),
            REGRESSION_GATE not in failing,
            failures=["badcase-0007 collided (production passes it)"]
            if REGRESSION_GATE in failing
            else [],
        )
        publish(
            lake,
            {f"{base}/reports/{REGRESSION_GATE}.json": regression},
            f"regression report {model_version}",
        )
    return manifest


def tamper(lake: VersionedLake, key: str, data: bytes) -> None:
    """Someone with write access changes an object directly on ``main``."""
    lake.put_object("main", key, data)
    lake.commit("main", f"tamper with {key}")


def set_production(lake: VersionedLake, manifest: dict[str, Any]) -> None:
    """The production pointer as the rollout layer moves it (format in docs/loop.md)."""
    commit = lake.resolve_ref("main")
    publish(
        lake,
        {
            PRODUCTION_POINTER_KEY: as_bytes(
                {
                    "version": manifest["model_version"],
                    "onnx_key": manifest["ship"]["key"],
                    "engine_sha256": manifest["ship"]["sha256"],
                    "commit": commit,
                    "model_uri": manifest["model_uri"],
                }
            )
        },
        f"production is {manifest['model_version']}",
    )


def set_rollout(
    lake: VersionedLake,
    manifest: dict[str, Any],
    *,
    status: str,
    cohort_percent: float,
    salt: str = "salt-1",
    previous_production: str | None = None,
) -> None:
    """A rollout state in the rollout layer's format, and ``current.json`` naming it."""
    version = manifest["model_version"]
    state = {
        "model_version": version,
        "engine_sha256": manifest["ship"]["sha256"],
        "stage_index": 1,
        "stage": f"{cohort_percent:g}%",
        "cohort_percent": cohort_percent,
        "status": status,
        "history": [],
        "approval": None,
        "previous_production": previous_production,
        "cohort_salt": salt,
    }
    publish(
        lake,
        {
            f"release/rollout/{version}.json": as_bytes(state),
            "release/rollout/current.json": as_bytes({"model_version": version}),
        },
        f"rollout {version} {status} {cohort_percent}",
    )


def register_versions(tracking_uri: str, count: int) -> None:
    """Registered-model versions 1..count, as trained_model registers them."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    client.create_registered_model("perception")
    for index in range(1, count + 1):
        client.create_model_version("perception", source=f"runs:/run-{index}/model")


def mlflow_uri(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"
