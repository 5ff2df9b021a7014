"""Which engine the fleet runs right now, as recorded on ``main``.

Before the first release there is none, and consumers get the bootstrap engine (model zero):
deterministic, so mining's results are reproducible and its engine hash is stable.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiinfra_pipelines.lake.layout import PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH

from .contract import PerceptionSpec, perception_spec
from .engine import OnnxRuntimeEngine

BOOTSTRAP_VERSION = "bootstrap-0"


@dataclass(frozen=True)
class DeployedEngine:
    engine: OnnxRuntimeEngine
    version: str
    onnx_bytes: bytes


def load_deployed_engine(
    lake: VersionedLake, spec: PerceptionSpec | None = None, batch_size: int = 64
) -> DeployedEngine:
    spec = spec or perception_spec()
    if lake.object_exists(MAIN_BRANCH, PRODUCTION_POINTER_KEY):
        pointer = lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
        onnx_bytes = lake.get_object(pointer.get("commit", MAIN_BRANCH), pointer["onnx_key"])
        version = str(pointer["version"])
    else:
        from .onnx_export import bootstrap_network, export_onnx  # torch only for model zero

        onnx_bytes = export_onnx(bootstrap_network(spec))
        version = BOOTSTRAP_VERSION
    engine = OnnxRuntimeEngine(onnx_bytes, spec, name=version, batch_size=batch_size)
    return DeployedEngine(engine=engine, version=version, onnx_bytes=onnx_bytes)
