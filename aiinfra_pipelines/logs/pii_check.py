"""The cloud's own check that a log arrives with no readable plate or face.

The car anonymizes before upload (``vehicle.anonymizer``); this is the independent proof
ingest runs before anything is merged, and what ``aiinfra logs inspect`` reports as
``pii_findings``. Two sources of candidate regions, neither of them the car's:

- the ground-truth plate boxes a simulated log carries (every plate the renderer painted);
- the cloud's own OpenCV cascades (different models from the car's, logs.yaml
  ``validation.pii_check``), which see only pixels and so also cover real fleets' logs.

A candidate is a finding when its region still has contrast: the anonymizer flattens a region
to its mean colour, so a blurred plate keeps a few grey levels of JPEG ringing at most while a
readable one keeps its glyphs (``docs/vehicle.md`` has the measured figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.pii_detection import (
    FRONT,
    REAR,
    Box,
    HaarCascadeDetector,
    painted_plate_regions,
    region_contrast,
)

RESIDUAL_PII = "residual_pii"
GROUND_TRUTH = "ground_truth_boxes"


@dataclass(frozen=True)
class PiiFinding:
    """A region that should have been anonymized and was not."""

    frame_index: int
    timestamp_ns: int
    camera: str
    box: Box
    kind: str
    found_by: str
    contrast: float

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["box"] = list(self.box)
        row["contrast"] = round(self.contrast, 2)
        return row

    def describe(self) -> str:
        x0, y0, x1, y1 = self.box
        return (
            f"frame {self.frame_index} {self.camera} {self.kind} at ({x0},{y0})-({x1},{y1}), "
            f"contrast {self.contrast:.1f} [{self.found_by}]"
        )


@lru_cache(maxsize=4)
def _cloud_detector(
    cascades: tuple[tuple[str, str], ...], scale: float, neighbors: int, min_size: tuple[int, ...]
) -> HaarCascadeDetector:
    settings = {
        "cascades": dict(cascades),
        "scale_factor": scale,
        "min_neighbors": neighbors,
        "min_size_px": list(min_size),
    }
    return HaarCascadeDetector(settings, name="cloud_haar_cascade")


def cloud_detector(settings: Mapping[str, Any]) -> HaarCascadeDetector:
    """The cloud's cascades, loaded once per process (ingest checks thousands of frames)."""
    haar = settings["haar_cascade"]
    return _cloud_detector(
        tuple(sorted((str(k), str(v)) for k, v in haar["cascades"].items())),
        float(haar["scale_factor"]),
        int(haar["min_neighbors"]),
        tuple(int(v) for v in haar["min_size_px"]),
    )


def find_residual_pii(log: DriveLog, settings: Mapping[str, Any]) -> list[PiiFinding]:
    """Every region of every frame that still shows a plate or face (``[]``: clean).

    ``settings`` is logs.yaml ``validation.pii_check``: ``max_region_contrast`` (luma standard
    deviation a flattened region may keep) and the cloud's ``haar_cascade``.
    """
    limit = float(settings["max_region_contrast"])
    detector = cloud_detector(settings)
    findings: list[PiiFinding] = []
    for index, frame in enumerate(log.frames):
        images = {FRONT: frame.image, REAR: frame.rear_image}
        seen: set[tuple[str, Box]] = set()
        for region in painted_plate_regions(frame, GROUND_TRUTH) + detector.detect(frame):
            image = images.get(region.camera)
            if image is None or (region.camera, region.box) in seen:
                continue
            seen.add((region.camera, region.box))
            contrast = region_contrast(image, region.box)
            if contrast > limit:
                findings.append(
                    PiiFinding(
                        frame_index=index,
                        timestamp_ns=int(frame.timestamp_ns),
                        camera=region.camera,
                        box=region.box,
                        kind=region.kind,
                        found_by=region.detector,
                        contrast=contrast,
                    )
                )
    return findings


def describe_findings(findings: list[PiiFinding], listed: int) -> str:
    """One line for a quarantine reason: how many, in which frames, the first ``listed``."""
    frames = sorted({finding.frame_index for finding in findings})
    shown = "; ".join(finding.describe() for finding in findings[:listed])
    more = f"; and {len(findings) - listed} more" if len(findings) > listed else ""
    return (
        f"{len(findings)} region(s) in {len(frames)} frame(s) still show a plate or face "
        f"(not anonymized on the vehicle): {shown}{more}"
    )


def pii_findings_report(findings: list[PiiFinding]) -> dict[str, Any]:
    """The ``pii_findings`` object of ``aiinfra logs inspect --json``."""
    return {
        "count": len(findings),
        "frames": sorted({finding.frame_index for finding in findings}),
        "regions": [finding.to_dict() for finding in findings],
    }
