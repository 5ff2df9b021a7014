"""From trained model to car-side engine: export, quantization, engine backends, parity, latency.

Pure logic sits in small modules the tests call without Dagster — ``export`` (ONNX with a parity
check), ``quantize`` / ``sensitivity`` / ``fallback`` (calibrated INT8 QDQ with a per-node
sensitivity ranking and the mixed-precision fallback loop), ``parity`` and ``layerwise``
(per-slice and per-tensor comparison with FP32), ``benchmark`` (latency and memory),
``backends`` (onnxruntime and TensorRT behind the perception ``Engine`` interface) and
``candidate`` (the manifest of docs/loop.md). ``payloads`` types what flows between the assets
(``CandidateIdentity``, ``StagedObject``) with today's JSON; ``staging``, ``quantized`` and
``publishing`` hold the asset logic, ``metadata`` the Dagster metadata. ``assets.py`` only wires
them to the lake, MLflow and the gates.
"""
