"""Remove personal data from drive logs before anything downstream of ingest can see them.

Three kinds of PII travel in a log: the vehicle's VIN (ties a drive to an owner), exact GPS
positions (home and work addresses) and licence plates of other cars in the camera image. The
VIN becomes a keyed pseudonym, so the same vehicle stays linkable across logs (fleet telemetry,
per-vehicle drift) without being identifiable by anyone who lacks the key; GPS is coarsened to a
grid; plate boxes are flattened. :func:`find_pii_leaks` is the independent proof an asset check
runs on the output.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import math
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.logs import _config
from aiinfra_pipelines.logs.lazy_frames import LazyFrames, signal_frames
from aiinfra_pipelines.logs.model import UNKNOWN_VALUE, DriveLog, Frame
from aiinfra_pipelines.logs.reader import build_drive_log, scan_mcap

ENV_KEY = "AIINFRA_ANON_KEY"
PSEUDONYM_PREFIX = "veh-"
PSEUDONYM_KEY = "vehicle_pseudonym"
DEV_KEY_BYTES = 32

Box = tuple[int, int, int, int]

# --------------------------------------------------------------------------- VIN


def pseudonymize_vin(vin: str, key: bytes) -> str:
    """``veh-`` + the first 16 hex chars of HMAC-SHA256(key, VIN).

    HMAC rather than a plain hash: VINs are a small, structured space (manufacturer prefix,
    model year, serial), so an unkeyed hash could be reversed by enumerating candidates.

    Truncating to 16 hex chars keeps 64 bits. By the birthday bound the chance that *any* two
    vehicles of a fleet of n collide is about n^2 / 2^65: ~3e-8 for a million vehicles, ~3e-6
    for ten million, negligible for a pseudonym whose collision would merely merge two cars'
    statistics. Shorter ids keep tables, paths and UIs readable.

    The VIN is upper-cased and stripped first so formatting differences between uploaders
    cannot split one vehicle into two pseudonyms.
    """
    _check_key(key)
    hex_chars = int(_config.setting("anonymization", "pseudonym_hex_chars"))
    digest = hmac.new(key, vin.strip().upper().encode("utf-8"), hashlib.sha256).hexdigest()
    return PSEUDONYM_PREFIX + digest[:hex_chars]


def _check_key(key: bytes) -> None:
    minimum = int(_config.setting("anonymization", "min_key_bytes"))
    if not isinstance(key, bytes | bytearray) or len(key) < minimum:
        raise ValueError(f"anonymization key must be at least {minimum} bytes")


# --------------------------------------------------------------------------- GPS


def coarsen_coordinate(value: float, decimals: int) -> float:
    """Round to ``decimals`` places: 3 decimals is ~111 m of latitude (street, not house).

    Rounding (a fixed grid) rather than adding noise: repeated drives past the same house
    would average random noise away, but all land on the same grid cell.
    """
    if decimals < 0:
        raise ValueError(f"decimals must be >= 0, got {decimals}")
    if not math.isfinite(value):
        return value  # validation rejects these; nothing to hide in a NaN
    return round(float(value), decimals)


def default_gps_decimals() -> int:
    return int(_config.setting("anonymization", "gps_decimals"))


# --------------------------------------------------------------------------- plates


def _clip_box(box: Sequence[int], height: int, width: int) -> Box | None:
    x0, y0, x1, y1 = (int(v) for v in box)
    x0, x1 = sorted((min(max(x0, 0), width), min(max(x1, 0), width)))
    y0, y1 = sorted((min(max(y0, 0), height), min(max(y1, 0), height)))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def blur_regions(image: np.ndarray, boxes: Iterable[Sequence[int] | None]) -> np.ndarray:
    """A copy of ``image`` with each ``(x0, y0, x1, y1)`` box (end-exclusive) flattened.

    Each box is replaced by its mean colour, i.e. pixelation with one block per box. A plate in
    a 48x128 frame is a few pixels wide; any finer block grid would keep glyph structure, and
    a blur kernel leaves a deconvolvable signal. The mean is irreversible and, unlike a block
    grid aligned with the content, changes every non-uniform region. Boxes are clipped to the
    image; pixels outside them are never touched.
    """
    result = image.copy()
    height, width = image.shape[:2]
    for box in boxes:
        clipped = None if box is None else _clip_box(box, height, width)
        if clipped is None:
            continue
        x0, y0, x1, y1 = clipped
        region = result[y0:y1, x0:x1]
        mean = region.reshape(-1, *region.shape[2:]).mean(axis=0)
        region[...] = np.round(mean).astype(image.dtype) if image.dtype.kind in "iu" else mean
    return result


def plate_boxes(frame: Frame) -> list[Box]:
    return [other.plate_box for other in frame.others if other.plate_box is not None]


def rear_plate_boxes(frame: Frame) -> list[Box]:
    """Plates in the rear camera's image: every stored camera is anonymized, not only the front."""
    return [other.rear_plate_box for other in frame.others if other.rear_plate_box is not None]


# --------------------------------------------------------------------------- whole log


