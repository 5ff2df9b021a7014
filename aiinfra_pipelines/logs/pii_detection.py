"""Finding personal data in camera images: the detector interface both sides of upload share.

The car blurs what its detectors find before a log is written (``vehicle.anonymizer``); the
cloud re-checks every frame with detectors of its own (``logs.pii_check``). Both speak in
:class:`PiiRegion` and take a whole :class:`Frame`, so one implementation can read pixels (an
OpenCV cascade) and another the simulator's own knowledge of where it painted plates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from aiinfra_pipelines.logs.anonymize import plate_boxes, rear_plate_boxes
from aiinfra_pipelines.logs.model import Frame

Box = tuple[int, int, int, int]
FRONT, REAR = "front", "rear"


@dataclass(frozen=True)
class PiiRegion:
    """One region of one camera image that holds (or may hold) a plate or a face."""

    camera: str  # "front" | "rear"
    box: Box  # (x0, y0, x1, y1), end-exclusive pixels
    kind: str  # "plate" | "face"
    detector: str


class PiiDetector(Protocol):
    """Anything that says where the personal data in a frame's images is."""

    name: str

    def detect(self, frame: Frame) -> list[PiiRegion]: ...


def camera_images(frame: Frame) -> Iterator[tuple[str, np.ndarray]]:
    """Every stored camera image of a frame, by camera name."""
    yield FRONT, frame.image
    if frame.rear_image is not None:
        yield REAR, frame.rear_image


def painted_plate_regions(frame: Frame, found_by: str) -> list[PiiRegion]:
    """The plate boxes a simulated frame carries (``logs.anonymize.plate_boxes`` and its rear
    twin) as regions: what the car's simulator detector and the cloud's ground-truth check
    both start from."""
    regions = [PiiRegion(FRONT, box, "plate", found_by) for box in plate_boxes(frame)]
    if frame.rear_image is not None:
        regions += [PiiRegion(REAR, box, "plate", found_by) for box in rear_plate_boxes(frame)]
    return regions


def luminance(image: np.ndarray) -> np.ndarray:
    """Rec. 601 luma as float32 (grayscale images pass through)."""
    if image.ndim == 2:
        return image.astype(np.float32)
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return image[..., :3].astype(np.float32) @ weights


def region_contrast(image: np.ndarray, box: Sequence[int]) -> float:
    """Standard deviation of the luma inside ``box`` (0.0 for an empty or flattened region).

    Anonymization replaces a region by its mean colour, so what is left of a plate's glyphs
    after it is this number: ~0 for a flattened plate (plus a few grey levels of JPEG ringing),
    tens of grey levels for a readable one.
    """
    height, width = image.shape[:2]
    x0, y0, x1, y1 = (int(v) for v in box)
    x0, x1 = max(0, x0), min(width, x1)
    y0, y1 = max(0, y0), min(height, y1)
    if x1 <= x0 or y1 <= y0:
        return 0.0
    return float(luminance(image[y0:y1, x0:x1]).std())


@lru_cache(maxsize=16)
def _cascade(path: str) -> Any:
    import cv2

    classifier = cv2.CascadeClassifier(path)
    if classifier.empty():
        raise FileNotFoundError(f"OpenCV could not load the cascade {path}")
    return classifier


def cascade_path(name: str) -> str:
    """A cascade shipped with opencv-python-headless (``cv2.data.haarcascades``) or a path."""
    if Path(name).is_absolute():
        return name
    import cv2

    path = Path(cv2.data.haarcascades) / name
    if not path.is_file():
        raise FileNotFoundError(f"no OpenCV cascade {name!r} in {cv2.data.haarcascades}")
    return str(path)


class HaarCascadeDetector:
    """OpenCV Haar cascades (plates, faces) run on every camera image of a frame.

    A real detector: it sees only pixels. The car and the cloud each configure their own
    cascades (different models), so the cloud's check does not share the car's blind spots.
    """

    def __init__(self, settings: Mapping[str, Any], name: str = "haar_cascade") -> None:
        self.name = name
        self._cascades = {
            str(kind): cascade_path(str(file)) for kind, file in settings["cascades"].items()
        }
        self._scale_factor = float(settings["scale_factor"])
        self._min_neighbors = int(settings["min_neighbors"])
        self._min_size = tuple(int(v) for v in settings["min_size_px"])
        for path in self._cascades.values():
            _cascade(path)  # fail at construction, not on the first frame

    def detect(self, frame: Frame) -> list[PiiRegion]:
        regions = []
        for camera, image in camera_images(frame):
            gray = np.clip(luminance(image), 0, 255).astype(np.uint8)
            for kind, path in self._cascades.items():
                found = _cascade(path).detectMultiScale(
                    gray,
                    scaleFactor=self._scale_factor,
                    minNeighbors=self._min_neighbors,
                    minSize=self._min_size,
                )
                for x, y, w, h in np.asarray(found, dtype=int).reshape(-1, 4):
                    box = (int(x), int(y), int(x + w), int(y + h))
                    regions.append(PiiRegion(camera, box, kind, self.name))
        return regions
