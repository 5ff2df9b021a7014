"""The deployment group through ``dg.materialize`` on a real lake state.

One fleet batch is driven, ingested, mined and trained on (a short training: this tests the
deployment, not the learning), then the deployment group runs three times: first with a parity
budget no engine the target may run can meet (a tightened gates.yaml under
``AIINFRA_RESOURCES``), which must leave ``main`` without the candidate; then, on a copy of that
lake, with a budget only INT8 breaks, which must ship FP16; then with the project's gates, which
must publish the INT8 engine. Slow.
"""

from __future__ import annotations

import hashlib
import io
import shutil

import dagster as dg
import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.deployment.frames import labelled_frames
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.lake.layout import LATEST_CANDIDATE_KEY, MAIN_BRANCH, candidate_manifest_key
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines_tests.support.loop_runs import (
    ingest_and_mine,
    loop_resources,
    run_deployment,
    run_training_cycle,
)

pytestmark = pytest.mark.slow

CANDIDATE_FILES = ("fp32.onnx", "fp16.onnx", "int8.onnx", "manifest.json")
REPORTS = ("offline_eval", "engine_parity", "engine_benchmark")
# gates.yaml deployment.latency.cpu-ci in these tests; memory keeps the project's budget.
UNTIMED_LATENCY_BUDGET = {"p99_ms_batch1": 1.0e6, "min_throughput_fps": 1.0e-6}


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        if event.asset_key.path == [asset]:
            return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    return {}


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _resources_copy(target, edit) -> None:
    """A copy of resources/ with ``edit(name, mapping)`` applied to its YAML files."""
    shutil.copytree(resources_dir(), target, dirs_exist_ok=True)
    for name in ("training.yaml", "gates.yaml", "deployment.yaml"):
        path = target / name
        loaded = yaml.safe_load(path.read_text())
        edit(name, loaded)
        path.write_text(yaml.safe_dump(loaded, sort_keys=False))


def _short_training(name: str, config: dict) -> None:
    if name == "training.yaml":
        config["max_epochs"] = 3
        config["data"]["num_workers"] = 0
    if name == "gates.yaml":
        # Three epochs on eight drives: deployment is under test, not whether such a model
        # beats the no-camera baselines (the first-release gate has its own tests).
        config["offline"]["first_release"] = None
        # The latency gate is blocking, and a shared CI runner's timings say nothing about the
        # engine: held to limits no machine misses, the verdict depends on the engines alone
        # (the gate's arithmetic is test_benchmark.py's; speed is benchmarks/engines.py's).
        config["deployment"]["latency"]["cpu-ci"].update(UNTIMED_LATENCY_BUDGET)


def _zero_tolerance_parity(name: str, config: dict) -> None:
    _short_training(name, config)
    if name == "gates.yaml":
        # Not a single metre of lead-gap difference from FP32: no reduced-precision engine can.
        config["deployment"]["parity"]["budgets"]["lead_gap_diff_m"] = 0.0
    if name == "deployment.yaml":
        # FP32 always holds against itself: a target that may run it would ship it. This one,
        # like a car, runs INT8 or FP16 only, so nothing it may ship holds.
        config["targets"]["cpu-ci"]["ship_precisions"] = ["int8", "fp16"]