def _anonymize_frame(frame: Frame, decimals: int) -> Frame:
    rear = frame.rear_image
    return dataclasses.replace(
        frame,
        image=blur_regions(frame.image, plate_boxes(frame)),
        rear_image=None if rear is None else blur_regions(rear, rear_plate_boxes(frame)),
        latitude=coarsen_coordinate(frame.latitude, decimals),
        longitude=coarsen_coordinate(frame.longitude, decimals),
        others=list(frame.others),
    )


def _anonymize_signals(frame: Frame, decimals: int) -> Frame:
    """A frame skeleton's share of :func:`_anonymize_frame` (it has no pixels to blur)."""
    return dataclasses.replace(
        frame,
        latitude=coarsen_coordinate(frame.latitude, decimals),
        longitude=coarsen_coordinate(frame.longitude, decimals),
        others=list(frame.others),
    )


def anonymize_metadata(metadata: Mapping[str, str], key: bytes) -> dict[str, str]:
    """``vin`` dropped (not renamed: a key called vin must never hold anything but a VIN).

    A VIN the recorder never knew (``unknown``, derived by a source profile) has the pseudonym
    ``unknown``: keying the word would make every such car one fake vehicle.
    """
    anonymized = {name: value for name, value in metadata.items() if name != "vin"}
    if "vin" in metadata:
        vin = metadata["vin"]
        anonymized[PSEUDONYM_KEY] = (
            UNKNOWN_VALUE if vin == UNKNOWN_VALUE else pseudonymize_vin(vin, key)
        )
    return anonymized


def anonymize_log(log: DriveLog, key: bytes, gps_decimals: int | None = None) -> DriveLog:
    """A new log without VIN, exact GPS or readable plates; the input is left untouched.

    The local pose (``x``/``y`` in the map frame) is kept: it is relative to the segment and is
    what the planner and the labels need.
    """
    decimals = default_gps_decimals() if gps_decimals is None else gps_decimals
    frames: Sequence[Frame]
    if isinstance(log.frames, LazyFrames):  # blurred as each frame is read, never all at once
        frames = log.frames.mapped(
            functools.partial(_anonymize_frame, decimals=decimals),
            functools.partial(_anonymize_signals, decimals=decimals),
        )
    else:
        frames = [_anonymize_frame(frame, decimals) for frame in log.frames]
    return DriveLog(
        metadata=anonymize_metadata(log.metadata, key),
        frames=frames,
        events=list(log.events),
        recording=log.recording,
        degradation=list(log.degradation),
        unknown_signals=log.unknown_signals,
    )


# --------------------------------------------------------------------------- keys


def load_or_create_dev_key(path: str | os.PathLike[str]) -> bytes:
    """The local development key, created (32 random bytes, mode 0600) on first use.

    ``O_EXCL`` makes creation race-free when two Dagster processes start at once: the loser
    reads the winner's key instead of overwriting it, so pseudonyms stay stable.
    """
    key_path = Path(path)
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key(key_path)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the umask could only narrow it; make it exact
        handle.write(secrets.token_bytes(DEV_KEY_BYTES))
    return _read_key(key_path)


def _read_key(path: Path) -> bytes:
    key = path.read_bytes()
    _check_key(key)
    return key


def dev_key_path() -> Path:
    return dagster_home() / "keys" / "anonymization.key"


def anonymization_key() -> bytes:
    """``AIINFRA_ANON_KEY`` (hex) in deployments; otherwise the per-checkout dev key.

    Production must set the variable from a secret store: the pseudonyms are only as stable and
    as private as this key.
    """
    value = os.environ.get(ENV_KEY)
    if value is None or not value.strip():
        return load_or_create_dev_key(dev_key_path())
    try:
        key = bytes.fromhex(value.strip())
    except ValueError as exc:
        raise ValueError(f"{ENV_KEY} must be hex-encoded") from exc
    _check_key(key)
    return key


# --------------------------------------------------------------------------- leak detection

_LAT_COLUMNS = ("latitude", "lat")
_LON_COLUMNS = ("longitude", "lon", "lng")


def _as_table(data: Any) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data
    if hasattr(data, "to_pandas"):  # pyarrow.Table
        return data.to_pandas()
    return pd.DataFrame(list(data))


def _needles(raw_vins: set[str]) -> set[str]:
    """The VINs to search for, normalized; ``unknown`` (no VIN was recorded) is none."""
    return {vin.strip().upper() for vin in raw_vins if vin.strip() and vin != UNKNOWN_VALUE}


def _vin_hits(texts: Iterable[tuple[str, str]], raw_vins: set[str]) -> list[str]:
    """``(where, text)`` pairs that contain a raw VIN, case-insensitively."""
    needles = _needles(raw_vins)
    leaks = []
    for where, text in texts:
        upper = text.upper()
        # Leak reports end up in Dagster metadata: say where, never echo the identifier itself.
        found = sum(1 for vin in needles if vin in upper)
        if found:
            leaks.append(f"raw VIN found in {where} ({found} distinct)")
    return leaks


