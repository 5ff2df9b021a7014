"""Model zero's ONNX is exported once and cached; a damaged cache is replaced, never used."""

from __future__ import annotations

from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import (
    BOOTSTRAP_VERSION,
    _bootstrap_cache_path,
    bootstrap_onnx,
    load_deployed_engine,
)
from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx


def test_cached_model_zero_is_byte_identical_to_a_fresh_export(dagster_home, local_lake):
    spec = perception_spec()
    first = bootstrap_onnx(spec)
    path = _bootstrap_cache_path(spec)
    assert path.is_file() and path.is_relative_to(dagster_home)
    assert bootstrap_onnx(spec) == first == export_onnx(bootstrap_network(spec))
    deployed = load_deployed_engine(local_lake, spec)
    assert deployed.version == BOOTSTRAP_VERSION and deployed.onnx_bytes == first


def test_a_torn_cache_file_is_exported_again(dagster_home):
    spec = perception_spec()
    good = bootstrap_onnx(spec)
    path = _bootstrap_cache_path(spec)
    path.write_bytes(good[: len(good) // 2])
    assert bootstrap_onnx(spec) == good
    assert path.read_bytes() == good