def _int8_loses_a_slice(name: str, config: dict) -> None:
    _short_training(name, config)
    if name == "gates.yaml":
        # A centimetre of mean lead-gap difference: FP16 stays within it (at most 3.2 mm per
        # gated row on this candidate), INT8 does not (5.6 to 75 cm). The quantization gate
        # keeps its own budget, so INT8 is built and then loses the parity gate.
        config["deployment"]["parity"]["budgets"]["lead_gap_diff_m"] = 0.01


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("deploy")
    (workdir / "home").mkdir()
    lake = LocalLake(root=str(workdir / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, workdir)
    short, strict = workdir / "resources-short", workdir / "resources-strict"
    mid = workdir / "resources-int8-loses"
    _resources_copy(short, _short_training)
    _resources_copy(strict, _zero_tolerance_parity)
    _resources_copy(mid, _int8_loses_a_slice)
    with (
        dg.instance_for_test(temp_dir=str(workdir / "home")) as instance,
        pytest.MonkeyPatch.context() as env,
    ):
        env.setenv("AIINFRA_RESOURCES", str(short))
        # Twelve drives that cover every lighting, weather and road type, a day slice and a
        # night slice driven twice each (so the benchmark holds a whole drive of each the
        # model never trained on): a small real lake state the calibration and benchmark sets
        # accept, whose three-epoch candidate PTQ holds (QAT's path is test_qat.py's). Since
        # datasets hold out whole drives, not logs, the former eight drives (seed 36) left the
        # benchmark two drives of two slices, and their candidate needed QAT.
        ingest_and_mine(instance, resources, "deploy", drive_fleet(4, 3, seed=37))
        training = run_training_cycle(instance, resources)
        assert training.success
        env.setenv("AIINFRA_RESOURCES", str(strict))
        refused = run_deployment(instance, resources, raise_on_error=False)
        candidates_after_refusal = sorted(
            stat.key for stat in lake.list_objects(MAIN_BRANCH, prefix="candidates/")
        )
        # The same lake state, copied: there the candidate's INT8 loses a slice and FP16 ships.
        shutil.copytree(workdir / "lake", workdir / "lake-fp16")
        fp16_lake = LocalLake(root=str(workdir / "lake-fp16"))
        env.setenv("AIINFRA_RESOURCES", str(mid))
        fp16_shipped = run_deployment(instance, loop_resources(fp16_lake, workdir))
        env.setenv("AIINFRA_RESOURCES", str(short))
        published = run_deployment(instance, resources)
        yield {
            "lake": lake,
            "instance": instance,
            "resources": resources,
            "training": training,
            "refused": refused,
            "candidates_after_refusal": candidates_after_refusal,
            "fp16_lake": fp16_lake,
            "fp16_shipped": fp16_shipped,
            "published": published,
            "version": _metadata(training, "trained_model")["model_version"],
        }


def test_a_parity_breach_blocks_the_publish_and_main_never_sees_the_candidate(deployed):
    refused = deployed["refused"]
    assert not refused.success
    checks = _checks(refused)
    assert checks["engine_parity_within_budget"] is False
    evaluation = next(
        e
        for e in refused.get_asset_check_evaluations()
        if e.check_name == "engine_parity_within_budget"
    )
    failures = evaluation.metadata["failures"].value
    assert failures and all("lead_gap_diff_m" in failure for failure in failures), failures
    assert {failure.split()[0] for failure in failures} == {"int8", "fp16"}  # each was judged
    assert evaluation.metadata["ship_precision"].value == "None"
    assert _metadata(refused, "published_engine") == {}
    assert deployed["candidates_after_refusal"] == []


def test_a_candidate_whose_int8_loses_a_slice_ships_fp16_behind_the_same_gates(deployed):
    lake, version, result = deployed["fp16_lake"], deployed["version"], deployed["fp16_shipped"]
    assert result.success and all(_checks(result).values())
    assert _metadata(result, "engine_parity")["ship_precision"] == "fp16"
    manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(version))
    assert manifest["ship"] == {
        "precision": "fp16",
        "key": f"candidates/{version}/fp16.onnx",
        "sha256": manifest["engines"]["fp16"]["sha256"],
        "target": "cpu-onnxruntime",
    }
    options = {option["engine"]: option for option in manifest["selection"]["options"]}
    assert options["int8"]["bytes"] < options["fp16"]["bytes"]  # INT8 would have shipped
    assert options["int8"]["holds"] is False and options["int8"]["failures"]
    assert all("lead_gap_diff_m" in failure for failure in options["int8"]["failures"])
    assert options["fp16"]["holds"] is True and manifest["selection"]["choice"] == "fp16"
    assert "int8" in manifest["engines"]  # built and kept beside the others, not shipped
    bench = lake.get_json(MAIN_BRANCH, manifest["reports"]["engine_benchmark"]["key"])
    assert bench["ship_precision"] == "fp16" and bench["passed"] is True
    parity = lake.get_json(MAIN_BRANCH, manifest["reports"]["engine_parity"]["key"])
    assert parity["passed"] is True and parity["failures"] == []
    assert parity["engines"]["int8"]["failures"] == options["int8"]["failures"]


