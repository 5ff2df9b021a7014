"""Lake states for the shadow, rollout, telemetry and drift tests, built the way the loop does.

Fleet logs are anonymized and tabled with the ingest layer's own functions and published to
``main`` at the keys the views read; candidates are published with manifest and passing gate
reports and *certified* with the real signer; engines are real ONNX files on onnxruntime:

* ``cautious``: confident, sees a lead 22 m ahead and every lane occupied → always SLOWER;
* ``reckless``: confident, sees an empty road → accelerates;
* ``bootstrap``: the seeded untrained network (model zero), near-zero confidence → the planner
  falls back on every frame — the deliberately bad candidate.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.ingest.tables import frames_table, scene_index_table, trigger_rule_names
from aiinfra_pipelines.lake.io_manager import LakeIOManager, asset_object_base, parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.certificate_evidence import required_gates
from aiinfra_pipelines.release.keys import ReleaseKeys
from aiinfra_pipelines.release.reference import REFERENCE_GATES
from aiinfra_pipelines.release.rollout import production_pointer
from aiinfra_pipelines.training.resources import MlflowTracking

ANON_KEY_HEX = "ab" * 32
ANON_KEY = bytes.fromhex(ANON_KEY_HEX)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def as_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def publish(lake: VersionedLake, objects: dict[str, bytes], message: str) -> str:
    return publish_objects(lake, f"test-{uuid.uuid4().hex[:12]}", objects, message, {})


# ------------------------------------------------------------------------------------ engines
@cache
def constant_engine_bytes(occupancy_logit: float, lead_gap_fraction: float) -> bytes:
    """A real PerceptionNet whose heads ignore the image: fixed, confident output."""
    import torch

    from aiinfra_pipelines.perception.network import PerceptionNet
    from aiinfra_pipelines.perception.onnx_export import export_onnx

    torch.manual_seed(0)
    net = PerceptionNet(perception_spec()).eval()
    with torch.no_grad():
        net.occupancy_head.weight.zero_()
        net.occupancy_head.bias.fill_(occupancy_logit)
        net.lead_gap_head.weight.zero_()
        net.lead_gap_head.bias.fill_(float(np.log(lead_gap_fraction / (1 - lead_gap_fraction))))
    return export_onnx(net)


def cautious_engine_bytes() -> bytes:
    return constant_engine_bytes(6.0, 0.3)


def reckless_engine_bytes() -> bytes:
    return constant_engine_bytes(-6.0, 0.999)


@cache
def network_engine_bytes(seed: int) -> bytes:
    """An untrained, seeded PerceptionNet: image-dependent, unconfident (seed 0 = model zero)."""
    from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx

    return export_onnx(bootstrap_network(perception_spec(), seed=seed))


# --------------------------------------------------------------------------------- fleet logs
def synthetic_logs(count: int, frames: int = 12, first_seed: int = 0, **overrides) -> list:
    """Valid drive logs with camera frames of the perception input size."""
    spec = perception_spec()
    return [
        make_synthetic_log(
            frames,
            seed=first_seed + index,
            image_height=spec.image_height,
            image_width=spec.image_width,
            **overrides,
        )
        for index in range(count)
    ]


def publish_logs(lake: VersionedLake, logs: Sequence[DriveLog], batch: str = "test") -> list[str]:
    """Publish ``anonymized_frames`` + ``scene_index`` partitions for ``logs`` to main."""
    objects: dict[str, bytes] = {}
    partitions = []
    for log in logs:
        partition = f"ingest-{batch}/logs/{log.log_id}.mcap"
        anonymous = anonymize_log(log, ANON_KEY)
        frames = frames_table(anonymous)
        frames_key = asset_object_base(dg.AssetKey("anonymized_frames"), partition) + ".parquet"
        tags = {k: v for k, v in anonymous.metadata.items() if k != "vin"}
        index = scene_index_table(
            frames,
            tags=tags,
            events=[(event.timestamp_ns, event.rule) for event in log.events],
            rule_names=trigger_rule_names(),
            source_branch=f"ingest-{batch}",
            source_commit="0" * 64,
            log_key=f"logs/{log.log_id}.mcap",
            frames_object=frames_key,
        )
        objects[frames_key] = parquet_bytes(frames)
        objects[asset_object_base(dg.AssetKey("scene_index"), partition) + ".parquet"] = (
            parquet_bytes(index)
        )
        partitions.append(partition)
    publish(lake, objects, f"fleet logs {batch}")
    return partitions


# --------------------------------------------------------------------------------- candidates
def publish_candidate(
    lake: VersionedLake,
    model_version: str,
    engine: bytes,
    keys: ReleaseKeys,
    reference_version: str | None = None,
) -> dict[str, Any]:
    """A published candidate with passing gate reports, certified and signed; its manifest.

    ``reference_version``: the release its gates judged it against (recorded by the reports
    that compare with one, as offline_eval and regression_simulation do)."""
    base = f"candidates/{model_version}"
    objects = {f"{base}/fp32.onnx": engine, f"{base}/int8.onnx": engine}
    reports = {}
    for gate in required_gates():
        report = {
            "gate": gate,
            "model_version": model_version,
            "passed": True,
            "gates_sha256": gate_rules().sha256,  # judged under the rules in force
        }
        if reference_version is not None and gate in REFERENCE_GATES:
            report["reference_version"] = reference_version
        data = as_bytes(report)
        objects[f"{base}/reports/{gate}.json"] = data
        reports[gate] = {"key": f"{base}/reports/{gate}.json", "sha256": sha(data), "passed": True}
    entry = {"key": f"{base}/int8.onnx", "sha256": sha(engine), "bytes": len(engine)}
    manifest = {
        "model_version": model_version,
        "registered_model": "perception",
        "mlflow_run_id": f"run-{model_version}",
        "model_uri": f"runs:/run-{model_version}/model",
        "dataset_version": "dataset-v0001",
        "dataset_commit": "",
        "code_version": "test",
        "onnx": {"key": f"{base}/fp32.onnx", "sha256": sha(engine)},
        "engines": {"int8": entry},
        "ship": {
            **{k: entry[k] for k in ("key", "sha256")},
            "precision": "int8",
            "target": "cpu-onnxruntime",
        },
        "reports": reports,
    }
    objects[f"{base}/manifest.json"] = as_bytes(manifest)
    objects["candidates/latest.json"] = as_bytes({"model_version": model_version})
    publish(lake, objects, f"candidate {model_version}")
    certify_candidate(
        lake, model_version, keys.certificate_signer(), root_run_id=f"cert-{uuid.uuid4().hex[:8]}"
    )
    return manifest


def set_production(lake: VersionedLake, manifest: dict[str, Any]) -> dict[str, Any]:
    pointer = production_pointer(manifest, lake.resolve_ref(MAIN_BRANCH))
    publish(lake, {PRODUCTION_POINTER_KEY: as_bytes(pointer)}, "production pointer")
    return pointer


@cache
def _registry_template(count: int) -> Path:
    """An MLflow sqlite store with versions 1..count, built once per process (creating the
    schema takes seconds; copying the file takes none)."""
    from mlflow import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
    atexit.register(shutil.rmtree, folder, True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("perception")
    for index in range(1, count + 1):
        client.create_model_version("perception", source=f"runs:/run-{index}/model")
    return folder / "mlflow.db"


def register_versions(tracking_uri: str, count: int) -> None:
    """Registered-model versions 1..count of ``perception`` (as trained_model registers them)
    in the sqlite store at ``tracking_uri``, which must not exist yet."""
    path = Path(tracking_uri.removeprefix("sqlite:///"))
    if path.exists():
        raise FileExistsError(f"{path} exists; register_versions creates a fresh store")
    shutil.copyfile(_registry_template(count), path)


def release_resources(lake: VersionedLake, workdir: Path, tracking_uri: str) -> dict[str, Any]:
    return {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "anonymization": AnonymizationKey(key_hex=ANON_KEY_HEX),
        "mlflow_tracking": MlflowTracking(
            tracking_uri=tracking_uri, checkpoint_root=str(workdir / "checkpoints")
        ),
        "release_keys": ReleaseKeys(dev_keys_dir=str(workdir / "keys")),
    }


def materialized(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    """The materialization metadata of ``asset`` in ``result``, as plain values."""
    for event in result.get_asset_materialization_events():
        if event.asset_key.path == [asset]:
            return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


# ---------------------------------------------------------------------------------- telemetry
def fleet_vins(count: int) -> list[str]:
    from aiinfra_pipelines.fleet.vehicles import build_fleet

    return [vehicle.vin for vehicle in build_fleet(count)]


def telemetry_records(
    engine_sha256: str,
    vins: Sequence[str],
    *,
    frames: int = 100,
    fallback_share: float = 0.0,
    collisions: int = 0,
    near_misses: int = 0,
    latency_ms: float = 5.0,
    confidence: float = 0.9,
    cohort: str = "control",
    tag: str = "w0",
    at_fault_collisions: int | None = None,
) -> list[dict[str, Any]]:
    """One vehicle-side record per VIN, built by the telemetry agent's own function; the
    collisions (all at fault unless ``at_fault_collisions`` says otherwise) go to the first."""
    from aiinfra_pipelines.operations.telemetry import telemetry_record

    fallback = round(frames * fallback_share)
    records = []
    for index, vin in enumerate(vins):
        records.append(
            telemetry_record(
                record_id=f"{vin}-{tag}",
                vin=vin,
                vehicle_model="sedan-a" if index % 2 == 0 else "suv-b",
                software_version="v-" + engine_sha256[:8],
                engine_sha256=engine_sha256,
                cohort=cohort,
                recorded_at="2024-06-03T06:00:00+00:00",
                latencies_ms=np.linspace(latency_ms * 0.8, latency_ms * 1.05, frames),
                confidences=np.full(frames, confidence),
                fallback_flags=[i < fallback for i in range(frames)],
                near_misses=near_misses,
                collisions=collisions if index == 0 else 0,
                at_fault_collisions=(
                    None if at_fault_collisions is None or index else at_fault_collisions
                ),
            )
        )
    return records


def published_records(records: Sequence[dict[str, Any]], batch: str = "ingest-b") -> Any:
    """``records`` as ``fleet_telemetry`` publishes them (validated, pseudonymized)."""
    from aiinfra_pipelines.operations.telemetry_intake import validate_uploads

    data = json.dumps(list(records)).encode()
    batch_result = validate_uploads(
        [("telemetry/uploads/x/records.json", data)],
        batch_id=batch,
        source_commit="c" * 64,
        key=ANON_KEY,
    )
    assert batch_result.quarantined.empty, batch_result.quarantined.to_dict(orient="records")
    return batch_result.accepted


# ------------------------------------------------------------------------------ release world
def build_release_world(
    workdir: Path, candidate_engine: bytes, logs: int = 6, frames: int = 20
) -> dict[str, Any]:
    """Published fleet logs, production v1 (cautious, certified, pointer + alias) and a
    certified candidate v2 registered in MLflow (candidate alias), ready for shadow."""
    from aiinfra_pipelines.lake.local import LocalLake
    from aiinfra_pipelines.release.registry import CANDIDATE_ALIAS, PRODUCTION_ALIAS, ModelRegistry

    lake = LocalLake(root=str(workdir / "lake"))
    lake.ensure_repository()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    register_versions(uri, 2)
    resources = release_resources(lake, workdir, uri)
    publish_logs(lake, synthetic_logs(logs, frames=frames))
    v1 = publish_candidate(lake, "1", cautious_engine_bytes(), resources["release_keys"])
    pointer = set_production(lake, v1)
    v2 = publish_candidate(lake, "2", candidate_engine, resources["release_keys"])
    registry = ModelRegistry(uri)
    registry.set_alias(PRODUCTION_ALIAS, "1")
    registry.set_alias(CANDIDATE_ALIAS, "2")
    return {
        "lake": lake,
        "resources": resources,
        "uri": uri,
        "registry": registry,
        "manifests": {"1": v1, "2": v2},
        "production_pointer": pointer,
    }


def materialize_telemetry(instance, resources, batch: str, records) -> dict[str, Any]:
    """Land ``records`` on ``ingest-<batch>`` and publish them with ``fleet_telemetry``."""
    from aiinfra_pipelines.operations.assets import fleet_telemetry, telemetry_batches
    from aiinfra_pipelines.operations.landing import land_telemetry

    landed = land_telemetry(resources["lake"], batch, records)
    instance.add_dynamic_partitions(telemetry_batches.name, [landed.branch])
    result = dg.materialize(
        [fleet_telemetry], instance=instance, resources=resources, partition_key=landed.branch
    )
    return materialized(result, "fleet_telemetry")


# Cohorts at 3 at-fault collisions and 3 near misses per 1,000 frames, 20,000 frames a car:
# exposure enough for gates.yaml's sequential rollout tests to show an equal engine
# non-inferior in one batch (a demo-sized batch keeps collecting, as it should).
STEADY_FRAMES = 20_000


def steady_fleet_records(
    candidate_sha: str,
    production_sha: str,
    candidate_vins: Sequence[str],
    control_vins: Sequence[str],
    *,
    tag: str,
    candidate_rate_factor: float = 1.0,
) -> list[dict[str, Any]]:
    """One batch of both cohorts driving at the same event rates (the candidate's at-fault
    collisions ``candidate_rate_factor`` times the control's)."""
    per_car = 3 * STEADY_FRAMES // 1000
    return telemetry_records(
        candidate_sha,
        candidate_vins,
        frames=STEADY_FRAMES,
        cohort="candidate",
        tag=tag,
        collisions=round(per_car * len(candidate_vins) * candidate_rate_factor),
        near_misses=per_car,
    ) + telemetry_records(
        production_sha,
        control_vins,
        frames=STEADY_FRAMES,
        tag=tag,
        collisions=per_car * len(control_vins),
        near_misses=per_car,
    )