class _CoordinateCheck:
    """Flags exact raw coordinates and any value finer than the anonymization grid.

    The grid test uses a tolerance of 10^-(decimals+2) degrees (~1 m at 3 decimals) so values
    that went through float32 storage are not false alarms.
    """

    def __init__(self, raw: Iterable[Sequence[float]], decimals: int) -> None:
        self.decimals = decimals
        self.tolerance = 10.0 ** -(decimals + 2)
        pairs = [(float(lat), float(lon)) for lat, lon in raw]
        # A raw value already on the grid is indistinguishable from its coarsened self.
        self.raw_values = {round(v, 9) for pair in pairs for v in pair if not self._on_grid(v)}

    def _on_grid(self, value: float) -> bool:
        return abs(value - round(value, self.decimals)) <= self.tolerance

    def check(self, where: str, name: str, values: Iterable[float]) -> list[str]:
        leaks = []
        finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        exact = [v for v in finite if round(v, 9) in self.raw_values]
        if exact:
            leaks.append(f"{len(exact)} exact raw {name} value(s) in {where}")
        fine = [v for v in finite if not self._on_grid(v)]
        if fine:
            leaks.append(
                f"{len(fine)} {name} value(s) in {where} finer than {self.decimals} decimals"
            )
        return leaks


def _log_leaks(log: DriveLog, raw_vins: set[str], coords: _CoordinateCheck) -> list[str]:
    texts = [(f"metadata[{k!r}]", f"{k}={v}") for k, v in log.metadata.items()]
    texts += [(f"trigger {i}", event.rule) for i, event in enumerate(log.events)]
    leaks = _vin_hits(texts, raw_vins)
    frames = signal_frames(log.frames)
    leaks += coords.check("frames", "latitude", (f.latitude for f in frames))
    leaks += coords.check("frames", "longitude", (f.longitude for f in frames))
    return leaks


def _binary_vin_hits(column: str, values: Iterable[bytes], raw_vins: set[str]) -> list[str]:
    """VINs inside binary cells (pixels, blobs), searched as bytes, case-insensitively.

    The same search as for text, without decoding every blob into a string first: a frames
    table holds megabytes of pixels per log, and this audit runs on every ingested batch.
    """
    needles = {vin.encode() for vin in _needles(raw_vins)}
    found = {needle for value in values for needle in needles if needle in value.upper()}
    return [f"raw VIN found in column {column!r} ({len(found)} distinct)"] if found else []


def _table_leaks(table: pd.DataFrame, raw_vins: set[str], coords: _CoordinateCheck) -> list[str]:
    texts = [(f"column name {c!r}", str(c)) for c in table.columns]
    leaks = []
    for column in table.columns:
        if table[column].dtype == object or pd.api.types.is_string_dtype(table[column]):
            values = table[column].dropna()
            binary = [bytes(v) for v in values if isinstance(v, bytes | bytearray | memoryview)]
            if binary:
                leaks += _binary_vin_hits(column, binary, raw_vins)
                values = values[[not isinstance(v, bytes | bytearray | memoryview) for v in values]]
            texts += [(f"column {column!r}", str(v)) for v in values.unique()]
    leaks = _vin_hits(texts, raw_vins) + leaks
    for column in table.columns:
        name = str(column).lower()
        if name in _LAT_COLUMNS or name in _LON_COLUMNS:
            values = pd.to_numeric(table[column], errors="coerce").dropna()
            leaks += coords.check(f"column {column!r}", name, values)
    return leaks


def _encoded_leaks(data: bytes, raw_vins: set[str], coords: _CoordinateCheck) -> list[str]:
    """Search raw bytes (metadata is uncompressed) *and* every decompressed message payload."""
    scanned = scan_mcap(data)
    leaks = _vin_hits([("the file bytes", data.decode("latin-1"))], raw_vins)
    payloads = (
        (f"a {topic} message", record.data.decode("latin-1"))
        for topic, records in scanned.messages.items()
        for record in records
    )
    leaks += _vin_hits(payloads, raw_vins)
    return leaks + _log_leaks(build_drive_log(scanned), raw_vins, coords)


def find_pii_leaks(
    frames_table_or_log: DriveLog | pd.DataFrame | bytes | Any,
    raw_vins: set[str],
    raw_coordinates: Iterable[Sequence[float]],
    gps_decimals: int | None = None,
) -> list[str]:
    """Human-readable descriptions of PII left in anonymized output; ``[]`` means clean.

    Accepts a :class:`DriveLog`, a frames table (pandas/pyarrow/records; coordinate columns
    ``latitude``/``lat`` and ``longitude``/``lon``/``lng``, every text column searched for
    VINs) or encoded MCAP bytes. ``raw_coordinates`` are ``(lat, lon)`` pairs of the raw logs.
    """
    decimals = default_gps_decimals() if gps_decimals is None else gps_decimals
    coords = _CoordinateCheck(raw_coordinates, decimals)
    if isinstance(frames_table_or_log, DriveLog):
        return _log_leaks(frames_table_or_log, raw_vins, coords)
    if isinstance(frames_table_or_log, bytes | bytearray | memoryview):
        return _encoded_leaks(bytes(frames_table_or_log), raw_vins, coords)
    return _table_leaks(_as_table(frames_table_or_log), raw_vins, coords)