def test_the_published_candidate_is_on_main_as_docs_loop_specifies(deployed):
    lake, version = deployed["lake"], deployed["version"]
    published = deployed["published"]
    assert published.success and all(_checks(published).values())
    assert lake.get_json(MAIN_BRANCH, LATEST_CANDIDATE_KEY)["model_version"] == version
    manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(version))
    for name in CANDIDATE_FILES:
        assert lake.object_exists(MAIN_BRANCH, f"candidates/{version}/{name}")
    training = _metadata(deployed["training"], "trained_model")
    assert manifest["model_version"] == version and manifest["registered_model"] == "perception"
    assert manifest["mlflow_run_id"] == training["mlflow_run_id"]
    assert manifest["dataset_commit"] == training["dataset_commit"]
    for precision, entry in manifest["engines"].items():
        stored = lake.get_object(MAIN_BRANCH, entry["key"])
        assert entry["key"] == f"candidates/{version}/{precision}.onnx"
        assert (
            hashlib.sha256(stored).hexdigest() == entry["sha256"] and len(stored) == entry["bytes"]
        )
    assert manifest["onnx"]["sha256"] == manifest["engines"]["fp32"]["sha256"]
    assert manifest["ship"] == {
        "precision": "int8",
        "key": f"candidates/{version}/int8.onnx",
        "sha256": manifest["engines"]["int8"]["sha256"],
        "target": "cpu-onnxruntime",
    }
    # INT8 is the smallest engine and holds every slice: engine_parity chose it.
    assert manifest["selection"]["choice"] == "int8"
    assert manifest["selection"]["allowed"] == ["int8", "fp16", "fp32"]
    assert {o["engine"]: o["holds"] for o in manifest["selection"]["options"]}["int8"] is True
    plan = manifest["engines"]["int8"]["precision_plan"]
    assert plan["path"] == "ptq" and "qat" not in plan  # PTQ held: QAT never ran
    # cpu-ci's INT8 takes the camera's bytes, checked bit-identical when it was rewritten.
    assert plan["quantization"]["camera_input"] is True
    assert plan["camera_input"]["applied"] is True
    assert "bit-identical" in plan["camera_input"]["note"]
    assert plan["passed"] and plan["steps"][-1]["passed"]
    assert set(plan["fp32_nodes"]) <= set(plan["candidates"]) and plan["int8_nodes"]
    assert set(manifest["reports"]) == set(REPORTS)
    for gate, entry in manifest["reports"].items():
        stored = lake.get_object(MAIN_BRANCH, entry["key"])
        assert entry["key"] == f"candidates/{version}/reports/{gate}.json"
        assert hashlib.sha256(stored).hexdigest() == entry["sha256"]
        report = lake.get_json(MAIN_BRANCH, entry["key"])
        assert report["passed"] is True and entry["passed"] is True
        assert report["model_version"] == version


