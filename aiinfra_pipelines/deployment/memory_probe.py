"""Peak memory of one engine, measured in a fresh process (``python -m`` this module).

Inside a long-lived process (a Dagster step, a benchmark that already ran other engines) the
allocator hands an engine memory it kept from earlier work, so the resident-set peak barely
moves and the engine looks free. On the car the engine lives in a process of its own; so is it
measured here: a child imports the runtime, records its resident set, resets the kernel's
high-water mark, then creates the engine and runs it at batch 1 and the serving batch. The
peak it reports is what the engine adds to a process that has only the runtime loaded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def probe_peak_memory_mb(
    onnx_bytes: bytes,
    images: np.ndarray,
    *,
    backend: str,
    precision: str,
    serving_batch: int,
    intra_op_threads: int = 0,
    timeout_s: float = 300.0,
) -> tuple[float, str]:
    """(peak MiB the engine adds, method) from a child process."""
    with tempfile.TemporaryDirectory(prefix="aiinfra-memprobe-") as directory:
        model, frames = Path(directory) / "model.onnx", Path(directory) / "frames.npy"
        model.write_bytes(onnx_bytes)
        np.save(frames, np.ascontiguousarray(images))
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                __name__,
                str(model),
                str(frames),
                "--backend",
                backend,
                "--precision",
                precision,
                "--batch",
                str(serving_batch),
                "--threads",
                str(intra_op_threads),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if completed.returncode != 0:
        raise RuntimeError(f"memory probe failed: {completed.stderr.strip()[-2000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    return float(result["peak_mb"]), f"{result['method']} (fresh process)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("frames")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import onnxruntime  # noqa: F401 - the runtime belongs to the baseline, not to the engine

    from aiinfra_pipelines.perception.contract import perception_spec

    from .backends import create_engine
    from .benchmark import PeakMemory

    onnx_bytes = Path(args.model).read_bytes()
    images = np.load(args.frames)
    spec = perception_spec()
    with PeakMemory() as memory:
        engine = create_engine(
            onnx_bytes,
            spec,
            backend=args.backend,
            precision=args.precision,
            batch_size=args.batch,
            intra_op_threads=args.threads,
        )
        engine.infer(images[:1])
        reps = int(np.ceil(args.batch / len(images)))
        engine.infer(np.concatenate([images] * reps)[: args.batch])
    print(json.dumps({"peak_mb": memory.mb, "method": memory.method}))


if __name__ == "__main__":
    main()
