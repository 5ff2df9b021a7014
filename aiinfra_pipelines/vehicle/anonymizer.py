"""Blur plates and faces on the car, before a log enters the upload path.

Anonymizing after upload means a face that slipped through is already in the lake, and every
batch it touched must be reprocessed. So the car runs its detectors on each camera image of a
segment it keeps and flattens every region they find; only then is the log written, and it
records which anonymizer (version and detectors) did it. The cloud trusts none of this and
checks again with detectors of its own (``logs.pii_check``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.logs.anonymize import blur_regions
from aiinfra_pipelines.logs.model import DriveLog, Frame
from aiinfra_pipelines.logs.pii_detection import (
    FRONT,
    REAR,
    Box,
    HaarCascadeDetector,
    PiiDetector,
    PiiRegion,
    painted_plate_regions,
)
from aiinfra_pipelines.vehicle.outbox_settings import CONFIG_FILE

ANONYMIZER_VERSION_KEY = "anonymizer_version"
REGIONS_BLURRED_KEY = "anonymizer_regions_blurred"


def merge_overlapping(boxes: list[Box]) -> list[Box]:
    """Boxes that overlap, replaced by their common bounding box, until none overlap.

    Flattening overlapping boxes one after the other would leave the first one holding two
    means (half its own, half the second's): no glyph survives, but the region is not flat, and
    a flat region is what the cloud's check (rightly) accepts as anonymized. So a car flattens
    the union of a cluster of overlapping detections as one region.
    """
    merged = [tuple(box) for box in boxes]
    changed = True
    while changed:
        changed = False
        for i in range(len(merged)):
            for j in range(i + 1, len(merged)):
                a, b = merged[i], merged[j]
                if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                    merged[i] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    del merged[j]
                    changed = True
                    break
            if changed:
                break
    return [(int(x0), int(y0), int(x1), int(y1)) for x0, y0, x1, y1 in merged]


class SimulatorPlateDetector:
    """The simulator's renderer knows where it painted each plate: a perfect plate detector.

    It stands in for the trained plate detector a production car runs. It reads the plate
    boxes the frame carries, which a real car's frames do not have, so it is only ever one
    detector of several (vehicle.yaml ``anonymizer.detectors``), never the car's only one.
    """

    name = "simulator_boxes"

    def detect(self, frame: Frame) -> list[PiiRegion]:
        return painted_plate_regions(frame, self.name)


@dataclass(frozen=True)
class AnonymizerSettings:
    version: str
    detectors: tuple[str, ...]
    haar_cascade: Mapping[str, Any]

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> AnonymizerSettings:
        config = settings_section(CONFIG_FILE, "", config).values
        section = config.get("anonymizer")
        if not isinstance(section, Mapping):
            raise KeyError(f"{CONFIG_FILE} has no anonymizer section")
        detectors = tuple(str(name) for name in section.get("detectors") or [])
        unknown = sorted(set(detectors) - set(_FACTORIES))
        if unknown or not detectors:
            raise ValueError(
                f"{CONFIG_FILE} anonymizer.detectors must name some of {sorted(_FACTORIES)}; "
                f"got {list(detectors)}"
            )
        return cls(
            version=str(section["version"]),
            detectors=detectors,
            haar_cascade=dict(section.get("haar_cascade") or {}),
        )


_FACTORIES = {
    SimulatorPlateDetector.name: lambda settings: SimulatorPlateDetector(),
    "haar_cascade": lambda settings: HaarCascadeDetector(settings.haar_cascade),
}


class VehicleAnonymizer:
    """The car's anonymizer: the union of its detectors' regions, flattened, on every camera."""

    def __init__(self, detectors: Sequence[PiiDetector], version: str) -> None:
        if not detectors:
            raise ValueError("a vehicle anonymizer needs at least one detector")
        self.detectors = list(detectors)
        self.version = f"{version}+" + "+".join(detector.name for detector in self.detectors)

    @classmethod
    def from_settings(cls, settings: AnonymizerSettings | None = None) -> VehicleAnonymizer:
        settings = settings or AnonymizerSettings.load()
        return cls([_FACTORIES[name](settings) for name in settings.detectors], settings.version)

    def regions(self, frame: Frame) -> list[PiiRegion]:
        return [region for detector in self.detectors for region in detector.detect(frame)]

    def anonymize_frame(self, frame: Frame) -> tuple[Frame, int]:
        """The frame with every detected region flattened, and how many regions that was."""
        regions = self.regions(frame)
        front = merge_overlapping([region.box for region in regions if region.camera == FRONT])
        rear = merge_overlapping([region.box for region in regions if region.camera == REAR])
        blurred = dataclasses.replace(
            frame,
            image=blur_regions(frame.image, front) if front else frame.image,
            rear_image=(
                blur_regions(frame.rear_image, rear)
                if rear and frame.rear_image is not None
                else frame.rear_image
            ),
        )
        return blurred, len(regions)

    def anonymize(self, log: DriveLog) -> DriveLog:
        """A copy of ``log`` whose images carry no detected plate or face, stamped with the
        anonymizer's version (GPS and the VIN are the cloud's to coarsen and pseudonymize)."""
        frames, blurred = [], 0
        for frame in log.frames:
            anonymous, count = self.anonymize_frame(frame)
            frames.append(anonymous)
            blurred += count
        metadata = {
            **log.metadata,
            ANONYMIZER_VERSION_KEY: self.version,
            REGIONS_BLURRED_KEY: str(blurred),
        }
        return dataclasses.replace(log, metadata=metadata, frames=frames)