def test_reports_hold_the_numbers_behind_the_verdicts(deployed):
    lake, version = deployed["lake"], deployed["version"]
    parity = lake.get_json(MAIN_BRANCH, f"candidates/{version}/reports/engine_parity.json")
    assert set(parity["engines"]) == {"fp16", "int8"}
    gated = [row for row in parity["engines"]["int8"]["comparison"] if row["gated"]]
    assert any(row["slice"] == "night/*/*" for row in gated)
    assert all(row["drop"] <= row["budget"] + 1e-9 for row in gated)
    tensors = parity["layerwise"]["int8"]["tensors"]
    assert tensors and {"tensor", "node", "sqnr_db"} <= set(tensors[0])
    bench = lake.get_json(MAIN_BRANCH, f"candidates/{version}/reports/engine_benchmark.json")
    assert bench["target"] == "cpu-ci" and bench["platform"]["backend"] == "onnxruntime"
    assert bench["passed"] is True and bench["failures"] == []
    assert bench["ship_precision"] == parity["ship_precision"] == "int8"
    assert bench["budget"] == {
        **UNTIMED_LATENCY_BUDGET,
        "max_peak_memory_mb": 512.0,
        "max_macs_per_frame": 2.0e9,
    }
    # The network's cost as the car runs it (both views), counted at export and gated here.
    assert 1e6 < bench["model"]["macs_per_frame"] < bench["budget"]["max_macs_per_frame"]
    for precision in ("fp32", "fp16", "int8"):
        stats = bench["engines"][precision]
        assert stats["iterations"] == 200 and stats["serving_batch"] == 32
        assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"]
        assert stats["throughput_fps"] > 0
        # Measured in a fresh process (memory_probe): weights and arena, far below a process.
        assert stats["memory_kind"] == "host_rss, vmhwm (fresh process)"
        assert 0.5 < stats["peak_memory_mb"] < 256
    offline = lake.get_json(MAIN_BRANCH, f"candidates/{version}/reports/offline_eval.json")
    assert offline["passed"] is True and offline["candidate"]
    # Every report names the gate rules it was judged under (certification requires it).
    judged = {
        lake.get_json(MAIN_BRANCH, f"candidates/{version}/reports/{gate}.json")["gates_sha256"]
        for gate in REPORTS
    }
    assert len(judged) == 1 and len(next(iter(judged))) == 64


def test_the_registry_version_carries_lineage_and_engine_hashes(deployed):
    lake, version = deployed["lake"], deployed["version"]
    manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(version))
    client = mlflow.MlflowClient(tracking_uri=deployed["resources"]["mlflow_tracking"].uri())
    model_version = client.get_model_version("perception", version)
    tags = model_version.tags
    training = _metadata(deployed["training"], "trained_model")
    assert tags["dataset_commit"] == training["dataset_commit"]
    assert tags["dataset_version"] == training["dataset_version"]
    assert tags["mlflow_run_id"] == training["mlflow_run_id"]
    assert tags["dagster_run_id"] == deployed["training"].run_id
    assert tags["code_version"]
    assert tags["onnx_sha256"] == manifest["onnx"]["sha256"]
    assert tags["engine_sha256"] == manifest["ship"]["sha256"]
    assert str(client.get_model_version_by_alias("perception", "candidate").version) == version
    artifacts = [a.path for a in client.list_artifacts(training["mlflow_run_id"], "onnx")]
    assert artifacts == ["onnx/fp32.onnx"]


def test_the_shipped_engine_runs_from_main_and_keeps_its_recorded_accuracy(deployed):
    lake, version = deployed["lake"], deployed["version"]
    manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(version))
    spec = perception_spec()
    engine = OnnxRuntimeEngine(lake.get_object(MAIN_BRANCH, manifest["ship"]["key"]), spec)
    assert engine.sha256 == manifest["ship"]["sha256"]
    assert engine.takes_camera_bytes  # the INT8 engine reads the frames as stored
    benchmark = lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    rows = pd.read_parquet(io.BytesIO(lake.get_object(MAIN_BRANCH, benchmark["frames_key"])))
    frames = labelled_frames(load_frames(lake, rows, MAIN_BRANCH))
    predictions = engine.infer(frames.images)
    parity = lake.get_json(MAIN_BRANCH, f"candidates/{version}/reports/engine_parity.json")
    recorded = next(r for r in parity["engines"]["int8"]["metrics"] if r["slice"] == "overall")
    accuracy = float(np.mean((predictions.occupancy >= 0.5) == (frames.occupancy_target >= 0.5)))
    assert accuracy == pytest.approx(recorded["occupancy_accuracy"], abs=1e-9)


