"""Which engine the fleet runs right now, as recorded on ``main``.

Before the first release there is none, and consumers get the bootstrap engine (model zero):
deterministic, so mining's results are reproducible and its engine hash is stable.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake

from .contract import (
    EMBEDDING_OUTPUT,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    ONNX_OPSET,
    PerceptionSpec,
    perception_spec,
)
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
    pointer = lake.get_json_or_none(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
    if pointer is not None:
        onnx_bytes = lake.get_object(pointer.get("commit", MAIN_BRANCH), pointer["onnx_key"])
        version = str(pointer["version"])
    else:
        onnx_bytes = bootstrap_onnx(spec)
        version = BOOTSTRAP_VERSION
    engine = OnnxRuntimeEngine(onnx_bytes, spec, name=version, batch_size=batch_size)
    return DeployedEngine(engine=engine, version=version, onnx_bytes=onnx_bytes)


def _bootstrap_cache_path(spec: PerceptionSpec) -> Path:
    """Where model zero's ONNX is cached: keyed by everything its bytes depend on."""
    # Versions from package metadata: importing torch and onnx would cost the seconds the
    # cache exists to save.
    versions = "|".join(importlib.metadata.version(name) for name in ("torch", "onnx"))
    # The output names too: a model zero cached before the embedding output must not be reused.
    outputs = ",".join((OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT, EMBEDDING_OUTPUT))
    identity = f"{sorted(asdict(spec).items())}|opset{ONNX_OPSET}|{versions}|{outputs}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return dagster_home() / "cache" / f"bootstrap-{digest}.onnx"


def bootstrap_onnx(spec: PerceptionSpec) -> bytes:
    """Model zero's ONNX, exported once per machine and cached under ``DAGSTER_HOME``.

    Exporting needs torch (seconds to import) and every mining run needs model zero until the
    first release; the export is deterministic, so the cache changes nothing but the time.
    A cached file is used only when it still loads in onnxruntime.
    """
    path = _bootstrap_cache_path(spec)
    if path.is_file():
        data = path.read_bytes()
        try:
            OnnxRuntimeEngine(data, spec, batch_size=1)
            return data
        except Exception:  # a torn or foreign file: export again
            path.unlink(missing_ok=True)
    from .onnx_export import bootstrap_network, export_onnx  # torch only for model zero

    data = export_onnx(bootstrap_network(spec))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
    return data