def test_qat_would_fine_tune_the_registered_network_on_the_train_split_it_learned_from(deployed):
    """What ``quantized_engine`` hands QAT when PTQ cannot hold a slice (the QAT path itself:
    deployment/test_qat.py): the candidate's own network from the registry, and the train
    rows of its dataset version read at the commit it recorded."""
    from aiinfra_pipelines.deployment.quantized import qat_inputs
    from aiinfra_pipelines.lake.layout import training_rows_key
    from aiinfra_pipelines.training.resources import mlflow_tracking_uri

    lake = deployed["lake"]
    onnx_model = deployed["published"].output_for_node("onnx_model")
    tracking_uri = deployed["resources"]["mlflow_tracking"].uri()
    network, train_frames = qat_inputs(lake, onnx_model, tracking_uri)

    with mlflow_tracking_uri(tracking_uri):
        registered = mlflow.pytorch.load_model(onnx_model["model_uri"], map_location="cpu")
    for key, value in registered.state_dict().items():
        assert np.array_equal(value.numpy(), network.state_dict()[key].numpy()), key
    rows = lake.get_parquet(
        onnx_model["dataset_commit"], training_rows_key(onnx_model["dataset_version"])
    )
    train_rows = rows[rows["split"] == "train"]
    assert len(train_frames) == len(train_rows) > 0
    assert set(train_frames.tags["log_id"]) == set(train_rows["log_id"])


def test_the_compression_report_measures_every_variant_of_the_published_candidate(deployed):
    """``compression_report`` on the published candidate: the car network pruned under the
    slice guard, QAT beside the shipped PTQ engine, FP16; no teacher (distillation is off in
    training.yaml), each scored on the benchmark and timed on the cpu-ci target."""
    from aiinfra_pipelines.deployment.compression_assets import compression_report_key
    from aiinfra_pipelines_tests.support.loop_runs import all_assets_and_checks

    lake, version = deployed["lake"], deployed["version"]
    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("compression_report"),
        instance=deployed["instance"],
        resources=deployed["resources"],
    )
    assert result.success
    output = result.output_for_node("compression_report")
    report = lake.get_json(MAIN_BRANCH, compression_report_key(version))
    assert output == {"model_version": version, "choice": report["choice"], "key": output["key"]}
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == [
        "teacher_fp32",
        "student_fp32",
        "pruned_fp32",
        "ptq_int8",
        "qat_int8",
        "fp16",
    ]
    assert rows["teacher_fp32"]["available"] is False
    for name in ("student_fp32", "pruned_fp32", "ptq_int8", "fp16"):
        assert rows[name]["available"] and rows[name]["p99_ms_batch1"] > 0, name
    assert rows["student_fp32"]["within_budget"]
    assert "stopped by" in rows["pruned_fp32"]["note"]
    assert rows["ptq_int8"]["note"] == "the loop's INT8 engine"
    assert report["choice"] in {name for name, row in rows.items() if row.get("within_budget")}
    chosen = rows[report["choice"]]
    assert all(
        chosen["bytes"] <= row["bytes"]
        for name, row in rows.items()
        if row.get("within_budget") and name != "teacher_fp32"
    )
    client = mlflow.MlflowClient(tracking_uri=deployed["resources"]["mlflow_tracking"].uri())
    artifacts = {a.path for a in client.list_artifacts(report["mlflow_run_id"], "compression")}
    assert artifacts == {"compression/report.json", "compression/report.md"}
